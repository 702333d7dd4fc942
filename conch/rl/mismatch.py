"""Train/inference mismatch: how far the trainer's view of a trajectory is from what the sampler saw.

Why measure it: PPO assumes the log-probs of the behaviour policy are the trainer's own. The sampler (an
inference engine with its own kernels, batch shapes and dtypes) computes slightly different ones, and in an MoE
model a flipped top-k expert choice changes a token's log-prob far more than numeric noise. These metrics are
the early warning: a growing gap is the usual cause of a run that collapses for no visible reason. They are
computed over sampled tokens only (mask = 1); inserted tokens have no sampler log-prob.

Direction of the KL: tokens were drawn from the sampler mu, so the estimators are unbiased for KL(mu || pi)
where pi is the trainer. With r = trainer_lp - sampler_lp = log(pi/mu) at a token x ~ mu:
  k1 = -r            (unbiased, can be negative per token)
  k3 = exp(r) - 1 - r (unbiased since E_mu[pi/mu] = 1, and >= 0 per token: lower variance)
The sign matters: exp(sampler_lp - trainer_lp) - 1 - (sampler_lp - trainer_lp) would estimate KL(pi || mu)
only under samples from pi, so with sampler tokens it is biased; we do not use it.

All functions return 0-dim tensors on the inputs' device (call float() when logging).
"""

from __future__ import annotations

import torch


def _m(mask: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return (mask != 0).to(like.dtype) if mask.dtype != torch.bool else mask.to(like.dtype)


def _check(trainer_lp: torch.Tensor, sampler_lp: torch.Tensor, mask: torch.Tensor) -> None:
    if trainer_lp.shape != sampler_lp.shape or trainer_lp.shape != mask.shape:
        raise ValueError(f"trainer_lp {tuple(trainer_lp.shape)}, sampler_lp {tuple(sampler_lp.shape)} and mask "
                         f"{tuple(mask.shape)} must have the same shape")


def _mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    m = _m(mask, x)
    x = torch.where(m > 0, x, torch.zeros((), dtype=x.dtype, device=x.device))
    return x.sum() / m.sum().clamp(min=1.0)


def logprob_abs_diff(trainer_lp: torch.Tensor, sampler_lp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean |trainer_lp - sampler_lp| over sampled tokens."""
    _check(trainer_lp, sampler_lp, mask)
    return _mean((trainer_lp.float() - sampler_lp.float()).abs(), mask)


def k1_kl(trainer_lp: torch.Tensor, sampler_lp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of sampler_lp - trainer_lp: the k1 estimate of KL(sampler || trainer)."""
    _check(trainer_lp, sampler_lp, mask)
    return _mean(sampler_lp.float() - trainer_lp.float(), mask)


def k3_kl(trainer_lp: torch.Tensor, sampler_lp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of exp(r) - 1 - r with r = trainer_lp - sampler_lp: the k3 estimate of KL(sampler || trainer)."""
    _check(trainer_lp, sampler_lp, mask)
    r = (trainer_lp.float() - sampler_lp.float()).clamp(max=20.0)
    return _mean(torch.expm1(r) - r, mask)


def prob_ratio_max(trainer_lp: torch.Tensor, sampler_lp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Largest exp(trainer_lp - sampler_lp) over sampled tokens (how much TIS has to cap); 1 if none."""
    _check(trainer_lp, sampler_lp, mask)
    r = torch.where(mask != 0, trainer_lp.float() - sampler_lp.float(),
                    torch.full((), float("-inf"), device=trainer_lp.device))
    top = r.max() if r.numel() else torch.zeros((), device=r.device)
    return torch.where(torch.isfinite(top), top.clamp(max=80.0).exp(), torch.ones((), device=r.device))


def _row_sets(own: torch.Tensor, recorded: torch.Tensor, mask: torch.Tensor | None
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """(differ, valid), both [..., layers] bool."""
    if own.shape != recorded.shape:
        raise ValueError(f"routing shapes differ: trainer {tuple(own.shape)} vs sampler {tuple(recorded.shape)}")
    if own.dim() < 2:
        raise ValueError(f"routing must be [..., layers, k]; got shape {tuple(own.shape)}")
    a = torch.sort(own.long(), dim=-1).values
    b = torch.sort(recorded.to(own.device).long(), dim=-1).values
    # A -1 anywhere means the sampler never routed that token-layer (or only partially): not comparable.
    valid = (b >= 0).all(dim=-1) & (a >= 0).all(dim=-1)
    if mask is not None:
        if mask.shape != own.shape[:-2]:
            raise ValueError(f"mask {tuple(mask.shape)} must match the routing's token dims {tuple(own.shape[:-2])}")
        valid = valid & (mask.to(own.device) != 0).unsqueeze(-1)
    differ = (a != b).any(dim=-1) & valid
    return differ, valid


def routing_disagreement(own: torch.Tensor, recorded: torch.Tensor, mask: torch.Tensor | None = None
                         ) -> torch.Tensor:
    """Fraction of token-layer rows whose top-k expert *sets* differ between the trainer's own router (`own`)
    and the sampler's record (`recorded`), both [..., layers, k]. Order within a row does not matter. Rows with
    a -1 in either are ignored; with `mask` ([...], the token dims) only mask-1 tokens count. 0 if no row."""
    differ, valid = _row_sets(own, recorded, mask)
    return differ.sum().float() / valid.sum().clamp(min=1).float()


def routing_disagreement_per_layer(own: torch.Tensor, recorded: torch.Tensor, mask: torch.Tensor | None = None
                                   ) -> torch.Tensor:
    """The same fraction for each MoE layer: [layers] float (0 for a layer with no comparable row)."""
    differ, valid = _row_sets(own, recorded, mask)
    layers = own.shape[-2]
    d = differ.reshape(-1, layers).sum(0).float()
    v = valid.reshape(-1, layers).sum(0).clamp(min=1).float()
    return d / v


def mismatch_metrics(trainer_lp: torch.Tensor, sampler_lp: torch.Tensor, mask: torch.Tensor,
                     own_routing: torch.Tensor | None = None, sampler_routing: torch.Tensor | None = None,
                     prefix: str = "mismatch/") -> dict[str, float]:
    """All of the above as floats, keyed for the metrics logger (one device sync)."""
    vals = {
        "logprob_abs_diff": logprob_abs_diff(trainer_lp, sampler_lp, mask),
        "k1_kl": k1_kl(trainer_lp, sampler_lp, mask),
        "k3_kl": k3_kl(trainer_lp, sampler_lp, mask),
        "prob_ratio_max": prob_ratio_max(trainer_lp, sampler_lp, mask),
    }
    if own_routing is not None and sampler_routing is not None:
        vals["routing_disagreement"] = routing_disagreement(own_routing, sampler_routing, mask)
    stacked = torch.stack([v.float().reshape(()) for v in vals.values()]).tolist()
    return {prefix + k: float(v) for k, v in zip(vals, stacked)}
