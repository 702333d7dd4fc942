"""The Sandbox protocol every backend implements.

Why a protocol this small: the agent loop, the verifier and the harness agents only ever need to start a box,
run commands in it (one-shot or through a persistent shell), move files in and out, and stop it. Keeping the
surface to that lets the `local` (bubblewrap) and `docker` backends give identical results, and lets a future
remote backend slot in without touching the callers.

Everything that crosses this interface is plain data (dataclasses of str/int/float/bool), so results can
travel between Ray workers later.
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, runtime_checkable

DEFAULT_OUTPUT_CAP = 64 * 1024  # bytes of output kept per stream (head + tail)


# Docker's default capability set (moby oci/caps/defaults.go): all that root in a box keeps, on both backends
# (enter.c spells the same list in C).
BOX_CAPS = ("CHOWN", "DAC_OVERRIDE", "FSETID", "FOWNER", "MKNOD", "NET_RAW", "SETGID", "SETUID", "SETFCAP",
            "SETPCAP", "NET_BIND_SERVICE", "SYS_CHROOT", "KILL", "AUDIT_WRITE")


@dataclass(frozen=True)
class ExecResult:
    """Outcome of one command.

    `exit_code` is None when the command was killed by its timeout. `truncated` is True when the middle of
    stdout or stderr was dropped to respect the output cap (head and tail are kept, with a marker line).
    """

    stdout: str
    stderr: str
    exit_code: int | None
    timed_out: bool = False
    truncated: bool = False
    seconds: float = 0.0


@dataclass(frozen=True)
class Limits:
    """Resource limits, from a task's `[environment]` table (Harbor) or backend defaults."""

    cpus: float = 1.0
    memory_mb: int = 2048
    storage_mb: int = 10240
    pids: int = 512


@dataclass(frozen=True)
class SandboxSpec:
    """What a backend needs to build and start a task's environment.

    `context_dir` is the Docker build context; `dockerfile` is the Dockerfile inside it (None: the bare base).
    `workdir` overrides the Dockerfile's WORKDIR when set.
    """

    name: str
    context_dir: Path | None = None
    dockerfile: Path | None = None
    compose_file: Path | None = None
    workdir: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    limits: Limits = field(default_factory=Limits)


@dataclass(frozen=True)
class Cleanup:
    """What a started sandbox holds on the host, all of which `stop()` releases: its state folders, its cgroup
    folders (memory first) and its containers. Empty before `start` and after `stop`. A caller that checks
    nothing was left behind (the benchmarks, the tests) or reads the box's memory charge uses this, never a
    backend's private fields."""

    dirs: tuple[Path, ...] = ()
    cgroups: tuple[Path, ...] = ()
    containers: tuple[str, ...] = ()


class SandboxError(RuntimeError):
    """The sandbox could not be built, started or used (not a command's own failure)."""


@runtime_checkable
class ShellSession(Protocol):
    """One real bash process whose state (cwd, variables, functions, jobs) persists between commands."""

    async def run(self, command: str, timeout: float = 60.0, output_cap: int = DEFAULT_OUTPUT_CAP) -> ExecResult:
        """Run `command` in the session. A timeout interrupts the command, never the session."""
        ...

    async def close(self) -> None: ...


@runtime_checkable
class Sandbox(Protocol):
    """An isolated machine-like environment with no network."""

    name: str

    async def start(self) -> None: ...

    async def stop(self) -> None:
        """Kill every process of the sandbox and release its filesystem. Idempotent."""
        ...

    async def exec(
        self,
        command: str,
        timeout: float = 60.0,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        output_cap: int = DEFAULT_OUTPUT_CAP,
    ) -> ExecResult:
        """Run `command` with `bash -c` in a fresh process inside the sandbox."""
        ...

    async def shell(self, cwd: str | None = None, env: dict[str, str] | None = None) -> ShellSession:
        """Open a persistent shell session inside the sandbox."""
        ...

    async def upload(self, src: Path, dest: str) -> None:
        """Copy a host file or folder to path `dest` inside the sandbox (parents created)."""
        ...

    async def download(self, src: str, dest: Path, max_bytes: int | None = None) -> None:
        """Copy a file or folder at `src` inside the sandbox to the host path `dest`.

        Links are copied as links (never followed on the host: read the result with conch/sandbox/readback.py).
        With `max_bytes`, an archive larger than that raises `ReadBackError` naming the cap."""
        ...

    async def netns_pid(self) -> int:
        """A host pid inside the started sandbox's network namespace (to wire its network from the host)."""
        ...

    def cleanup(self) -> Cleanup:
        """What this sandbox holds on the host now, which `stop()` releases (see `Cleanup`)."""
        ...

    def verification(self, setup: "VerifierSetup") -> "AbstractAsyncContextManager[Sandbox]":
        """A verifier box over the agent's filesystem as it is now (conch.sandbox.verifier_view): no process of
        the agent runs in it or beside it, the verifier's toolchain is the image's, `setup`'s folders are bound
        in. Leaving the context stops the verifier box (and, unless `setup.final`, resumes the agent)."""
        ...


# Where the verifier box shows conch's own files (read-write, never part of the agent's filesystem).
VERIFIER_RUN = "/run/conch-verifier"


@dataclass(frozen=True)
class VerifierSetup:
    """What a verifier box gets that the agent's box never had, and where its results come back.

    `tests` (a staged copy of the task's tests, its test script included) appears read-only at /tests and `run`
    (conch's pytest.ini, the task's prefetched wheels) read-only at VERIFIER_RUN, with an empty writable
    VERIFIER_RUN/uv-cache. /logs/verifier and /var/log/conch start empty, on size-capped storage of the box
    (never a host folder); when the verifier's command is done and the box's processes are stopped, the
    backend copies them (links as links, nothing followed, `DOWNLOAD_CAP` in all, else `ReadBackError`) into
    the new host folders `logs` and `warnings`, using no tool of the box. `final`: the agent's episode is
    over, its processes are killed for good; otherwise (a mid-episode measurement) they are frozen for the
    verification and resumed afterwards, and nothing the verifier wrote is left in the agent's filesystem."""

    tests: Path
    logs: Path
    warnings: Path
    run: Path
    final: bool = True
