"""`conch synth`: generate a validated corpus of procedural tasks, have an LLM write tasks from seed tasks, or
print statistics of a task folder (or of an LLM synthesis run).

    conch synth --out DIR --n N --seed S [--families a,b] [--split train|heldout] [--jobs J] [--no-validate]
                [--sandbox local|docker]
                [--trajectories FILE.jsonl [--mistake-rate R]]
    conch synth --from-seeds DIR --llm URL --model NAME --n N --out DIR (--against REF_DIR | --no-decontam)
                [--api-key-env VAR] [--repairs K] [--llm-jobs L] [--jobs J] [--max-candidates M] [--resume]
    conch synth --stats DIR [--json]
    conch synth --list [--json]

`--backend` is the deprecated old name of `--sandbox` (still accepted, with a warning).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from conch.sandbox import BACKENDS


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("synth", help="synthesize procedural tasks (Harbor layout), or show corpus stats",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, help="output folder for the task folders")
    p.add_argument("--n", type=int, default=100, help="number of tasks to keep (default 100)")
    p.add_argument("--seed", type=int, default=0, help="corpus seed (same seed, same folders)")
    p.add_argument("--families", help="comma-separated family names (default: all of the split)")
    p.add_argument("--split", choices=["train", "heldout"], help="only families tagged with this split")
    p.add_argument("--jobs", type=int, default=2, help="tasks validated in parallel (default 2)")
    p.add_argument("--no-validate", action="store_true", help="skip the oracle/nop check in real sandboxes")
    p.add_argument("--sandbox", choices=BACKENDS, default=None,
                   help="sandbox backend for validation (default local)")
    p.add_argument("--backend", choices=BACKENDS, default=None, help=argparse.SUPPRESS)  # deprecated: --sandbox
    p.add_argument("--max-attempts", type=int, default=4, help="seeds tried per slot before giving up")
    p.add_argument("--trajectories", type=Path, help="write the oracle runs as chat JSONL (needs validation)")
    p.add_argument("--mistake-rate", type=float, default=0.0,
                   help="share of trajectories that show the family's mistake instead of the oracle (default 0)")
    p.add_argument("--stats", type=Path, metavar="DIR", help="print statistics of the tasks under DIR (of the run, "
                   "per gate and per seed, when DIR holds an LLM run's synth.jsonl)")
    p.add_argument("--list", action="store_true", help="list the families with their split and category")
    p.add_argument("--json", action="store_true", help="machine-readable output (with --stats or --list)")
    from conch.tasks.llmsynth.command import add_arguments

    add_arguments(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from conch.cli import UsageError

    if args.list:
        return _list(args)
    if args.stats is not None:
        return _stats(args)
    if args.from_seeds is not None:
        from conch.tasks.llmsynth.command import run_llm

        return run_llm(args, _sandbox(args))
    from conch.tasks.llmsynth.command import stray_flags
    from conch.tasks.synth import select_families, summary_lines, synthesize

    if stray_flags(args):
        raise UsageError(f"{', '.join(stray_flags(args))} belong to LLM synthesis: add --from-seeds DIR")
    sandbox = _sandbox(args)
    if args.out is None:
        raise UsageError("--out DIR is required (or use --stats DIR / --list)")
    if args.n < 1:
        raise UsageError("--n must be at least 1")
    if args.jobs < 1 or args.max_attempts < 1:
        raise UsageError("--jobs and --max-attempts must be at least 1")
    if args.trajectories is not None and args.no_validate:
        raise UsageError("--trajectories records real oracle runs; it cannot be combined with --no-validate")
    if not 0.0 <= args.mistake_rate <= 1.0:
        raise UsageError(f"--mistake-rate must be between 0 and 1, got {args.mistake_rate}")
    if args.mistake_rate and args.trajectories is None:
        raise UsageError("--mistake-rate shapes the trajectories; it needs --trajectories FILE.jsonl")
    names = [n.strip() for n in args.families.split(",") if n.strip()] if args.families else None
    try:
        fams = select_families(names, args.split)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    report = synthesize(args.out, args.n, args.seed, fams, validate=not args.no_validate, jobs=args.jobs,
                        backend=sandbox, max_attempts=args.max_attempts, trajectories=args.trajectories,
                        mistake_rate=args.mistake_rate)
    for line in summary_lines(report, fams):
        print(line, file=sys.stderr)
    if args.trajectories is not None:
        print(f"wrote {report.trajectories} trajectories to {args.trajectories}", file=sys.stderr)
    return 0 if len(report.kept) == args.n else 1


def _sandbox(args: argparse.Namespace) -> str:
    """--sandbox, or the deprecated --backend it replaced (same values; it warns once on stderr)."""
    from conch.cli import UsageError

    if args.backend is None:
        return args.sandbox or "local"
    if args.sandbox is not None and args.sandbox != args.backend:
        raise UsageError(f"--backend {args.backend} contradicts --sandbox {args.sandbox}; give only --sandbox")
    print("conch: warning: `conch synth --backend` is deprecated; use --sandbox (as every other command does)",
          file=sys.stderr)
    return args.backend


def _list(args: argparse.Namespace) -> int:
    from conch.tasks.synth import load_families

    fams = load_families()
    if args.json:
        print(json.dumps([{"name": f.name, "split": f.split, "category": f.category, "description": f.description}
                          for f in fams.values()], indent=2))
        return 0
    for f in fams.values():
        print(f"{f.name:<16} {f.split:<8} {f.category:<20} {f.description}")
    return 0


def _stats(args: argparse.Namespace) -> int:
    from conch.cli import UsageError
    from conch.tasks.synth import corpus_stats

    if not args.stats.is_dir():
        raise UsageError(f"{args.stats}: not a directory")
    if (args.stats / "synth.jsonl").is_file():
        from conch.tasks.llmsynth.command import stats_llm

        return stats_llm(args)
    st = corpus_stats(args.stats)
    if args.json:
        print(json.dumps(st, indent=2))
        return 0
    print(f"{st['tasks']} task(s) in {args.stats}")
    for split, count in st["splits"].items():
        print(f"  split {split}: {count}")
    for fam, count in st["families"].items():
        print(f"  {fam:<18} {count}")
    for key, label in (("tests_per_task", "tests per task"), ("turns", "solution turns")):
        s = st[key]
        print(f"{label}: min {s['min']}, mean {s['mean']}, max {s['max']} (over {s['n']} task(s))")
    return 0
