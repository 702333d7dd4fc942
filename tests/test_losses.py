"""PPO losses: masking, clipping at the boundaries, dual clip, asymmetric clip, value clipping, TIS, KL,
aggregation, and chunked log-prob/entropy against a direct computation."""

import math

import pytest
import torch

from conch.rl.losses import (LossConfig, LossStats, aggregate, chunked_logprobs_and_entropy, kl_estimate,
                             logprobs_and_entropy_from_logits, policy_loss, ppo_loss, tis_weights, value_loss)


def one(ratio: float, adv: float, **kw):
    """Policy loss and d loss / d new_logp for a single sampled token with the given ratio."""
    new = torch.tensor([[math.log(ratio)]], requires_grad=True)
    loss, stats = policy_loss(new, torch.zeros(1, 1), torch.tensor([[adv]]), torch.ones(1, 1), **kw)
    loss.backward()
    return float(loss.detach()), float(new.grad), stats


def test_gradient_only_through_sampled_tokens():
    g = torch.Generator().manual_seed(0)
    new = torch.randn(2, 6, generator=g).requires_grad_(True)
    old = new.detach() + 0.05 * torch.randn(2, 6, generator=g)
    old[0, 2] = float("nan")  # garbage on an inserted token must not leak
    adv = torch.randn(2, 6, generator=g)
    mask = torch.tensor([[1, 1, 0, 1, 0, 0], [0, 1, 1, 1, 1, 0]])
    values = torch.randn(2, 6, generator=g).requires_grad_(True)
    ent = torch.rand(2, 6, generator=g).requires_grad_(True)
    cfg = LossConfig(entropy_coef=0.01, kl_coef=0.1)
    total, stats = ppo_loss(cfg, new, old, adv, mask, values=values, old_values=values.detach(),
                            returns=torch.randn(2, 6, generator=g), entropy=ent, ref_logp=old.nan_to_num(0.0),
                            sampler_logp=old.nan_to_num(0.0))
    total.backward()
    assert torch.isfinite(total)
    assert all(math.isfinite(v) for v in stats.to_dict().values())
    off = mask == 0
    for grad in (new.grad, values.grad, ent.grad):
        assert torch.all(grad[off] == 0)
        assert torch.any(grad[~off] != 0)
    assert float(stats.num_tokens) == 7


def test_unclipped_inside_the_trust_region():
    loss, grad, stats = one(1.1, 2.0, clip_low=0.2, clip_high=0.2)
    assert math.isclose(loss, -2.0 * 1.1, rel_tol=1e-6)
    assert math.isclose(grad, -2.0 * 1.1, rel_tol=1e-5)  # d(-A e^x)/dx = -A ratio
    assert float(stats.clip_frac) == 0


@pytest.mark.parametrize("adv,ratio,clipped", [
    (1.0, 1.25, True),    # A > 0, above 1 + eps_high: no gradient
    (1.0, 1.15, False),   # A > 0, inside
    (1.0, 0.5, False),    # A > 0, below 1 - eps_low: still pushed up (pessimistic min keeps ratio term)
    (-1.0, 0.75, True),   # A < 0, below 1 - eps_low: no gradient
    (-1.0, 0.85, False),  # A < 0, inside
    (-1.0, 1.5, False),   # A < 0, above 1 + eps_high: still pushed down (no dual clip here)
])
def test_clip_boundaries(adv, ratio, clipped):
    loss, grad, stats = one(ratio, adv, clip_low=0.2, clip_high=0.2)
    if clipped:
        bound = 1.2 if adv > 0 else 0.8
        assert math.isclose(loss, -adv * bound, rel_tol=1e-6)
        assert grad == 0.0
        assert float(stats.clip_frac) == 1.0
    else:
        assert math.isclose(loss, -adv * ratio, rel_tol=1e-5)
        assert grad != 0.0
        assert float(stats.clip_frac) == 0.0


def test_asymmetric_clip():
    # eps_high = 0.28 lets ratio 1.25 through for A > 0, eps_low = 0.2 still clips 0.75 for A < 0.
    loss, grad, _ = one(1.25, 1.0, clip_low=0.2, clip_high=0.28)
    assert math.isclose(loss, -1.25, rel_tol=1e-5) and grad != 0
    loss, grad, _ = one(1.30, 1.0, clip_low=0.2, clip_high=0.28)
    assert math.isclose(loss, -1.28, rel_tol=1e-6) and grad == 0
    loss, grad, _ = one(0.75, -1.0, clip_low=0.2, clip_high=0.28)
    assert math.isclose(loss, 0.8, rel_tol=1e-6) and grad == 0
    loss, grad, _ = one(0.75, -1.0, clip_low=0.3, clip_high=0.28)
    assert math.isclose(loss, 0.75, rel_tol=1e-5) and grad != 0


def test_dual_clip_bounds_negative_advantages():
    # A < 0 and a huge ratio: standard PPO loss is -A * ratio = 10, unbounded; dual clip caps it at c * |A|.
    loss, grad, stats = one(10.0, -1.0, clip_low=0.2, clip_high=0.2)
    assert math.isclose(loss, 10.0, rel_tol=1e-5) and grad != 0
    loss, grad, stats = one(10.0, -1.0, clip_low=0.2, clip_high=0.2, dual_clip=3.0)
    assert math.isclose(loss, 3.0, rel_tol=1e-6) and grad == 0
    assert float(stats.dual_clip_frac) == 1.0 and float(stats.clip_frac) == 0.0
    # Below the bound the dual clip does nothing.
    loss, grad, stats = one(2.0, -1.0, clip_low=0.2, clip_high=0.2, dual_clip=3.0)
    assert math.isclose(loss, 2.0, rel_tol=1e-5) and grad != 0 and float(stats.dual_clip_frac) == 0
    # Positive advantages are never dual-clipped.
    loss, grad, stats = one(10.0, 1.0, clip_low=0.2, clip_high=0.2, dual_clip=3.0)
    assert math.isclose(loss, -1.2, rel_tol=1e-6) and float(stats.dual_clip_frac) == 0
    with pytest.raises(ValueError, match="dual_clip"):
        one(1.0, 1.0, dual_clip=0.9)


def test_tis_weight_cap_and_scaling():
    old = torch.tensor([[0.0, 0.0, 0.0]])
    sampler = torch.tensor([[math.log(4.0), 0.0, -math.log(4.0)]])  # exp(old - sampler) = 0.25, 1, 4
    w = tis_weights(old, sampler, cap=2.0)
    assert torch.allclose(w, torch.tensor([[0.25, 1.0, 2.0]]))
    new = torch.zeros(1, 3, requires_grad=True)
    adv = torch.ones(1, 3)
    mask = torch.ones(1, 3)
    cfg = LossConfig(tis_cap=2.0, dual_clip=None)
    loss, stats = ppo_loss(cfg, new, old, adv, mask, sampler_logp=sampler)
    assert math.isclose(float(loss.detach()), -(0.25 + 1.0 + 2.0) / 3, rel_tol=1e-6)
    assert math.isclose(float(stats.tis_weight_mean), (0.25 + 1 + 2) / 3, rel_tol=1e-6)
    assert math.isclose(float(stats.tis_capped_frac), 1 / 3, rel_tol=1e-6)
    loss.backward()
    assert torch.allclose(new.grad, -w / 3)  # the weight is a constant, not differentiated
    loss_off, _ = ppo_loss(LossConfig(tis_cap=None, dual_clip=None), new, old, adv, mask, sampler_logp=sampler)
    assert math.isclose(float(loss_off.detach()), -1.0, rel_tol=1e-6)


def test_value_clipping():
    old = torch.tensor([[1.0, 1.0, 1.0]])
    ret = torch.tensor([[3.0, 3.0, 0.0]])
    # token 0: v moved 1.0 -> 2.0 toward R=3: clipped v=1.2 is further, the max takes it -> no gradient.
    # token 1: v = 1.1 inside the clip range; token 2: v moved away from R beyond the range (unclipped wins).
    v = torch.tensor([[2.0, 1.1, 1.5]], requires_grad=True)
    loss, frac = value_loss(v, old, ret, torch.ones(1, 3), clip=0.2)
    expected = 0.5 * ((3 - 1.2) ** 2 + (3 - 1.1) ** 2 + 1.5 ** 2) / 3
    assert math.isclose(float(loss.detach()), expected, rel_tol=1e-6)
    assert math.isclose(float(frac), 1 / 3, rel_tol=1e-6)
    loss.backward()
    assert v.grad[0, 0] == 0 and v.grad[0, 1] != 0 and v.grad[0, 2] != 0
    unclipped, frac0 = value_loss(v, old, ret, torch.ones(1, 3), clip=None)
    assert math.isclose(float(unclipped.detach()), 0.5 * (1 + 1.9 ** 2 + 1.5 ** 2) / 3, rel_tol=1e-6) and float(frac0) == 0


def test_kl_estimators():
    logp = torch.tensor([-1.0, -2.0])
    ref = torch.tensor([-1.5, -1.0])
    r = ref - logp
    assert torch.allclose(kl_estimate(logp, ref, "k1"), -r)
    assert torch.allclose(kl_estimate(logp, ref, "k2"), 0.5 * r ** 2)
    assert torch.allclose(kl_estimate(logp, ref, "k3"), torch.exp(r) - 1 - r)
    assert torch.all(kl_estimate(logp, ref, "k3") >= 0)
    assert torch.all(kl_estimate(logp, logp, "k3") == 0)
    with pytest.raises(ValueError):
        kl_estimate(logp, ref, "k9")


def test_approx_kl_is_k3_between_new_and_old():
    new = torch.tensor([[-1.0, -0.5]])
    old = torch.tensor([[-1.2, -0.1]])
    _, stats = policy_loss(new, old, torch.zeros(1, 2), torch.ones(1, 2))
    lr = new - old
    assert math.isclose(float(stats.approx_kl), float((torch.exp(lr) - 1 - lr).mean()), rel_tol=1e-6)


def test_aggregation_modes_and_denominator():
    x = torch.tensor([[1.0, 2.0, 3.0, 0.0], [10.0, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]])
    assert math.isclose(float(aggregate(x, mask, "token-mean")), 16 / 4)
    assert math.isclose(float(aggregate(x, mask, "seq-mean-token-mean")), (2 + 10) / 2)
    # Gradient accumulation: two micro-batches scaled by the global token count add up to the full token-mean.
    parts = aggregate(x[:1], mask[:1], denom=4) + aggregate(x[1:], mask[1:], denom=4)
    assert math.isclose(float(parts), float(aggregate(x, mask)))
    with pytest.raises(ValueError):
        aggregate(x, mask, "sum")


def test_stats_mean_is_token_weighted_and_independent_of_denom():
    g = torch.Generator().manual_seed(3)
    new, old, adv = (torch.randn(2, 5, generator=g) for _ in range(3))
    mask = torch.tensor([[1, 1, 1, 1, 0], [1, 0, 0, 0, 0]])
    _, full = policy_loss(new, old, adv, mask)
    _, a = policy_loss(new[:1], old[:1], adv[:1], mask[:1], denom=5)
    _, b = policy_loss(new[1:], old[1:], adv[1:], mask[1:], denom=5)
    merged = LossStats.mean([a, b])
    assert math.isclose(merged["train/policy_loss"], float(full.policy_loss), rel_tol=1e-5)
    assert math.isclose(merged["train/approx_kl"], float(full.approx_kl), rel_tol=1e-5)
    assert merged["train/num_tokens"] == 5
    assert set(full.to_dict()) >= {"train/policy_loss", "train/clip_frac", "train/approx_kl"}


def test_chunked_logprobs_and_entropy_match_direct():
    g = torch.Generator().manual_seed(4)
    hidden = torch.randn(2, 9, 16, generator=g, dtype=torch.float64).requires_grad_(True)
    weight = torch.randn(50, 16, generator=g, dtype=torch.float64).requires_grad_(True)
    ids = torch.randint(0, 50, (2, 9), generator=g)
    mask = torch.rand(2, 9, generator=g) < 0.5
    temp = 0.7
    logits = (hidden @ weight.T) / temp
    logp_all = torch.log_softmax(logits, -1)
    ref_lp = logp_all.gather(-1, ids[..., None]).squeeze(-1)
    ref_ent = -(logp_all.exp() * logp_all).sum(-1)
    (ref_lp.sum() + ref_ent.sum()).backward()
    ref_gh, ref_gw = hidden.grad.clone(), weight.grad.clone()
    hidden.grad = weight.grad = None
    lp, ent = chunked_logprobs_and_entropy(hidden, weight, ids, chunk=4, temperature=temp)
    assert torch.allclose(lp.double(), ref_lp, atol=1e-5) and torch.allclose(ent.double(), ref_ent, atol=1e-5)
    (lp.sum() + ent.sum()).backward()
    assert torch.allclose(hidden.grad, ref_gh, atol=1e-4) and torch.allclose(weight.grad, ref_gw, atol=1e-4)
    # Masked: only mask-1 positions computed, zeros elsewhere, same values where computed.
    lpm, entm = chunked_logprobs_and_entropy(hidden, weight, ids, mask=mask, chunk=3, temperature=temp)
    assert torch.allclose(lpm[mask].double(), ref_lp[mask].detach(), atol=1e-5)
    assert torch.all(lpm[~mask] == 0) and torch.all(entm[~mask] == 0)
    lpl, entl = logprobs_and_entropy_from_logits(logits.detach(), ids, chunk=5)
    assert torch.allclose(lpl.double(), ref_lp.detach(), atol=1e-5)
    assert torch.allclose(entl.double(), ref_ent.detach(), atol=1e-5)
