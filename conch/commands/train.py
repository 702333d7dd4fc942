"""`conch train`: warm-started PPO for a terminal agent (the main job). See conch/rl/train.py for the algorithm.

    conch train --out RUNDIR                                     synthesized tasks, the tiny model (the demo)
    conch train --out RUNDIR corpus.train_tasks=DIR              your own tasks: split into SFT / PPO / eval,
                                                                 demonstrations from their solution/solve.sh
    conch train --out RUNDIR corpus.train_tasks=DIR corpus.eval_tasks=DIR2 corpus.sft_data=FILE.jsonl
    conch train --resume RUNDIR [section.key=value ...]          continue; changes to unfinished stages allowed

Every path in the config is checked before the first stage; `conch config show` documents every key.
"""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="train an agent: corpus, SFT warm start, critic warm-up, PPO", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", help="TOML config file (see `conch config show`)")
    p.add_argument("--out", help="run folder (metrics.jsonl, checkpoints, summary.json)")
    p.add_argument("--resume", metavar="RUNDIR", help="continue a run from its last complete stage/iteration")
    p.add_argument("--json", action="store_true", help="print summary.json to stdout at the end")
    p.add_argument("--against", metavar="DIR", help="drop training/eval tasks that nearly copy a task in DIR "
                                                    "(same as corpus.decontam_against=DIR; report in RUNDIR)")
    p.add_argument("overrides", nargs="*", metavar="section.key=value", help="config overrides")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import json
    import sys
    from pathlib import Path

    from conch.cli import UsageError
    from conch.config import ConfigError, load_config

    from conch.rl.ranks import is_follower

    if is_follower():
        from conch.rl.learner_group import follow

        return follow()  # torchrun rank > 0: rank 0 drives the run and sends this rank the learner's calls

    if args.against:
        args.overrides = [*args.overrides, f"corpus.decontam_against={args.against}"]
    if bool(args.out) == bool(args.resume):
        raise UsageError("give exactly one of --out RUNDIR (new run) or --resume RUNDIR")
    try:
        if args.resume:
            run_dir = Path(args.resume)
            if not (run_dir / "config.toml").exists():
                raise UsageError(f"{run_dir}: not a conch run folder (no config.toml)")
            cfg = load_config(args.config or run_dir / "config.toml", args.overrides)
            from conch.rl.stages import check_resume_changes

            for line in check_resume_changes(load_config(run_dir / "config.toml"), cfg, run_dir):
                print(f"conch train: resume changes {line}", file=sys.stderr)
        else:
            run_dir = Path(args.out)
            if (run_dir / "config.toml").exists():
                raise UsageError(f"{run_dir} already holds a run; use --resume {run_dir} or another --out")
            cfg = load_config(args.config, args.overrides)
        from conch.rl.train import summary_table, train

        summary = train(cfg, run_dir)
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    print(summary_table(summary), file=sys.stderr)
    print(f"summary: {run_dir / 'summary.json'}", file=sys.stderr)
    if args.json:
        print(json.dumps(summary))
    return 0
