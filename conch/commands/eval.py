"""`conch eval`: pass rate and mean tests passed of a model on task folders, per task.

    conch eval --model CKPT --tasks DIR [--config FILE] [section.key=value ...]
    conch eval --from-run RUNDIR [--stage init|warm|final] [section.key=value ...]

Sampling, agent and context settings come from the one training config (`conch config show`: [agent], [eval],
ppo.concurrency, model.sampler_dtype), so `conch eval` and `conch train` evaluate alike. With --from-run they
come from the run's own config.toml, the model is the run's checkpoint of that stage and the tasks its evaluation
set: with the same seed the figures are the run's own (RUNDIR/evals/STAGE.json). Flags override the config.
"""

from __future__ import annotations

import argparse

from conch.sandbox import BACKENDS

EVAL_SEED = 11  # the seed `conch train` evaluates its evaluation set with (conch/rl/train.py)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("eval", help="evaluate a model on tasks, or re-run a training run's evaluation",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="HF checkpoint folder (with --from-run: the run's checkpoint of --stage)")
    p.add_argument("--tasks", nargs="+", help="task folders, searched recursively (with --from-run: the run's "
                                              "evaluation tasks)")
    p.add_argument("--from-run", metavar="RUNDIR", help="evaluate exactly as this `conch train` run did")
    p.add_argument("--stage", default="final", choices=["init", "warm", "final"],
                   help="with --from-run: which checkpoint (default final)")
    p.add_argument("--preset", metavar="NAME", help="a named config (e.g. demo for the tiny model) applied under "
                                                    "--config and the flags (`conch config show --preset NAME`)")
    p.add_argument("--config", help="TOML config file (default with --from-run: RUNDIR/config.toml)")
    p.add_argument("--n-per-task", type=int, help="samples per task (default: eval.n_per_task)")
    p.add_argument("--sandbox", choices=BACKENDS, help="sandbox backend (default: sandbox.backend)")
    p.add_argument("--concurrency", type=int, help="trajectories in flight (default: ppo.concurrency)")
    p.add_argument("--temperature", type=float, help="sampling temperature, 0: greedy (default: eval.temperature)")
    p.add_argument("--max-turns", type=int, help="assistant turns per episode (default: agent.max_turns)")
    p.add_argument("--max-new-tokens", type=int, help="tokens per turn (default: agent.max_new_tokens)")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], help="engine dtype (default: model.sampler_dtype)")
    p.add_argument("--seed", type=int, default=EVAL_SEED, help=f"sampling seed (default {EVAL_SEED}, as in training)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    from conch.engine.registry import add_engine_arguments

    add_engine_arguments(p, from_config=True)
    p.add_argument("--out", help="also write every trajectory to this JSONL file (readable by `conch report`)")
    p.add_argument("overrides", nargs="*", metavar="section.key=value", help="config overrides")
    p.set_defaults(func=run)


FLAG_KEYS = (("n_per_task", "eval.n_per_task"), ("sandbox", "sandbox.backend"), ("concurrency", "ppo.concurrency"),
             ("temperature", "eval.temperature"), ("max_turns", "agent.max_turns"),
             ("max_new_tokens", "agent.max_new_tokens"), ("dtype", "model.sampler_dtype"))


def resolve(args: argparse.Namespace):
    """(config, model folder, task folders) from the flags, the config and, with --from-run, the run folder."""
    import json
    from pathlib import Path

    from conch.cli import UsageError
    from conch.config import load_config
    from conch.preflight import check_dir, check_model_dir

    config = args.config
    run = None
    if args.from_run and args.preset:
        raise UsageError("--preset and --from-run: a run is evaluated with its own config.toml")
    if args.from_run:
        run = check_dir(args.from_run, "--from-run")
        if not (run / "config.toml").is_file():
            raise UsageError(f"--from-run: {run} is not a conch run folder (no config.toml)")
        config = config or run / "config.toml"
    flags = [f"{key}={getattr(args, attr)}" for attr, key in FLAG_KEYS if getattr(args, attr) is not None]
    cfg = load_config(config, [*args.overrides, *flags], preset=args.preset)
    model, tasks = args.model, args.tasks
    if run is not None:
        if model is None:
            model = {"init": cfg.model.path or run / "init", "warm": run / "warm", "final": run / "final"}[args.stage]
            if not Path(model).exists():
                raise UsageError(f"--stage {args.stage}: {model} does not exist (the run has not reached it)")
        if tasks is None:
            done = run / "corpus.done.json"
            if not done.is_file():
                raise UsageError(f"--from-run: {run} has no corpus.done.json (its corpus stage did not finish)")
            tasks = [json.loads(done.read_text())["eval"]]
    if model is None or not tasks:
        raise UsageError("give --model and --tasks, or --from-run RUNDIR")
    return cfg, check_model_dir(model, "--model"), [Path(t) for t in tasks]


def run(args: argparse.Namespace) -> int:
    import asyncio
    import json

    import sys

    from conch.cli import UsageError
    from conch.preflight import check_task_dir
    from conch.progress import Progress
    from conch.report.hooks import outcome_info
    from conch.rl.stages import evaluate
    from conch.rl.user_corpus import load_user_tasks

    cfg, model, folders = resolve(args)
    for folder in folders:
        check_task_dir(folder, "--tasks")
    say = lambda msg: print(f"conch eval: {msg}", file=sys.stderr)  # noqa: E731
    tasks = [t for p in folders for t in load_user_tasks(p, say)]
    if not tasks:
        raise UsageError(f"--tasks: no loadable tasks under {' '.join(map(str, folders))}")

    a = cfg.agent
    from conch.model.context import context_length

    try:
        context = f"context {context_length(a.max_context, model)} tokens"
    except ValueError:
        context = "context: the engine's"
    say(f"{model} on {len(tasks)} task(s) x {cfg.eval.n_per_task}, temperature {cfg.eval.temperature}, "
        f"{a.max_turns} turns of {a.max_new_tokens} tokens, {context}, seed {args.seed}")

    async def main():
        from conch.agent.tito import ChatCodec
        from conch.engine.registry import build_engine, options_for_command
        from conch.tasks.synth.trajectories import BASH_TOOL

        engine = build_engine(options_for_command(cfg, args), model, max_batch=cfg.ppo.concurrency)
        try:
            codec = ChatCodec(engine.tokenizer, tools=[BASH_TOOL])
            bar = Progress(len(tasks) * cfg.eval.n_per_task, "eval")
            return await evaluate(engine, codec, tasks, cfg, seed=args.seed, out=Path(args.out) if args.out else None,
                                  on_done=lambda t: bar.update(info=outcome_info(t)))
        finally:
            await engine.aclose()

    res = asyncio.run(main())
    if args.json:
        print(json.dumps(res.to_json()))
    else:
        for name, d in res.per_task.items():
            if d["pass_rate"] is None:
                print(f"{name:40} error: {res.error_tasks.get(name, 'no episode ran')}")
            else:
                errors = f"  ({d['errors']} errors not counted)" if d.get("errors") else ""
                print(f"{name:40} pass {d['pass_rate']:.2f}  tests {d['tests_passed_mean']:.2f}/{d['n_total']}{errors}")
        print(f"{res.describe()}; {res.tasks} tasks; per episode {res.turns_mean:.2f} turns, "
              f"{res.sampled_tokens_mean:.1f} sampled tokens")
    return 0
