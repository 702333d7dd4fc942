"""Token sampling for the engine: temperature, top-k, top-p, per-session generators, stop conditions.

Why per-session generators: a session's samples must not depend on which other sessions share its decode
batch, or rollouts are not reproducible. Each sampled token consumes exactly one uniform draw from its session's
own `torch.Generator` (inverse-CDF sampling over the truncated distribution), whatever the batch. One draw per
token instead of one per vocabulary entry: measured ~10x cheaper than exponential-race sampling at batch 32.

Log-probs: `log_softmax(logits / temperature)` in float32, over the full vocabulary, before top-k/top-p
truncation: the quantity a trainer recomputes from the same logits. Greedy rows (temperature 0) report
`log_softmax(logits)`. The logits themselves come from the model in the engine's dtype (float32 or bfloat16).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from conch.engine.base import SamplingParams


def validate(params: SamplingParams) -> None:
    if params.temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {params.temperature}")
    if not 0 < params.top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {params.top_p}")
    if params.top_k < 0:
        raise ValueError(f"top_k must be >= 0 (0: off), got {params.top_k}")
    if params.max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {params.max_new_tokens}")
    if any(not s for s in params.stop_strings):
        raise ValueError("stop_strings must not contain empty strings")


def make_generator(seed: int | None, device: torch.device) -> torch.Generator:
    g = torch.Generator(device=device)
    if seed is None:
        g.seed()  # non-deterministic, from the OS
    else:
        g.manual_seed(int(seed) & 0xFFFF_FFFF_FFFF_FFFF)
    return g


@dataclass
class RowSpec:
    params: SamplingParams
    generator: torch.Generator


def _truncate(probs: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Zero out tokens outside the top-k / nucleus (top-p) set; the most likely token always survives."""
    if top_k and top_k < probs.shape[-1]:
        kth = torch.topk(probs, top_k).values[-1]
        probs = torch.where(probs >= kth, probs, torch.zeros_like(probs))
    if top_p < 1.0:
        sorted_p, order = torch.sort(probs, descending=True)
        cum = torch.cumsum(sorted_p, dim=-1)
        drop_sorted = (cum - sorted_p) >= top_p * cum[-1]  # mass before this token already reaches top_p
        drop = torch.zeros_like(drop_sorted).scatter(0, order, drop_sorted)
        probs = probs.masked_fill(drop, 0.0)
    return probs


def sample(logits: torch.Tensor, rows: list[RowSpec]) -> tuple[list[int], list[float]]:
    """Sample one token per row of `logits` [rows, vocab]; returns (token ids, their log-probs)."""
    if logits.shape[0] != len(rows):
        raise ValueError(f"{logits.shape[0]} logit rows for {len(rows)} sampling specs")
    logits = logits.float()
    temps = torch.tensor([r.params.temperature if r.params.temperature > 0 else 1.0 for r in rows],
                         device=logits.device, dtype=torch.float32)
    logp = torch.log_softmax(logits / temps[:, None], dim=-1)
    probs = logp.exp()
    uniform = torch.empty(len(rows), device=logits.device)
    greedy = []
    for i, spec in enumerate(rows):
        p = spec.params
        if p.temperature == 0:
            greedy.append(i)
            uniform[i] = 0.0
            continue
        if p.top_k or p.top_p < 1.0:
            probs[i] = _truncate(probs[i], p.top_k, p.top_p)
        # one uniform draw per sampled token from the session's own generator, whatever the batch
        uniform[i] = torch.rand((), generator=spec.generator, device=logits.device)
    # inverse-CDF sampling: the first token whose cumulative mass exceeds u * total (zero-mass tokens never win)
    cdf = torch.cumsum(probs, dim=-1)
    target = (uniform * cdf[:, -1] * (1.0 - 1e-6))[:, None]
    idx = torch.searchsorted(cdf, target, right=True)[:, 0].clamp_max(probs.shape[-1] - 1)
    if greedy:
        g = torch.tensor(greedy, device=logits.device)
        idx[g] = torch.argmax(logits[g], dim=-1)
    picked = logp.gather(1, idx[:, None])[:, 0]
    return idx.tolist(), picked.tolist()


def stop_string_hit(text_tail: str, stop_strings: tuple[str, ...]) -> str | None:
    for s in stop_strings:
        if s in text_tail:
            return s
    return None


def tail_tokens_for(stop_strings: tuple[str, ...]) -> int:
    """How many trailing tokens to decode so any stop string ending in the newest token is visible.

    A token holds at least one byte, so a stop string of b UTF-8 bytes spans at most b tokens; one extra
    token covers a stop string that starts inside a multi-byte character's token."""
    return max((len(s.encode("utf-8")) for s in stop_strings), default=0) + 1
