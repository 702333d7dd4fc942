"""The stages around the PPO loop: corpus, model, evaluation. Each is resumable: its output lives in RUNDIR and
a finished stage leaves a marker (`*.done.json`) with what it produced, so `--resume` skips it.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from conch.agent.trajectory import error_reason
from conch.config import Config

EVAL_SEED_OFFSET = 1_000_000  # eval tasks use synthesis seeds far from the training seeds


_T0 = time.monotonic()


def log(msg: str) -> None:
    """A progress line on stderr, stamped with minutes:seconds since the command started."""
    m, s = divmod(int(time.monotonic() - _T0), 60)
    print(f"conch train [{m:02d}:{s:02d}]: {msg}", file=sys.stderr, flush=True)


def marker(run_dir: Path, name: str) -> dict | None:
    """What a finished stage recorded, or None: not done (an empty or corrupt marker counts as not done)."""
    from conch.rl.checkpoint import read_json

    data = read_json(run_dir / f"{name}.done.json", f"the {name} stage marker")
    return data if isinstance(data, dict) else None


def mark_done(run_dir: Path, name: str, data: dict) -> None:
    from conch.rl.checkpoint import atomic_write_text

    atomic_write_text(run_dir / f"{name}.done.json", json.dumps(data, indent=2))


@dataclass
class Corpus:
    train: Path
    eval: Path
    heldout: Path
    trajectories: Path | None  # expert chats of the train split (SFT data)
    rl: Path | None = None  # the PPO pool when it is not the train split (`corpus.n_rl`)


def marker_corpus(done: dict) -> Corpus:
    return Corpus(Path(done["train"]), Path(done["eval"]), Path(done["heldout"]),
                  Path(done["trajectories"]) if done["trajectories"] else None,
                  Path(done["rl"]) if done.get("rl") else None)


def build_corpus(cfg: Config, run_dir: Path) -> Corpus:
    """Synthesize the train split (with expert trajectories), an eval set of new seeds of the same families, and
    a heldout-family set; or use the task folders the user named."""
    done = marker(run_dir, "corpus")
    if done:
        return marker_corpus(done)
    c = cfg.corpus
    t0 = time.monotonic()
    if c.train_tasks:  # the user's own tasks: nothing is synthesized (conch/rl/user_corpus.py)
        from conch.rl.user_corpus import build_user_corpus

        done = build_user_corpus(cfg, run_dir, log) | {"seconds": time.monotonic() - t0}
        mark_done(run_dir, "corpus", done)  # only now: a stage that failed is never pinned
        return marker_corpus(done)
    from conch.tasks.synth import select_families, summary_lines, synthesize

    root = run_dir / "corpus"
    train_fams = select_families(c.families or None, split="train")
    train, traj_path = root / "train", root / "expert.jsonl"
    log(f"synthesizing {c.n_train} training tasks ({len(train_fams)} families) with expert trajectories")
    rep = synthesize(train, c.n_train, c.seed, train_fams, validate=True, jobs=cfg.run.jobs,
                     backend=cfg.sandbox.backend, trajectories=traj_path, log=lambda m: None,
                     mistake_rate=c.mistake_rate)
    for line in summary_lines(rep, train_fams):
        log(line)
    if c.eval_tasks:
        eval_dir = Path(c.eval_tasks)
    else:
        eval_dir = root / "eval"
        log(f"synthesizing {c.n_eval} evaluation tasks (training families, unseen seeds)")
        synthesize(eval_dir, c.n_eval, c.seed + EVAL_SEED_OFFSET, train_fams, validate=True, jobs=cfg.run.jobs,
                   backend=cfg.sandbox.backend, log=lambda m: None)
        dropped = drop_seen_instructions(eval_dir, train)
        if dropped:
            log(f"dropped {dropped} evaluation task(s) whose instruction also occurs in the training set")
    rl: Path | None = None
    if c.n_rl > 0:
        # Not validated: these come from the same generators as the validated train split, and a broken task
        # would only end as a verifier error, which PPO excludes from the loss (validating hundreds of tasks
        # would cost minutes of the demo's budget).
        rl = root / "rl"
        log(f"synthesizing {c.n_rl} PPO tasks of the training families (no expert trajectories)")
        synthesize(rl, c.n_rl, c.seed + 3 * EVAL_SEED_OFFSET, train_fams, validate=False, log=lambda m: None)
        dropped = drop_seen_instructions(rl, eval_dir)
        if dropped:
            log(f"dropped {dropped} PPO task(s) whose instruction also occurs in the evaluation set")
    heldout = root / "heldout"
    if c.n_heldout > 0:
        log(f"synthesizing {c.n_heldout} tasks of the heldout families")
        synthesize(heldout, c.n_heldout, c.seed + 2 * EVAL_SEED_OFFSET, select_families(None, split="heldout"),
                   validate=True, jobs=cfg.run.jobs, backend=cfg.sandbox.backend, log=lambda m: None)
    if c.decontam_against:
        drop_contaminated(cfg, run_dir, [p for p in (train, eval_dir, rl, heldout) if p and p.is_dir()], traj_path)
    corpus = Corpus(train, eval_dir, heldout, traj_path, rl)
    mark_done(run_dir, "corpus", {"train": str(train), "eval": str(eval_dir), "heldout": str(heldout),
                                  "trajectories": str(traj_path) if traj_path else None,
                                  "rl": str(rl) if rl else None,
                                  "seconds": time.monotonic() - t0})
    return corpus


def drop_contaminated(cfg: Config, run_dir: Path, folders: list[Path], trajectories: Path | None) -> None:
    """Synthesized tasks that nearly copy a task of `corpus.decontam_against` are deleted, with their
    demonstrations; the report is RUNDIR/decontam.json."""
    import shutil

    from conch.rl.user_corpus import decontaminate_tasks

    flagged = decontaminate_tasks(folders, Path(cfg.corpus.decontam_against), run_dir / "decontam.json", log)
    root = (run_dir / "corpus").resolve()
    names = {p.name for p in flagged if root in p.parents}
    for p in flagged:
        if root in p.parents:
            shutil.rmtree(p)
    if names and trajectories is not None and trajectories.exists():
        kept = [line for line in trajectories.read_text().splitlines()
                if line.strip() and json.loads(line).get("task") not in names]
        trajectories.write_text("".join(line + "\n" for line in kept))


def drop_seen_instructions(folder: Path, other: Path) -> int:
    """Remove the tasks of `folder` whose instruction text is identical to a task's in `other`, so every
    evaluated instance is one the policy never trained on (random draws of small starter families can collide)."""
    import shutil

    seen = {p.read_text() for p in other.glob("*/instruction.md")}
    dropped = 0
    for p in sorted(folder.glob("*/instruction.md")):
        if p.read_text() in seen:
            shutil.rmtree(p.parent)
            dropped += 1
    return dropped


def load_task_list(folder: Path) -> list:
    from conch.tasks.loader import load_tasks
    from conch.tasks.model import TaskLoadError

    if not folder.exists():
        return []
    tasks = load_tasks([folder])
    for t in tasks:
        if isinstance(t, TaskLoadError):
            log(f"skipping task {t.name}: {t}")
    return [t for t in tasks if not isinstance(t, TaskLoadError)]


def task_sources(folder: Path) -> list[Path]:
    """The real folders of the tasks in `folder` (a user corpus holds symlinks, which rglob does not follow)."""
    return [p.resolve() for p in sorted(folder.iterdir())] if folder.is_dir() else []


def init_or_load_model(cfg: Config, run_dir: Path, corpus: Corpus) -> Path:
    """The starting checkpoint folder: the user's, or a tiny Qwen3-MoE whose tokenizer is trained on the corpus."""
    if cfg.model.path:
        return Path(cfg.model.path)
    out = run_dir / "init"
    if marker(run_dir, "model"):
        return out
    from conch.model.init import init_model

    extra = task_sources(corpus.train) + ([corpus.trajectories] if corpus.trajectories else [])
    if corpus.rl and any(p.is_symlink() for p in corpus.rl.iterdir()):  # the user's PPO tasks (links)
        extra += task_sources(corpus.rl)
    log(f"initialising a {cfg.model.size} Qwen3-MoE model with a tokenizer trained on the corpus")
    init_model(out, size=cfg.model.size, seed=cfg.run.seed, tokenizer_corpus=extra)
    mark_done(run_dir, "model", {"path": str(out)})
    return out


@dataclass
class EvalResult:
    """An evaluation's figures, over the episodes that ran: an episode that errored for a reason not the agent's
    (`agent.trajectory.error_reason`) is counted in `errors`, never as a zero. `pass_rate` and
    `tests_passed_mean` are None when no episode ran."""

    pass_rate: float | None
    tests_passed_mean: float | None
    samples: int  # episodes, errored ones included
    tasks: int
    per_task: dict[str, dict[str, Any]]
    turns_mean: float = 0.0  # assistant turns per episode
    sampled_tokens_mean: float = 0.0  # tokens the policy sampled per episode
    errors: int = 0  # episodes not scored: sandbox/engine failures, infrastructure verifier errors, tampering
    agent_errors: int = 0  # verifier errors the agent caused, scored as failures (and counted in the figures)
    error_tasks: dict[str, str] = field(default_factory=dict)  # task -> reason, for tasks that errored every time
    policy: str = ""  # which policy was measured (the cache key, with `setup`)
    setup: dict[str, Any] = field(default_factory=dict)  # the evaluation's own settings (seed, samples, tasks)

    @property
    def ran(self) -> int:
        return self.samples - self.errors

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "EvalResult":
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})

    def describe(self) -> str:
        """One log line: the figures, and the errors beside them."""
        if self.ran == 0:
            head = "no episode ran"
        else:
            head = f"pass rate {self.pass_rate:.3f}, tests passed {self.tests_passed_mean:.2f}"
        tail = f"{self.ran} of {self.samples} episodes ran" if self.errors else f"{self.samples} episodes"
        if self.errors:
            tail += f"; {self.errors} error{'s' if self.errors != 1 else ''} not counted"
        if self.agent_errors:
            tail += f"; {self.agent_errors} verifier error{'s' if self.agent_errors != 1 else ''} caused by the " \
                    f"agent, scored as failures"
        return f"{head} ({tail})"


def _figures(trajs: Sequence[Any]) -> dict[str, Any]:
    ran = [t for t in trajs if not error_reason(t)]
    n = len(ran)
    return {"pass_rate": sum(1 for t in ran if t.n_total and t.n_passed == t.n_total) / n if n else None,
            "tests_passed_mean": sum(t.n_passed for t in ran) / n if n else None,
            "n_total": max((t.n_total for t in trajs), default=0), "errors": len(trajs) - n}


def eval_result(trajs: Sequence[Any]) -> EvalResult:
    per: dict[str, list] = {}
    for t in trajs:
        per.setdefault(t.task, []).append(t)
    n = len(trajs) or 1
    total = _figures(trajs)
    error_tasks = {}
    for task, group in sorted(per.items()):
        reasons = [error_reason(t) for t in group]
        if all(reasons):
            error_tasks[task] = reasons[0]
    return EvalResult(
        pass_rate=total["pass_rate"],
        tests_passed_mean=total["tests_passed_mean"],
        samples=len(trajs),
        tasks=len(per),
        turns_mean=sum(len(t.turns) for t in trajs) / n,
        sampled_tokens_mean=sum(t.num_sampled for t in trajs) / n,
        per_task={k: _figures(v) for k, v in sorted(per.items())},
        errors=total["errors"],
        agent_errors=sum(1 for t in trajs if t.verifier_error and getattr(t, "verifier_fault", None) == "agent"
                         and not error_reason(t)),
        error_tasks=error_tasks,
    )


async def evaluate(engine: Any, codec: Any, tasks: Sequence[Any], cfg: Config, seed: int, n_per_task: int | None = None,
                   out: Path | None = None, on_done: Any = None) -> EvalResult:
    """The policy on `tasks` with the config's `[agent]` section at the evaluation's temperature (greedy: top_p 1)."""
    from conch.agent.rollout import run_rollouts

    agent = dataclasses.replace(cfg.agent, temperature=cfg.eval.temperature,
                                top_p=1.0 if cfg.eval.temperature == 0 else cfg.agent.top_p)
    trajs, _ = await run_rollouts(engine, codec, tasks, n_per_task or cfg.eval.n_per_task, agent,
                                  concurrency=cfg.ppo.concurrency, backend=cfg.sandbox.backend, seed=seed, out=out,
                                  network=cfg.sandbox.network,
                                  on_done=on_done)
    return eval_result(trajs)


# Config keys whose stage's output is pinned once the stage is complete: (key prefix, markers that pin it).
_PINNED = (("corpus.", ("corpus",)), ("model.path", ("model", "sft")), ("model.size", ("model", "sft")),
           ("sft.", ("sft",)), ("critic.", ("critic",)))


def config_changes(old: Config, new: Config) -> list[tuple[str, Any, Any]]:
    """(dotted key, old value, new value) for every field that differs."""
    out = []
    a, b = old.to_dict(), new.to_dict()
    for section, fields in b.items():
        for key, value in fields.items():
            if a[section][key] != value:
                out.append((f"{section}.{key}", a[section][key], value))
    return out


def check_resume_changes(old: Config, new: Config, run_dir: Path) -> list[str]:
    """Lines saying what a `--resume` changed; ConfigError when a change touches a stage already complete
    (its output would silently not follow the new value)."""
    from conch.config import ConfigError

    lines = []
    for key, before, after in config_changes(old, new):
        for prefix, stages in _PINNED:
            done = [s for s in stages if (run_dir / f"{s}.done.json").exists()]
            if key.startswith(prefix) and done:
                raise ConfigError(f"{key} cannot change on --resume: the {done[0]} stage is complete "
                                  f"({run_dir / (done[0] + '.done.json')}); start a new run with --out")
        lines.append(f"{key}: {before!r} -> {after!r}")
    return lines
