"""The inference engine protocol.

Why sessions: a terminal episode is hundreds of turns over one growing token sequence. An engine session keeps
its KV cache between calls, so a turn costs only its new tokens (the observation appended, the reply sampled).

Alignment contract (the agent loop and R3 rely on it):
- `open_session(prompt_ids)` registers the prompt; nothing is computed yet.
- `generate(sid, new_ids, sampling)` processes the pending prompt (first call only) and `new_ids`, samples until
  a stop, and keeps every token of the session (the sampled ones included) as context for the next call.
- `GenerateResult.routed_experts`: routing rows [rows, moe_layers, top_k], dtype uint8 (≤256 experts) or int16,
  of the session's tokens in order, each token's row reported once, by the first call that has fed the token
  (None for dense models or when capture is off). A call's rows start at the session's first token not yet
  reported and end at its last token fed. An engine may leave the last sampled token unfed until the next call: HFEngine feeds it before it
  returns (rows `pending prompt ids + new_ids + token_ids`); VLLMEngine does not (vLLM never feeds the token it
  sampled last), so its rows are `[the previous call's last sampled token] + pending + new_ids + token_ids[:-1]`,
  the owed row coming first in the next call at no extra request. Concatenated over a session's calls, the rows
  are those of its first N tokens, where N is the session's length or one less (its final sampled token).
  `generate(sid, [], SamplingParams(max_new_tokens=0))` feeds everything and returns the rows still owed (none
  on HFEngine), for a caller that needs the final row.
- Why the final row may stay owed: with causal attention a token's routing affects only its own position and
  later ones, so the final token's routing changes no log-prob of the sequence (token t's is read at position
  t-1) and no value PPO uses (`values_before_tokens` reads token t's state at position t-1). Trajectories mark
  it -1 (never routed), as they mark inserted ids no call fed; replay and the routing metrics skip -1 rows.
- `logprobs[i]` is log softmax(logits / temperature)[token_ids[i]] in the sampler's dtype, before top-k/top-p
  truncation: the same quantity the trainer recomputes, so their difference measures the numeric gap only.
  Precisely (HFEngine): the logits come from the model running in the sampler's dtype; the log-softmax is taken
  in float32 over the full vocabulary; temperature 0 (greedy) reports log softmax(logits).
- Stops: only the given `stop_token_ids` / `stop_strings` end a turn (no implicit EOS); the stop token or the
  tokens of the stop string stay in `token_ids`. finish_reason "length": max_new_tokens or the context is full.
- `seed` seeds the session's generator on its first call and whenever a call brings a different seed (the same
  seed on every turn continues one stream); results do not depend on which sessions share a batch.
- `load_weights` makes live sessions stale: their next call re-prefills their history under the new weights
  (those rows are not reported, but for a row still owed, which is read then), so log-probs and experts always
  belong to the live weights.
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
