"""`conch bench sandbox --sessions N`: N live sandboxes at once, each with a persistent shell that ran a command.

Why: an RL run keeps `ppo.concurrency` episodes alive at once, each a sandbox plus a shell, on one machine; what
one costs in memory, how fast they start and stop, and whether stopping leaves anything behind decide how many
fit. Reported per backend:
- memory per session: host-side processes this conch process started (RSS and PSS, from /proc), and the
  sandbox's own memory cgroup usage (its processes and page cache, as the kernel charges it);
- start rate (sandbox started + shell opened + `echo` answered) and stop rate, sessions per second;
- leaks after every sandbox stopped: host processes left, sandbox state folders, cgroups, loop devices, and
  containers carrying this run's owner label. Anything left makes the command exit 1.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any


def _descendants(pid: int) -> list[int]:
    out, stack = [], [pid]
    while stack:
        p = stack.pop()
        try:
            kids = [int(x) for t in os.listdir(f"/proc/{p}/task")
                    for x in Path(f"/proc/{p}/task/{t}/children").read_text().split()]
        except OSError:
            continue
        out.extend(kids)
        stack.extend(kids)
    return out


def _rss_pss_kib(pid: int) -> tuple[int, int]:
    rss = pss = 0
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Rss:"):
                rss = int(line.split()[1])
            elif line.startswith("Pss:"):
                pss = int(line.split()[1])
    except (OSError, ValueError):
        pass
    return rss, pss


def _cgroup_bytes(box: Any) -> int:
    """Memory charged to the sandbox's cgroup (v2 memory.current or v1 memory.usage_in_bytes)."""
    for p in box.cleanup().cgroups:
        for name in ("memory.current", "memory.usage_in_bytes"):
            try:
                return int((Path(p) / name).read_text())
            except (OSError, ValueError):
                continue
    return 0


def _traces(backend: str, box: Any) -> list[str]:
    """What a started sandbox holds on the host, to be checked again after it stopped (docker's cgroups are the
    engine's to remove with the container)."""
    held = box.cleanup()
    if backend == "local":
        return [str(p) for p in held.dirs] + [str(p) for p in held.cgroups]
    return [f"container:{name}" for name in held.containers]


def _left_behind(backend: str, traces: list[str], processes_before: int) -> dict[str, int]:
    """Counts of what is still there: host processes of ours, state folders, cgroups, loop devices, containers."""
    left = {"processes": max(0, len(_descendants(os.getpid())) - processes_before)}
    if backend == "local":
        dirs = [t for t in traces if "/sys/fs/cgroup" not in t]
        left["state_dirs"] = sum(os.path.exists(t) for t in dirs)
        left["cgroups"] = sum(os.path.exists(t) for t in traces if "/sys/fs/cgroup" in t)
        loops = 0
        for p in Path("/sys/block").glob("loop*"):
            try:
                backing = (p / "loop" / "backing_file").read_text().strip()
            except OSError:
                continue
            loops += any(backing.startswith(d + "/") for d in dirs)
        left["loop_devices"] = loops
    else:
        from conch.sandbox import docker_images as di

        api = di.client().api
        names = {t.split(":", 1)[1] for t in traces}
        left["containers"] = sum(1 for c in api.containers(all=True, filters={"label": f"{di.LABEL_KIND}=sandbox"})
                                 if {n.lstrip("/") for n in c.get("Names", [])} & names)
    return {k: v for k, v in left.items() if v}


async def load(backend: str, sessions: int, parallel: int = 8) -> dict[str, Any]:
    """Open `sessions` sandboxes with a shell each, measure, stop them all, check for leaks."""
    from conch.sandbox import SandboxSpec, make_sandbox
    from conch.sandbox.base import Limits

    processes_before = len(_descendants(os.getpid()))
    limits = Limits(cpus=0.5, memory_mb=256, storage_mb=512, pids=64)
    boxes: list[Any] = []
    shells: list[Any] = []
    gate = asyncio.Semaphore(parallel)
    failures: list[str] = []

    async def open_one(i: int) -> None:
        async with gate:
            box = make_sandbox(backend, SandboxSpec(name=f"load-{i}", limits=limits))
            try:
                await box.start()
                shell = await box.shell()
                r = await shell.run(f"echo {i}")
                if r.stdout.strip() != str(i):
                    raise RuntimeError(f"session {i} answered {r.stdout!r}")
            except Exception as exc:  # noqa: BLE001 - counted and reported; the box is stopped below
                failures.append(f"{type(exc).__name__}: {exc}"[:200])
                await box.stop()
                return
            boxes.append(box)
            shells.append(shell)

    t0 = time.perf_counter()
    await asyncio.gather(*(open_one(i) for i in range(sessions)))
    start_s = time.perf_counter() - t0
    live = len(boxes)
    ours = _descendants(os.getpid())
    rss_pss = [_rss_pss_kib(p) for p in ours]
    cgroup = [_cgroup_bytes(b) for b in boxes]
    self_rss = _rss_pss_kib(os.getpid())
    traces = [t for b in boxes for t in _traces(backend, b)]
    t1 = time.perf_counter()
    stopping = asyncio.Semaphore(parallel * 2)

    async def stop_one(box: Any) -> None:
        async with stopping:
            await box.stop()

    await asyncio.gather(*(stop_one(b) for b in boxes))
    stop_s = time.perf_counter() - t1
    await asyncio.sleep(0.5)  # let the kernel finish tearing down namespaces and loop devices
    leaked = _left_behind(backend, traces, processes_before)
    n = max(live, 1)
    return {
        "sessions": sessions, "live": live, "failed": len(failures), "failures": failures[:5],
        "host_rss_mib_per_session": round(sum(r for r, _ in rss_pss) / 1024 / n, 2),
        "host_pss_mib_per_session": round(sum(p for _, p in rss_pss) / 1024 / n, 2),
        "cgroup_mib_per_session": round(sum(cgroup) / 2**20 / n, 2),
        "conch_process_rss_mib": round(self_rss[0] / 1024, 1),
        "host_processes": len(ours),
        "start_per_s": round(live / start_s, 2), "stop_per_s": round(live / max(stop_s, 1e-9), 2),
        "leaked": leaked,
    }
