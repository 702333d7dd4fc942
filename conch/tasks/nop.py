"""How many of a task's tests pass when the agent does nothing: measured once, cached by the task's content.

Why: some real tests pass without any action (they check that an input is intact, that a tool is installed),
so a raw passing count rewards doing nothing. Reward mode `count_over_nop` pays `n_passed - nop_passed`
(floor 0), which needs each task's nop count. Measuring it is one sandbox run of the `nop` agent, so it is
done the first time a task is seen and cached under CONCH_HOME/nop/, keyed by a hash of every file of the task
folder and the base root recipe: editing the task or changing the base measures again. A nop run whose
verifier errors caches nothing (the count is unknown, and a trajectory scored against an unknown count is
excluded, never guessed).
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import time
from collections.abc import Sequence
from pathlib import Path

from conch.sandbox import paths
from conch.tasks.model import Task


def task_key(task: Task, network: str = "never") -> str:
    """Hash of the task folder's files (names, modes, contents), the base recipe and whether the sandbox had
    the registries (sandbox.network)."""
    from conch.sandbox.baseroot import recipe_id
    from conch.sandbox.network import granted

    net = granted(network, task.allow_internet)
    h = hashlib.sha256(f"conch-nop 1 {recipe_id()} {task.fmt} net={net}\0".encode())
    root = Path(task.path)
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames):
            p = Path(dirpath) / name
            h.update(f"\0{p.relative_to(root).as_posix()}\0".encode())
            try:
                h.update(p.read_bytes() if not p.is_symlink() else os.readlink(p).encode())
            except OSError:
                h.update(b"<unreadable>")
    return h.hexdigest()[:24]


def _cache_file(task: Task, network: str = "never") -> Path:
    return paths.conch_home() / "nop" / f"{task_key(task, network)}.json"


def cached(task: Task, network: str = "never") -> int | None:
    """The cached nop count of `task`, or None when it was never measured (or could not be)."""
    try:
        doc = json.loads(_cache_file(task, network).read_text())
    except (OSError, ValueError):
        return None
    n = doc.get("nop_passed")
    return n if isinstance(n, int) and n >= 0 else None


def store(task: Task, nop_passed: int, n_total: int, network: str = "never") -> None:
    out = _cache_file(task, network)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{secrets.token_hex(4)}")
    tmp.write_text(json.dumps({"task": task.name, "nop_passed": nop_passed, "n_total": n_total,
                               "measured_at": time.time()}))
    os.replace(tmp, out)


def record(task: Task, result, network: str = "never") -> None:
    """Cache the count of a finished nop `CheckResult` of `task` (nothing when its verifier errored)."""
    if result.error is None and result.n_total > 0:
        store(task, result.n_passed, result.n_total, network)


async def nop_counts(tasks: Sequence[Task], backend: str = "local", jobs: int = 2,
                     network: str = "never") -> dict[str, int | None]:
    """{task name: nop count}, measuring (with the nop agent) only the tasks not cached yet. None: unknown
    (the nop run errored)."""
    from conch.harness import run_tasks

    out: dict[str, int | None] = {t.name: cached(t, network) for t in tasks}
    todo = [t for t in tasks if out[t.name] is None]
    if todo:
        results = await run_tasks(todo, agent="nop", backend=backend, jobs=jobs, network=network)
        for task, result in zip(todo, results):
            record(task, result, network)
            out[task.name] = result.n_passed if result.error is None and result.n_total > 0 else None
    return out


async def attach(trajs: Sequence, tasks: Sequence[Task], backend: str = "local", jobs: int = 2,
                 network: str = "never") -> None:
    """Set `nop_passed` on each trajectory (reward mode count_over_nop); a trajectory whose task's nop count is
    unknown gets a verifier error, so it is excluded from the loss instead of being scored against a guess."""
    counts = await nop_counts(tasks, backend, jobs, network)
    for tr in trajs:
        n = counts.get(tr.task)
        tr.nop_passed = n
        if n is None and not tr.verifier_error:
            tr.verifier_error = "nop count unknown (the nop agent's verifier run errored); needed by count_over_nop"
