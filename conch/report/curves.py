"""The run's curves, read from what the run wrote (metrics.jsonl, sft.done.json, critic.done.json, evals/), as
plain series that both the HTML report (plotly) and the PNGs (matplotlib) draw.

Why one list of panels: the HTML and the PNGs must show the same numbers; each panel names its metric keys once,
and a panel whose keys the run never logged is left out rather than drawn empty.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from conch.report.store import family_of


@dataclass
class Series:
    name: str
    x: list[float]
    y: list[float | None]


@dataclass
class Panel:
    id: str
    title: str
    xlabel: str
    series: list[Series]
    vlines: list[tuple[float, str]] = field(default_factory=list)  # (x, label): learning-rate cuts
    note: str = ""


# (panel id, title, metric keys) over PPO iterations; a key missing from every row is skipped.
PPO_PANELS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("ppo-reward", "PPO reward", ("reward/mean",)),
    ("ppo-pass", "PPO pass rate and tests passed", ("reward/pass_all", "reward/tests_passed_mean", "reward/n_passed_mean")),
    ("ppo-errors", "verifier errors and tampering per iteration (agent-caused are scored 0; infra and tampered "
     "are excluded)", ("reward/agent_errors", "reward/infra_errors", "reward/tampered", "reward/excluded")),
    ("ppo-kl", "KL (approx. to old policy, to reference)", ("train/approx_kl", "train/kl_ref", "train/ref_kl")),
    ("ppo-clip", "clip fraction", ("train/clip_frac", "train/dual_clip_frac", "train/value_clip_frac")),
    ("ppo-entropy", "entropy", ("train/entropy",)),
    ("ppo-value", "value loss", ("train/value_loss",)),
    ("ppo-ev", "explained variance of the critic", ("train/explained_variance",)),
    ("mismatch", "train/inference mismatch", ("mismatch/logprob_abs_diff", "mismatch/k3_kl", "mismatch/k1_kl",
                                               "mismatch/routing_disagreement")),
    ("timings", "seconds per iteration", ("time/iteration_s", "time/rollout_s", "time/update_s",
                                          "time/trajectory_write_s")),
    ("throughput", "throughput (tokens/s)", ("rollout/tokens_per_s", "train/tokens_per_s")),
)


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def eval_names(run_dir: Path) -> list[str]:
    """Evaluation names in the order they happen: init, warm, iter1, iter2, ..., final (heldout_* after)."""
    names = [p.stem for p in (run_dir / "evals").glob("*.json")]

    def key(n: str) -> tuple:
        base = n.removeprefix("heldout_")
        m = re.fullmatch(r"iter(\d+)", base)
        order = {"init": -2, "warm": -1, "final": 10**9}.get(base, int(m.group(1)) if m else 10**8)
        return (n.startswith("heldout_"), order, n)

    return sorted(names, key=key)


def eval_step(name: str, iterations: int) -> int:
    base = name.removeprefix("heldout_")
    return int(base[4:]) if base.startswith("iter") else iterations if base == "final" else 0


def last_attempt(rows: list[dict], key: str) -> list[dict]:
    """The rows of the last attempt of a stage: an interrupted stage that ran again (`--resume`) starts its
    counter over, and a PPO iteration logged twice keeps its last record."""
    if key == "iteration":
        return list({r["iteration"]: r for r in rows}.values())
    out: list[dict] = []
    for r in rows:
        if out and r[key] <= out[-1][key]:
            out = []
        out.append(r)
    return out


def panels(run_dir: Path) -> list[Panel]:
    from conch.rl.metrics import read_metrics

    rows = read_metrics(run_dir, stages=True)
    ppo = sorted(last_attempt([r for r in rows if "stage" not in r], "iteration"), key=lambda r: r["iteration"])
    out: list[Panel] = []
    sft = read_json(run_dir / "sft.done.json") or {}
    sft_rows = last_attempt([r for r in rows if r.get("stage") == "sft"], "step")
    train = [(r["step"], r.get("sft/loss")) for r in sft_rows] or [tuple(p) for p in sft.get("train_curve", [])]
    val = [(r["step"], r["sft/val_loss"]) for r in sft_rows if "sft/val_loss" in r] or \
          [tuple(p) for p in sft.get("val_curve", [])]
    if train or val:
        cuts = sft.get("lr_cuts") or [r["step"] for r in sft_rows if r.get("sft/lr_cut")]
        out.append(Panel("sft-loss", "SFT loss (dashed: learning-rate cuts)", "SFT step",
                         [Series("train", [p[0] for p in train], [_num(p[1]) for p in train]),
                          Series("validation", [p[0] for p in val], [_num(p[1]) for p in val])],
                         vlines=[(float(c), "lr cut") for c in cuts]))
    crit = last_attempt([r for r in rows if r.get("stage") == "critic"], "step")
    ev = [(r["step"] + 1, r.get("critic/explained_variance")) for r in crit] or \
         [(i + 1, v) for i, v in enumerate((read_json(run_dir / "critic.done.json") or {}).get("explained_variance", []))]
    if ev:
        out.append(Panel("critic-ev", "critic warm-up: explained variance (actor frozen)", "warm-up iteration",
                         [Series("explained variance", [p[0] for p in ev], [_num(p[1]) for p in ev])],
                         note="1 = the critic predicts returns exactly; 0 = no better than their mean"))
    for pid, title, keys in PPO_PANELS:
        series = [Series(k, [r["iteration"] for r in ppo if k in r], [_num(r[k]) for r in ppo if k in r])
                  for k in keys if any(k in r for r in ppo)]
        if series:
            out.append(Panel(pid, title, "PPO iteration", series))
    out.extend(eval_panels(run_dir, ppo))
    return out


def eval_panels(run_dir: Path, ppo: list[dict]) -> list[Panel]:
    """Eval pass rate over PPO iterations, overall and per family (from RUNDIR/evals/*.json)."""
    iterations = max([r["iteration"] + 1 for r in ppo], default=0)
    out = []
    for heldout in (False, True):
        fams: dict[str, list[tuple[int, float]]] = {}
        for name in eval_names(run_dir):
            if name.startswith("heldout_") != heldout:
                continue
            d = read_json(run_dir / "evals" / f"{name}.json")
            if not d:
                continue
            step = eval_step(name, iterations)
            if d.get("pass_rate") is not None:  # None: no episode of that evaluation ran
                fams.setdefault("all", []).append((step, d["pass_rate"]))
            per: dict[str, list[float]] = {}
            for task, v in d.get("per_task", {}).items():
                if v.get("pass_rate") is not None:
                    per.setdefault(family_of(task), []).append(v["pass_rate"])
            for fam, xs in per.items():
                fams.setdefault(fam, []).append((step, sum(xs) / len(xs)))
        if fams:
            title = "heldout families: pass rate" if heldout else "evaluation pass rate per family"
            out.append(Panel("eval-heldout" if heldout else "eval-families", title,
                             "PPO iteration (init and warm at 0)",
                             [Series(f, [p[0] for p in pts], [p[1] for p in pts]) for f, pts in sorted(fams.items())]))
    return out


def write_pngs(panel_list: list[Panel], out_dir: Path) -> list[Path]:
    """One PNG per panel in `out_dir` (matplotlib, Agg: no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for p in panel_list:
        fig, ax = plt.subplots(figsize=(6.4, 3.6), dpi=110)
        for s in p.series:
            pts = [(x, y) for x, y in zip(s.x, s.y) if y is not None]
            ax.plot([a for a, _ in pts], [b for _, b in pts], marker="o" if len(pts) < 30 else None, ms=3,
                    label=s.name)
        for x, _label in p.vlines:
            ax.axvline(x, ls="--", lw=1, color="grey")
        ax.set_title(p.title, fontsize=10)
        ax.set_xlabel(p.xlabel)
        ax.grid(alpha=0.3)
        if len(p.series) > 1:
            ax.legend(fontsize=7)
        fig.tight_layout()
        path = out_dir / f"{p.id}.png"
        fig.savefig(path)
        plt.close(fig)
        paths.append(path)
    return paths
