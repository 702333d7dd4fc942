"""The warm start's patience rule (SFT and critic warm-up): when it keeps weights, cuts the rate, stops."""

from conch.rl.plateau import Plateau


def test_improvements_are_kept_and_reset_patience():
    p = Plateau(patience=2, max_cuts=1)
    assert [p.observe(v) for v in (1.0, 0.5, 0.6, 0.4)] == ["best", "best", "wait", "best"]
    assert p.best == 0.4 and p.bad == 0 and p.scale == 1.0


def test_plateau_cuts_the_learning_rate_then_stops():
    p = Plateau(patience=2, max_cuts=2, lr_cut=0.3)
    actions = [p.observe(v) for v in (1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0)]
    assert actions == ["best", "wait", "cut", "wait", "cut", "wait", "stop"]
    assert p.cuts == 2 and abs(p.scale - 0.09) < 1e-12


def test_a_gain_below_min_delta_is_no_improvement():
    p = Plateau(patience=1, max_cuts=0, min_delta=1e-3)
    assert p.observe(0.0500) == "best"
    assert p.observe(0.0495) == "stop"
    assert p.best == 0.0500


def test_improvement_after_a_cut_restarts_patience():
    p = Plateau(patience=2, max_cuts=1)
    assert [p.observe(v) for v in (1.0, 1.0, 1.0, 0.5, 0.6, 0.6)] == ["best", "wait", "cut", "best", "wait", "stop"]


def test_critic_use_negated_explained_variance_and_nan_is_no_gain():
    p = Plateau(patience=2, max_cuts=0)
    assert [p.observe(-ev) for ev in (0.10, float("nan"), 0.1005)] == ["best", "wait", "stop"]
