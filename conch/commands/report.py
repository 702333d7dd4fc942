"""`conch report`: one self-contained HTML page for a run folder (summary, curves, trajectory browser, per-task
table) or for a rollout file of `conch rollout --out` / `conch eval --out`; PNGs of the curves go to
RUNDIR/plots/."""

from __future__ import annotations

import argparse

RUN_FILES = ("metrics.jsonl", "trajectories", "evals", "summary.json")  # one of these makes a folder a run folder


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("report", help="HTML report of a run folder or a rollout file", description=__doc__)
    p.add_argument("path", help="run folder (conch train --out) or trajectory file (.jsonl / .jsonl.gz)")
    p.add_argument("--out", help="HTML file to write (default: RUNDIR/report.html, or FILE.html next to a file)")
    p.add_argument("--tokenizer", help="tokenizer.json for the token view (default: the run's own)")
    p.add_argument("--no-png", action="store_true", help="do not write RUNDIR/plots/*.png")
    p.set_defaults(func=run)


def holds_trajectories(path) -> bool:
    """True when the file has at least one trajectory record conch can read: anything else (a text file, a
    JSONL of something else, an unreadable gzip) would otherwise make an empty report."""
    from conch.report.store import read_records

    try:
        return next(iter(read_records(path)), None) is not None
    except (OSError, UnicodeDecodeError, EOFError, ValueError, KeyError, TypeError):
        return False


def run(args: argparse.Namespace) -> int:
    import sys
    from pathlib import Path

    from conch.cli import UsageError

    path = Path(args.path)
    if not path.exists():
        raise UsageError(f"{path}: no such run folder or file")
    if path.is_dir() and not any((path / n).exists() for n in RUN_FILES):
        raise UsageError(f"{path}: not a run folder (no metrics.jsonl, trajectories/, evals/ or summary.json)")
    if not path.is_dir() and not holds_trajectories(path):
        raise UsageError(f"{path}: not a run folder (no metrics.jsonl, trajectories/, evals/ or summary.json) nor "
                         "a trajectory file (no JSONL line of `conch rollout --out`, `conch eval --out` or "
                         "RUNDIR/trajectories/)")
    tokenizer = Path(args.tokenizer) if args.tokenizer else None
    if tokenizer is not None and not tokenizer.is_file():
        raise UsageError(f"--tokenizer {tokenizer}: not a file")
    out = Path(args.out) if args.out else (path / "report.html" if path.is_dir() else path.with_name(path.name.split(".")[0] + ".html"))

    from conch.progress import Progress
    from conch.report.html import write_report

    bar = Progress(1, "report")
    try:
        written = write_report(path, out, tokenizer=tokenizer, pngs=not args.no_png)
    except (ValueError, KeyError) as exc:
        raise UsageError(f"{path}: cannot read it as conch trajectories ({type(exc).__name__}: {exc})") from None
    bar.update(info=f"{written['trajectories']} trajectories, {written['panels']} curves")
    print(f"wrote {written['html']}" + (f" and {len(written['pngs'])} PNGs in {path / 'plots'}" if written["pngs"] else ""),
          file=sys.stderr)
    print(written["html"])
    return 0
