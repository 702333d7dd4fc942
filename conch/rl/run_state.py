"""What a run knows about itself across processes and signals: its wall time over every process (a resumed run
keeps counting), the stage it is in, and how it stops on Ctrl-C or SIGTERM.

Why a module of its own: an interrupted run must say one line (where it stopped, its last checkpoint, the
exact resume command) and exit 130 with its sandboxes and servers cleaned up, not print pages of asyncio
tracebacks of tasks that died with it; and `summary.json` must count the minutes of every process of the run,
not only the last one's.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

TIME_FILE = "time.json"


class RunClock:
    """Seconds of the run over all its processes, kept in RUNDIR/time.json (written atomically by `save`)."""

    def __init__(self, run_dir: Path) -> None:
        from conch.rl.checkpoint import read_json

        self.path = run_dir / TIME_FILE
        prev = read_json(self.path, "the run's time ledger") if self.path.exists() else None
        prev = prev if isinstance(prev, dict) else {}
        self.before = float(prev.get("seconds", 0.0))
        self.processes = int(prev.get("processes", 0)) + 1
        self.t0 = time.monotonic()

    def process_seconds(self) -> float:
        return time.monotonic() - self.t0

    def total_seconds(self) -> float:
        return self.before + self.process_seconds()

    def save(self) -> None:
        from conch.rl.checkpoint import atomic_write_text

        atomic_write_text(self.path, json.dumps({"seconds": self.total_seconds(), "processes": self.processes}))


def clock_text(seconds: float) -> str:
    """12:03, or 1:02:03 past an hour."""
    m, s = divmod(int(max(seconds, 0)), 60)
    h, m = divmod(m, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


class Interrupt:
    """Ctrl-C / SIGTERM during `conch train`: the first cancels the run's main task (every `finally` runs:
    sandboxes stopped, servers shut down, the time ledger written); a second one exits at once."""

    def __init__(self) -> None:
        self.stage = "starting"
        self.signal: str | None = None
        self._task: asyncio.Task | None = None

    def enter(self, stage: str) -> None:
        self.stage = stage

    def install(self) -> None:
        """In the running event loop: route SIGINT and SIGTERM to `_on_signal`, and keep quiet about the tasks
        that die with an interrupted run."""
        loop = asyncio.get_running_loop()
        self._task = asyncio.current_task()
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                loop.add_signal_handler(sig, self._on_signal, sig)
            except (NotImplementedError, RuntimeError, ValueError):  # not the main thread
                pass
        default = loop.get_exception_handler()

        def handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
            if self.signal is not None:
                return  # a task that died with the interrupted run
            if default is not None:
                default(loop, context)
            else:
                loop.default_exception_handler(context)

        loop.set_exception_handler(handler)

    def _on_signal(self, sig: signal.Signals) -> None:
        if self.signal is not None:
            print(f"conch train: {signal.Signals(sig).name} again: exiting now", file=sys.stderr, flush=True)
            os._exit(130)
        self.signal = signal.Signals(sig).name
        if self._task is not None:
            self._task.cancel()

    def message(self, run_dir: Path) -> str:
        from conch.rl.checkpoint import latest_complete

        ckpt = latest_complete(run_dir)
        where = f"last checkpoint {ckpt}" if ckpt else "no PPO checkpoint yet (finished stages are kept)"
        return (f"conch train: interrupted ({self.signal or 'SIGINT'}) during {self.stage}; {where}; "
                f"resume with: conch train --resume {run_dir}")
