"""`conch rollout`: run the agent on tasks and save exact-token trajectories as JSONL."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("rollout", help="run the agent on tasks; save TITO trajectories (JSONL)", description=__doc__)
    p.add_argument("--model", help="HF checkpoint folder (default: the embedded tiny MoE, created on first use)")
    p.add_argument("--tasks", nargs="+", required=True, help="task folders (searched recursively)")
    p.add_argument("--n-per-task", type=int, default=1, help="trajectories per task (default 1)")
    p.add_argument("--concurrency", type=int, default=8, help="trajectories in flight at once (default 8)")
    p.add_argument("--out", required=True, help="output JSONL file (appended as trajectories finish)")
    p.add_argument("--sandbox", default="local", choices=["local", "docker"])
    p.add_argument("--mode", default="tito", choices=["tito", "retokenize"], help="token bookkeeping (default tito)")
    p.add_argument("--max-turns", type=int, default=300)
    p.add_argument("--max-new-tokens", type=int, default=256, help="per assistant turn")
    p.add_argument("--max-context", type=int, default=32768)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="sampler dtype")
    p.add_argument("--seed", type=int, default=0)
    from conch.engine.registry import add_engine_arguments

    add_engine_arguments(p)
    p.add_argument("--json", action="store_true", help="print a JSON summary to stdout")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import asyncio
    import json
    import sys
    from pathlib import Path

    from conch.cli import UsageError
    from conch.tasks.loader import load_tasks
    from conch.tasks.model import TaskLoadError

    tasks = load_tasks([Path(p) for p in args.tasks])
    bad = [t for t in tasks if isinstance(t, TaskLoadError)]
    for t in bad:
        print(f"skipping task {t.name}: {t}", file=sys.stderr)
    tasks = [t for t in tasks if not isinstance(t, TaskLoadError)]
    if not tasks:
        raise UsageError(f"no loadable tasks under {' '.join(args.tasks)}")
    if args.n_per_task < 1 or args.concurrency < 1:
        raise UsageError("--n-per-task and --concurrency must be at least 1")

    from conch.agent.loop import AgentConfig
    from conch.agent.rollout import progress_printer, run_rollouts, summarize
    from conch.agent.tito import ChatCodec
    from conch.engine.registry import build_engine, options_from_args
    from conch.tasks.synth.trajectories import BASH_TOOL
    from conch.model.init import cached_model

    model_dir = Path(args.model) if args.model else cached_model()
    cfg = AgentConfig(
        max_turns=args.max_turns,
        max_new_tokens=args.max_new_tokens,
        max_context=args.max_context,
        temperature=args.temperature,
        top_p=args.top_p,
        mode=args.mode,
    )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)

    async def main() -> int:
        engine = build_engine(options_from_args(args), model_dir, max_batch=args.concurrency)
        try:
            codec = ChatCodec(engine.tokenizer, tools=[BASH_TOOL])
            total = len(tasks) * args.n_per_task
            print(f"rollout: {total} trajectories, concurrency {args.concurrency}, model {model_dir}", file=sys.stderr)
            trajs, stats = await run_rollouts(
                engine, codec, tasks, args.n_per_task, cfg, args.concurrency, args.sandbox, args.seed, out,
                on_done=progress_printer(total),
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
