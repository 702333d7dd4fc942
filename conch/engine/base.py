"""The inference engine protocol.

Why sessions: a terminal episode is hundreds of turns over one growing token sequence. An engine session keeps
its KV cache between calls, so a turn costs only its new tokens (the observation appended, the reply sampled).

Alignment contract (the agent loop and R3 rely on it):
- `open_session(prompt_ids)` registers the prompt; nothing is computed yet.
- `generate(sid, new_ids, sampling)` processes the pending prompt (first call only) and `new_ids`, samples until
  a stop, and then also feeds the last sampled token, so the cache holds every token of the session.
- `GenerateResult.routed_experts` therefore has one row per token processed in the call, in order:
  `pending prompt ids + new_ids + token_ids`, shape [rows, moe_layers, top_k], dtype uint8 (≤256 experts) or
  int16. None for dense models or when capture is off.
- `logprobs[i]` is log softmax(logits / temperature)[token_ids[i]] in the sampler's dtype, before top-k/top-p
  truncation: the same quantity the trainer recomputes, so their difference measures the numeric gap only.
  Precisely (HFEngine): the logits come from the model running in the sampler's dtype; the log-softmax is taken
  in float32 over the full vocabulary; temperature 0 (greedy) reports log softmax(logits).
- Stops: only the given `stop_token_ids` / `stop_strings` end a turn (no implicit EOS); the stop token or the
  tokens of the stop string stay in `token_ids`. finish_reason "length": max_new_tokens or the context is full.
- `seed` seeds the session's generator on its first call and whenever a call brings a different seed (the same
  seed on every turn continues one stream); results do not depend on which sessions share a batch.
- `load_weights` makes live sessions stale: their next call re-prefills their history under the new weights
  (those rows are not reported), so log-probs and experts always belong to the live weights.
- One generate in flight per session; `close_session` frees the session's cache.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0: off
    max_new_tokens: int = 256
    stop_token_ids: tuple[int, ...] = ()
    stop_strings: tuple[str, ...] = ()
    seed: int | None = None


@dataclass
class GenerateResult:
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str  # "stop" (stop token or string) or "length"
    routed_experts: np.ndarray | None = None
    prompt_tokens: int = 0  # tokens processed before sampling in this call (pending prompt + new ids)
    seconds: float = 0.0
    stop_reason_detail: str | None = field(default=None)  # the stop string or token that ended it


@runtime_checkable
class Engine(Protocol):
    """An async inference engine with persistent sessions and continuous batching."""

    num_experts: int  # 0 for dense models
    num_moe_layers: int
    top_k: int

    async def open_session(self, prompt_ids: list[int]) -> int: ...

    async def generate(self, session: int, new_token_ids: list[int], sampling: SamplingParams) -> GenerateResult: ...

    async def close_session(self, session: int) -> None: ...

    def load_weights(self, state_dict: dict) -> None:
        """Replace the live weights (weight sync from the trainer) without restarting the engine."""
        ...

    async def aclose(self) -> None: ...
