"""`conch bench horizon`: seconds for 30/100/300-turn conversations with and without prefix reuse.

Why: a terminal episode is hundreds of turns over one growing sequence. With the session cache a turn costs
its new tokens only, so total time grows about linearly with the number of turns (target: 300 turns take at
most 12x the time of 30). Without reuse every turn re-prefills the whole conversation and total time grows
quadratically. Each turn appends 20-50 observation tokens and samples 10-30 tokens (seeded, no stop tokens, so
both modes do the same amount of sampling). One conversation is timed and read at each checkpoint, so the
30-turn figure is the first 30 turns of the 300-turn run. The reuse conversation runs `--repeats` times and
each checkpoint reports the median: on a shared VM a 3-second window (30 turns) varies by 20% between runs,
which moved the ratio by more than a kernel change did. Every run's times are in the JSON.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time

from conch.bench.engine import ServerCounters, add_common, engine_options, random_ids, resolve_model, vocab_size


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_common(parser)
    from conch.engine.registry import add_engine_arguments

    add_engine_arguments(parser, device=False)
    parser.add_argument("--turns", default="30,100,300", help="comma-separated checkpoints (turn counts)")
    parser.add_argument("--system-tokens", type=int, default=64, help="length of the opening prompt")
    parser.add_argument("--no-reuse-budget", type=float, default=900.0,
                        help="stop the no-reuse run after this many seconds; unreached checkpoints print null")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=3, help="reuse conversations timed (median per checkpoint)")


def plan(turns: int, seed: int, vocab: int) -> list[tuple[list[int], int]]:
    """Per turn: (observation token ids, number of tokens to sample). Same plan for both modes."""
    r = random.Random(seed)
    return [(random_ids(r.randint(20, 50), vocab, seed * 100_003 + t), r.randint(10, 30)) for t in range(turns)]


async def reuse_run(engine, system: list[int], turns: list[tuple[list[int], int]], checkpoints: list[int],
                    seed: int) -> list[float]:
    from conch.engine.base import SamplingParams

    out, t0 = [], time.perf_counter()
    sid = await engine.open_session(system)
    for i, (obs, n) in enumerate(turns, start=1):
        await engine.generate(sid, obs, SamplingParams(temperature=1.0, max_new_tokens=n, seed=seed))
        if i in checkpoints:
            out.append(round(time.perf_counter() - t0, 3))
            print(f"reuse: {i} turns in {out[-1]:.2f}s", file=sys.stderr)
    await engine.close_session(sid)
    return out


async def no_reuse_run(engine, system: list[int], turns: list[tuple[list[int], int]], checkpoints: list[int],
                       seed: int, budget: float) -> list[float | None]:
    from conch.engine.base import SamplingParams

    out: list[float | None] = []
    history, t0 = list(system), time.perf_counter()
    for i, (obs, n) in enumerate(turns, start=1):
        history += obs
        sid = await engine.open_session(history)
        res = await engine.generate(sid, [], SamplingParams(temperature=1.0, max_new_tokens=n, seed=seed + i))
        await engine.close_session(sid)
        history += res.token_ids
        if i in checkpoints:
            out.append(round(time.perf_counter() - t0, 3))
            print(f"no reuse: {i} turns in {out[-1]:.2f}s", file=sys.stderr)
        if time.perf_counter() - t0 > budget:
            print(f"no reuse: stopped at turn {i} (budget {budget:.0f}s)", file=sys.stderr)
            break
    return out + [None] * (len(checkpoints) - len(out))


async def conversation(engine, checkpoints: list[int], system_tokens: int, seed: int, repeats: int,
                       no_reuse_budget: float) -> dict:
    """The horizon measurement on a live engine (also part of `conch bench engine`)."""
    checkpoints = sorted(checkpoints)
    vocab = vocab_size(engine)
    turns = plan(checkpoints[-1], seed, vocab)
    system = random_ids(system_tokens, vocab, seed + 7)
    total = system_tokens + sum(len(o) + n for o, n in turns)
    if total > engine.max_positions:
        raise SystemExit(f"{checkpoints[-1]} turns need {total} tokens; the model's context is {engine.max_positions}")
    await reuse_run(engine, system, turns[:3], [], seed)  # warm-up
    runs = [await reuse_run(engine, system, turns, checkpoints, seed) for _ in range(max(1, repeats))]
    reuse = [statistics.median(run[i] for run in runs) for i in range(len(checkpoints))]
    no_reuse = await no_reuse_run(engine, system, turns, checkpoints, seed, no_reuse_budget)
    i30 = checkpoints.index(30) if 30 in checkpoints else 0
    i300 = checkpoints.index(300) if 300 in checkpoints else len(checkpoints) - 1
    return {"turns": checkpoints, "seconds_reuse": reuse, "seconds_no_reuse": no_reuse,
            "reuse_ratio_last_first": round(reuse[i300] / reuse[i30], 2), "tokens_at_last": total,
            "seconds_reuse_runs": runs, "ratio_per_run": [round(run[i300] / run[i30], 2) for run in runs],
            "attention": getattr(engine, "attention_kernel", "vllm server")}


def parse_turns(text: str) -> list[int]:
    return sorted(int(x) for x in text.split(",") if x.strip())


async def _bench(args: argparse.Namespace) -> dict:
    from conch.engine.registry import build_engine

    model = resolve_model(args.model)
    engine = build_engine(engine_options(args), model)
    try:
        counters = ServerCounters(engine)
        result = await conversation(engine, parse_turns(args.turns), args.system_tokens, args.seed, args.repeats,
                                    args.no_reuse_budget)
        server = counters.delta()
    finally:
        await engine.aclose()
    return {**result, "model": model, "dtype": args.dtype, "device": args.device, "engine": args.engine,
            **({"server": server} if server else {})}


def report(result: dict) -> None:
    print(f"reuse: last/first checkpoint time ratio {result['reuse_ratio_last_first']} "
          f"(target <= 12 for 300/30); {result['tokens_at_last']} tokens at the last turn", file=sys.stderr)


def run(args: argparse.Namespace) -> int:
    import asyncio

    result = asyncio.run(_bench(args))
    if args.json:
        print(json.dumps(result))
    else:
        print(json.dumps({k: result[k] for k in ("turns", "seconds_reuse", "seconds_no_reuse")}))
        report(result)
    return 0
