"""`conch report`: one self-contained HTML file for a run folder or a rollout file.

Why self-contained: a report is mailed, attached to an issue or opened on a cluster login node; it must open
with no network. plotly.js (MIT, ~4.8 MB, from the pinned `plotly` package) and the page's own script
(`report.js`) and style (`report.css`, shipped with conch) are inlined; the run's data is one JSON block.

What the page shows: the summary (init/warm/final, time per stage, config), every curve of `curves.panels`, a
trajectory browser over the kept trajectories (filters; transcript with per-test results; a token view coloured
by |trainer - sampler log-prob| with routing disagreements marked), and a per-task table across evaluations.
Trajectory details are embedded for at most MAX_DETAILED trajectories (all are listed), so the file stays a
few MB for long runs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from conch.report.curves import Panel, eval_names, panels, read_json
from conch.report.store import read_records

MAX_DETAILED = 300
MAX_TOKENS_SHOWN = 4000  # sampled tokens per trajectory in the token view
ASSETS = Path(__file__).parent / "assets"


def outcome(r: dict) -> str:
    if r.get("error") or r.get("verifier_error"):
        return "error"
    if r.get("solved"):
        return "solved"
    return "partial" if r.get("n_passed") else "failed"


def _when(r: dict) -> str:
    if r["stage"] == "ppo":
        return f"ppo iter {r['iteration']}"
    return f"{r['stage']} {r['name']}"


def _detail(r: dict) -> dict[str, Any]:
    """What the trajectory view needs: steps with their sampled tokens as [id, sampler lp, trainer lp, layers]."""
    toks, mask, slp, tlp = r["tokens"], r["mask"], r["sampler_lp"], r.get("trainer_lp")
    dis: dict[int, list[int]] = {}
    for t, layer in r.get("routing_disagreements") or []:
        dis.setdefault(t, []).append(layer)
    shown = 0
    steps = []
    for s in r["steps"]:
        span = s.get("span") or [0, 0]
        tv = []
        for i in range(span[0], min(span[1], len(toks))):
            if mask[i] != 1 or shown >= MAX_TOKENS_SHOWN:
                continue
            tv.append([toks[i], slp[i], tlp[i] if tlp is not None else None, dis.get(i)])
            shown += 1
        steps.append({k: s.get(k) for k in ("text", "command", "exit_code", "timed_out", "parse_error", "output",
                                            "gen_s", "env_s", "finish")} | {"tokens": tv})
    instruction = next((m.get("content", "") for m in r["messages"] if m.get("role") == "user"), "")
    return {"instruction": instruction, "steps": steps, "tests": r.get("tests", []), "cut": r.get("cut", []),
            "timings": r.get("timings", {}), "drift": r.get("drift", {}), "error": r.get("error"),
            "verifier_error": r.get("verifier_error"), "has_trainer": tlp is not None}


def _pick_detailed(records: list[dict]) -> set[int]:
    """All when few; else the latest evaluations and PPO iterations first, round-robin over (stage, name)."""
    if len(records) <= MAX_DETAILED:
        return set(range(len(records)))
    groups: dict[str, list[int]] = {}
    for i, r in enumerate(records):
        groups.setdefault(_when(r), []).append(i)
    order = sorted(groups, key=lambda g: -max(groups[g]))
    picked: set[int] = set()
    while len(picked) < MAX_DETAILED:
        for g in order:
            if groups[g] and len(picked) < MAX_DETAILED:
                picked.add(groups[g].pop(0))
    return picked


def _vocab(details: list[dict], tokenizer: Path | None) -> dict[int, str]:
    ids = {t[0] for d in details for s in d["steps"] for t in s["tokens"]}
    if tokenizer is None or not ids:
        return {}
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer))
    return {i: tok.decode([i], skip_special_tokens=False) for i in sorted(ids)}


def find_tokenizer(path: Path) -> Path | None:
    for sub in ("final", "warm", "init", "."):
        p = path / sub / "tokenizer.json" if path.is_dir() else path.parent / sub / "tokenizer.json"
        if p.exists():
            return p
    return None


def per_task(run_dir: Path | None, records: list[dict]) -> dict[str, Any]:
    """Pass rate of each task at each evaluation (RUNDIR/evals/*.json, or the kept records), and the tasks
    whose outcome changed between the first and the last evaluation (passing = pass rate >= 0.5)."""
    cols: dict[str, dict[str, float]] = {}
    if run_dir is not None and (run_dir / "evals").is_dir():
        for name in eval_names(run_dir):
            d = read_json(run_dir / "evals" / f"{name}.json")
            if d:
                cols[name] = {t: v["pass_rate"] for t, v in d.get("per_task", {}).items()}
    if not cols:
        acc: dict[str, dict[str, list[bool]]] = {}
        for r in records:
            if r["stage"] != "ppo":
                acc.setdefault(r["name"], {}).setdefault(r["task"], []).append(bool(r["solved"]))
        cols = {n: {t: sum(v) / len(v) for t, v in d.items()} for n, d in acc.items()}
    rows = []
    for main in (False, True):
        names = [n for n in cols if n.startswith("heldout_") == main]
        tasks = sorted({t for n in names for t in cols[n]})
        for t in tasks:
            rates = {n: cols[n].get(t) for n in names}
            seen = [v for v in rates.values() if v is not None]
            change = ""
            if len(seen) >= 2 and (seen[0] >= 0.5) != (seen[-1] >= 0.5):
                change = "fail→pass" if seen[-1] >= 0.5 else "pass→fail"
            rows.append({"task": t, "rates": rates, "change": change, "heldout": main})
    return {"columns": list(cols), "rows": rows}


def _summary(run_dir: Path | None) -> dict[str, Any]:
    if run_dir is None:
        return {}
    from conch.rl.metrics import read_metrics

    s = read_json(run_dir / "summary.json") or {}
    times = {}
    for name, f in (("corpus", "corpus.done.json"), ("SFT", "sft.done.json")):
        d = read_json(run_dir / f) or {}
        if isinstance(d.get("seconds"), (int, float)):
            times[name] = d["seconds"]
    ppo = read_metrics(run_dir)
    if ppo:
        times["PPO (rollout + update)"] = sum(r.get("time/iteration_s") or 0 for r in ppo)
        times["keeping trajectories"] = sum(r.get("time/trajectory_write_s") or 0 for r in ppo)
    if s.get("minutes"):
        times["whole run"] = s["minutes"] * 60
    evals = {n: (read_json(run_dir / "evals" / f"{n}.json") or {}) for n in eval_names(run_dir)}
    config = (run_dir / "config.toml").read_text() if (run_dir / "config.toml").exists() else ""
    return {"summary": s, "times": times, "iterations": len(ppo), "config": config,
            "evals": {n: {k: d.get(k) for k in ("pass_rate", "tests_passed_mean", "samples", "tasks", "errors",
                                                 "policy")}
                      for n, d in evals.items()}}


def _panel_json(p: Panel) -> dict[str, Any]:
    return {"id": p.id, "title": p.title, "xlabel": p.xlabel, "note": p.note, "vlines": p.vlines,
            "series": [{"name": s.name, "x": s.x, "y": s.y} for s in p.series]}


def build_data(path: Path, tokenizer: Path | None = None) -> dict[str, Any]:
    path = Path(path)
    run_dir = path if path.is_dir() else None
    records = list(read_records(path))
    detailed = _pick_detailed(records)
    index, details = [], {}
    for i, r in enumerate(records):
        index.append({"i": i, "stage": r["stage"], "name": r["name"], "iteration": r.get("iteration"),
                      "when": _when(r), "task": r["task"], "family": r["family"], "sample": r["sample"],
                      "outcome": outcome(r), "n_passed": r["n_passed"], "n_total": r["n_total"],
                      "reward": r.get("reward"), "stop": r["stop_reason"], "turns": len(r["steps"])})
        if i in detailed:
            details[i] = _detail(r)
    tokenizer = tokenizer or (find_tokenizer(path) if path.exists() else None)
    return {
        "title": (run_dir.name if run_dir else path.name),
        "source": str(path),
        "run": _summary(run_dir),
        "panels": [_panel_json(p) for p in (panels(run_dir) if run_dir else [])],
        "trajectories": index,
        "details": {str(k): v for k, v in details.items()},
        "vocab": {str(k): v for k, v in _vocab(list(details.values()), tokenizer).items()},
        "per_task": per_task(run_dir, records),
        "max_detailed": MAX_DETAILED,
    }


def _inline(text: str) -> str:
    return text.replace("</", "<\\/")


def render(data: dict[str, Any]) -> str:
    import html as _html

    from plotly.offline import get_plotlyjs

    page = (ASSETS / "report.html").read_text()
    blob = _inline(json.dumps(data, separators=(",", ":"), allow_nan=False, default=str))
    return (page.replace("{{TITLE}}", _html.escape(data["title"]))
                .replace("{{CSS}}", (ASSETS / "report.css").read_text())
                .replace("{{PLOTLY}}", _inline(get_plotlyjs()))
                .replace("{{APP}}", _inline((ASSETS / "report.js").read_text()))
                .replace("{{DATA}}", blob))


def _finite(obj: Any) -> Any:
    """NaN/inf -> None, recursively (strict JSON)."""
    import math

    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


def write_report(path: Path, out: Path, tokenizer: Path | None = None, pngs: bool = True) -> dict[str, Any]:
    """Write the HTML (and, for a run folder, RUNDIR/plots/*.png); returns what was written."""
    from conch.report.curves import write_pngs

    data = _finite(build_data(path, tokenizer))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render(data))
    written = {"html": str(out), "trajectories": len(data["trajectories"]), "panels": len(data["panels"]),
               "pngs": []}
    if pngs and Path(path).is_dir():
        written["pngs"] = [str(p) for p in write_pngs(panels(Path(path)), Path(path) / "plots")]
    return written
