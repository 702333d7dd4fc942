"""The PPO update, end to end on the tiny model, moves probability the right way.

Unit tests check GAE and the losses piece by piece; this checks the assembled update (`prepare` +
`ppo_update`): after a few steps on two continuations of one prompt, the rewarded one is more likely and the
unrewarded one less likely than before. A sign or masking error anywhere in the chain fails it.
"""

from __future__ import annotations

import pytest
import torch

from conch.agent.trajectory import Trajectory
from conch.rl.batch import collate, policy_forward
from conch.rl.critic import ValueModel
from conch.rl.losses import LossConfig
from conch.rl.update import ppo_update, prepare


@pytest.fixture(scope="module")
def policy():
    from conch.model.loading import load_policy
    from conch.model.init import cached_model

    torch.manual_seed(0)
    return load_policy(cached_model(), dtype="float32", with_tokenizer=False).model


def _traj(policy, prompt: list[int], cont: list[int], n_passed: int, sample: int) -> Trajectory:
    t = Trajectory(task="bandit", sample=sample, tokens=prompt + cont, mask=[0] * len(prompt) + [1] * len(cont),
                   logprobs=[0.0] * (len(prompt) + len(cont)), n_passed=n_passed, n_total=3)
    batch = collate([t], pad_id=0, with_experts=False)
    with torch.no_grad():
        lp, _, _ = policy_forward(policy, batch, replay=False)
    t.logprobs = [float(x) if m else 0.0 for x, m in zip(lp[0].tolist(), t.mask)]
    return t


def _seq_logprob(policy, t: Trajectory) -> float:
    batch = collate([t], pad_id=0, with_experts=False)
    with torch.no_grad():
        lp, _, _ = policy_forward(policy, batch, replay=False)
    return float((lp * batch.mask).sum())


@pytest.mark.parametrize("lam", [0.95, 1.0])
def test_update_favours_the_rewarded_continuation(policy, lam):
    import copy

    pi = copy.deepcopy(policy)
    critic = ValueModel.from_policy(pi)
    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(10, 4000, (40,), generator=g).tolist()
    good_ids = torch.randint(10, 4000, (30,), generator=g).tolist()
    bad_ids = torch.randint(10, 4000, (30,), generator=g).tolist()
    good = [_traj(pi, prompt, good_ids, 3, i) for i in range(4)]
    bad = [_traj(pi, prompt, bad_ids, 0, 4 + i) for i in range(4)]
    before = (_seq_logprob(pi, good[0]), _seq_logprob(pi, bad[0]))
    opt_pi = torch.optim.AdamW(pi.parameters(), lr=1e-4)
    opt_v = torch.optim.AdamW(critic.parameters(), lr=1e-3)
    for it in range(3):
        prepared, _ = prepare(pi, critic, good + bad, 0, False, "count", 1.0, lam, micro_batch=4)
        ppo_update(pi, critic, opt_pi, opt_v, prepared, 0, False, LossConfig(), epochs=1, micro_batch=4,
                   grad_accum=1, max_grad_norm=1.0, seed=it)
    after = (_seq_logprob(pi, good[0]), _seq_logprob(pi, bad[0]))
    assert after[0] > before[0] + 0.5, (before, after)
    assert after[1] < before[1] - 0.5, (before, after)
