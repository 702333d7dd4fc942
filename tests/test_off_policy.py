"""One-step-off-policy PPO: the sampler's (stale) log-probs are the ones the IS weight and the ratio mask see.

A batch is sampled by the policy before an update; the learner then updates once and scores that batch: its
old log-probs are the updated trainer's, the sampler log-probs stay the stale ones, so the train/sample ratio
moves away from 1, and a band narrower than that movement masks tokens out of the policy loss.
"""

from __future__ import annotations

import copy

import pytest
import torch

from conch.agent.trajectory import Trajectory
from conch.config import load_config
from conch.rl.batch import collate, policy_forward
from conch.rl.learner import Learner
from conch.rl.losses import LossConfig, ppo_loss, ratio_band_mask


def test_ratio_band_mask_engages_only_outside_its_band():
    old = torch.log(torch.tensor([[1.0, 1.0, 1.0, 1.0]]))
    sampler = torch.log(torch.tensor([[1.0, 0.4, 3.0, 1.0]]))  # ratios exp(old - sampler): 1, 2.5, 0.33, 1
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    keep = ratio_band_mask(old, sampler, mask, 0.5, 2.0)
    assert keep.tolist() == [[1.0, 0.0, 0.0, 0.0]]
    assert ratio_band_mask(old, sampler, mask, None, None) is None
    adv = torch.ones_like(old)
    _, st = ppo_loss(LossConfig(mask_low=0.5, mask_high=2.0), old.clone(), old, adv, mask, sampler_logp=sampler)
    assert float(st.mismatch_masked_frac) == pytest.approx(2 / 3)
    loss_masked, _ = ppo_loss(LossConfig(mask_low=0.5, mask_high=2.0, tis_cap=None), old.clone().requires_grad_(),
                              old, adv, mask, sampler_logp=sampler)
    loss_all, _ = ppo_loss(LossConfig(tis_cap=None), old.clone().requires_grad_(), old, adv, mask,
                           sampler_logp=sampler)
    assert float(loss_masked.detach()) == pytest.approx(float(loss_all.detach()) / 3)  # one of three tokens left, same denominator


@pytest.fixture(scope="module")
def policy():
    from conch.model.init import cached_model
    from conch.model.loading import load_policy

    torch.manual_seed(0)
    return load_policy(cached_model(), dtype="float32", with_tokenizer=False).model


def _sampled(policy, n: int) -> list[Trajectory]:
    g = torch.Generator().manual_seed(3)
    out = []
    for i in range(n):
        ids = torch.randint(10, 4000, (30,), generator=g).tolist()
        mask = [0] * 8 + [1] * 22
        t = Trajectory(task=f"t{i % 2}", sample=i, tokens=ids, mask=mask, logprobs=[0.0] * 30, n_passed=i % 3,
                       n_total=3)
        with torch.no_grad():
            lp, _, own = policy_forward(policy, collate([t], 0, with_experts=False), replay=False)
        t.logprobs = [float(x) if m else 0.0 for x, m in zip(lp[0].tolist(), mask)]
        t.routed_experts = own[0].to(torch.uint8).numpy()
        out.append(t)
    return out


def test_stale_sampler_logprobs_drive_is_and_the_mask(policy):
    cfg = load_config(overrides=["ppo.lr=3e-3", "ppo.critic_lr=1e-3", "ppo.micro_batch=2", "ppo.grad_accum=2",
                                 "ppo.epochs=1", "ppo.mask_low=0.9", "ppo.mask_high=1.1"])
    learner = Learner(cfg, copy.deepcopy(policy), None, pad_id=0)
    batch_k = _sampled(learner.policy, 4)
    batch_k1 = _sampled(learner.policy, 4)       # sampled on the same weights: rollout k+1 overlaps update k
    fresh = learner.score(batch_k)
    assert fresh.mismatch["mismatch/logprob_abs_diff"] < 1e-5  # on-policy: trainer == sampler
    learner.update(fresh, update_policy=True, seed=0)             # update k lands
    stale = learner.score(batch_k1)
    for p in stale.prepared:  # old log-probs are the updated trainer's; the sampler's are still the stale ones
        assert p.traj.logprobs == next(t for t in batch_k1 if t.sample == p.traj.sample).logprobs
    assert stale.mismatch["mismatch/logprob_abs_diff"] > 1e-3
    stats = learner.update(stale, update_policy=True, seed=1)
    assert stats["train/mismatch_masked_frac"] > 0.0  # ratios left the [0.9, 1.1] band
    assert stats["train/tis_weight_mean"] != pytest.approx(1.0, abs=1e-6)
