"""`conch bench mismatch`'s sampling side: both token modes' rollouts with the same tasks and seeds, and, per
episode, every engine call (what each generate processed, its ids, log-probs and routing rows).

Why apart from the scoring (conch/bench/mismatch.py): the agent loop keeps no routing in retokenize mode, so the
bench records it here, at the engine, and scoring replays it through the trainer's forward.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections import Counter
from dataclasses import dataclass, replace
from typing import Any

@dataclass
class EngineCall:
    """One generate of a retokenize-mode turn: everything the sampler processed and produced."""

    prompt: list[int]
    token_ids: list[int]
    logprobs: list[float]
    rows: Any  # numpy [len(prompt) + len(token_ids), layers, k]: routing of every processed id


class RecordingEngine:
    """Delegates to an engine and records, per asyncio task (one per episode in `run_rollouts`), what each
    generate processed. The agent loop keeps no routing in retokenize mode; this is where the bench gets it.
    `score_retokenize` compares and replays the row of every id a turn processed, its last sampled one included:
    where the engine still owes that row (VLLMEngine, see conch/engine/base.py) a prefill-only call fetches it, and
    the result handed on carries every row of the call, as HFEngine's does."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.num_experts, self.num_moe_layers, self.top_k = inner.num_experts, inner.num_moe_layers, inner.top_k
        self.max_positions = getattr(inner, "max_positions", None)
        self._prompts: dict[int, list[int]] = {}
        self._calls: dict[asyncio.Task, list[EngineCall]] = {}

    async def open_session(self, prompt_ids: list[int]) -> int:
        sid = await self.inner.open_session(prompt_ids)
        self._prompts[sid] = [int(t) for t in prompt_ids]
        return sid

    async def generate(self, session: int, new_token_ids: list[int], sampling: Any) -> Any:
        fed = self._prompts.pop(session, []) + [int(t) for t in new_token_ids]
        res = await self.inner.generate(session, new_token_ids, sampling)
        rows = res.routed_experts
        if rows is not None and rows.shape[0] < len(fed) + len(res.token_ids):
            import numpy as np

            owed = await self.inner.generate(session, [], replace(sampling, max_new_tokens=0))
            res.routed_experts = np.concatenate([rows, owed.routed_experts])
        task = asyncio.current_task()
        assert task is not None
        self._calls.setdefault(task, []).append(EngineCall(fed, list(res.token_ids), list(res.logprobs),
                                                           res.routed_experts))
        return res

    async def close_session(self, session: int) -> None:
        self._prompts.pop(session, None)
        await self.inner.close_session(session)

    def load_weights(self, state_dict: dict) -> None:
        self.inner.load_weights(state_dict)

    async def aclose(self) -> None:
        await self.inner.aclose()

    def take_calls(self) -> list[EngineCall]:
        """The calls of the current task's episode (called from `run_rollouts`' on_done, in the same task)."""
        task = asyncio.current_task()
        return self._calls.pop(task, []) if task is not None else []


@dataclass
class Collected:
    """Trajectories of both modes (the same tasks and seeds), each with its episode's engine calls."""

    modes: dict[str, list[tuple[Any, list[EngineCall]]]]
    pad_id: int
    end_id: int


async def collect(args: argparse.Namespace, model_dir: str, tasks: list) -> Collected:
    from conch.agent.rollout import run_rollouts
    from conch.agent.tito import ChatCodec
    from conch.bench.agents import bench_agent, fallback_loop
    from conch.engine.registry import build_engine, options_from_args
    from conch.tasks.synth.trajectories import BASH_TOOL

    inner = build_engine(options_from_args(args, dtype=args.sampler_dtype), model_dir, max_batch=args.concurrency)
    engine = RecordingEngine(inner)
    codec = ChatCodec(inner.tokenizer, tools=[BASH_TOOL])
    out: dict[str, list] = {}
    try:
        for mode in ("tito", "retokenize"):
            cfg = bench_agent(max_turns=args.turns, max_new_tokens=args.max_new_tokens, temperature=1.0, mode=mode)
            got: list = []
            trajs, _ = await run_rollouts(engine, codec, tasks, args.n_per_task, cfg, concurrency=args.concurrency,
                                          backend=args.sandbox, seed=args.seed,
                                          on_done=lambda t: got.append((t, engine.take_calls())),
                                          loop=fallback_loop(args.fallback_command))
            calls = {(t.task, t.sample): c for t, c in got}
            out[mode] = [(t, calls.get((t.task, t.sample), [])) for t in trajs]
            stops = Counter(t.stop_reason.value for t in trajs)
            print(f"{mode}: {len(trajs)} trajectories, {sum(len(t.turns) for t in trajs)} turns, stops "
                  f"{dict(stops)}", file=sys.stderr)
    finally:
        await engine.aclose()
    pad = inner.tokenizer.pad_token_id
    return Collected(out, pad if pad is not None else codec.end_id, codec.end_id)
