"""The task model shared by every loader, the verifier, the harness agents and the synthesizer.

A `Task` is plain, serializable data: paths and strings. Loaders (`harbor.py`, `tb1.py`) turn a folder into a
`Task` or a `TaskLoadError`; nothing downstream needs to know which layout a task came from except through the
few fields that differ (`test_script`, `test_env`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from conch.sandbox.base import Limits
from conch.tasks.fields import printable


@dataclass(frozen=True)
class Task:
    """One runnable task.

    - `path`: the task folder; `name`: its folder name (the id reported everywhere).
    - `fmt`: "harbor" (Terminal-Bench 2.x) or "tb1" (Terminal-Bench 1).
    - `tests_dir`: host folder uploaded to /tests before verification.
    - `test_script`: host path of the script run by the verifier (`tests/test.sh` or TB1 `run-tests.sh`).
    - `test_env`: extra environment for the verifier (TB1: TEST_DIR=/tests).
    - `solution_script`: host path of a shell solution (`solution/solve.sh`, TB1 `solution.sh`), or None.
    - `solution_commands`: a solution given as a command list (TB1 `solution.yaml`, synthesized tasks), or None.
    - `context_dir`/`dockerfile`/`compose_file`: the environment definition.
    - `env`: environment for every command in the sandbox (Harbor `[environment.env]`).
    - `metadata`: everything else in task.toml/task.yaml, unknown keys kept.
    """

    name: str
    path: Path
    fmt: str
    instruction: str
    tests_dir: Path
    test_script: Path
    context_dir: Path | None
    dockerfile: Path | None
    compose_file: Path | None = None
    solution_script: Path | None = None
    solution_commands: tuple[str, ...] | None = None
    agent_timeout_sec: float = 900.0
    verifier_timeout_sec: float = 180.0
    limits: Limits = field(default_factory=Limits)
    test_env: dict[str, str] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)

    @property
    def allow_internet(self) -> bool:
        """Harbor `[environment] allow_internet = true`: the task wants the network at run time."""
        env = self.metadata.get("environment") if isinstance(self.metadata, dict) else None
        return isinstance(env, dict) and env.get("allow_internet") is True

    def sandbox_spec(self):
        from conch.sandbox.base import SandboxSpec

        return SandboxSpec(
            name=self.name,
            context_dir=self.context_dir,
            dockerfile=self.dockerfile,
            compose_file=self.compose_file,
            env=dict(self.env),
            limits=self.limits,
        )


@dataclass(frozen=True)
class TaskLoadError:
    """A task folder that could not be loaded: `file` names the offending file, `message` what is wrong.

    `name` is always printable (a folder name that is not UTF-8 is escaped); `file` and `path` are the real
    paths, so print the error with `str()`, which escapes them too."""

    name: str
    path: Path
    file: Path
    message: str

    def __str__(self) -> str:
        """One printable line: bytes of a file name that are not UTF-8 are written as `\\xff`."""
        return printable(f"{self.file}: {self.message}")
