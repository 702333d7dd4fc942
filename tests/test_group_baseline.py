"""`ppo.group_baseline`: each trajectory's final reward is centred on its task's mean over the K rollouts."""

from __future__ import annotations

from conch.agent.trajectory import Trajectory
from conch.rl.rewards import token_rewards
from conch.rl.update import _group_offsets, _shifted


def _t(task: str, n_passed: int, mask: list[int]) -> Trajectory:
    return Trajectory(task=task, sample=0, tokens=list(range(len(mask))), mask=mask,
                      logprobs=[0.0] * len(mask), n_passed=n_passed, n_total=4)


def test_offsets_are_task_means_and_land_on_the_last_sampled_token():
    a1, a2, b1 = _t("a", 3, [0, 1, 1, 0]), _t("a", 1, [0, 1, 1, 0]), _t("b", 0, [0, 0, 1, 1])
    bad = Trajectory(task="a", sample=9, tokens=[1], mask=[1], logprobs=[0.0], verifier_error="timeout", n_total=4)
    off = _group_offsets([a1, a2, b1, bad], "count")
    assert off == {id(a1): 2.0, id(a2): 2.0, id(b1): 0.0}  # the excluded trajectory is not in its group's mean
    r = _shifted(a2, token_rewards(a2, "count"), off[id(a2)])
    assert r.tolist() == [0.0, 0.0, -1.0, 0.0]  # 1 - 2 at index 2, the last sampled token
    assert _shifted(b1, token_rewards(b1, "count"), 0.0).tolist() == [0.0, 0.0, 0.0, 0.0]
