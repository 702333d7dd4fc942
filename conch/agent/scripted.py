"""ScriptedEngine: an `Engine` whose "model" is a Python function choosing the ids of each turn.

Why: the agent loop's guarantees (exact sampled ids, alignment of masks, log-probs and routed experts, drift
repair, stop reasons) must be testable deterministically, and a randomly initialised model almost never emits
a tool call. Everything around the model stays real: sessions, the alignment contract of `conch/engine/base.py`
(routing rows for pending prompt + new ids + sampled ids), stop ids and `max_new_tokens`. Every call is recorded
so a test can compare what the engine returned with what the trajectory stored.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from conch.engine.base import GenerateResult, SamplingParams

# policy(turn index within the session, every id the session holds so far) -> ids to return. The engine applies
# the stop ids and `max_new_tokens` to them as a sampler would.
Policy = Callable[[int, Sequence[int]], Sequence[int]]


@dataclass
class Call:
    """One generate call as the engine saw it."""

    session: int
    fed: list[int]  # pending prompt ids + new ids processed by the call
    sampled: list[int]
    logprobs: list[float]
    finish_reason: str
    routed: np.ndarray | None


@dataclass
class _Session:
    pending: list[int]
    history: list[int] = field(default_factory=list)
    turns: int = 0


def fake_logprob(token: int, position: int) -> float:
    """A deterministic, distinct-looking log-prob for a scripted token."""
    return -0.001 * (1 + (token * 7919 + position * 104729) % 5000)


class ScriptedEngine:
    """Implements the Engine protocol over a scripted policy. `num_experts` > 0 fakes MoE routing rows
    (deterministic in token id and position) so routing alignment is testable too."""

    def __init__(self, policy: Policy, num_experts: int = 8, num_moe_layers: int = 2, top_k: int = 2,
                 max_positions: int | None = None, delay: float = 0.0) -> None:
        self.policy = policy
        self.num_experts, self.num_moe_layers, self.top_k = num_experts, num_moe_layers, top_k
        if max_positions is not None:
            self.max_positions = max_positions
        self.delay = delay
        self.calls: list[Call] = []
        self.closed: dict[int, list[int]] = {}  # session -> every id it held when closed
        self._sessions: dict[int, _Session] = {}
        self._ids = itertools.count(1)

    def routing_row(self, token: int, position: int) -> np.ndarray:
        base = (token * 31 + position) % self.num_experts
        return np.array([[(base + layer + j) % self.num_experts for j in range(self.top_k)]
                         for layer in range(self.num_moe_layers)], dtype=np.uint8)

    async def open_session(self, prompt_ids: list[int]) -> int:
        sid = next(self._ids)
        self._sessions[sid] = _Session(pending=[int(t) for t in prompt_ids])
        return sid

    async def generate(self, session: int, new_token_ids: list[int], sampling: SamplingParams) -> GenerateResult:
        s = self._sessions.get(session)
        if s is None:
            raise KeyError(f"unknown or closed session {session}")
        t0 = time.perf_counter()
        fed = s.pending + [int(t) for t in new_token_ids]
        s.pending = []
        first = len(s.history)
        s.history.extend(fed)
        if self.delay:
            await asyncio.sleep(self.delay)
        wanted = [int(t) for t in self.policy(s.turns, list(s.history))]
        s.turns += 1
        out: list[int] = []
        finish = "length"
        for tok in wanted:
            if len(out) >= sampling.max_new_tokens:
                break
            out.append(tok)
            if tok in sampling.stop_token_ids:
                finish = "stop"
                break
        logprobs = [fake_logprob(t, len(s.history) + i) for i, t in enumerate(out)]
        s.history.extend(out)
        routed = None
        if self.num_experts:
            rows = [self.routing_row(t, first + i) for i, t in enumerate(s.history[first:])]
            routed = np.stack(rows) if rows else np.zeros((0, self.num_moe_layers, self.top_k), dtype=np.uint8)
        self.calls.append(Call(session, fed, list(out), list(logprobs), finish, routed))
        return GenerateResult(token_ids=out, logprobs=logprobs, finish_reason=finish, routed_experts=routed,
                              prompt_tokens=len(fed), seconds=time.perf_counter() - t0)

    async def close_session(self, session: int) -> None:
        s = self._sessions.pop(session, None)
        if s is not None:
            self.closed[session] = list(s.history)

    def load_weights(self, state_dict: dict) -> None:
        return None

    async def aclose(self) -> None:
        self._sessions.clear()


def tool_call_text(command: str | None, name: str = "bash") -> str:
    """A Qwen3-style tool call, spelled exactly as conch's chat template renders it (so it causes no drift)."""
    import json

    args = {"command": command} if command is not None else {}
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": args}, ensure_ascii=False) + "\n</tool_call>"
