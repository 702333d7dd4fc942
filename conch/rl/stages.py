"""The stages around the PPO loop: corpus, model, evaluation. Each is resumable: its output lives in RUNDIR and
a finished stage leaves a marker (`*.done.json`) with what it produced, so `--resume` skips it.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from conch.config import Config

EVAL_SEED_OFFSET = 1_000_000  # eval tasks use synthesis seeds far from the training seeds


_T0 = time.monotonic()


def log(msg: str) -> None:
    """A progress line on stderr, stamped with minutes:seconds since the command started."""
    m, s = divmod(int(time.monotonic() - _T0), 60)
    print(f"conch train [{m:02d}:{s:02d}]: {msg}", file=sys.stderr, flush=True)


def marker(run_dir: Path, name: str) -> dict | None:
    p = run_dir / f"{name}.done.json"
    return json.loads(p.read_text()) if p.exists() else None


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


def build_corpus(cfg: Config, run_dir: Path) -> Corpus:
    """Synthesize the train split (with expert trajectories), an eval set of new seeds of the same families, and
    a heldout-family set; or use the task folders the user named."""
    done = marker(run_dir, "corpus")
    if done:
        return Corpus(Path(done["train"]), Path(done["eval"]), Path(done["heldout"]),
                      Path(done["trajectories"]) if done["trajectories"] else None,
                      Path(done["rl"]) if done.get("rl") else None)
    from conch.tasks.synth import select_families, summary_lines, synthesize

    root = run_dir / "corpus"
    c = cfg.corpus
    t0 = time.monotonic()
    train_fams = select_families(c.families or None, split="train")
    traj_path: Path | None = None
    if c.train_tasks:
        train = Path(c.train_tasks)
    else:
        train, traj_path = root / "train", root / "expert.jsonl"
        log(f"synthesizing {c.n_train} training tasks ({len(train_fams)} families) with expert trajectories")
        rep = synthesize(train, c.n_train, c.seed, train_fams, validate=True, jobs=cfg.run.jobs,
                         backend=cfg.run.sandbox, trajectories=traj_path, log=lambda m: None,
                         mistake_rate=c.mistake_rate)
        for line in summary_lines(rep, train_fams):
            log(line)
    if c.eval_tasks:
        eval_dir = Path(c.eval_tasks)
    else:
        eval_dir = root / "eval"
        log(f"synthesizing {c.n_eval} evaluation tasks (training families, unseen seeds)")
        synthesize(eval_dir, c.n_eval, c.seed + EVAL_SEED_OFFSET, train_fams, validate=True, jobs=cfg.run.jobs,
                   backend=cfg.run.sandbox, log=lambda m: None)
        dropped = drop_seen_instructions(eval_dir, train)
        if dropped:
            log(f"dropped {dropped} evaluation task(s) whose instruction also occurs in the training set")
    rl: Path | None = None
    if c.n_rl > 0 and c.train_tasks:
        log(f"corpus.n_rl = {c.n_rl} ignored: PPO rolls out on corpus.train_tasks ({train})")
    elif c.n_rl > 0:
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
                   validate=True, jobs=cfg.run.jobs, backend=cfg.run.sandbox, log=lambda m: None)
    corpus = Corpus(train, eval_dir, heldout, traj_path, rl)
    mark_done(run_dir, "corpus", {"train": str(train), "eval": str(eval_dir), "heldout": str(heldout),
                                  "trajectories": str(traj_path) if traj_path else None,
                                  "rl": str(rl) if rl else None,
                                  "seconds": time.monotonic() - t0})
    return corpus


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


def init_or_load_model(cfg: Config, run_dir: Path, corpus: Corpus) -> Path:
    """The starting checkpoint folder: the user's, or a tiny Qwen3-MoE whose tokenizer is trained on the corpus."""
    if cfg.model.path:
        return Path(cfg.model.path)
    out = run_dir / "init"
    if marker(run_dir, "model"):
        return out
    from conch.model.init import init_model

    extra = [corpus.train] + ([corpus.trajectories] if corpus.trajectories else [])
    log(f"initialising a {cfg.model.size} Qwen3-MoE model with a tokenizer trained on the corpus")
    init_model(out, size=cfg.model.size, seed=cfg.run.seed, tokenizer_corpus=extra)
    mark_done(run_dir, "model", {"path": str(out)})
    return out


@dataclass
class EvalResult:
    pass_rate: float
    tests_passed_mean: float
    samples: int
    tasks: int
    per_task: dict[str, dict[str, float]]

    def to_json(self) -> dict[str, Any]:
        return {"pass_rate": self.pass_rate, "tests_passed_mean": self.tests_passed_mean, "samples": self.samples,
                "tasks": self.tasks, "per_task": self.per_task}


def eval_result(trajs: Sequence[Any]) -> EvalResult:
    per: dict[str, list] = {}
    for t in trajs:
        per.setdefault(t.task, []).append(t)
    n = len(trajs) or 1
    solved = [t for t in trajs if t.n_total and t.n_passed == t.n_total and not t.verifier_error]
    return EvalResult(
        pass_rate=len(solved) / n,
        tests_passed_mean=sum(t.n_passed for t in trajs) / n,
        samples=len(trajs),
        tasks=len(per),
        per_task={k: {"pass_rate": sum(1 for t in v if t.n_total and t.n_passed == t.n_total) / len(v),
                      "tests_passed_mean": sum(t.n_passed for t in v) / len(v),
                      "n_total": max(t.n_total for t in v)} for k, v in sorted(per.items())},
    )


async def evaluate(engine: Any, codec: Any, tasks: Sequence[Any], cfg: Config, seed: int, n_per_task: int | None = None,
                   out: Path | None = None, on_done: Any = None) -> EvalResult:
    from dataclasses import replace

    from conch.agent.rollout import run_rollouts

    agent = agent_config(cfg)
    agent = replace(agent, temperature=cfg.eval.temperature, top_p=1.0 if cfg.eval.temperature == 0 else agent.top_p)
    trajs, _ = await run_rollouts(engine, codec, tasks, n_per_task or cfg.eval.n_per_task, agent,
                                  concurrency=cfg.ppo.concurrency, backend=cfg.run.sandbox, seed=seed, out=out,
                                  on_done=on_done)
    return eval_result(trajs)


def agent_config(cfg: Config):
    from conch.agent.loop import AgentConfig

    a = cfg.agent
    return AgentConfig(max_turns=a.max_turns, max_context=a.max_context, max_new_tokens=a.max_new_tokens,
                       obs_token_budget=a.obs_token_budget, command_timeout=a.command_timeout,
                       temperature=a.temperature, top_p=a.top_p, mode=a.mode)
