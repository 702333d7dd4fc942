"""Find and load every task below some folders, whatever its layout.

A task is a folder holding `task.toml` (Harbor / Terminal-Bench 2.x) or `task.yaml` (Terminal-Bench 1). Why
errors are values here: a batch of hundreds of tasks must not stop at the first broken one; each broken task
becomes a `TaskLoadError` naming its file and problem, reported beside the tasks that did load. That includes
a task folder that is not plain data (a symlink out of it, a name that is not UTF-8, see `fields.check_tree`)
and a number out of its bounds (`fields.BOUNDS`): hostile task data is refused per task, never by the batch.
"""

from __future__ import annotations

import os
from pathlib import Path

from conch.tasks.fields import printable
from conch.tasks.harbor import MARKER as HARBOR_MARKER
from conch.tasks.harbor import load_harbor_task
from conch.tasks.model import Task, TaskLoadError
from conch.tasks.tb1 import MARKER as TB1_MARKER
from conch.tasks.tb1 import load_tb1_task


def is_task_dir(folder: Path) -> bool:
    return (folder / HARBOR_MARKER).is_file() or (folder / TB1_MARKER).is_file()


def load_task(folder: Path) -> Task | TaskLoadError:
    """Load one task folder. task.toml wins when both markers are present."""
    folder = Path(folder)
    if (folder / HARBOR_MARKER).is_file():
        return load_harbor_task(folder)
    if (folder / TB1_MARKER).is_file():
        return load_tb1_task(folder)
    return TaskLoadError(
        name=printable(folder.name),
        path=folder.resolve(),
        file=folder.resolve(),
        message=f"not a task folder (no {HARBOR_MARKER} or {TB1_MARKER})",
    )


def find_task_dirs(root: Path) -> list[Path]:
    """Task folders at or below `root` (a task folder is not searched further; hidden folders are skipped).

    Symlinked folders are followed (a folder of links to chosen tasks is a common way to assemble a task set);
    each real folder is visited once, so a link cycle cannot loop."""
    root = Path(root)
    if root.is_file() and root.name in (HARBOR_MARKER, TB1_MARKER):
        return [root.parent]
    if is_task_dir(root):
        return [root]
    found = []
    visited: set[str] = set()
    for dirpath, dirnames, _ in os.walk(root, followlinks=True):
        real = os.path.realpath(dirpath)
        if real in visited:
            dirnames.clear()
            continue
        visited.add(real)
        here = Path(dirpath)
        if here != root and is_task_dir(here):
            found.append(here)
            dirnames.clear()
            continue
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
    return found


def load_tasks(paths: list[Path] | list[str]) -> list[Task | TaskLoadError]:
    """Every task below `paths`, sorted by name (then path); each folder loaded once."""
    seen: set[Path] = set()
    results: list[Task | TaskLoadError] = []
    for path in paths:
        for folder in find_task_dirs(Path(path)):
            key = folder.resolve()
            if key in seen:
                continue
            seen.add(key)
            results.append(load_task(folder))
    results.sort(key=lambda t: (t.name, str(t.path)))
    return results
