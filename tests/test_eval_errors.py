"""Evaluation figures are over the episodes that ran: an errored episode is counted apart, never a zero
(issue 35). Pure functions over hand-made trajectories; the end-to-end path is in test_train_e2e.py."""

from conch.agent.trajectory import StopReason, Trajectory
from conch.rl.figures import iteration_line, summary_table
from conch.rl.run_state import RunClock, clock_text
from conch.rl.stages import EvalResult, eval_result
from conch.config import Config


def _traj(task: str, passed: int, total: int = 2, **kw) -> Trajectory:
    t = Trajectory(task=task, sample=0, tokens=[1, 2], mask=[0, 1], logprobs=[0.0, -0.1])
    t.n_passed, t.n_total = passed, total
    for k, v in kw.items():
        setattr(t, k, v)
    return t


def test_errors_are_counted_apart_not_as_zero():
    trajs = [_traj("a", 2), _traj("a", 0), _traj("b", 0, verifier_error="No module named 'numpy'",
                                                   verifier_fault="infra"),
             _traj("b", 0, error="sandbox died", stop_reason=StopReason.ERROR),
             _traj("c", 0, verifier_error="verifier timed out after 60s", verifier_fault="agent")]
    res = eval_result(trajs)
    assert (res.samples, res.errors, res.ran, res.agent_errors) == (5, 2, 3, 1)
    assert res.pass_rate == 1 / 3  # a: one of two solved; c: the agent's error is a failure; b: not counted
    assert res.per_task["b"]["pass_rate"] is None and res.per_task["b"]["errors"] == 2
    assert list(res.error_tasks) == ["b"] and "numpy" in res.error_tasks["b"]
    assert "3 of 5 episodes ran; 2 errors not counted" in res.describe()
    again = EvalResult.from_json(res.to_json() | {"unknown": 1})
    assert again.errors == 2 and again.error_tasks == res.error_tasks


def test_an_evaluation_where_nothing_ran_has_no_figures():
    res = eval_result([_traj("a", 0, error="engine down", stop_reason=StopReason.ERROR)])
    assert res.pass_rate is None and res.tests_passed_mean is None and res.describe().startswith("no episode ran")


def test_iteration_line_says_k_of_n_eta_and_exclusions():
    cfg = Config()
    cfg.ppo.iterations, cfg.run.time_budget_minutes = 4, 0
    m = {"reward/scored": 6, "reward/excluded": 2, "reward/excluded_verifier": 1, "reward/excluded_episode": 1,
         "reward/mean": 1.5}
    line = iteration_line(1, cfg, m, [30.0, 50.0], 100.0)
    assert line.startswith("PPO iteration 2/4: reward 1.50 over 6 episodes, 2 excluded (1 verifier, 1 episode")
    assert "elapsed 1:40" in line and "ETA 1:20" in line
    line = iteration_line(3, cfg, {"reward/scored": 0, "reward/excluded": 8, "reward/excluded_verifier": 8}, [1.0],
                          10.0)
    assert "no episode scored, 8 excluded" in line and "ETA" not in line


def test_summary_table_shows_errors_and_a_readable_mismatch():
    s = {"pass_rate": {"init": 0.1, "warm": 0.2, "final": None}, "tests_passed_mean": {"init": 1, "warm": 2,
         "final": None}, "heldout_families": {"pass_rate": {}, "tests_passed_mean": {}}, "eval_tasks": 3,
         "eval_samples": 12, "eval_errors": {"init": 0, "warm": 2, "final": 12},
         "mismatch": {"logprob_abs_diff": 0.0123}, "minutes": 2.0}
    s["heldout_families"]["pass_rate"] = s["heldout_families"]["tests_passed_mean"] = \
        {"init": None, "warm": None, "final": None}
    text = summary_table(s)
    assert "errors (not counted)" in text and "{" not in text and "logprob abs diff 0.0123" in text


def test_run_clock_accumulates_over_processes(tmp_path):
    a = RunClock(tmp_path)
    a.before = 0.0
    a.t0 -= 90
    a.save()
    b = RunClock(tmp_path)
    assert b.processes == 2 and 90 <= b.total_seconds() < 95
    assert clock_text(3725) == "1:02:05" and clock_text(65) == "1:05"
