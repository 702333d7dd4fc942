"""`conch export atif RUNDIR|FILE --out DIR`: write kept trajectories (a run folder's, or a rollout file's) in
Harbor's Agent Trajectory Interchange Format, validated with harbor's own models, one JSON file per trajectory."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("export", help="export trajectories (ATIF)", description=__doc__)
    p.add_argument("format", choices=["atif"], help="output format")
    p.add_argument("path", help="run folder (conch train --out) or trajectory file (.jsonl / .jsonl.gz)")
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--model-name", help="model name recorded in the trajectories' agent section")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import sys
    from pathlib import Path

    from conch.cli import UsageError

    path = Path(args.path)
    if not path.exists():
        raise UsageError(f"{path}: no such run folder or file")
    from conch.progress import Progress
    from conch.report.atif import export
    from conch.report.store import read_records

    try:
        records = list(read_records(path))
    except (ValueError, KeyError, TypeError) as exc:
        raise UsageError(f"{path}: cannot read it as conch trajectories ({type(exc).__name__}: {exc})") from None
    if not records:
        raise UsageError(f"{path}: no trajectories (a run keeps them in RUNDIR/trajectories/)")
    bar = Progress(len(records), "export atif")
    try:
        paths = []
        for r in records:
            paths += export([r], Path(args.out), model_name=args.model_name)
            bar.update()
    except RuntimeError as exc:
        raise UsageError(str(exc)) from None
    print(f"wrote {len(paths)} ATIF trajectories under {args.out}", file=sys.stderr)
    return 0
