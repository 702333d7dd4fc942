"""Procedural task synthesis: families, generation into Harbor task folders, validation, corpus statistics.

Pipeline (`synthesize`): N slots are dealt round-robin over the selected families; slot i of family F gets
seed `derive_seed("synth", S, F, i, attempt)`. A slot's task is written, then (unless validation is off) run
through the real harness: the oracle must pass every test and the nop agent must fail at least one. A failing
task is deleted and the slot retried with the next attempt's seed, at most `max_attempts` times. Everything a
slot produces depends only on (S, F, i, attempt), so the same seed gives byte-identical folders.

With `trajectories`, each kept task's oracle run becomes an expert demonstration; with `mistake_rate` > 0,
that share of the tasks whose family defines a `mistake` is demonstrated by a real run of the mistake instead
(kept only if it passes fewer tests than the oracle), so the expert is imperfect in a known, measured way.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import shutil
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from conch.tasks.synth.base import REGISTRY, SPLITS, Family, TaskDraft, derive_seed, rng_for, task_name, write_task

FAMILY_MODULES = ("families_basic", "families_files", "families_text", "families_data", "families_code", "families_git",
                  "families_proc", "families_discover", "families_long")


def load_families() -> dict[str, Family]:
    for module in FAMILY_MODULES:
        importlib.import_module(f"conch.tasks.synth.{module}")
    return dict(sorted(REGISTRY.items()))


def select_families(names: Sequence[str] | None = None, split: str | None = None) -> list[Family]:
    """The named families (default: all), restricted to `split` when given. Raises ValueError on bad input."""
    fams = load_families()
    if names:
        unknown = [n for n in names if n not in fams]
        if unknown:
            raise ValueError(f"unknown families {', '.join(unknown)}; known: {', '.join(fams)}")
        chosen = [fams[n] for n in dict.fromkeys(names)]
    else:
        chosen = list(fams.values())
    if split is not None:
        if split not in SPLITS:
            raise ValueError(f"split must be one of {', '.join(SPLITS)}, not {split!r}")
        chosen = [f for f in chosen if f.split == split]
    if not chosen:
        raise ValueError("no family matches the selection")
    return chosen


def slot_seed(seed: int, family_name: str, index: int, attempt: int) -> int:
    return derive_seed("synth", seed, family_name, index, attempt)


def draft_for(fam: Family, seed: int) -> TaskDraft:
    return fam.generate(rng_for(fam.name, seed))


def emit(fam: Family, seed: int, out: Path) -> Path:
    """Generate and write one task; an existing folder of the same name is replaced."""
    draft = draft_for(fam, seed)
    target = out / task_name(fam.name, seed)
    if target.exists():
        shutil.rmtree(target)
    return write_task(fam, seed, draft, out)


@dataclass
class FamilyStats:
    generated: int = 0
    kept: int = 0
    oracle_failed: int = 0
    nop_passed: int = 0
    gen_errors: int = 0
    gave_up: int = 0
    mistakes: int = 0  # demonstrations that show the family's mistake
    reasons: list[str] = field(default_factory=list)

    @property
    def validation_yield(self) -> float | None:
        return self.kept / self.generated if self.generated else None


@dataclass
class SynthReport:
    out: Path
    kept: list[Path]
    families: dict[str, FamilyStats]
    seconds: float
    validated: bool
    trajectories: int = 0
    mistakes: int = 0


@dataclass(eq=False)
class _Slot:
    fam: Family
    index: int
    attempt: int = 0
    path: Path | None = None
    seed: int = 0

    @property
    def seed_parts(self) -> tuple[str, int, int]:
        return (self.fam.name, self.index, self.attempt)


def plan_slots(n: int, fams: Sequence[Family]) -> list[_Slot]:
    counters: dict[str, int] = {}
    slots = []
    for i in range(n):
        fam = fams[i % len(fams)]
        slots.append(_Slot(fam, counters.get(fam.name, 0)))
        counters[fam.name] = counters.get(fam.name, 0) + 1
    return slots


def _eprint(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _judge(oracle, nop) -> str | None:
    """Why a task must be dropped, or None to keep it."""
    if oracle.error or oracle.n_total == 0 or oracle.n_passed != oracle.n_total:
        return f"oracle {oracle.n_passed}/{oracle.n_total}" + (f": {oracle.error}" if oracle.error else "")
    if nop is None or nop.error:
        return f"nop run failed: {nop.error if nop else 'not run'}"
    if nop.n_passed >= nop.n_total:
        return f"nop passes {nop.n_passed}/{nop.n_total}"
    return None


async def _validate(paths: list[Path], backend: str, jobs: int, log: Callable[[str], None]) -> list[tuple]:
    """(reason-or-None, oracle CheckResult, Task) per path, oracle and nop each in a real sandbox."""
    from conch.harness import run_task
    from conch.tasks.loader import load_task

    import time

    from conch.progress import fmt_seconds

    gate = asyncio.Semaphore(max(1, jobs))
    done, t0 = 0, time.monotonic()

    async def one(path: Path):
        nonlocal done
        task = load_task(path)
        async with gate:
            oracle = await run_task(task, "oracle", backend)
            nop = await run_task(task, "nop", backend) if _judge(oracle, None) == "nop run failed: not run" else None
        reason = _judge(oracle, nop)
        done += 1
        nop_s = f"nop {nop.n_passed}/{nop.n_total}" if nop else "nop skipped"
        log(f"  [{done}/{len(paths)}] {path.name}: oracle {oracle.n_passed}/{oracle.n_total}, {nop_s}, "
            f"{oracle.seconds + (nop.seconds if nop else 0):.1f}s -> {'kept' if reason is None else 'DROP ' + reason}"
            f"  ETA {fmt_seconds((time.monotonic() - t0) / done * (len(paths) - done))}")
        return reason, oracle, task

    return list(await asyncio.gather(*(one(p) for p in paths)))


def shows_mistake(fam: Family, seed: int, rate: float) -> list[str]:
    """The mistake a task's demonstration shows (a fixed `rate` share of tasks, by seed), or []."""
    if rate <= 0:
        return []
    import random

    return draft_for(fam, seed).mistake if random.Random(derive_seed("mistake", seed)).random() < rate else []


async def _run_mistakes(jobs_: list[tuple], backend: str, jobs: int) -> list:
    """A real sandbox run of each (task, commands); CheckResults in order."""
    from conch.harness import run_task

    gate = asyncio.Semaphore(max(1, jobs))

    async def one(task, commands):
        async with gate:
            return await run_task(task, commands, backend)

    return list(await asyncio.gather(*(one(t, c) for t, c in jobs_)))


def synthesize(
    out: Path,
    n: int,
    seed: int,
    fams: Sequence[Family],
    validate: bool = True,
    jobs: int = 1,
    backend: str = "local",
    max_attempts: int = 4,
    trajectories: Path | None = None,
    log: Callable[[str], None] = _eprint,
    mistake_rate: float = 0.0,
) -> SynthReport:
    """Write `n` tasks to `out` (fewer if some slots exhaust `max_attempts`)."""
    start = time.monotonic()
    out.mkdir(parents=True, exist_ok=True)
    stats = {f.name: FamilyStats() for f in fams}
    slots = plan_slots(n, fams)
    pending = list(slots)
    kept: list[_Slot] = []
    chats: dict[str, dict] = {}
    for attempt in range(max_attempts):
        if not pending:
            break
        written: list[_Slot] = []
        for slot in pending:
            slot.attempt = attempt
            sd = slot.seed = slot_seed(seed, *slot.seed_parts)
            try:
                slot.path = emit(slot.fam, sd, out)
            except Exception as exc:  # a generator bug must not sink the batch; it is counted and retried
                stats[slot.fam.name].gen_errors += 1
                stats[slot.fam.name].reasons.append(f"generate seed {sd}: {type(exc).__name__}: {exc}")
                continue
            stats[slot.fam.name].generated += 1
            written.append(slot)
        log(f"synth: round {attempt + 1}: wrote {len(written)} task(s) to {out}")
        if not validate:
            kept += written
            pending = [s for s in pending if s not in written]
            continue
        results = asyncio.run(_validate([s.path for s in written], backend, jobs, log))
        failed = set()
        mistaken: list[tuple] = []
        for slot, (reason, oracle, task) in zip(written, results):
            st = stats[slot.fam.name]
            if reason is None:
                kept.append(slot)
                st.kept += 1
                if trajectories is not None:
                    chats[slot.path.name] = _chat(slot, task, oracle)
                    mistake = shows_mistake(slot.fam, slot.seed, mistake_rate)
                    if mistake:
                        mistaken.append((slot, task, oracle, mistake))
                continue
            if reason.startswith("oracle"):
                st.oracle_failed += 1
            else:
                st.nop_passed += 1
            st.reasons.append(f"{slot.path.name}: {reason}")
            shutil.rmtree(slot.path, ignore_errors=True)
            failed.add(id(slot))
        if mistaken:
            runs = asyncio.run(_run_mistakes([(t, m) for _, t, _, m in mistaken], backend, jobs))
            for (slot, task, oracle, _), run in zip(mistaken, runs):
                st = stats[slot.fam.name]
                if run.error or run.n_total != oracle.n_total or run.n_passed >= oracle.n_passed:
                    st.reasons.append(f"{slot.path.name}: mistake not demonstrated (passes {run.n_passed}/"
                                      f"{run.n_total}{': ' + run.error if run.error else ''}); oracle shown")
                    continue
                st.mistakes += 1
                chats[slot.path.name] = _chat(slot, task, run) | {"mistake": f"{run.n_passed}/{run.n_total}"}
        pending = [s for s in pending if id(s) in failed or s not in written]
    for slot in pending:
        stats[slot.fam.name].gave_up += 1
    if not validate:
        for slot in kept:
            stats[slot.fam.name].kept += 1
    n_traj = 0
    if trajectories is not None:
        trajectories.parent.mkdir(parents=True, exist_ok=True)
        with trajectories.open("w") as f:
            for slot in slots:
                if slot.path is not None and slot.path.name in chats:
                    f.write(json.dumps(chats[slot.path.name]) + "\n")
                    n_traj += 1
    kept_paths = [s.path for s in slots if s in kept and s.path is not None]
    return SynthReport(out, kept_paths, stats, time.monotonic() - start, validate, n_traj,
                       sum(st.mistakes for st in stats.values()))


def _chat(slot: _Slot, task, run) -> dict:
    """The demonstration record of one real run (oracle or mistake) of a kept task."""
    from conch.tasks.synth.trajectories import build_chat

    steps = [(s.command, s.output, s.exit_code) for s in run.steps]
    final = task.metadata.get("metadata", {}).get("final_message", "The task is complete.")
    return build_chat(slot.path.name, slot.fam.name, task.instruction, steps, final, slot.fam.split)


def summary_lines(report: SynthReport, fams: Sequence[Family]) -> list[str]:
    lines = [f"{'family':<18} {'split':<8} {'generated':>9} {'kept':>5} {'oracle✗':>8} {'nop✓':>5} {'gen✗':>5} "
             f"{'gave up':>7} {'yield':>6}"]
    for fam in fams:
        st = report.families[fam.name]
        y = st.validation_yield
        lines.append(f"{fam.name:<18} {fam.split:<8} {st.generated:>9} {st.kept:>5} {st.oracle_failed:>8} "
                     f"{st.nop_passed:>5} {st.gen_errors:>5} {st.gave_up:>7} {'-' if y is None else f'{y:.0%}':>6}")
    for fam in fams:
        for reason in report.families[fam.name].reasons[:3]:
            lines.append(f"  {fam.name}: {reason}")
    lines.append(f"kept {len(report.kept)} task(s) in {report.out} ({report.seconds:.1f}s"
                 f"{', validated' if report.validated else ', not validated'})")
    if report.mistakes:
        lines.append(f"{report.mistakes} of {report.trajectories} demonstration(s) show the family's mistake "
                     f"(a real run that fails some tests)")
    return lines


def corpus_stats(root: Path) -> dict:
    """Counts per family and split, tests per task and solution turns, for any folder of Harbor/TB1 tasks."""
    import tomllib

    from conch.tasks.loader import find_task_dirs
    from conch.verify_parsers import static_test_count

    families: dict[str, int] = {}
    splits: dict[str, int] = {}
    tests, turns = [], []
    for folder in find_task_dirs(root):
        meta = {}
        toml = folder / "task.toml"
        if toml.is_file():
            try:
                meta = tomllib.loads(toml.read_text()).get("metadata", {})
            except tomllib.TOMLDecodeError:
                meta = {}
        fam = str(meta.get("family", "unknown"))
        families[fam] = families.get(fam, 0) + 1
        split = str(meta.get("split", "unknown"))
        splits[split] = splits.get(split, 0) + 1
        try:
            tests.append(static_test_count(folder / "tests"))
        except Exception:
            pass
        commands = folder / "solution" / "commands.json"
        if commands.is_file():
            try:
                turns.append(len(json.loads(commands.read_text())))
            except (json.JSONDecodeError, TypeError):
                pass

    def summary(xs: list[int]) -> dict:
        if not xs:
            return {"min": None, "mean": None, "max": None, "n": 0}
        return {"min": min(xs), "mean": round(statistics.fmean(xs), 2), "max": max(xs), "n": len(xs)}

    return {"tasks": sum(families.values()), "families": dict(sorted(families.items())),
            "splits": dict(sorted(splits.items())), "tests_per_task": summary(tests), "turns": summary(turns)}


__all__ = ["Family", "FamilyStats", "SynthReport", "corpus_stats", "draft_for", "emit", "load_families",
           "select_families", "slot_seed", "summary_lines", "synthesize"]
