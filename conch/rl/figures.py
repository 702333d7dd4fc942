"""What a run says about itself: the line after each PPO iteration, `summary.json` and the table printed at
the end. Kept apart from the driver (conch/rl/train.py) so the algorithm reads on one screen."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from conch.config import Config


def iteration_line(it: int, cfg: Config, m: dict[str, float], durations: list[float], elapsed: float) -> str:
    """"PPO iteration 3/16: reward 1.25 over 14 episodes, 2 excluded (1 verifier, 1 episode); 41 s; elapsed
    12:03, ETA 8:10" (ETA: this process's mean iteration time over the iterations left, within the budget)."""
    from conch.rl.run_state import clock_text

    n = cfg.ppo.iterations
    scored, excluded = int(m.get("reward/scored", 0)), int(m.get("reward/excluded", 0))
    reward = f"reward {m['reward/mean']:.2f} over {scored} episodes" if scored else "no episode scored"
    if excluded:
        reward += (f", {excluded} excluded ({int(m.get('reward/excluded_verifier', 0))} verifier, "
                   f"{int(m.get('reward/excluded_episode', 0))} episode, {int(m.get('reward/tampered', 0))} tampered)")
    left = sum(durations) / len(durations) * (n - it - 1)
    if cfg.run.time_budget_minutes:
        left = min(left, max(cfg.run.time_budget_minutes * 60 - elapsed, 0.0))
    eta = f", ETA {clock_text(left)}" if it + 1 < n else ""
    return f"PPO iteration {it + 1}/{n}: {reward}; {durations[-1]:.0f} s; elapsed {clock_text(elapsed)}{eta}"


def last_mismatch(run_dir: Path) -> dict[str, float]:
    from conch.rl.metrics import read_metrics

    rows = read_metrics(run_dir)
    if not rows:
        return {}
    last = rows[-1]
    return {k.split("/", 1)[1]: last.get(k) for k in ("mismatch/logprob_abs_diff", "mismatch/routing_disagreement")
            if k in last}


def make_summary(evals: dict, mismatch: dict, seconds: float, stopped_early: bool) -> dict[str, Any]:
    def pick(prefix: str, field: str) -> dict[str, float | None]:
        return {stage: (getattr(evals.get(f"{prefix}{stage}"), field, None)) for stage in ("init", "warm", "final")}

    final = evals.get("final")
    heldout = evals.get("heldout_final")
    return {
        "pass_rate": pick("", "pass_rate"),
        "tests_passed_mean": pick("", "tests_passed_mean"),
        "eval_tasks": final.tasks if final else 0,
        "eval_samples": final.samples if final else 0,
        "eval_errors": {stage: getattr(evals.get(stage), "errors", None) for stage in ("init", "warm", "final")},
        "heldout_families": {
            "pass_rate": pick("heldout_", "pass_rate"),
            "tests_passed_mean": pick("heldout_", "tests_passed_mean"),
            "tasks": heldout.tasks if heldout else 0,
        },
        "mismatch": mismatch,
        "minutes": seconds / 60,
        "stopped_early": stopped_early,
    }


def summary_table(summary: dict) -> str:
    lines = [f"{'':24}{'init':>8}{'warm':>8}{'final':>8}"]
    for label, d in (("pass rate", summary["pass_rate"]), ("tests passed (mean)", summary["tests_passed_mean"]),
                     ("heldout pass rate", summary["heldout_families"]["pass_rate"]),
                     ("heldout tests passed", summary["heldout_families"]["tests_passed_mean"])):
        cells = "".join(f"{v:8.3f}" if isinstance(v, (int, float)) else f"{'-':>8}" for v in (d["init"], d["warm"], d["final"]))
        lines.append(f"{label:24}{cells}")
    errors = summary.get("eval_errors") or {}
    if any(errors.values()):
        cells = "".join(f"{v:8d}" if isinstance(v, int) else f"{'-':>8}" for v in
                        (errors.get("init"), errors.get("warm"), errors.get("final")))
        lines.append(f"{'errors (not counted)':24}{cells}")
    mismatch = ", ".join(f"{k.replace('_', ' ')} {v:.4g}" for k, v in summary["mismatch"].items()
                         if isinstance(v, (int, float)))
    lines.append(f"eval: {summary['eval_tasks']} tasks, {summary['eval_samples']} samples"
                 + (f"; mismatch: {mismatch}" if mismatch else "") + f"; {summary['minutes']:.1f} min")
    return "\n".join(lines)
