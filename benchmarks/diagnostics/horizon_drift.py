"""Is the 30-turn figure of `conch bench horizon` biased by the host drifting during the run?

`conch bench horizon` takes its 30-turn time from the first 30 turns of the 300-turn conversation. If the host
ran faster at the start of a run (boost, a quiet neighbour) than over the next 25 seconds, that figure would be
low and the ratio 300/30 high. This runs a separate 30-turn conversation (same plan, same seed) right before and
right after each 300-turn one and prints the three 30-turn times side by side with both ratios: without drift,
the three agree to within the VM's noise. Same engine, plan and seed as the benchmark's defaults.

    python benchmarks/diagnostics/horizon_drift.py [--rounds 3] [--model DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import json


async def main(rounds: int, model: str | None) -> None:
    from conch.bench.engine import random_ids
    from conch.bench.horizon import plan, reuse_run
    from conch.engine.hf import HFEngine
    from conch.model.init import cached_model

    engine = HFEngine(model or cached_model("tiny"))
    vocab = engine.model.config.vocab_size
    turns, system = plan(300, 0, vocab), random_ids(64, vocab, 7)
    await reuse_run(engine, system, turns[:3], [], 0)  # warm-up, as the benchmark does
    for _ in range(rounds):
        before = (await reuse_run(engine, system, turns[:30], [30], 0))[0]
        long = await reuse_run(engine, system, turns, [30, 100, 300], 0)
        after = (await reuse_run(engine, system, turns[:30], [30], 0))[0]
        print(json.dumps({"30_before": before, "30_in_300": long[0], "30_after": after, "300": long[2],
                          "ratio_in_run": round(long[2] / long[0], 2),
                          "ratio_separate_30": round(long[2] / ((before + after) / 2), 2)}), flush=True)
    await engine.aclose()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--model", default=None, help="model folder (default: the cached tiny model)")
    args = parser.parse_args()
    asyncio.run(main(args.rounds, args.model))
