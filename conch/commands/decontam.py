"""`conch decontam DIR --against REF_DIR`: find tasks that are near-copies of reference (benchmark) tasks.

Each task is scored against every reference: copies by word 8-/13-gram containment (instruction and test
files) and a word-level fuzzy ratio; paraphrases by the share of the reference's concrete artifacts (paths,
file names, URLs, versions, identifiers, expected output strings, Docker image) found in the task, combined
with a TF-IDF content-word similarity; copied test/solution files by identical content. See
conch/tasks/decontam.py. The score is in [0, 1]; tasks scoring at or above --threshold (default 0.5) are
flagged, and each row says why: the deciding signal and what the task shares with its nearest reference.
Exit status: 0 when nothing is flagged (or every flagged task was removed with --drop), 3 when flagged tasks
remain (the check ran and found a problem; 1 is kept for unexpected failures, 2 for usage errors).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

from conch.cli import FOUND_PROBLEM


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("decontam", help=f"flag tasks that nearly copy reference tasks (exit {FOUND_PROBLEM} when "
                       "flagged tasks remain)", description=__doc__)
    p.add_argument("dir", type=Path, help="folder of tasks to check (Harbor, TB1, or bare instruction.md)")
    p.add_argument("--against", type=Path, required=True, help="folder of reference tasks")
    p.add_argument("--threshold", type=float, default=None, help="flag at or above this score (default 0.5)")
    p.add_argument("--json", action="store_true", help="print a JSON array of {task, nearest, score, flagged, why}")
    p.add_argument("--drop", action="store_true", help="delete the folders of flagged tasks")
    p.add_argument("--top", type=int, default=10, help="closest tasks listed in the text report (default 10)")
    p.set_defaults(func=run)


def explain(why: dict) -> str:
    """One line: the deciding signal, then the shared artifacts and identical files."""
    parts = [f"{why.get('signal')}"]
    if why.get("artifacts"):
        more = why.get("n_shared_artifacts", 0) - len(why["artifacts"])
        shown = [a if len(a) <= 40 else a[:37] + "..." for a in why["artifacts"]]
        parts.append("shares " + ", ".join(shown) + (f" (+{more} more)" if more > 0 else ""))
    if why.get("files"):
        parts.append("identical files " + ", ".join(why["files"]))
    return "; ".join(parts)


def run(args: argparse.Namespace) -> int:
    from conch.cli import UsageError
    from conch.tasks.decontam import DEFAULT_THRESHOLD, decontaminate

    threshold = DEFAULT_THRESHOLD if args.threshold is None else args.threshold
    if not 0.0 < threshold <= 1.0:
        raise UsageError("--threshold must be in (0, 1]")
    for folder in (args.dir, args.against):
        if not folder.is_dir():
            raise UsageError(f"{folder}: not a directory")
    start = time.monotonic()
    try:
        matches = decontaminate(args.dir, args.against, threshold)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    seconds = time.monotonic() - start
    flagged = [m for m in matches if m.flagged]
    dropped = 0
    if args.drop:
        root = args.dir.resolve()
        for m in flagged:
            target = m.path.resolve()
            if target != root and root in target.parents:
                shutil.rmtree(target)
                dropped += 1
    if args.json:
        print(json.dumps([m.to_json() for m in matches], indent=2))
    else:
        ranked = sorted(matches, key=lambda m: (-m.score, m.task))
        shown = flagged + [m for m in ranked if not m.flagged][: args.top]
        print(f"{'score':>6}  {'flag':<4}  {'task':<40} nearest reference  (signals)")
        for m in sorted(shown, key=lambda m: (-m.score, m.task)):
            detail = " ".join(f"{k}={v:.2f}" for k, v in m.detail.items())
            print(f"{m.score:6.3f}  {'YES' if m.flagged else '':<4}  {m.task:<40} {m.nearest}  ({detail})")
            if m.flagged:
                print(f"{'':14}why: {explain(m.why)}")
    print(f"decontam: {len(matches)} task(s) vs {args.against}: {len(flagged)} flagged at threshold {threshold}"
          f"{f', {dropped} dropped' if args.drop else ''} ({seconds:.1f}s)", file=sys.stderr)
    return FOUND_PROBLEM if len(flagged) > dropped else 0
