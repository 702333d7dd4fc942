"""Rewards: turn a trajectory's verifier result into rewards placed on its sampled tokens.

Why here and not in the verifier: the verifier reports facts (tests passed, tests run, errors); how those facts
become a learning signal is a training choice. Modes:

- `count` (default): the absolute number of passing tests. Tasks with more tests weigh more, on purpose: every
  test is one unit of credit.
- `fraction`: n_passed / n_total.
- `binary`: 1.0 if every test passed (n_total > 0 and n_passed == n_total), else 0.0.
- `count_over_nop`: passing tests minus those that pass when the agent does nothing (`Trajectory.nop_passed`,
  measured once per task by conch.tasks.nop), floor 0: a reward that cannot be earned by doing nothing.
- `progress`: dense, in count units. The rollout measured the passing count every k turns
  (`Trajectory.progress`, a list of (turn index, n_passed)); turn i's measurement is rewarded with the change
  since the previous measurement (the first one against 0) on the last sampled token of turn i, and the final
  verifier result closes the sequence with its own change on the last sampled token of the trajectory. The
  rewards telescope: they sum to the final n_passed, the `count` reward, so `progress` redistributes credit in
  time without changing the episode total.

Terminal modes place their single reward on the last sampled token.

Exclusion is never a zero: a trajectory whose episode errored (sandbox/engine failure), whose verifier errored
for a reason not the agent's (`verifier_fault = "infra"`: a missing module, a dependency conch could not serve,
a sandbox failure), whose verification was tampered with (results inconsistent with the task's tests), that
reported no test outcomes, or that has no sampled token, is *excluded* from the loss; `exclusion_reason` says
why, and the scoring functions return None for it. Scoring such a trajectory 0 would punish the policy for
infrastructure failures. A verifier error the agent caused (`verifier_fault = "agent"`: the tests did not
finish, the verifier ran out of memory or disk, a result file refused) is scored as a failure (n_passed = 0)
and trained on: otherwise breaking the verifier whenever it is failing would cost a policy nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from conch.agent.trajectory import error_reason

if TYPE_CHECKING:
    from conch.agent.trajectory import Trajectory

REWARD_MODES = ("count", "fraction", "binary", "progress", "count_over_nop")


def check_mode(mode: str) -> str:
    if mode not in REWARD_MODES:
        raise ValueError(f"unknown reward mode {mode!r}; choose one of {', '.join(REWARD_MODES)}")
    return mode


def exclusion_reason(traj: "Trajectory") -> str | None:
    """Why `traj` must be left out of the loss, or None when it can be scored."""
    if why := error_reason(traj):
        return why
    if traj.n_total <= 0:
        return "verifier reported no test outcomes (n_total = 0)"
    if not any(traj.mask):
        return "no sampled tokens"
    if len(traj.mask) != len(traj.tokens):
        return f"mask has {len(traj.mask)} entries for {len(traj.tokens)} tokens"
    return None


def scalar_reward(traj: "Trajectory", mode: str = "count") -> float | None:
    """The episode's total reward in `mode` (for `progress`: the sum of its placements, i.e. n_passed);
    None when the trajectory is excluded."""
    check_mode(mode)
    if exclusion_reason(traj) is not None:
        return None
    if mode == "fraction":
        return traj.n_passed / traj.n_total
    if mode == "binary":
        return 1.0 if traj.n_passed == traj.n_total else 0.0
    if mode == "count_over_nop":
        nop = getattr(traj, "nop_passed", None)
        if nop is None:
            raise ValueError(f"trajectory {traj.task}#{traj.sample}: reward mode count_over_nop needs its task's "
                             "nop count (conch.tasks.nop.attach)")
        return float(max(0, traj.n_passed - nop))
    return float(traj.n_passed)  # count, and progress's telescoped total


def last_sampled_index(mask: list[int], before: int | None = None) -> int | None:
    """Index of the last mask-1 token strictly before `before` (default: the end), or None."""
    end = len(mask) if before is None else min(before, len(mask))
    for i in range(end - 1, -1, -1):
        if mask[i]:
            return i
    return None


def reward_placements(traj: "Trajectory", mode: str = "count") -> list[tuple[int, float]] | None:
    """[(token index, reward)] in increasing token order, indices unique, every index a sampled token;
    None when the trajectory is excluded."""
    check_mode(mode)
    if exclusion_reason(traj) is not None:
        return None
    last = last_sampled_index(traj.mask)
    assert last is not None  # exclusion_reason guarantees a sampled token
    if mode != "progress":
        value = scalar_reward(traj, mode)
        assert value is not None
        return [(last, value)]
    placed: dict[int, float] = {}
    prev = 0
    for turn_idx, n_passed in sorted(traj.progress, key=lambda p: p[0]):
        if not 0 <= turn_idx < len(traj.turns):
            raise ValueError(f"trajectory {traj.task}#{traj.sample}: progress entry for turn {turn_idx} but the "
                             f"trajectory has {len(traj.turns)} turns")
        idx = last_sampled_index(traj.mask, traj.turns[turn_idx].end)
        if idx is None:  # a turn with no sampled token before it cannot happen in a real episode; be safe
            idx = last
        placed[idx] = placed.get(idx, 0.0) + float(n_passed - prev)
        prev = n_passed
    placed[last] = placed.get(last, 0.0) + float(traj.n_passed - prev)
    return sorted(placed.items())


def token_rewards(traj: "Trajectory", mode: str = "count", device: torch.device | str | None = None,
                  dtype: torch.dtype = torch.float32) -> torch.Tensor | None:
    """Per-token rewards [len(traj.tokens)] (zero except at the placements); None when excluded."""
    placements = reward_placements(traj, mode)
    if placements is None:
        return None
    out = torch.zeros(len(traj.tokens), dtype=dtype)
    for idx, value in placements:
        out[idx] += value
    return out if device is None else out.to(device)


def partition(trajs: "list[Trajectory]") -> "tuple[list[Trajectory], list[tuple[Trajectory, str]]]":
    """(scoreable, [(excluded, reason)]): filter before building a training batch."""
    kept, excluded = [], []
    for tr in trajs:
        why = exclusion_reason(tr)
        if why is None:
            kept.append(tr)
        else:
            excluded.append((tr, why))
    return kept, excluded


def batch_rewards(trajs: "list[Trajectory]", mode: str = "count", length: int | None = None,
                  device: torch.device | str | None = None) -> torch.Tensor:
    """[B, length] rewards (length defaults to the longest trajectory; right padding is zero), aligned with a
    right-padded batch of the same trajectories. Raises ValueError on an excluded trajectory (filter with
    `partition` first: an excluded trajectory has no reward, not a zero one)."""
    width = max((len(tr.tokens) for tr in trajs), default=0) if length is None else length
    out = torch.zeros(len(trajs), width)
    for b, tr in enumerate(trajs):
        row = token_rewards(tr, mode)
        if row is None:
            raise ValueError(f"trajectory {tr.task}#{tr.sample} is excluded ({exclusion_reason(tr)}); "
                             f"filter with partition() before batch_rewards")
        if row.numel() > width:
            raise ValueError(f"trajectory {tr.task}#{tr.sample} has {row.numel()} tokens, more than length {width}")
        out[b, :row.numel()] = row
    return out if device is None else out.to(device)


def error_counts(trajs: "list[Trajectory]") -> dict[str, float]:
    """Verifier errors by whose fault they were, and tampered verifications (metrics, report, `conch check`)."""
    tampered = [t for t in trajs if t.tampered]
    errors = [t for t in trajs if t.verifier_error and not t.tampered]
    agent = sum(1 for t in errors if t.verifier_fault == "agent")
    return {"reward/agent_errors": float(agent), "reward/infra_errors": float(len(errors) - agent),
            "reward/tampered": float(len(tampered))}


def reward_metrics(trajs: "list[Trajectory]", mode: str = "count") -> dict[str, float]:
    """`reward/` metrics over a rollout batch: means over scored trajectories, counts of excluded ones."""
    kept, excluded = partition(trajs)
    n = len(kept)
    out: dict[str, float] = {
        "reward/scored": float(n),
        "reward/excluded": float(len(excluded)),
        "reward/excluded_verifier": float(sum(1 for _, why in excluded if why.startswith("verifier error"))),
        "reward/excluded_episode": float(sum(1 for _, why in excluded if why.startswith("episode error"))),
        **error_counts(trajs),
    }
    if n:
        out["reward/mean"] = sum(scalar_reward(tr, mode) or 0.0 for tr in kept) / n
        out["reward/pass_all"] = sum(1.0 for tr in kept if tr.n_passed == tr.n_total) / n
        out["reward/tests_passed_mean"] = sum(tr.n_passed for tr in kept) / n
        out["reward/test_fraction_mean"] = sum(tr.n_passed / tr.n_total for tr in kept) / n
    return out
