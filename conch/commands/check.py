"""`conch check PATH...`: run a scripted agent on every task below PATH and verify it.

Use it to vet tasks before training: `--agent oracle` should score n/n on every task, `--agent nop` fewer.
Failing tasks are results, not failures of the command: it exits 0 once it ran, 2 on usage errors.
"""

from __future__ import annotations

import argparse
import sys

AGENTS = ("oracle", "nop")  # kept equal to conch.harness.AGENTS (not imported: keeps `conch --help` light)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("check", help="run the oracle or nop agent on tasks and verify them", description=__doc__)
    p.add_argument("paths", nargs="+", metavar="PATH", help="task folders or folders holding tasks")
    p.add_argument("--agent", choices=AGENTS, default="oracle", help="scripted agent (default: oracle)")
    p.add_argument("--sandbox", choices=("local", "docker"), default="local", help="sandbox backend (default: local)")
    p.add_argument("--jobs", type=int, default=2, help="tasks run at once (default: 2)")
    p.add_argument("--json", action="store_true", help="print a JSON array of per-task results to stdout")
    p.set_defaults(func=run)


def format_table(results: list) -> str:
    """Aligned table: task, passed/total, reward, seconds, error; then a totals line."""
    rows = [("TASK", "TESTS", "REWARD", "SECONDS", "ERROR")]
    for r in results:
        reward = "-" if r.reward is None else f"{r.reward:g}"
        rows.append((r.task, f"{r.n_passed}/{r.n_total}", reward, f"{r.seconds:.1f}", r.error or ""))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row[:4], widths)) + "  " + row[4] for row in rows]
    n_passed = sum(r.n_passed for r in results)
    n_total = sum(r.n_total for r in results)
    solved = sum(1 for r in results if r.error is None and r.n_total > 0 and r.n_passed == r.n_total)
    errors = sum(1 for r in results if r.error)
    lines.append(
        f"{len(results)} tasks: {solved} fully passed, {errors} errors; "
        f"tests {n_passed}/{n_total} passed; {sum(r.seconds for r in results):.1f}s total task time"
    )
    return "\n".join(line.rstrip() for line in lines)


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

    results = asyncio.run(run_tasks(tasks, agent=args.agent, backend=args.sandbox, jobs=args.jobs, on_result=progress))
    if args.json:
        print(json.dumps([r.to_json() for r in results], indent=2))
    else:
        print(format_table(results))
    return 0
