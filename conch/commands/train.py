"""`conch train`: warm-started PPO for a terminal agent (the main job). See conch/rl/train.py for the algorithm.

    conch train --out RUNDIR                                     synthesized tasks, the tiny model (the demo
                                                                 preset, as without model.path it always is)
    conch train --preset qwen3-30b-a3b --out RUNDIR model.path=DIR   a real model (`conch config show --preset`)
    conch train --out RUNDIR corpus.train_tasks=DIR              your own tasks: split into SFT / PPO / eval,
                                                                 demonstrations from their solution/solve.sh
    conch train --out RUNDIR corpus.train_tasks=DIR corpus.eval_tasks=DIR2 corpus.sft_data=FILE.jsonl
    conch train --resume RUNDIR [section.key=value ...]          continue; changes to unfinished stages allowed

Precedence: defaults < --preset < --config file < section.key=value. Without --preset, --config and model.path
the demo preset is used (said in the first line). A resumed run reads its own RUNDIR/config.toml, already
resolved. Every path in the config is checked before the first stage; `conch config show` documents every key.
"""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="train an agent: corpus, SFT warm start, critic warm-up, PPO", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", metavar="NAME", help="a named whole config applied over the defaults, e.g. demo or "
                                                    "qwen3-30b-a3b (`conch config show --preset NAME`); new runs only")
    p.add_argument("--config", help="TOML config file, applied over the preset (see `conch config show`)")
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
    if args.resume and args.preset:
        raise UsageError(f"--preset applies to new runs only: {args.resume}/config.toml already holds the run's "
                         f"resolved config (change keys with section.key=value)")
    notice = ""
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
            cfg, notice = new_run_config(args)
        from conch.rl.figures import summary_table
        from conch.rl.train import check_config, train

        if notice:
            check_config(cfg)  # a bad key or path stays a one-line error, before the notice (train checks again)
            print(notice, file=sys.stderr, flush=True)
        summary = train(cfg, run_dir)
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    print(summary_table(summary), file=sys.stderr)
    print(f"summary: {run_dir / 'summary.json'}", file=sys.stderr)
    if args.json:
        print(json.dumps(summary))
    return 0


def new_run_config(args: argparse.Namespace):
    """(config, notice): defaults < preset < --config < overrides; the demo preset, with a notice, when neither a
    preset nor a config file nor model.path is given."""
    from conch.config import load_config
    from conch.presets import DEMO, check_needs, demo_notice, wants_demo

    preset, notice = args.preset, ""
    if not preset and wants_demo(args.config, args.overrides):
        preset, notice = DEMO, demo_notice()
    cfg = load_config(args.config, args.overrides, preset=preset)
    if preset:
        check_needs(preset, cfg)
    return cfg, notice
