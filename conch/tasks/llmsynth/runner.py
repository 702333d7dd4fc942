"""Run the synthesis: candidates in parallel, LLM calls and sandbox checks each behind their own limit.

Why two limits: an LLM call waits on a remote server and costs no local CPU, a sandbox check is the local
heavy part, so `--llm-jobs` and `--jobs` are sized apart. Candidate ids are slots `s00000, s00001, ...` up to
`max_candidates`; each slot's seed, difficulty and skill follow from its number and `--seed`, so a resumed run
asks for the same things. An accepted task is renamed from `.work/` into the output folder before its ledger
line is written; `--resume` skips every slot with a line and recovers a folder whose line a crash lost.
Accepted tasks sit directly in the output folder (hidden `.work/`, `.answers/` are skipped by every loader),
so `conch train corpus.train_tasks=OUT` trains on them.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import re
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from conch.tasks.llmsynth import PROMPT_VERSION
from conch.tasks.llmsynth.client import ChatClient, ChatError
from conch.tasks.llmsynth.gates import Corpus, Decontam, Outcome, build_gate, giveaway_gate, load_gate, \
    nop_gate, oracle_gate, timed
from conch.tasks.llmsynth.ledger import Ledger
from conch.tasks.llmsynth.parse import ParseError, parse_answer, write_task
from conch.tasks.llmsynth.prompts import generate_messages, repair_messages

DIFFICULTIES = ("easy", "medium", "hard")
SKILLS = ("text processing", "file operations", "data wrangling", "log analysis", "debugging a script",
          "configuration editing", "archives and compression", "permissions", "version control",
          "processes and services", "search and discovery", "build and packaging")
_SLOT = re.compile(r"^s\d{5}-")


class SetupError(ValueError):
    """The run cannot start as asked (no seeds, an output folder in use); one line for the user."""


@dataclass
class Settings:
    seeds_dir: Path
    out: Path
    client: ChatClient
    n: int
    max_candidates: int
    against: Path | None
    threshold: float = 0.5
    dup_threshold: float = 0.5
    repairs: int = 0
    llm_jobs: int = 4
    jobs: int = 2
    backend: str = "local"
    network: str = "never"
    resume: bool = False
    seed: int = 0
    difficulty: str | None = None
    prompt_version: str = PROMPT_VERSION


def load_seeds(folder: Path) -> list:
    from conch.tasks.loader import load_tasks
    from conch.tasks.model import Task

    if not Path(folder).is_dir():
        raise SetupError(f"--from-seeds {folder}: not a directory")
    loaded = load_tasks([folder])
    seeds = [t for t in loaded if isinstance(t, Task)]
    for t in loaded:
        if not isinstance(t, Task):
            print(f"conch: warning: seed {t.name} skipped: {t.message}", file=sys.stderr)
    if not seeds:
        raise SetupError(f"--from-seeds {folder}: no loadable tasks (no task.toml or task.yaml found)")
    return seeds


def slug(instruction: str) -> str:
    words = re.findall(r"[a-z0-9]+", instruction.lower())[:6]
    return "-".join(words)[:48].strip("-") or "task"


@dataclass
class Run:
    s: Settings
    seeds: list
    decontam: Decontam | None
    corpus: Corpus
    ledger: Ledger
    accepted: int = 0
    done: set = field(default_factory=set)

    def __post_init__(self) -> None:
        self.llm_gate = asyncio.Semaphore(self.s.llm_jobs)
        self.box_gate = asyncio.Semaphore(self.s.jobs)
        self.lock = asyncio.Lock()

    def plan(self, i: int) -> tuple:
        rng = random.Random(f"{self.s.seed}:{i}")
        seed = self.seeds[i % len(self.seeds)]
        return seed, self.s.difficulty or rng.choice(DIFFICULTIES), rng.choice(SKILLS)

    async def gates(self, cid: str, attempt: int, answer: str) -> tuple[list[Outcome], Path | None]:
        """Every gate in order until one fails; the accepted task's final path when all pass."""
        t0 = time.monotonic()
        try:
            files = parse_answer(answer)
        except ParseError as exc:
            return [Outcome("parse", False, str(exc), time.monotonic() - t0)], None
        work = self.s.out / ".work" / f"{cid}-a{attempt}"
        shutil.rmtree(work, ignore_errors=True)
        folder = write_task(work / f"{cid}-{slug(files['instruction.md'])}", files)
        outcomes = [Outcome("parse", True, f"{len(files)} files", time.monotonic() - t0)]
        try:
            return outcomes, await self._checked(folder, outcomes)
        finally:
            shutil.rmtree(work, ignore_errors=True)

    async def _checked(self, folder: Path, outcomes: list[Outcome]) -> Path | None:
        task, loaded = load_gate(folder)
        outcomes.append(loaded)
        if task is None:
            return None
        async with self.box_gate:
            outcomes.append(await build_gate(task, self.s.backend, self.s.network))
            if not outcomes[-1].ok:
                return None
            oracle, passed = await oracle_gate(task, self.s.backend, self.s.network)
            outcomes.append(oracle)
            if not oracle.ok:
                return None
            outcomes.append(await nop_gate(task, self.s.backend, self.s.network, passed))
            if not outcomes[-1].ok:
                return None
        outcomes.append(timed("giveaway", giveaway_gate, task))
        if not outcomes[-1].ok:
            return None
        if self.decontam is not None:
            outcomes.append(timed("decontam", self.decontam.check, task))
            if not outcomes[-1].ok:
                return None
        async with self.lock:  # check and accept at once: two candidates in flight cannot both be the first
            outcomes.append(timed("duplicate", self.corpus.check, task))
            if not outcomes[-1].ok or self.accepted >= self.s.n:
                return None
            final = self.s.out / folder.name
            folder.rename(final)
            self.corpus.add(final.name, final, task.instruction)
            self.accepted += 1
            return final

    async def candidate(self, i: int) -> dict:
        cid = f"s{i:05d}"
        seed, difficulty, skill = self.plan(i)
        t0 = time.monotonic()
        rec = {"id": cid, "seed": seed.name, "difficulty": difficulty, "skill": skill,
               "prompt_version": self.s.prompt_version, "model": self.s.client.model, "attempts": [],
               "status": "rejected", "rejected_at": None, "reason": None, "accepted_path": None}
        messages = generate_messages(seed, cid, difficulty, skill, self.s.prompt_version)
        for attempt in range(self.s.repairs + 1):
            try:
                async with self.llm_gate:
                    answer = await asyncio.to_thread(self.s.client.chat, messages)
            except ChatError as exc:
                rec.update(status="error", rejected_at="llm", reason=str(exc)[:1000])
                break
            sha = hashlib.sha256(answer.encode()).hexdigest()
            answers = self.s.out / ".answers"
            answers.mkdir(exist_ok=True)
            (answers / f"{cid}-a{attempt}.txt").write_text(answer)
            outcomes, final = await self.gates(cid, attempt, answer)
            rec["attempts"].append({"answer_sha256": sha, "gates": [o.to_json() for o in outcomes]})
            if final is not None:
                rec.update(status="accepted", rejected_at=None, reason=None, accepted_path=str(final))
                break
            failed = outcomes[-1]
            reason = failed.message if not failed.ok else f"{self.s.n} tasks accepted already"
            rec.update(rejected_at=failed.gate if not failed.ok else "quota", reason=reason[:2000])
            if not failed.ok and attempt < self.s.repairs:
                messages = repair_messages(messages, answer, failed.gate, failed.message, self.s.prompt_version)
        rec["seconds"] = round(time.monotonic() - t0, 3)
        return rec


def _prepare(s: Settings, ledger: Ledger) -> list[dict]:
    """The output folder ready for this run: refuses to mix runs without --resume; clears stale work."""
    s.out.mkdir(parents=True, exist_ok=True)
    records = ledger.records()
    if not s.resume and (records or ledger.path.exists()):
        raise SetupError(f"{ledger.path} exists: pass --resume to continue that run, or choose a new --out")
    if not s.resume and any(_SLOT.match(p.name) for p in s.out.iterdir()):
        raise SetupError(f"{s.out} already holds synthesized tasks: pass --resume or choose a new --out")
    shutil.rmtree(s.out / ".work", ignore_errors=True)
    return records


def _recover(s: Settings, ledger: Ledger, records: list[dict]) -> list[dict]:
    """Accepted folders whose ledger line a crash lost get their line now (they are never redone)."""
    known = {r["id"] for r in records}
    for p in sorted(s.out.iterdir()):
        cid = p.name[:6]
        if p.is_dir() and _SLOT.match(p.name) and cid not in known and (p / "task.toml").is_file():
            rec = {"id": cid, "seed": None, "prompt_version": s.prompt_version, "model": s.client.model,
                   "attempts": [], "status": "accepted", "rejected_at": None, "accepted_path": str(p),
                   "reason": "recovered on --resume: accepted before a crash lost its ledger line", "seconds": 0.0}
            ledger.append(rec)
            records.append(rec)
    return records


def _accepted_entries(records: list[dict]) -> list[tuple[str, Path, str]]:
    out = []
    for r in records:
        p = Path(r["accepted_path"]) if r.get("status") == "accepted" and r.get("accepted_path") else None
        if p is not None and (p / "instruction.md").is_file():
            out.append((p.name, p, (p / "instruction.md").read_text(errors="replace")))
    return out


async def _drive(run: Run, todo: list[int], progress) -> None:
    queue = list(reversed(todo))
    workers: list[asyncio.Task] = []

    async def worker() -> None:
        while queue and run.accepted < run.s.n:
            i = queue.pop()
            rec = await run.candidate(i)
            run.ledger.append(rec)
            run.done.add(rec["id"])
            where = "" if rec["status"] == "accepted" else f" at {rec['rejected_at']}"
            progress.update(info=f"accepted {run.accepted}/{run.s.n}; {rec['id']} {rec['status']}{where}")
            if run.accepted >= run.s.n:  # quota met: candidates still in flight are dropped (redone on resume)
                for w in workers:
                    if w is not asyncio.current_task():
                        w.cancel()

    workers.extend(asyncio.create_task(worker()) for _ in range(run.s.llm_jobs + run.s.jobs))
    results = await asyncio.gather(*workers, return_exceptions=True)
    for r in results:
        if isinstance(r, BaseException) and not isinstance(r, asyncio.CancelledError):
            raise r


def synthesize(s: Settings) -> dict:
    """Run (or resume) the synthesis into `s.out`; returns ledger.stats over every candidate of the run."""
    from conch.progress import Progress
    from conch.tasks.llmsynth.ledger import stats

    seeds = load_seeds(s.seeds_dir)
    ledger = Ledger(s.out)
    records = _recover(s, ledger, _prepare(s, ledger))
    decontam = Decontam(s.against, s.threshold) if s.against is not None else None
    seed_entries = [(f"seed:{t.name}", Path(t.path), t.instruction) for t in seeds]
    corpus = Corpus(seed_entries + _accepted_entries(records), s.dup_threshold)
    run = Run(s, seeds, decontam, corpus, ledger, done={r["id"] for r in records})
    run.accepted = sum(1 for r in records if r.get("status") == "accepted")
    todo = [i for i in range(s.max_candidates) if f"s{i:05d}" not in run.done]
    if run.accepted >= s.n or not todo:
        print(f"conch synth: nothing to do ({run.accepted} accepted, {len(run.done)} candidates done)",
              file=sys.stderr)
    else:
        progress = Progress(len(todo), "synth")
        try:
            asyncio.run(_drive(run, todo, progress))
        finally:
            progress.close()
            shutil.rmtree(s.out / ".work", ignore_errors=True)
    return stats(ledger.records())
