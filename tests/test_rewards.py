"""Reward modes from verifier results: terminal placement, progress deltas, exclusion of errored trajectories."""

import pytest
import torch

from conch.agent.trajectory import StopReason, Trajectory, Turn
from conch.rl.rewards import exclusion_reason, reward_placements, scalar_reward, token_rewards


def make_traj(n_passed=3, n_total=5, progress=(), **kw) -> Trajectory:
    # prompt(3) | turn0 sampled 3..5 | obs 6..7 | turn1 sampled 8..9 | obs 10 | turn2 sampled 11..13 | trailing 14
    mask = [0, 0, 0, 1, 1, 1, 0, 0, 1, 1, 0, 1, 1, 1, 0]
    turns = [Turn(3, 6, "stop"), Turn(8, 10, "stop"), Turn(11, 14, "stop")]
    return Trajectory(task="t", sample=0, tokens=list(range(100, 100 + len(mask))), mask=mask,
                      logprobs=[-0.5 * m for m in mask], turns=turns, n_passed=n_passed, n_total=n_total,
                      progress=list(progress), **kw)


@pytest.mark.parametrize("mode,expected", [("count", 3.0), ("fraction", 0.6), ("binary", 0.0)])
def test_terminal_modes_on_last_sampled_token(mode, expected):
    tr = make_traj()
    r = token_rewards(tr, mode)
    assert r.shape == (15,)
    assert r[13] == pytest.approx(expected)
    assert float(r.sum()) == pytest.approx(expected)
    assert reward_placements(tr, mode) == [(13, pytest.approx(expected))]
    assert scalar_reward(tr, mode) == pytest.approx(expected)


def test_binary_all_pass():
    assert scalar_reward(make_traj(n_passed=5, n_total=5), "binary") == 1.0
    assert scalar_reward(make_traj(n_passed=4, n_total=5), "binary") == 0.0


def test_progress_deltas_on_turn_ends_and_final_closes():
    # Measured 1 passing after turn 0, 3 after turn 1; final verifier says 2 (a regression in turn 2).
    tr = make_traj(n_passed=2, progress=[(0, 1), (1, 3)])
    placements = reward_placements(tr, "progress")
    assert placements == [(5, 1.0), (9, 2.0), (13, -1.0)]
    r = token_rewards(tr, "progress")
    assert float(r.sum()) == pytest.approx(scalar_reward(tr, "count"))  # telescopes to the count reward
    assert torch.count_nonzero(r) == 3


def test_progress_measurement_on_last_turn_merges_with_final():
    tr = make_traj(n_passed=4, progress=[(2, 3), (0, 1)])  # unordered input
    assert reward_placements(tr, "progress") == [(5, 1.0), (13, 3.0)]  # 2 from turn 2's delta + 1 final


def test_progress_without_measurements_equals_count():
    tr = make_traj(n_passed=3)
    assert torch.equal(token_rewards(tr, "progress"), token_rewards(tr, "count"))


def test_progress_bad_turn_index():
    with pytest.raises(ValueError, match="turn 7"):
        reward_placements(make_traj(progress=[(7, 1)]), "progress")


@pytest.mark.parametrize("kw,why", [
    ({"verifier_error": "timeout"}, "verifier error"),
    ({"error": "SandboxError: boom", "stop_reason": StopReason.ERROR}, "episode error"),
    ({"stop_reason": StopReason.ERROR}, "episode error"),
    ({"n_total": 0, "n_passed": 0}, "no test outcomes"),
])
def test_errored_trajectories_are_excluded_not_zero(kw, why):
    tr = make_traj(**kw)
    assert why in exclusion_reason(tr)
    for mode in ("count", "fraction", "binary", "progress"):
        assert token_rewards(tr, mode) is None
        assert scalar_reward(tr, mode) is None
        assert reward_placements(tr, mode) is None


def test_no_sampled_tokens_excluded():
    tr = Trajectory(task="t", sample=0, tokens=[1, 2], mask=[0, 0], n_passed=1, n_total=1)
    assert exclusion_reason(tr) == "no sampled tokens"
    assert token_rewards(tr) is None


def test_unknown_mode():
    with pytest.raises(ValueError, match="unknown reward mode"):
        token_rewards(make_traj(), "dense")


def test_device_and_dtype():
    r = token_rewards(make_traj(), "count", device="cpu", dtype=torch.float64)
    assert r.dtype == torch.float64 and r.device.type == "cpu"


def test_partition_batch_rewards_and_metrics():
    from conch.rl.rewards import batch_rewards, partition, reward_metrics

    good = make_traj(n_passed=5, n_total=5)
    short = Trajectory(task="s", sample=1, tokens=[1, 2, 3], mask=[0, 1, 1], n_passed=1, n_total=2)
    bad = make_traj(verifier_error="timeout")
    kept, excluded = partition([good, bad, short])
    assert kept == [good, short] and excluded[0][0] is bad and "verifier" in excluded[0][1]
    r = batch_rewards(kept, "fraction")
    assert r.shape == (2, 15)
    assert r[0, 13] == 1.0 and r[1, 2] == 0.5 and float(r.sum()) == 1.5
    with pytest.raises(ValueError, match="partition"):
        batch_rewards([good, bad])
    m = reward_metrics([good, bad, short], "count")
    assert m["reward/scored"] == 2 and m["reward/excluded"] == 1 and m["reward/excluded_verifier"] == 1
    assert m["reward/mean"] == pytest.approx(3.0) and m["reward/pass_all"] == pytest.approx(0.5)
    assert m["reward/test_fraction_mean"] == pytest.approx(0.75)


def test_count_over_nop_cannot_be_earned_by_doing_nothing():
    assert scalar_reward(make_traj(n_passed=4, nop_passed=1), "count_over_nop") == 3.0
    assert scalar_reward(make_traj(n_passed=1, nop_passed=1), "count_over_nop") == 0.0  # what nop gets: 0
    assert scalar_reward(make_traj(n_passed=0, nop_passed=1), "count_over_nop") == 0.0  # floor 0
    assert reward_placements(make_traj(n_passed=5, nop_passed=2), "count_over_nop") == [(13, 3.0)]
    with pytest.raises(ValueError, match="nop count"):
        scalar_reward(make_traj(), "count_over_nop")


def test_nop_counts_cached_by_task_content(tmp_path, monkeypatch):
    import asyncio
    import shutil
    from pathlib import Path

    from conch.tasks import nop
    from conch.tasks.loader import load_tasks

    monkeypatch.setenv("CONCH_HOME", str(tmp_path / "home"))
    shutil.copytree(Path(__file__).resolve().parents[1] / "examples" / "tasks" / "word-count", tmp_path / "word-count")
    (task,) = load_tasks([tmp_path / "word-count"])
    assert nop.cached(task) is None
    nop.store(task, 1, 5)
    assert nop.cached(task) == 1
    assert asyncio.run(nop.nop_counts([task])) == {"word-count": 1}  # cached: no sandbox started
    trajs = [Trajectory(task="word-count", sample=0)]
    asyncio.run(nop.attach(trajs, [task]))
    assert trajs[0].nop_passed == 1 and trajs[0].verifier_error is None
    (tmp_path / "word-count" / "tests" / "test_outputs.py").write_text("def test_changed():\n    pass\n")
    (task,) = load_tasks([tmp_path / "word-count"])
    assert nop.cached(task) is None  # another task content: measured again


@pytest.mark.parametrize("mode", ["count", "fraction", "binary", "count_over_nop", "progress"])
def test_agent_caused_verifier_errors_are_scored_as_failures(mode):
    """Breaking the verifier must cost the policy: an agent-caused error scores 0 and is trained on."""
    tr = make_traj(n_passed=0, verifier_error="verifier timed out after 60s", verifier_fault="agent")
    tr.nop_passed = 1
    assert exclusion_reason(tr) is None
    assert scalar_reward(tr, mode) == 0.0


def test_infra_errors_and_tampering_are_excluded_and_counted():
    from conch.rl.rewards import reward_metrics

    infra = make_traj(verifier_error="dependency unavailable offline", verifier_fault="infra")
    forged = make_traj(n_passed=5, verifier_error="verifier result inconsistent", verifier_fault="agent",
                       tampered="1000 results for the task's 5 tests")
    broke = make_traj(n_passed=0, verifier_error="verifier timed out", verifier_fault="agent")
    assert "verifier error" in exclusion_reason(infra)
    assert "tampered" in exclusion_reason(forged)
    m = reward_metrics([infra, forged, broke, make_traj()])
    assert (m["reward/agent_errors"], m["reward/infra_errors"], m["reward/tampered"]) == (1, 1, 1)
    assert m["reward/scored"] == 2 and m["reward/excluded"] == 2
