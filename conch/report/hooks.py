"""What the training driver calls to keep trajectories, log every stage and show progress, a line per hook.

Why a recorder object: the driver (`rl/train.py`) should read like the algorithm; everything about *recording*
the run (which trajectories are kept, under what name, which metrics each stage logs, progress bars with ETA)
lives here, and moves with the driver when the driver is split into roles.
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

from conch.progress import Progress
from conch.report.store import TrajectoryStore, family_of


def eval_metrics(name: str, per_task: dict[str, dict[str, Any]], pass_rate: float | None,
                 tests_passed_mean: float | None, errors: int = 0) -> dict[str, float]:
    """`eval/<name>/pass_rate`, `eval/<name>/tests_passed_mean`, `eval/<name>/errors` and the pass rate of each
    task family, over the episodes that ran (a figure no episode measured is left out, never a zero)."""
    m = {f"eval/{name}/pass_rate": pass_rate, f"eval/{name}/tests_passed_mean": tests_passed_mean,
         f"eval/{name}/errors": float(errors)}
    m = {k: v for k, v in m.items() if v is not None}
    fams: dict[str, list[float]] = {}
    for task, d in per_task.items():
        if d.get("pass_rate") is not None:
            fams.setdefault(family_of(task), []).append(d["pass_rate"])
    for fam, xs in sorted(fams.items()):
        m[f"eval/{name}/family/{fam}/pass_rate"] = sum(xs) / len(xs)
    return m


def outcome_info(traj: Any) -> str:
    err = traj.error or traj.verifier_error
    return f"{traj.task}#{traj.sample} {traj.n_passed}/{traj.n_total}" + (" error" if err else "")


class RunRecorder:
    """Trajectories (RUNDIR/trajectories), stage metrics (`metrics.log_event`) and progress of one run."""

    def __init__(self, run_dir: Path, metrics: Any, keep_rollouts: int, seed: int = 0, sft_steps: int = 0) -> None:
        self.store = TrajectoryStore(run_dir)
        self.sft_steps = sft_steps
        self._sft_bar: Progress | None = None
        self.metrics = metrics
        self.keep_rollouts = keep_rollouts
        self.seed = seed

    @contextmanager
    def evaluation(self, name: str, total: int) -> Iterator[Callable[[Any], None]]:
        """An `on_done` callback for an evaluation's rollouts: keeps each trajectory, advances a progress bar."""
        bar = Progress(total, f"eval {name}")
        with self.store.writer(f"eval-{name}", "eval", name) as keep:
            def on_done(traj: Any) -> None:
                keep(traj)
                bar.update(info=outcome_info(traj))
            try:
                yield on_done
            finally:
                bar.close()

    def evaluated(self, name: str, res: Any, ppo_iterations: int) -> None:
        """Logs the evaluation at the PPO iteration it measures (init and warm: 0; iterN: N; final: the end)."""
        step = int(name[4:]) if name.startswith("iter") else ppo_iterations if "final" in name else 0
        self.metrics.log_event("eval", step, eval_metrics(name, res.per_task, res.pass_rate, res.tests_passed_mean,
                                                          res.errors))

    def rollout_progress(self, total: int, label: str) -> Callable[[Any], None]:
        bar = Progress(total, label)
        return lambda traj: bar.update(info=outcome_info(traj))

    def sft_step(self, step: int, values: dict[str, float]) -> None:
        if self._sft_bar is None:
            self._sft_bar = Progress(self.sft_steps, "SFT", late=True)
        self._sft_bar.update(info=f"loss {values['sft/loss']:.3f}")
        self.metrics.log_event("sft", step, values)

    def critic_iteration(self, i: int, stats: dict[str, Any]) -> None:
        keys = ("train/explained_variance", "train/value_loss", "train/value_clip_frac")
        self.metrics.log_event("critic", i, {"critic/" + k.split("/", 1)[1]: stats[k] for k in keys if k in stats})

    def ppo_iteration(self, it: int, prepared: list, excluded: list) -> float:
        """Keep `run.keep_rollouts` of this iteration's rollouts; the seconds spent (logged as
        `time/trajectory_write_s`, the cost of keeping them). `excluded`: the (trajectory, reason) pairs of
        `rl.rewards.partition`."""
        if self.keep_rollouts == 0:
            return 0.0
        return self.store.keep_ppo(it, prepared, self.keep_rollouts, seed=self.seed * 7919 + it,
                                   excluded=[traj for traj, _ in excluded])
