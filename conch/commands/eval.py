"""`conch eval`: pass rate and mean tests passed of a model on task folders, per task."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("eval", help="evaluate a model on tasks", description=__doc__)
    p.add_argument("--model", required=True, help="HF checkpoint folder")
    p.add_argument("--tasks", nargs="+", required=True, help="task folders")
    p.add_argument("--n-per-task", type=int, default=1)
    p.add_argument("--sandbox", default="local", choices=["local", "docker"])
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--temperature", type=float, default=0.0, help="0: greedy (default)")
    p.add_argument("--max-turns", type=int, default=30)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--seed", type=int, default=0)
    from conch.engine.registry import add_engine_arguments

    add_engine_arguments(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import asyncio
    import json
    import sys
    from pathlib import Path

    from conch.cli import UsageError
    from conch.config import load_config
    from conch.rl.stages import evaluate, load_task_list

    tasks = [t for p in args.tasks for t in load_task_list(Path(p))]
    if not tasks:
        raise UsageError(f"no loadable tasks under {' '.join(args.tasks)}")
    cfg = load_config(None, [f"eval.n_per_task={args.n_per_task}", f"eval.temperature={args.temperature}",
                             f"run.sandbox={args.sandbox}", f"ppo.concurrency={args.concurrency}",
                             f"agent.max_turns={args.max_turns}", f"agent.max_new_tokens={args.max_new_tokens}"])

    async def main():
        from conch.agent.tito import ChatCodec
        from conch.engine.registry import build_engine, options_from_args
        from conch.tasks.synth.trajectories import BASH_TOOL

        engine = build_engine(options_from_args(args), Path(args.model), max_batch=args.concurrency)
        try:
            codec = ChatCodec(engine.tokenizer, tools=[BASH_TOOL])
            return await evaluate(engine, codec, tasks, cfg, seed=args.seed)
        finally:
            await engine.aclose()

    res = asyncio.run(main())
    if args.json:
        print(json.dumps(res.to_json()))
    else:
        for name, d in res.per_task.items():
            print(f"{name:40} pass {d['pass_rate']:.2f}  tests {d['tests_passed_mean']:.2f}/{d['n_total']}")
        print(f"pass rate {res.pass_rate:.3f}, tests passed mean {res.tests_passed_mean:.2f} "
              f"({res.tasks} tasks, {res.samples} samples)")
    return 0
