"""PPO losses over sampled tokens: clipped policy loss (asymmetric + dual clip), clipped value loss, KL to a
reference, entropy bonus, truncated importance sampling (TIS) for the train/inference gap.

Why each piece:
- Asymmetric clip (eps_low < eps_high, "clip-higher"): lets low-probability tokens grow faster than they may
  shrink, which keeps entropy from collapsing on long agent episodes.
- Dual clip (c > 1, negative advantages only): with A < 0 the standard clipped objective is unbounded as the
  ratio grows; the loss is capped at c * |A| so one stale, very off-policy token cannot dominate a batch.
- TIS: the sampler (inference engine) and the trainer compute slightly different probabilities. The PPO ratio
  is taken against the trainer's own old log-probs; the gap between trainer-old and sampler is corrected by
  weight = min(exp(old_logp_trainer - sampler_logp), C), detached, multiplied into the per-token policy loss.
- Entropy and log-probs are computed chunk by chunk with activation checkpointing, so the [tokens, vocab]
  float32 logits never exist for the whole sequence at once (32k tokens x 150k vocab x 4 B = 19 GB).

Conventions: all per-token tensors are [B, T] and aligned (the log-prob of token t sits at index t); `mask` is
1 for tokens the model sampled. Inserted tokens get no loss and no gradient. Aggregation:
- `token-mean`: sum over the batch's sampled tokens / their number (or / `denom`, for gradient accumulation:
  pass the sampled-token count of the whole optimizer step so every micro-batch is weighted correctly);
- `seq-mean-token-mean`: mean over each sequence's sampled tokens, then mean over sequences (or / `denom`
  sequences). Sequences with no sampled token count as 0 and still count in the number of sequences.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Callable

import torch
from torch.utils.checkpoint import checkpoint

AGG_MODES = ("token-mean", "seq-mean-token-mean")
KL_ESTIMATORS = ("k1", "k2", "k3")


def _maskf(mask: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return (mask != 0).to(like.dtype) if mask.dtype != torch.bool else mask.to(like.dtype)


def aggregate(per_token: torch.Tensor, mask: torch.Tensor, mode: str = "token-mean",
              denom: float | torch.Tensor | None = None) -> torch.Tensor:
    """Reduce a [B, T] per-token loss over mask-1 tokens (see the module docstring for modes and `denom`)."""
    m = _maskf(mask, per_token)
    # where(), not a product: a non-finite value on an inserted token must not leak into the sum or gradient.
    kept = torch.where(m > 0, per_token, torch.zeros((), dtype=per_token.dtype, device=per_token.device))
    if mode == "token-mean":
        n = m.sum().clamp(min=1.0) if denom is None else denom
        return kept.sum() / n
    if mode == "seq-mean-token-mean":
        per_seq = kept.sum(-1) / m.sum(-1).clamp(min=1.0)
        n = per_token.new_tensor(float(per_seq.numel())) if denom is None else denom
        return per_seq.sum() / n
    raise ValueError(f"unknown loss aggregation {mode!r}; choose one of {', '.join(AGG_MODES)}")


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    m = _maskf(mask, x)
    kept = torch.where(m > 0, x, torch.zeros((), dtype=x.dtype, device=x.device))
    return kept.sum() / m.sum().clamp(min=1.0)


def tis_weights(old_logp: torch.Tensor, sampler_logp: torch.Tensor, cap: float) -> torch.Tensor:
    """Truncated importance weights min(exp(old_logp_trainer - sampler_logp), cap), detached."""
    if cap <= 0:
        raise ValueError(f"TIS cap must be > 0; got {cap}")
    with torch.no_grad():
        return torch.exp(old_logp.float() - sampler_logp.float()).clamp(max=cap)


def kl_estimate(logp: torch.Tensor, ref_logp: torch.Tensor, kind: str = "k3") -> torch.Tensor:
    """Per-token estimate of KL(pi || pi_ref) from tokens sampled by pi (Schulman's estimators), with
    r = ref_logp - logp: k1 = -r, k2 = r^2 / 2, k3 = exp(r) - 1 - r (unbiased, always >= 0)."""
    r = ref_logp.float() - logp.float()
    if kind == "k1":
        return -r
    if kind == "k2":
        return 0.5 * r * r
    if kind == "k3":
        return torch.expm1(r.clamp(max=20.0)) - r  # clamp: one exp overflow would poison the whole batch
    raise ValueError(f"unknown KL estimator {kind!r}; choose one of {', '.join(KL_ESTIMATORS)}")


def _stat(loss: torch.Tensor, per_token: torch.Tensor, mask: torch.Tensor, agg: str,
          denom: float | torch.Tensor | None) -> torch.Tensor:
    """The value to report: the micro-batch's own aggregate, whatever `denom` the loss was scaled by."""
    return loss.detach() if denom is None else aggregate(per_token.detach(), mask, agg)


@dataclass
class LossStats:
    """Detached 0-dim tensors (no device sync until `to_dict`). Means are over the micro-batch's sampled tokens;
    loss values are the micro-batch's own aggregate (independent of `denom`), so `LossStats.mean` over the
    micro-batches of a step gives the step's token-mean."""

    policy_loss: torch.Tensor
    clip_frac: torch.Tensor  # tokens where the (asymmetric) clip is active
    dual_clip_frac: torch.Tensor  # tokens where the dual-clip bound is active
    approx_kl: torch.Tensor  # k3 of KL(old || new), tokens from old
    entropy: torch.Tensor | None = None
    value_loss: torch.Tensor | None = None
    value_clip_frac: torch.Tensor | None = None
    ref_kl: torch.Tensor | None = None
    tis_weight_mean: torch.Tensor | None = None
    tis_capped_frac: torch.Tensor | None = None
    mismatch_masked_frac: torch.Tensor | None = None  # tokens dropped: train/sample ratio outside its band
    total_loss: torch.Tensor | None = None
    num_tokens: torch.Tensor | None = None

    def to_dict(self, prefix: str = "train/") -> dict[str, float]:
        return {prefix + f.name: float(v) for f in fields(self) if (v := getattr(self, f.name)) is not None}

    @staticmethod
    def mean(stats: list["LossStats"]) -> dict[str, float]:
        """Token-weighted mean of micro-batch stats (num_tokens summed), as floats under `train/`."""
        if not stats:
            return {}
        weights = [float(s.num_tokens) if s.num_tokens is not None else 1.0 for s in stats]
        total = sum(weights) or 1.0
        out: dict[str, float] = {}
        for f in fields(LossStats):
            vals = [(getattr(s, f.name), w) for s, w in zip(stats, weights) if getattr(s, f.name) is not None]
            if not vals:
                continue
            if f.name == "num_tokens":
                out["train/num_tokens"] = sum(float(v) for v, _ in vals)
            else:
                out["train/" + f.name] = sum(float(v) * w for v, w in vals) / (sum(w for _, w in vals) or total)
        return out


def policy_loss(new_logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                clip_low: float = 0.2, clip_high: float = 0.2, dual_clip: float | None = None,
                is_weights: torch.Tensor | None = None, agg: str = "token-mean",
                denom: float | torch.Tensor | None = None) -> tuple[torch.Tensor, LossStats]:
    """Clipped PPO surrogate. ratio = exp(new - old); per token
    L = max(-A * ratio, -A * clip(ratio, 1 - clip_low, 1 + clip_high)), and for A < 0 with dual clip c:
    L = min(L, -A * c). Multiplied by `is_weights` (TIS) when given, then aggregated."""
    if dual_clip is not None and dual_clip <= 1.0:
        raise ValueError(f"dual_clip must be > 1 (it bounds the loss at c * |A|); got {dual_clip}")
    # float32 throughout: a bf16 ratio is too coarse to see a 0.2 clip boundary clearly.
    log_ratio = (new_logp.float() - old_logp.detach().float()).clamp(-20.0, 20.0)
    m = _maskf(mask, log_ratio)
    adv = advantages.detach().float()
    ratio = torch.exp(log_ratio)
    loss1 = -adv * ratio
    loss2 = -adv * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    clipped = torch.maximum(loss1, loss2)
    per_token = clipped
    dual_active = torch.zeros_like(ratio, dtype=torch.bool)
    if dual_clip is not None:
        bound = -adv * dual_clip
        dual_active = (adv < 0) & (clipped > bound)
        per_token = torch.where(adv < 0, torch.minimum(clipped, bound), clipped)
    if is_weights is not None:
        per_token = per_token * is_weights.detach().to(per_token.dtype)
    loss = aggregate(per_token, mask, agg, denom)
    with torch.no_grad():
        clip_active = (loss2 > loss1) & ~dual_active
        stats = LossStats(
            policy_loss=_stat(loss, per_token, mask, agg, denom),
            clip_frac=masked_mean(clip_active.float(), m),
            dual_clip_frac=masked_mean(dual_active.float(), m),
            approx_kl=masked_mean(torch.expm1(log_ratio) - log_ratio, m),
            num_tokens=m.sum(),
        )
        if is_weights is not None:
            stats.tis_weight_mean = masked_mean(is_weights.float(), m)
    return loss, stats


def _value_per_token(values: torch.Tensor, old_values: torch.Tensor | None, returns: torch.Tensor,
                     mask: torch.Tensor, clip: float | None) -> tuple[torch.Tensor, torch.Tensor]:
    v = values.float()
    ret = returns.detach().float()
    err = (v - ret) ** 2
    if clip is None:
        return 0.5 * err, torch.zeros((), device=values.device)
    if old_values is None:
        raise ValueError("value clipping needs old_values (pass clip=None for an unclipped value loss)")
    old = old_values.detach().float()
    v_clip = old + torch.clamp(v - old, -clip, clip)
    err_clip = (v_clip - ret) ** 2
    with torch.no_grad():
        frac = masked_mean((err_clip > err).float(), mask)
    return 0.5 * torch.maximum(err, err_clip), frac


def value_loss(values: torch.Tensor, old_values: torch.Tensor | None, returns: torch.Tensor, mask: torch.Tensor,
               clip: float | None = 0.2, agg: str = "token-mean",
               denom: float | torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss, clipped fraction). Per token 0.5 * max((v - R)^2, (v_clip - R)^2) with
    v_clip = old_v + clamp(v - old_v, -clip, clip); plain 0.5 * (v - R)^2 when clip is None. The clipped
    fraction counts tokens where the clipped error is the larger one (their gradient is zero)."""
    per_token, frac = _value_per_token(values, old_values, returns, mask, clip)
    return aggregate(per_token, mask, agg, denom), frac


@dataclass(frozen=True)
class LossConfig:
    clip_low: float = 0.2
    clip_high: float = 0.28
    dual_clip: float | None = 3.0
    value_clip: float | None = 0.2
    vf_coef: float = 0.5
    entropy_coef: float = 0.0
    kl_coef: float = 0.0
    kl_estimator: str = "k3"
    tis_cap: float | None = 2.0  # None disables TIS
    agg: str = "token-mean"
    # Token mask on the train/sample ratio exp(old_logp - sampler_logp) (IcePop/MIS style): tokens outside
    # [mask_low, mask_high] get no policy gradient (they still count in the denominator). None: off.
    mask_low: float | None = None
    mask_high: float | None = None


def ratio_band_mask(old_logp: torch.Tensor, sampler_logp: torch.Tensor | None, mask: torch.Tensor,
                    low: float | None, high: float | None) -> torch.Tensor | None:
    """1 where the train/sample ratio exp(old - sampler) lies in [low, high], else 0; None when off.

    With off-policy rollouts the sampler's log-probs come from weights one or more updates old, so the ratio
    also measures staleness; tokens far outside the band carry a gradient estimate too biased to use."""
    if sampler_logp is None or (low is None and high is None):
        return None
    with torch.no_grad():
        ratio = torch.exp(old_logp.float() - sampler_logp.float())
        keep = torch.ones_like(ratio)
        if low is not None:
            keep = keep * (ratio >= low)
        if high is not None:
            keep = keep * (ratio <= high)
        return torch.where(mask.bool(), keep, torch.zeros_like(keep))


def ppo_loss(cfg: LossConfig, new_logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor,
             mask: torch.Tensor, *, values: torch.Tensor | None = None, old_values: torch.Tensor | None = None,
             returns: torch.Tensor | None = None, entropy: torch.Tensor | None = None,
             ref_logp: torch.Tensor | None = None, sampler_logp: torch.Tensor | None = None,
             denom: float | torch.Tensor | None = None) -> tuple[torch.Tensor, LossStats]:
    """total = policy (with TIS if cfg.tis_cap and sampler_logp) + vf_coef * value (if values given)
    + kl_coef * KL to reference (if ref_logp given and kl_coef > 0) - entropy_coef * entropy (if given).
    All terms aggregate the same way (cfg.agg, `denom`)."""
    weights = None
    if cfg.tis_cap is not None and sampler_logp is not None:
        weights = tis_weights(old_logp, sampler_logp, cfg.tis_cap)
    keep = ratio_band_mask(old_logp, sampler_logp, mask, cfg.mask_low, cfg.mask_high)
    if keep is not None:
        weights = keep if weights is None else weights * keep
    loss, stats = policy_loss(new_logp, old_logp, advantages, mask, cfg.clip_low, cfg.clip_high, cfg.dual_clip,
                              weights, cfg.agg, denom)
    if keep is not None:
        stats.mismatch_masked_frac = masked_mean(1.0 - keep, mask)
    if weights is not None and cfg.tis_cap is not None:
        with torch.no_grad():
            raw = torch.exp(old_logp.float() - sampler_logp.float())  # type: ignore[union-attr]
            stats.tis_capped_frac = masked_mean((raw > cfg.tis_cap).float(), mask)
    total = loss
    if values is not None:
        if returns is None:
            raise ValueError("value loss needs `returns`")
        v_tok, v_frac = _value_per_token(values, old_values, returns, mask, cfg.value_clip)
        v_loss = aggregate(v_tok, mask, cfg.agg, denom)
        total = total + cfg.vf_coef * v_loss
        stats.value_loss, stats.value_clip_frac = _stat(v_loss, v_tok, mask, cfg.agg, denom), v_frac
    if ref_logp is not None:
        kl = kl_estimate(new_logp, ref_logp, cfg.kl_estimator)
        kl_loss = aggregate(kl, mask, cfg.agg, denom)
        if cfg.kl_coef > 0:
            total = total + cfg.kl_coef * kl_loss
        stats.ref_kl = _stat(kl_loss, kl, mask, cfg.agg, denom)
    if entropy is not None:
        ent = aggregate(entropy, mask, cfg.agg, denom)
        if cfg.entropy_coef != 0:
            total = total - cfg.entropy_coef * ent
        stats.entropy = _stat(ent, entropy, mask, cfg.agg, denom)
    with torch.no_grad():
        report = stats.policy_loss
        if stats.value_loss is not None:
            report = report + cfg.vf_coef * stats.value_loss
        if stats.ref_kl is not None and cfg.kl_coef > 0:
            report = report + cfg.kl_coef * stats.ref_kl
        if stats.entropy is not None and cfg.entropy_coef != 0:
            report = report - cfg.entropy_coef * stats.entropy
        stats.total_loss = report
    return total, stats


# ---- log-probs and entropy without materialising the full logits ----

def _lp_ent(logits: torch.Tensor, ids: torch.Tensor, temperature: float,
            with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor]:
    z = logits.float()
    if temperature != 1.0:
        z = z / temperature
    lse = torch.logsumexp(z, dim=-1)
    lp = z.gather(-1, ids.unsqueeze(-1)).squeeze(-1) - lse
    if with_entropy:
        ent = lse - (torch.softmax(z, dim=-1) * z).sum(-1)
    else:
        ent = torch.zeros_like(lp)
    return lp, ent


def _head_chunk(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, ids: torch.Tensor,
                temperature: float, with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor]:
    return _lp_ent(torch.nn.functional.linear(hidden, weight, bias), ids, temperature, with_entropy)


def _chunked(n: int, chunk: int, fn: Callable[[slice], tuple[torch.Tensor, torch.Tensor]],
             ) -> tuple[torch.Tensor, torch.Tensor]:
    lps, ents = [], []
    for s in range(0, n, chunk):
        lp, ent = fn(slice(s, min(n, s + chunk)))
        lps.append(lp)
        ents.append(ent)
    return torch.cat(lps), torch.cat(ents)


def _select(mask: torch.Tensor | None, lead: torch.Size, device: torch.device) -> torch.Tensor | None:
    if mask is None:
        return None
    if mask.shape != lead:
        raise ValueError(f"mask must have shape {tuple(lead)}; got {tuple(mask.shape)}")
    return torch.nonzero(mask.reshape(-1) != 0).squeeze(-1).to(device)


def _scatter_back(lp: torch.Tensor, ent: torch.Tensor, rows: torch.Tensor | None,
                  lead: torch.Size) -> tuple[torch.Tensor, torch.Tensor]:
    if rows is None:
        return lp.view(lead), ent.view(lead)
    n = lead.numel()
    full_lp = lp.new_zeros(n).index_copy(0, rows, lp)
    full_ent = ent.new_zeros(n).index_copy(0, rows, ent)
    return full_lp.view(lead), full_ent.view(lead)


def chunked_logprobs_and_entropy(hidden: torch.Tensor, lm_head_weight: torch.Tensor, ids: torch.Tensor, *,
                                 lm_head_bias: torch.Tensor | None = None, mask: torch.Tensor | None = None,
                                 chunk: int = 1024, temperature: float = 1.0, with_entropy: bool = True,
                                 checkpointed: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """(log-prob of `ids`, entropy), both float32 shaped like `ids`, from final hidden states [..., H] and the
    LM head, `chunk` positions at a time. `hidden[..., t, :]` must be the state that predicts `ids[..., t]`
    (callers shift: hidden[:, :-1], ids[:, 1:]). With `mask`, only mask-1 positions are computed (the others
    are 0): on agent trajectories most tokens are observations, so this skips most of the head's work.
    `checkpointed` recomputes each chunk's logits in backward instead of storing them."""
    lead = ids.shape
    if hidden.shape[:-1] != lead:
        raise ValueError(f"hidden {tuple(hidden.shape)} must be ids' shape {tuple(lead)} plus a hidden dim")
    h = hidden.reshape(-1, hidden.shape[-1])
    flat = ids.reshape(-1)
    rows = _select(mask, lead, h.device)
    if rows is not None:
        h, flat = h.index_select(0, rows), flat.index_select(0, rows)

    def fn(s: slice) -> tuple[torch.Tensor, torch.Tensor]:
        args = (h[s], lm_head_weight, lm_head_bias, flat[s], temperature, with_entropy)
        if checkpointed and torch.is_grad_enabled():
            return checkpoint(_head_chunk, *args, use_reentrant=False)
        return _head_chunk(*args)

    if h.shape[0] == 0:
        z = torch.zeros(0, device=h.device)
        return _scatter_back(z, z, rows, lead)
    lp, ent = _chunked(h.shape[0], chunk, fn)
    return _scatter_back(lp, ent, rows, lead)


def logprobs_and_entropy_from_logits(logits: torch.Tensor, ids: torch.Tensor, *, mask: torch.Tensor | None = None,
                                     chunk: int = 1024, temperature: float = 1.0, with_entropy: bool = True,
                                     checkpointed: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Like `chunked_logprobs_and_entropy` for logits [..., V] that already exist: bounds the float32
    softmax/log-softmax temporaries to `chunk` rows (the logits themselves are not copied)."""
    lead = ids.shape
    if logits.shape[:-1] != lead:
        raise ValueError(f"logits {tuple(logits.shape)} must be ids' shape {tuple(lead)} plus a vocab dim")
    z = logits.reshape(-1, logits.shape[-1])
    flat = ids.reshape(-1)
    rows = _select(mask, lead, z.device)
    if rows is not None:
        z, flat = z.index_select(0, rows), flat.index_select(0, rows)

    def fn(s: slice) -> tuple[torch.Tensor, torch.Tensor]:
        args = (z[s], flat[s], temperature, with_entropy)
        if checkpointed and torch.is_grad_enabled():
            return checkpoint(_lp_ent, *args, use_reentrant=False)
        return _lp_ent(*args)

    if z.shape[0] == 0:
        e = torch.zeros(0, device=z.device)
        return _scatter_back(e, e, rows, lead)
    lp, ent = _chunked(z.shape[0], chunk, fn)
    return _scatter_back(lp, ent, rows, lead)
