"""`conch check PATH...`: run a scripted agent on every task below PATH and verify it.

Use it to vet tasks before training: `--agent oracle` should score n/n on every task, `--agent nop` fewer.
Failing tasks are results, not failures of the command: it exits 0 once it ran, 2 on usage errors. With
`--strict` a failing task fails the command (for CI and scripts): exit 3 when any task errored or, with the
oracle, did not fully pass (a test failed or its reward is below 1), or, with nop, passed fully (a vacuous task);
the last line says how many failed and why, e.g. `strict: 10 of 13 tasks failed (3 errors, 7 oracle not passing)`.
The table shows, per task, the tests passed, `resolved` (all passed: the outcome of tasks without a reward
file, such as every TB1 task), the task's own reward, the nop count (tests passing with no action, measured
once per task and cached; what reward.mode count_over_nop subtracts), and the error or warnings.
"""

from __future__ import annotations

import argparse
import sys

from conch.cli import FOUND_PROBLEM as STRICT_FAILED  # 3: the check ran and found a problem
from conch.sandbox import BACKENDS

AGENTS = ("oracle", "nop")  # kept equal to conch.harness.AGENTS (not imported: keeps `conch --help` light)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("check", help="run the oracle or nop agent on tasks and verify them", description=__doc__)
    p.add_argument("paths", nargs="+", metavar="PATH", help="task folders or folders holding tasks")
    p.add_argument("--agent", choices=AGENTS, default="oracle", help="scripted agent (default: oracle)")
    p.add_argument("--sandbox", choices=BACKENDS, default="local", help="sandbox backend (default: local)")
    p.add_argument("--jobs", type=int, default=2, help="tasks run at once (default: 2)")
    p.add_argument("--json", action="store_true", help="print a JSON array of per-task results to stdout")
    p.add_argument("--network", choices=("never", "task"), default="never",
                   help="never (default): sandboxes are offline; task: a task with allow_internet = true may reach "
                        "the package registries (PyPI, Debian, npm) through a proxy, nothing else")
    p.add_argument("--no-nop", action="store_true", help="do not measure or show each task's nop count (tests "
                   "that pass with no action; measured once per task and cached, used by reward.mode count_over_nop)")
    p.add_argument("--logs", metavar="DIR", help="write the whole verifier output of each task that errored "
                   "to DIR/<task>/verifier.log")
    p.add_argument("--strict", action="store_true", help=f"exit {STRICT_FAILED} when any task errored or its "
                   "oracle did not fully pass (with --agent nop: when nop passed a task fully); the last line says why")
    p.set_defaults(func=run)


def resolved(r) -> bool:
    """Terminal-Bench's official outcome when a task writes no reward (every TB1 task): all tests passed."""
    return r.error is None and r.n_total > 0 and r.n_passed == r.n_total


def result_json(r, nop: dict[str, int | None] | None = None) -> dict:
    """A result's public JSON: the harness's fields plus `resolved`, `nop_passed` (tests a do-nothing agent
    passes; null when unknown) unless --no-nop, and `warnings` when there are any."""
    out = {**r.to_json(), "resolved": resolved(r)}
    if nop is not None:
        out["nop_passed"] = nop.get(r.task)
    if r.verify is not None and r.verify.warnings:
        out["warnings"] = list(r.verify.warnings)
    return out


def format_table(results: list, nop: dict[str, int | None] | None = None) -> str:
    """Aligned table: task, passed/total, resolved, reward, [nop], seconds, error/warnings; then totals."""
    head = ["TASK", "TESTS", "RESOLVED", "REWARD"] + (["NOP"] if nop is not None else []) + ["SECONDS"]
    rows = [(*head, "ERROR")]
    for r in results:
        reward = "-" if r.reward is None else f"{r.reward:g}"
        cells = [r.task, f"{r.n_passed}/{r.n_total}", "yes" if resolved(r) else "no", reward]
        if nop is not None:
            n = nop.get(r.task)
            cells.append("?" if n is None else str(n))
        note = r.error or ""
        if r.verify is not None and r.verify.warnings:
            note = (note + "; " if note else "") + "warning: " + "; ".join(r.verify.warnings)
        rows.append((*cells, f"{r.seconds:.1f}", note))
    k = len(head)
    widths = [max(len(row[i]) for row in rows) for i in range(k)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row[:k], widths)) + "  " + row[k] for row in rows]
    n_passed = sum(r.n_passed for r in results)
    n_total = sum(r.n_total for r in results)
    solved = sum(1 for r in results if resolved(r))
    errors = [r.to_json() for r in results if r.error]
    agent = sum(1 for e in errors if e["fault"] == "agent" and not e["tampered"])
    tampered = sum(1 for e in errors if e["tampered"])
    lines.append(
        f"{len(results)} tasks: {solved} fully passed, {len(errors)} errors ({len(errors) - agent - tampered} infra, "
        f"{agent} agent-caused, {tampered} tampered); "
        f"tests {n_passed}/{n_total} passed; {sum(r.seconds for r in results):.1f}s total task time"
    )
    return "\n".join(line.rstrip() for line in lines)


def strict_verdict(results: list, agent: str) -> tuple[bool, str]:
    """(failed, one line): --strict fails on any error, and on an oracle that did not fully pass (a test
    failed, or the reward is below 1) or a nop that did (the task is vacuous)."""
    errors = sum(1 for r in results if r.error)
    if agent == "oracle":
        what = "oracle not passing"
        bad = sum(1 for r in results if not r.error and not (resolved(r) and (r.reward is None or r.reward >= 1)))
    else:
        what = "nop passing fully"
        bad = sum(1 for r in results if not r.error and (resolved(r) or (r.reward is not None and r.reward >= 1)))
    if errors + bad == 0:
        return False, f"strict: all {len(results)} tasks passed"
    return True, f"strict: {errors + bad} of {len(results)} tasks failed ({errors} errors, {bad} {what})"


def write_logs(results: list, folder) -> None:
    """The verifier's whole output of every task that errored, as <folder>/<task>/verifier.log."""
    from pathlib import Path

    for r in results:
        if r.verify is not None and r.verify.log:
            out = Path(folder) / r.task / "verifier.log"
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(r.verify.log)


def nop_column(tasks: list, results: list, args: argparse.Namespace) -> dict[str, int | None]:
    """Each task's nop count: this run's own when the agent is nop (and cached), else the cache, measuring the
    tasks not measured yet."""
    import asyncio

    from conch.tasks import nop
    from conch.tasks.model import Task

    loaded = [t for t in tasks if isinstance(t, Task)]
    if args.agent == "nop":
        by_name = {r.task: r for r in results}
        for t in loaded:
            nop.record(t, by_name[t.name], args.network)
        return {r.task: (r.n_passed if r.error is None and r.n_total > 0 else None) for r in results}
    if any(nop.cached(t, args.network) is None for t in loaded):
        print("conch: measuring the nop count of tasks not measured before (once per task)...", file=sys.stderr)
    return asyncio.run(nop.nop_counts(loaded, backend=args.sandbox, jobs=args.jobs, network=args.network))


def run(args: argparse.Namespace) -> int:
    import asyncio
    import json
    from pathlib import Path

    from conch.cli import UsageError
    from conch.harness import run_tasks
    from conch.tasks.loader import load_tasks

    if args.jobs < 1:
        raise UsageError(f"--jobs must be at least 1, got {args.jobs}")
    missing = [p for p in args.paths if not Path(p).exists()]
    if missing:
        raise UsageError(f"no such path: {', '.join(missing)}")
    tasks = load_tasks(args.paths)
    if not tasks:
        raise UsageError(f"no tasks found (no task.toml or task.yaml) below {', '.join(args.paths)}")

    import time

    from conch.progress import fmt_seconds

    done, t0 = 0, time.monotonic()

    def progress(result) -> None:
        nonlocal done
        done += 1
        status = f"{result.n_passed}/{result.n_total}"
        tail = f"  ERROR: {result.error}" if result.error else ""
        eta = (time.monotonic() - t0) / done * (len(tasks) - done)
        print(f"[{done}/{len(tasks)}] {result.task}  {status}  {result.seconds:.1f}s  ETA {fmt_seconds(eta)}{tail}",
              file=sys.stderr, flush=True)

    results = asyncio.run(run_tasks(tasks, agent=args.agent, backend=args.sandbox, jobs=args.jobs, on_result=progress,
                                    network=args.network))
    nop = None if args.no_nop else nop_column(tasks, results, args)
    if args.logs:
        write_logs(results, args.logs)
    if args.json:
        print(json.dumps([result_json(r, nop) for r in results], indent=2))
    else:
        print(format_table(results, nop))
    if not args.strict:
        return 0
    failed, line = strict_verdict(results, args.agent)
    print(line, file=sys.stderr if args.json else sys.stdout)  # stdout stays pure JSON with --json
    return STRICT_FAILED if failed else 0
