"""Tasks: the model, loaders for the Harbor/Terminal-Bench 2.x and 1.x layouts, synthesis, decontamination."""

from conch.tasks.model import Task, TaskLoadError

__all__ = ["Task", "TaskLoadError"]
