"""A disk limit for Docker sandboxes where the storage driver cannot enforce one (overlay2 on ext4).

Why a watchdog: the engine only honours `--storage-opt size=` for overlay2 on XFS with project quotas, and a
container's writable layer cannot be moved onto a size-limited loop volume without replacing the storage
driver. So where the engine refused the quota, conch measures the container's writable layer (the overlay
upper directory, read on this host) every `interval` seconds and, once it holds more than the task's
`storage_mb`, kills the container: every later call on the sandbox fails with `disk limit: ...`, which the
verifier reports as its error. What the box can write past the limit is bounded by one interval of writing.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Any, Awaitable, Callable

MAX_ENTRIES = 2_000_000  # a walk stops here: that many files is over any sane limit anyway


def usage_bytes(root: Path, stop_above: int) -> int:
    """Bytes allocated below `root` (links not followed), stopping early once above `stop_above`."""
    total, entries, stack = 0, 0, [str(root)]
    while stack:
        try:
            it = os.scandir(stack.pop())
        except OSError:
            continue
        with it:
            for entry in it:
                entries += 1
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                total += st.st_blocks * 512
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
                if total > stop_above or entries > MAX_ENTRIES:
                    return max(total, stop_above + 1)
    return total


class DiskWatch:
    """Polls `upper` and calls `on_exceed(bytes)` once when it holds more than `limit` bytes."""

    def __init__(self, upper: Path, limit: int, on_exceed: Callable[[int], Awaitable[None]],
                 interval: float = 0.5) -> None:
        self.upper, self.limit, self.on_exceed, self.interval = upper, limit, on_exceed, interval
        self.exceeded: int | None = None
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        while True:
            used = await asyncio.to_thread(usage_bytes, self.upper, self.limit)
            if used > self.limit:
                self.exceeded = used
                await self.on_exceed(used)
                return
            await asyncio.sleep(self.interval)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None


_warned = False


def watch_container(info: dict[str, Any], limit: int, on_exceed: Callable[[int], Awaitable[None]]) -> DiskWatch | None:
    """A started `DiskWatch` on the writable layer of the container `info` (the engine's inspect document), or
    None, with a one-time warning, when that layer is not readable from here (a remote engine, another driver)."""
    global _warned
    upper = ((info.get("GraphDriver") or {}).get("Data") or {}).get("UpperDir")
    if not upper or not os.path.isdir(upper):
        if not _warned:
            _warned = True
            print("conch: warning: the Docker engine's writable layers are not readable here (a remote engine or "
                  "another storage driver); sandbox disk limits are not enforced", file=sys.stderr, flush=True)
        return None
    watch = DiskWatch(Path(upper), limit, on_exceed)
    watch.start()
    return watch
