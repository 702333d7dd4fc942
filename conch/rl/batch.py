"""Trajectories → padded tensors, and the trainer's forward passes over them (policy log-probs, values).

The shift convention everywhere: position t of the per-token outputs describes token t as predicted from
tokens < t (so the first token has no log-prob and is never a sampled token). With R3 on, the recorded experts
of every token are replayed in the forward pass; padded positions and tokens the sampler never routed carry -1
and fall back to the trainer's own router.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch

from conch.agent.trajectory import Trajectory


@dataclass
class Batch:
    ids: torch.Tensor  # [B, T] long
    attn: torch.Tensor  # [B, T] long (1 = real token)
    mask: torch.Tensor  # [B, T] float (1 = sampled by the model: gets loss)
    sampler_logprobs: torch.Tensor  # [B, T] float
    experts: torch.Tensor | None  # [B, T, layers, k] long, -1 where unknown


def collate(trajs: Sequence[Trajectory], pad_id: int, with_experts: bool) -> Batch:
    T = max(len(t.tokens) for t in trajs)
    B = len(trajs)
    ids = torch.full((B, T), pad_id, dtype=torch.long)
    attn = torch.zeros((B, T), dtype=torch.long)
    mask = torch.zeros((B, T), dtype=torch.float32)
    lps = torch.zeros((B, T), dtype=torch.float32)
    experts = None
    if with_experts:
        shapes = [t.routed_experts.shape[1:] for t in trajs if t.routed_experts is not None]
        if shapes:
            experts = torch.full((B, T, *shapes[0]), -1, dtype=torch.long)
    for b, t in enumerate(trajs):
        n = len(t.tokens)
        ids[b, :n] = torch.tensor(t.tokens, dtype=torch.long)
        attn[b, :n] = 1
        mask[b, :n] = torch.tensor(t.mask, dtype=torch.float32)
        lps[b, :n] = torch.tensor(t.logprobs, dtype=torch.float32)
        if experts is not None and t.routed_experts is not None:
            experts[b, :n] = torch.from_numpy(t.routed_experts.astype("int64"))
    mask[:, 0] = 0.0  # nothing predicts the first token
    return Batch(ids, attn, mask, lps, experts)


def token_logprobs(logits: torch.Tensor, ids: torch.Tensor, chunk: int = 1024) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token log-prob of `ids` under `logits` (shifted) and the entropy, computed in sequence chunks so the
    float32 log-softmax over the vocabulary never materialises for the whole sequence at once."""
    B, T, _ = logits.shape
    lp = logits.new_zeros((B, T), dtype=torch.float32)
    ent = logits.new_zeros((B, T), dtype=torch.float32)
    for s in range(0, T - 1, chunk):
        e = min(T - 1, s + chunk)
        logp = torch.log_softmax(logits[:, s:e].float(), dim=-1)
        lp[:, s + 1 : e + 1] = logp.gather(-1, ids[:, s + 1 : e + 1].unsqueeze(-1)).squeeze(-1)
        ent[:, s + 1 : e + 1] = -(logp.exp() * logp).sum(-1)
    return lp, ent


def policy_forward(
    model: Any, batch: Batch, replay: bool, temperature: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Trainer log-probs [B, T], entropies [B, T] and the trainer's own expert choices [B, T, layers, k]
    (what its router would pick, also while replaying; None for dense models)."""
    from contextlib import ExitStack

    from conch.moe.routing import RoutingReplay, capture_routing, moe_layer_count, replay_routing

    B, T = batch.ids.shape
    own = None
    with ExitStack() as stack:
        state = cap = None
        if replay and batch.experts is not None:
            state = stack.enter_context(replay_routing(model, RoutingReplay(batch.experts)))
        elif moe_layer_count(model):
            cap = stack.enter_context(capture_routing(model))
        logits = model(input_ids=batch.ids, attention_mask=batch.attn).logits
        if state is not None:
            own = state.own_experts().long()
        elif cap is not None:
            got = cap.take()
            own = got.long().view(B, T, got.shape[1], got.shape[2])
    if temperature != 1.0:
        logits = logits / temperature
    lp, ent = token_logprobs(logits, batch.ids)
    return lp, ent, own


def own_routing(model: Any, batch: Batch) -> torch.Tensor | None:
    """The trainer's own top-k choices (no replay) for every token: [B, T, layers, k]."""
    from conch.moe.routing import capture_routing, moe_layer_count

    if moe_layer_count(model) == 0:
        return None
    with capture_routing(model) as cap, torch.no_grad():
        model(input_ids=batch.ids, attention_mask=batch.attn)
        got = cap.take()
    B, T = batch.ids.shape
    return got.long().view(B, T, got.shape[1], got.shape[2])
