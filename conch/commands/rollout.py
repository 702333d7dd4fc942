"""`conch rollout`: run the agent on tasks and save exact-token trajectories as JSONL."""

from __future__ import annotations

import argparse

from conch.commands.eval import EVAL_SEED
from conch.sandbox import BACKENDS


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("rollout", help="run the agent on tasks; save TITO trajectories (JSONL)", description=__doc__)
    p.add_argument("--model", help="HF checkpoint folder (default: the embedded tiny MoE, created on first use)")
    p.add_argument("--tasks", nargs="+", required=True, help="task folders (searched recursively)")
    p.add_argument("--n-per-task", type=int, default=1, help="trajectories per task (default 1)")
    p.add_argument("--concurrency", type=int, help="trajectories in flight at once (default: ppo.concurrency)")
    p.add_argument("--out", required=True, help="output JSONL file (appended as trajectories finish)")
    p.add_argument("--sandbox", choices=BACKENDS, help="sandbox backend (default: sandbox.backend)")
    p.add_argument("--mode", choices=["tito", "retokenize"], help="token bookkeeping (default: agent.mode)")
    p.add_argument("--max-turns", type=int, help="assistant turns per episode (default: agent.max_turns)")
    p.add_argument("--max-new-tokens", type=int, help="tokens per assistant turn (default: agent.max_new_tokens)")
    p.add_argument("--max-context", type=int, help="context limit in tokens (default: agent.max_context)")
    p.add_argument("--temperature", type=float, help="sampling temperature (default: agent.temperature)")
    p.add_argument("--top-p", type=float, help="nucleus sampling (default: agent.top_p)")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], help="sampler dtype (default: model.sampler_dtype)")
    p.add_argument("--seed", type=int, default=EVAL_SEED,
                   help=f"sampling seed (default {EVAL_SEED}: what `conch eval` and training's evaluations use)")
    p.add_argument("--preset", metavar="NAME", help="a named config under --config and the flags (default without "
                                                    "--model and --config: demo, sized for the tiny model)")
    p.add_argument("--config", help="TOML config file whose [agent] settings apply (see `conch config show`)")
    from conch.engine.registry import add_engine_arguments

    add_engine_arguments(p, from_config=True)
    p.add_argument("--json", action="store_true", help="print a JSON summary to stdout")
    p.add_argument("overrides", nargs="*", metavar="section.key=value", help="config overrides")
    p.set_defaults(func=run)


def load_rollout_tasks(args: argparse.Namespace) -> list:
    """The loadable tasks under --tasks (the others said on stderr); UsageError when none, or a bad --n-per-task."""
    import sys
    from pathlib import Path

    from conch.cli import UsageError
    from conch.preflight import check_task_dir
    from conch.tasks.loader import load_tasks
    from conch.tasks.model import TaskLoadError

    for p in args.tasks:
        check_task_dir(p, "--tasks")
    tasks = load_tasks([Path(p) for p in args.tasks])
    for t in tasks:
        if isinstance(t, TaskLoadError):
            print(f"skipping task {t.name}: {t}", file=sys.stderr)
    tasks = [t for t in tasks if not isinstance(t, TaskLoadError)]
    if not tasks:
        raise UsageError(f"no loadable tasks under {' '.join(args.tasks)}")
    if args.n_per_task < 1:
        raise UsageError("--n-per-task must be at least 1")
    return tasks


def run(args: argparse.Namespace) -> int:
    import asyncio
    import json
    import sys
    from pathlib import Path

    tasks = load_rollout_tasks(args)
    from conch.agent.rollout import progress_printer, run_rollouts, summarize
    from conch.progress import Progress
    from conch.report.hooks import outcome_info

    def rollout_bar(total: int):  # a bar with ETA (plain lines every 10 s off a terminal)
        bar = Progress(total, "rollout")
        return lambda traj: bar.update(info=outcome_info(traj))
    from conch.agent.tito import ChatCodec
    from conch.config import load_config
    from conch.engine.registry import build_engine, options_for_command
    from conch.model.init import cached_model
    from conch.preflight import check_model_dir
    from conch.tasks.synth.trajectories import BASH_TOOL

    flags = (("concurrency", "ppo.concurrency"), ("sandbox", "sandbox.backend"), ("mode", "agent.mode"),
             ("max_turns", "agent.max_turns"), ("max_new_tokens", "agent.max_new_tokens"),
             ("max_context", "agent.max_context"), ("temperature", "agent.temperature"),
             ("top_p", "agent.top_p"), ("dtype", "model.sampler_dtype"))
    from conch.presets import DEMO

    preset = args.preset or (DEMO if not args.model and not args.config else None)
    if preset == DEMO and not args.preset:
        print(f"conch rollout: the embedded tiny model, with the {DEMO} preset's agent settings "
              f"(conch/configs/{DEMO}.toml); --model and --preset/--config for a real one", file=sys.stderr)
    conf = load_config(args.config, [*args.overrides, *(f"{key}={getattr(args, attr)}" for attr, key in flags
                                                         if getattr(args, attr) is not None)], preset=preset)
    model_dir = check_model_dir(args.model, "--model") if args.model else cached_model()
    cfg = conf.agent
    args.concurrency, args.sandbox, args.dtype = conf.ppo.concurrency, conf.sandbox.backend, conf.model.sampler_dtype
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)

    async def main() -> int:
        engine = build_engine(options_for_command(conf, args), model_dir, max_batch=args.concurrency)
        try:
            codec = ChatCodec(engine.tokenizer, tools=[BASH_TOOL])
            total = len(tasks) * args.n_per_task
            print(f"rollout: {total} trajectories, concurrency {args.concurrency}, model {model_dir}", file=sys.stderr)
            trajs, stats = await run_rollouts(
                engine, codec, tasks, args.n_per_task, cfg, args.concurrency, args.sandbox, args.seed, out,
                on_done=progress_printer(total) if total <= 16 else rollout_bar(total),
            )
        finally:
            await engine.aclose()
        summary = summarize(trajs) | {
            "sampled_tokens": stats.sampled_tokens,
            "env_steps": stats.env_steps,
            "seconds": round(stats.seconds, 2),
            "tokens_per_s": round(stats.tokens_per_s, 1),
            "out": str(out),
        }
        if args.json:
            print(json.dumps(summary))
        else:
            for k, v in summary.items():
                print(f"{k:18} {v}")
        return 0

    return asyncio.run(main())
