"""The corpus stage when the user names their own tasks (`corpus.train_tasks`): nothing is synthesized.

- Malformed tasks are reported by name and skipped; a batch never stops at one.
- With `corpus.decontam_against`, tasks that nearly copy a reference task are dropped first; the report is kept
  in RUNDIR/decontam.json.
- One folder: the tasks are split by task into SFT demonstrations / PPO pool / evaluation (`corpus.split`,
  seeded by `corpus.seed`). Two folders (`corpus.eval_tasks` too): SFT and PPO use the training folder.
- Demonstrations come from `corpus.sft_data` (a JSONL of chats), else from each SFT task's solution, run one
  command per turn in its sandbox and kept only when it passes (`conch/tasks/demos.py`).

Each split is a folder of symlinks to the user's task folders (RUNDIR/corpus/{sft,rl,eval}), so the rest of the
pipeline reads them like a synthesized corpus and the user's folders are never written.
"""

from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path
from typing import Any, Sequence

from conch.config import Config, ConfigError


def split_counts(n: int, shares: Sequence[float], priority: Sequence[int] = (1, 2, 0)) -> list[int]:
    """`n` split by `shares` (largest remainder). A share > 0 that rounded to zero takes one item from the
    largest part holding more than one, else from a part later in `priority` (default: PPO pool, then
    evaluation, then SFT: with two tasks, one is trained on by PPO and one evaluated)."""
    total = sum(shares)
    raw = [n * s / total for s in shares]
    counts = [int(r) for r in raw]
    for i in sorted(range(len(raw)), key=lambda i: raw[i] - counts[i], reverse=True)[: n - sum(counts)]:
        counts[i] += 1
    order = list(priority) + [i for i in range(len(shares)) if i not in priority]
    for rank, i in enumerate(order):
        if shares[i] <= 0 or counts[i]:
            continue
        donors = [j for j in range(len(counts)) if counts[j] > 1] or [j for j in order[rank + 1:] if counts[j]]
        if donors:
            j = max(donors, key=lambda j: counts[j])
            counts[j] -= 1
            counts[i] += 1
    return counts


def split_tasks(tasks: Sequence[Any], shares: Sequence[float], seed: int) -> list[list[Any]]:
    """Tasks (sorted by name, then shuffled by `seed`) cut into len(shares) disjoint parts."""
    order = sorted(tasks, key=lambda t: t.name)
    random.Random(seed).shuffle(order)
    parts, start = [], 0
    for c in split_counts(len(order), shares):
        parts.append(sorted(order[start:start + c], key=lambda t: t.name))
        start += c
    return parts


def parse_split(value: Any) -> list[float]:
    """`corpus.split` as three non-negative shares with a positive sum (ConfigError otherwise)."""
    try:
        shares = [float(v) for v in value]
    except (TypeError, ValueError):
        raise ConfigError(f"corpus.split: expected three numbers (SFT, PPO, eval), got {value!r}") from None
    if len(shares) != 3 or any(s < 0 for s in shares) or sum(shares) <= 0:
        raise ConfigError(f"corpus.split: expected three non-negative shares (SFT, PPO, eval) with a positive "
                          f"sum, got {value!r}")
    return shares


def load_user_tasks(folder: Path, log) -> list:
    from conch.tasks.loader import load_tasks
    from conch.tasks.model import TaskLoadError

    good = []
    for t in load_tasks([folder]):
        if isinstance(t, TaskLoadError):
            log(f"skipping malformed task {t.name}: {t}")
        else:
            good.append(t)
    return good


def link_tasks(tasks: Sequence[Any], folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    used: set[str] = set()
    for t in tasks:
        name, i = t.name, 1
        while name in used:
            i += 1
            name = f"{t.name}-{i}"
        used.add(name)
        link = folder / name
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(Path(t.path).resolve(), target_is_directory=True)
    return folder


def decontaminate_tasks(folders: Sequence[Path], against: Path, out: Path, log) -> set[Path]:
    """Resolved paths of the tasks under `folders` that nearly copy a task under `against`; report to `out`."""
    from conch.tasks.decontam import DEFAULT_THRESHOLD, decontaminate

    rows, flagged = [], set()
    for folder in folders:
        for m in decontaminate(folder, against, DEFAULT_THRESHOLD):
            rows.append({**m.to_json(), "path": str(m.path)})
            if m.flagged:
                flagged.add(Path(m.path).resolve())
    out.write_text(json.dumps({"against": str(against), "threshold": DEFAULT_THRESHOLD,
                               "flagged": sum(r["flagged"] for r in rows), "tasks": rows}, indent=2))
    names = sorted(r["task"] for r in rows if r["flagged"])
    log(f"decontamination against {against}: {len(rows)} task(s) scored, {len(names)} dropped"
        f"{': ' + ', '.join(names) if names else ''} (report: {out})")
    return flagged


def demonstrations(cfg: Config, sft_tasks: Sequence[Any], out: Path, log) -> Path | None:
    """The SFT chats as a JSONL file at `out`, or None when there are none."""
    from conch.tasks.demos import demonstrate_all, read_sft_data

    c = cfg.corpus
    if c.sft_data:
        chats = read_sft_data(Path(c.sft_data))
        log(f"SFT demonstrations: {len(chats)} chat(s) from {c.sft_data}")
    else:
        with_solution = [t for t in sft_tasks if t.solution_script or t.solution_commands]
        for t in sft_tasks:
            if t not in with_solution:
                log(f"no demonstration for task {t.name}: it has no solution/solve.sh")
        if not with_solution:
            return None
        log(f"running the solutions of {len(with_solution)} task(s) one command per turn (demonstrations)")

        def report(r) -> None:
            if r.error:
                log(f"no demonstration for task {r.task}: {r.error}")

        results = asyncio.run(demonstrate_all(with_solution, cfg.sandbox.backend, cfg.run.jobs, on_result=report))
        chats = [r.chat for r in results if r.chat is not None]
        log(f"SFT demonstrations: {len(chats)} of {len(with_solution)} solution(s) passed their verifier when "
            f"run one command per turn")
    if not chats:
        return None
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps(ch) + "\n" for ch in chats))
    return out


def build_user_corpus(cfg: Config, run_dir: Path, log) -> dict[str, Any]:
    """The corpus.done.json fields for the user's tasks (train, eval, heldout, trajectories, rl, counts)."""
    c = cfg.corpus
    root = run_dir / "corpus"
    root.mkdir(parents=True, exist_ok=True)
    if c.n_heldout or c.n_rl:
        log("corpus.n_heldout / corpus.n_rl ignored: no tasks are synthesized when corpus.train_tasks is set")
    train = load_user_tasks(Path(c.train_tasks), log)
    evals = load_user_tasks(Path(c.eval_tasks), log) if c.eval_tasks else []
    if c.decontam_against:
        folders = [Path(c.train_tasks)] + ([Path(c.eval_tasks)] if c.eval_tasks else [])
        flagged = decontaminate_tasks(folders, Path(c.decontam_against), run_dir / "decontam.json", log)
        train = [t for t in train if Path(t.path).resolve() not in flagged]
        evals = [t for t in evals if Path(t.path).resolve() not in flagged]
    if c.eval_tasks:
        sft, pool = train, train
    else:
        shares = parse_split(c.split)
        sft, pool, evals = split_tasks(train, shares, c.seed)
        log(f"split {len(train)} task(s) of {c.train_tasks} by corpus.split {shares}: {len(sft)} SFT, "
            f"{len(pool)} PPO pool, {len(evals)} evaluation")
        pool = pool or sft
    if not pool:
        raise ConfigError(f"corpus.train_tasks: no usable tasks in {c.train_tasks}")
    traj = demonstrations(cfg, sft, root / "demos.jsonl", log)
    return {"train": str(link_tasks(sft, root / "sft")), "eval": str(link_tasks(evals, root / "eval")),
            "heldout": str(root / "heldout"), "trajectories": str(traj) if traj else None,
            "rl": str(link_tasks(pool, root / "rl")), "user_tasks": True,
            "tasks": {"sft": [t.name for t in sft], "rl": [t.name for t in pool], "eval": [t.name for t in evals]}}
