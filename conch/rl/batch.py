"""Trajectories → padded tensors, and the trainer's forward passes over them (policy log-probs, values).

The shift convention everywhere: position t of the per-token outputs describes token t as predicted from
tokens < t (so the first token has no log-prob and is never a sampled token). With R3 on, the recorded experts
of every token are replayed in the forward pass; padded positions and tokens the sampler never routed carry -1
and fall back to the trainer's own router.

Memory at long sequence lengths (agent trajectories reach 32k tokens): the policy forward stops at the decoder's
hidden states and applies the LM head + log-softmax in sequence chunks, each recomputed in backward
(`conch.rl.losses.chunked_logprobs_and_entropy`), so [T, vocab] logits never exist at once. Activation
(gradient) checkpointing of the decoder layers is switched on with `set_gradient_checkpointing`, which also
makes each layer's recomputation in backward replay the same experts as its forward (see `_recompute_context`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, nullcontext
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Sequence

import torch
from torch import nn

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


# Causal-LM config fields that transform the logits after the linear head (softcapping, scaling). A model that
# sets one gets the unchunked path (its own forward computes the logits), so its log-probs stay exact.
_LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "logits_scaling", "output_multiplier_scale",
                     "lm_head_multiplier", "logit_multiplier")


def split_head(model: Any) -> tuple[nn.Module, nn.Module] | None:
    """(decoder stack returning `last_hidden_state`, linear LM head) when the model's logits are exactly
    head(hidden); None when they are not (or the parts cannot be found), so callers take the full-logits path."""
    config = getattr(model, "config", None)
    for name in _LOGIT_TRANSFORMS:
        v = getattr(config, name, None)
        if v not in (None, 1, 1.0, 0, 0.0, False):
            return None
    decoder = getattr(model, "model", None)
    if decoder is None and hasattr(model, "get_decoder"):
        try:
            decoder = model.get_decoder()
        except (AttributeError, ValueError):
            decoder = None
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if decoder is None or decoder is model or not isinstance(head, nn.Linear):
        return None
    return decoder, head


def _sharded(model: Any) -> bool:
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # pragma: no cover - torch without distributed
        return False
    return isinstance(model, FSDPModule)


def policy_forward(
    model: Any, batch: Batch, replay: bool, temperature: float = 1.0, *, chunk: int | None = 1024,
    sampled_only: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Trainer log-probs [B, T], entropies [B, T] and the trainer's own expert choices [B, T, layers, k]
    (what its router would pick, also while replaying; None for dense models).

    `sampled_only`: compute the LM head only at sampled positions (`batch.mask`), leaving 0 elsewhere (the
    full-logits path below computes every position regardless; values at sampled positions agree). What the
    PPO update needs: on agent trajectories most positions are prompt and observations (about 7 in 8 in the
    demo), and the head over a vocabulary is the largest per-position cost of this model size.

    `chunk`: sequence positions per LM-head chunk (the default, memory-lean path: decoder hidden states, then
    head + log-softmax per chunk, recomputed in backward). None: the reference path through the model's full
    logits [B, T, V]; models whose logits are not a plain linear head of the hidden states always take it."""
    from conch.moe.routing import RoutingReplay, capture_routing, moe_layer_count
    from conch.rl.losses import chunked_logprobs_and_entropy

    B, T = batch.ids.shape
    own = None
    # Under FSDP2 the head's weight is a shard until the root's forward gathers it: take the full-logits path.
    parts = split_head(model) if chunk is not None and not _sharded(model) else None
    with ExitStack() as stack:
        state = cap = None
        if replay and batch.experts is not None:
            state = stack.enter_context(replaying(model, RoutingReplay(batch.experts)))
        elif moe_layer_count(model):
            cap = stack.enter_context(capture_routing(model))
        if parts is not None:
            decoder, head = parts
            hidden = decoder(input_ids=batch.ids, attention_mask=batch.attn, use_cache=False).last_hidden_state
        else:
            logits = model(input_ids=batch.ids, attention_mask=batch.attn, use_cache=False).logits
        if state is not None:
            own = state.own_experts().long()
        elif cap is not None:
            got = cap.take()
            own = got.long().view(B, T, got.shape[1], got.shape[2])
    if parts is None:
        if temperature != 1.0:
            logits = logits / temperature
        lp, ent = token_logprobs(logits, batch.ids)
        return lp, ent, own
    lp_s, ent_s = chunked_logprobs_and_entropy(
        hidden[:, :-1], head.weight, batch.ids[:, 1:], lm_head_bias=head.bias, chunk=max(1, chunk or 1),
        temperature=temperature, mask=batch.mask[:, 1:] if sampled_only else None,
    )
    first = lp_s.new_zeros((B, 1))
    return torch.cat([first, lp_s], dim=1), torch.cat([first, ent_s], dim=1), own


# ---- R3 routing replay that survives activation checkpointing ----
#
# Under non-reentrant checkpointing a layer's forward runs again during backward, after `policy_forward` has
# left its replay context and removed the router hooks. Without them the recomputation would route by the
# trainer's own choice, so the layer would compute something else than in forward (a CheckpointError, or wrong
# gradients). `set_gradient_checkpointing` passes `_checkpoint_contexts` as checkpoint's `context_fn`: called
# at forward time, it notes the replays active then, and the recompute context re-installs the same replay
# (a throwaway state, so counters and `own` are not touched) -- or, if backward runs while the replay context
# is still open and its hooks still fire, restores the state's counters and `own` afterwards.


@dataclass
class _ActiveReplay:
    model: nn.Module
    state: Any  # conch.moe.routing.RoutingReplay
    open: bool = True


_ACTIVE: ContextVar[tuple[_ActiveReplay, ...]] = ContextVar("conch_active_replays", default=())


@contextmanager
def replaying(model: nn.Module, state: Any) -> Iterator[Any]:
    """`conch.moe.routing.replay_routing`, plus registration so checkpointed layers replay in backward too.
    Refuses a model whose layers are checkpointed by something other than `set_gradient_checkpointing`."""
    from conch.moe.routing import replay_routing

    _check_checkpoint_func(model)
    entry = _ActiveReplay(model, state)
    token = _ACTIVE.set(_ACTIVE.get() + (entry,))
    try:
        with replay_routing(model, state) as st:
            yield st
    finally:
        entry.open = False
        _ACTIVE.reset(token)


def _checkpoint_contexts() -> tuple[Any, Any]:
    return nullcontext(), _recompute_context(_ACTIVE.get())


@contextmanager
def _recompute_context(entries: tuple[_ActiveReplay, ...]) -> Iterator[None]:
    from conch.moe.routing import RoutingReplay, replay_routing

    with ExitStack() as stack:
        for e in entries:
            if e.open:  # its hooks are still registered and will fire: undo their bookkeeping afterwards
                saved = (e.state.replayed_rows, e.state.fallback_rows, dict(e.state.own))
                stack.callback(_restore, e.state, saved)
            else:
                stack.enter_context(replay_routing(e.model, RoutingReplay(e.state.experts, record_own=False)))
        yield


def _restore(state: Any, saved: tuple[int, int, dict]) -> None:
    state.replayed_rows, state.fallback_rows = saved[0], saved[1]
    state.own.clear()
    state.own.update(saved[2])


def _checkpointed_layers(model: nn.Module) -> list[nn.Module]:
    return [m for m in model.modules() if getattr(m, "gradient_checkpointing", False) is True
            and hasattr(m, "_gradient_checkpointing_func")]


def _check_checkpoint_func(model: nn.Module) -> None:
    for m in _checkpointed_layers(model):
        kw = getattr(m._gradient_checkpointing_func, "keywords", {}) or {}
        if kw.get("context_fn") is not _checkpoint_contexts:
            raise RuntimeError(
                f"{type(model).__name__}: gradient checkpointing was enabled without conch's replay support "
                f"({type(m).__name__}); use conch.rl.batch.set_gradient_checkpointing(model, True) instead of "
                f"the model's own gradient_checkpointing_enable()")


def set_gradient_checkpointing(model: nn.Module, on: bool) -> None:
    """Activation checkpointing of every decoder layer (non-reentrant), for a policy or a critic (ValueModel:
    its backbone). Layers are only checkpointed in training mode (`model.train()`); R3 replay stays exact."""
    target = next((m for m in model.modules() if hasattr(m, "supports_gradient_checkpointing")), None)
    if target is None:
        raise ValueError(f"{type(model).__name__} contains no transformers PreTrainedModel to checkpoint")
    if not on:
        disable = getattr(target, "activation_checkpointing_disable", None) or target.gradient_checkpointing_disable
        disable()
        return
    kwargs = {"use_reentrant": False, "context_fn": _checkpoint_contexts}
    enable = getattr(target, "activation_checkpointing_enable", None)
    if enable is not None:
        enable(activation_checkpointing_kwargs=kwargs)
    else:
        target.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    if not _checkpointed_layers(target):
        raise ValueError(f"{type(target).__name__}: no layer took gradient checkpointing")


def own_routing(model: Any, batch: Batch) -> torch.Tensor | None:
    """The trainer's own top-k choices (no replay) for every token: [B, T, layers, k]."""
    from conch.moe.routing import capture_routing, moe_layer_count

    if moe_layer_count(model) == 0:
        return None
    with capture_routing(model) as cap, torch.no_grad():
        model(input_ids=batch.ids, attention_mask=batch.attn, use_cache=False)
        got = cap.take()
    B, T = batch.ids.shape
    return got.long().view(B, T, got.shape[1], got.shape[2])
