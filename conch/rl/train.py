"""`conch train`: warm-started actor-critic PPO for terminal agents. The driver reads like the algorithm:

    corpus → model → eval(init) → SFT warm start → eval(warm) → critic warm-up (actor frozen) →
    for each iteration: rollout → verify → reward → advantages → update → sync → eval → checkpoint
    → eval(final) → summary.json

Where this departs from textbook PPO:
- Rewards come from the task's own verifier; the default is the absolute number of passing tests (`count`),
  placed on the last sampled token. Trajectories whose verifier or sandbox errored are excluded, not scored 0.
- The MDP steps are sampled tokens only: observation and prompt tokens carry the value through and get no loss
  (GAE over sampled tokens; `rl/advantages.py`).
- Old log-probs are the trainer's own, recomputed before the update; the sampler's log-probs only enter through a
  truncated importance-sampling weight (`tis_cap`) that corrects the train/inference gap, and through the
  `mismatch/` metrics.
- Asymmetric clip (clip_low < clip_high) and dual clip for negative advantages; token-mean aggregation.
- The critic is a copy of the warm policy's backbone with a scalar head, warmed up on rollouts of the frozen
  warm policy before PPO starts (the "aggressive warm start").
- R3: with `ppo.routing_replay`, every trainer forward (actor and critic) replays the experts the sampler chose.
- The trainer sees exactly the sampled token ids (TITO, `agent/tito.py`), never a re-tokenization.
- PPO rolls out on its own task pool (`corpus.n_rl`), larger than and disjoint from the tasks whose expert
  trajectories SFT imitated: RL needs only a verifier, and on the demo's 150 demonstrated tasks alone PPO fit
  some families at the cost of others (make-dirs 0.55 -> 0.91, copy-files 0.56 -> 0.46), where 400 fresh
  tasks lifted all five.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import sys
import time
from pathlib import Path
from typing import Any

from conch.config import Config, ConfigError, describe
from conch.rl.figures import iteration_line, last_mismatch, make_summary
from conch.rl.stages import (
    Corpus,
    EvalResult,
    build_corpus,
    evaluate,
    init_or_load_model,
    load_task_list,
    log,
    mark_done,
    marker,
)


def check_config(cfg: Config) -> None:
    """Fail before any work when the config cannot run: a missing path, a folder without tasks, routing replay on
    a dense model (conch/preflight.py)."""
    from conch.preflight import check_model_dir, check_train_paths
    from conch.rl.learner_group import check_ranks

    check_train_paths(cfg)
    check_ranks(cfg)
    if cfg.ppo.routing_replay and cfg.model.path:
        cfg_file = Path(cfg.model.path) / "config.json"
        if not cfg_file.exists():
            raise ConfigError(f"model.path: {cfg_file} not found")
        mc = json.loads(cfg_file.read_text())
        experts = mc.get("num_experts") or mc.get("num_local_experts") or mc.get("n_routed_experts") or 0
        if not experts:
            raise ConfigError(f"ppo.routing_replay = true, but the model at {cfg.model.path} has no MoE layers "
                              f"(no num_experts in config.json); set ppo.routing_replay = false")
    if cfg.engine.backend == "vllm" and not cfg.engine.url and not cfg.engine.launch:
        raise ConfigError("engine.backend = vllm needs engine.url (a running server) or engine.launch = true")
    if "cuda" in (cfg.engine.device, cfg.model.trainer_device):
        import torch

        if not torch.cuda.is_available():
            raise ConfigError("engine.device / model.trainer_device = cuda, but torch sees no CUDA device")
    if not cfg.corpus.train_tasks:
        from conch.tasks.synth import select_families

        try:
            select_families(cfg.corpus.families or None, split="train")
        except ValueError as exc:
            raise ConfigError(f"corpus.families: {exc}") from None
    if cfg.model.path:
        check_model_dir(cfg.model.path, "model.path")


def train(cfg: Config, run_dir: Path) -> dict[str, Any]:
    """The whole run. Ctrl-C or SIGTERM stops it with one line (stage, last checkpoint, the resume command) and
    exit status 130, after every stage's cleanup ran (conch/rl/run_state.py)."""
    from conch.rl.run_state import Interrupt, RunClock

    check_config(cfg)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.toml").write_text(describe(cfg))
    clock, interrupt = RunClock(run_dir), Interrupt()
    try:
        interrupt.enter("the corpus stage")
        corpus = build_corpus(cfg, run_dir)  # synchronous: it validates tasks with its own event loop
        return asyncio.run(_train(cfg, run_dir, corpus, clock, interrupt))
    except (KeyboardInterrupt, asyncio.CancelledError):
        print(interrupt.message(run_dir), file=sys.stderr, flush=True)
        raise SystemExit(130) from None
    finally:
        clock.save()


async def _train(cfg: Config, run_dir: Path, corpus: Corpus, clock: Any, interrupt: Any) -> dict[str, Any]:
    import torch

    from conch.agent.tito import ChatCodec
    from conch.model.loading import load_policy
    from conch.moe.routing import moe_layer_count
    from conch.rl.checkpoint import latest_complete
    from conch.rl.learner_group import make_learner
    from conch.report.hooks import RunRecorder
    from conch.rl.metrics import MetricsLogger
    from conch.tasks.synth.trajectories import BASH_TOOL

    interrupt.install()
    torch.manual_seed(cfg.run.seed)
    train_tasks = load_task_list(corpus.train)
    pool = load_task_list(corpus.rl) if corpus.rl else train_tasks  # what the critic warm-up and PPO roll out on
    eval_tasks = load_task_list(corpus.eval)
    heldout_tasks = load_task_list(corpus.heldout)
    if not pool:
        raise ConfigError(f"no loadable PPO tasks in {corpus.rl}")
    model_dir = init_or_load_model(cfg, run_dir, corpus)
    loaded = load_policy(model_dir, dtype=cfg.model.trainer_dtype, device=cfg.model.trainer_device)
    policy, tok = loaded.model, loaded.tokenizer
    if cfg.ppo.routing_replay and moe_layer_count(policy) == 0:
        raise ConfigError(f"ppo.routing_replay = true, but {model_dir} has no MoE layers")
    codec = ChatCodec(tok, tools=[BASH_TOOL])
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else codec.end_id
    engine = make_eval_engine(cfg, run_dir, policy, tok, model_dir)
    metrics = MetricsLogger(run_dir, tensorboard=cfg.run.tensorboard, wandb=cfg.run.wandb, config=cfg.to_dict(),
                            wandb_project=cfg.run.wandb_project, wandb_run_name=cfg.run.name or run_dir.name,
                            wandb_mode=cfg.run.wandb_mode)
    recorder = RunRecorder(run_dir, metrics, cfg.run.keep_rollouts, seed=cfg.run.seed, sft_steps=cfg.sft.steps)
    evals = Evals(cfg, run_dir, engine, codec, recorder)
    source = learner = None
    try:
        interrupt.enter("the initial evaluation")
        evals["init"] = await evals.run("init", eval_tasks, seed=11)                # the untrained model
        evals["heldout_init"] = await evals.run("heldout_init", heldout_tasks, seed=12)

        interrupt.enter("the SFT warm start")
        policy = sft_stage(cfg, run_dir, policy, tok, codec, corpus, pad_id, recorder)  # warm start 1: SFT
        learner = make_learner(cfg, policy, tok, pad_id, model_dir, run_dir)  # N ranks: cluster.learner_ranks
        evals.weights = learner.weights
        interrupt.enter("the evaluation of the warm policy")
        evals["warm"] = await evals.run("warm", eval_tasks, seed=11)
        evals["heldout_warm"] = await evals.run("heldout_warm", heldout_tasks, seed=12)

        source = make_rollout_source(cfg, engine, codec, model_dir)
        latest = latest_complete(run_dir)
        start_it = 0
        if latest is not None:
            start_it = learner.load(latest) + 1
            log(f"resumed from {latest} (iteration {start_it - 1})")
        elif marker(run_dir, "critic"):
            learner.load_critic(run_dir / "critic.pt")
        else:                                                                        # warm start 2: critic
            interrupt.enter("the critic warm-up")
            curve = await critic_warmup(cfg, learner, source, pool, recorder)
            learner.save_critic(run_dir / "critic.pt")
            mark_done(run_dir, "critic", {"explained_variance": curve})

        if dropped := metrics.keep_before(start_it):  # rows logged after the last checkpoint are redone
            log(f"metrics.jsonl: dropped {dropped} row(s) from iteration {start_it} on, logged after the last checkpoint")
        stopped_early = await ppo(cfg, run_dir, learner, source, pool, evals, eval_tasks, metrics, start_it, clock.t0,
                                  recorder, stage=interrupt.enter)
        learner.publish(run_dir / "final")  # the trained policy, whole, for `conch eval --model`

        interrupt.enter("the final evaluation")
        trained = f"ppo-{ppo_updates(run_dir)}"  # the cache of a resumed run that trained on is not reused
        evals["final"] = await evals.run("final", eval_tasks, seed=11, policy=trained)
        evals["heldout_final"] = await evals.run("heldout_final", heldout_tasks, seed=12, policy=trained)
        final_mismatch = last_mismatch(run_dir)
    finally:
        metrics.close()
        if learner is not None:
            learner.close()  # the follower ranks (stopped already if one failed)
        if source is not None and getattr(source, "engine", None) is not engine:
            await source.aclose()  # Ray workers; the local source shares `engine`, closed below
        await engine.aclose()
    summary = make_summary(evals, final_mismatch, clock.total_seconds(), stopped_early)
    from conch.rl.checkpoint import atomic_write_text

    atomic_write_text(run_dir / "summary.json", json.dumps(summary, indent=2))
    return summary


def ppo_updates(run_dir: Path) -> int:
    """PPO iterations the newest complete checkpoint holds (0 before the first)."""
    from conch.rl.checkpoint import list_checkpoints

    found = list_checkpoints(run_dir)
    return found[-1][0] + 1 if found else 0


def make_eval_engine(cfg: Config, run_dir: Path, policy: Any, tok: Any, model_dir: Path) -> Any:
    """The driver's engine (`engine.backend`: in-process HF, or a vLLM server): evaluations, and the rollouts too
    unless they run on Ray workers."""
    from conch.engine.registry import build_engine, options_from_config

    return build_engine(options_from_config(cfg, run_dir), policy, tokenizer=tok, max_batch=cfg.ppo.concurrency,
                        model_dir=model_dir)


def make_rollout_source(cfg: Config, engine: Any, codec: Any, model_dir: Path) -> Any:
    """`cluster.backend`: this process's engine and sandboxes, or Ray rollout workers."""
    agent = cfg.agent
    verify_every = cfg.reward.verify_every if cfg.reward.mode == "progress" else 0
    if cfg.cluster.backend == "ray":
        from conch.cluster.ray_rollout import RayRolloutSource

        log(f"starting {cfg.cluster.rollout_workers} Ray rollout workers x {cfg.cluster.sandboxes_per_worker} "
            f"sandboxes" + (f" on {cfg.cluster.address}" if cfg.cluster.address else " (local Ray instance)"))
        from conch.engine.registry import options_from_config

        return RayRolloutSource(model_dir, options_from_config(cfg), agent, cfg.cluster, backend=cfg.run.sandbox,
                                verify_every=verify_every, network=cfg.sandbox.network)
    from conch.rl.rollout_source import LocalRolloutSource

    return LocalRolloutSource(engine, codec, agent, backend=cfg.run.sandbox, concurrency=cfg.ppo.concurrency,
                              verify_every=verify_every, network=cfg.sandbox.network)


class Evals(dict):
    """Evaluation results by name, each cached in RUNDIR/evals/NAME.json so a resumed run does not redo it.

    The engine is synced from `weights()` before an evaluation whenever the policy may have changed."""

    def __init__(self, cfg: Config, run_dir: Path, engine: Any, codec: Any, recorder: Any) -> None:
        super().__init__()
        self.cfg, self.run_dir, self.engine, self.codec, self.recorder = cfg, run_dir, engine, codec, recorder
        self.weights: Any = None  # callable returning the policy's current weights, once a learner exists
        self.named_errors: set[str] = set()
        (run_dir / "evals").mkdir(exist_ok=True)

    async def run(self, name: str, tasks: list, seed: int, policy: str = "") -> EvalResult | None:
        """Evaluate `policy` (a name of the weights measured: "init", "warm", "ppo-3"...) on `tasks`, or return
        the cached result when it measured the same policy with the same settings."""
        from conch.rl.checkpoint import atomic_write_text, read_json

        policy = policy or name
        setup = {"seed": seed, "n_per_task": self.cfg.eval.n_per_task, "temperature": self.cfg.eval.temperature,
                 "tasks": len(tasks)}
        cache = self.run_dir / "evals" / f"{name}.json"
        cached = read_json(cache, "evaluation cache")  # an empty or corrupt cache is redone, with a warning
        if isinstance(cached, dict):
            old = EvalResult.from_json(cached)
            if (old.policy or policy, old.setup or setup) == (policy, setup):
                return old
            log(f"evals/{name}.json measured {old.policy or 'another policy'} {old.setup}: evaluating {policy} again")
        if not tasks:
            return None
        if self.weights is not None:
            self.engine.load_weights(self.weights())
        log(f"evaluating {name} ({policy}) on {len(tasks)} tasks x {self.cfg.eval.n_per_task}")
        with self.recorder.evaluation(name, len(tasks) * self.cfg.eval.n_per_task) as keep:  # RUNDIR/trajectories
            res = await evaluate(self.engine, self.codec, tasks, self.cfg, seed=seed, on_done=keep)
        res.policy, res.setup = policy, setup
        self.recorder.evaluated(name, res, self.cfg.ppo.iterations)
        atomic_write_text(cache, json.dumps(res.to_json()))
        log(f"eval {name}: {res.describe()}")
        for task, reason in res.error_tasks.items():
            if task not in self.named_errors:  # said once per run, not at every evaluation
                self.named_errors.add(task)
                log(f"task {task} errored on every sample: {reason}")
        return res


def sft_stage(cfg: Config, run_dir: Path, policy: Any, tok: Any, codec: Any, corpus: Corpus, pad_id: int,
              recorder: Any) -> Any:
    """Warm start 1: SFT on the expert trajectories, once (a resumed run loads the published warm policy)."""
    from conch.model.loading import load_policy
    from conch.rl.checkpoint import publish_model

    warm_dir = run_dir / "warm"
    if marker(run_dir, "sft"):
        return load_policy(warm_dir, dtype=cfg.model.trainer_dtype, device=cfg.model.trainer_device,
                           with_tokenizer=False).model
    report = warm_start_sft(cfg, policy, codec, corpus.trajectories, pad_id, on_step=recorder.sft_step)
    publish_model(policy, tok, warm_dir)
    mark_done(run_dir, "sft", report)
    return policy


def sample_tasks(cfg: Config, pool: list, it: int) -> list:
    rng = random.Random(cfg.run.seed * 7919 + it)
    return rng.sample(pool, min(cfg.ppo.tasks_per_iter, len(pool)))


async def critic_warmup(cfg: Config, learner: Any, source: Any, pool: list, recorder: Any) -> list[float]:
    """Warm start 2: the same iteration as PPO with the actor frozen, until explained variance stops improving."""
    from conch.rl.plateau import Plateau

    source.load_weights(learner.weights())
    plateau = Plateau(patience=cfg.critic.patience, max_cuts=0)  # on -EV: lower is better
    rng = random.Random(cfg.run.seed)
    curve: list[float] = []
    for i in range(cfg.critic.iterations):
        tasks = rng.sample(pool, min(cfg.ppo.tasks_per_iter, len(pool)))
        rollout = await source.rollouts(tasks, cfg.ppo.n_per_task, seed=10_000 + i,
                                        on_done=recorder.rollout_progress(len(tasks) * cfg.ppo.n_per_task,
                                                                          f"critic warm-up {i + 1}"))
        m, _ = await iteration(cfg, learner, rollout, tasks, update_policy=False, seed=i)
        ev = m.get("train/explained_variance", float("nan"))
        curve.append(ev)
        recorder.critic_iteration(i, m)
        log(f"critic warm-up {i + 1}/{cfg.critic.iterations}: explained variance {ev:.3f}")
        if plateau.observe(-ev) == "stop":
            break
    return curve


async def ppo(cfg: Config, run_dir: Path, learner: Any, source: Any, pool: list, evals: Evals | None,
              eval_tasks: list, metrics: Any, start_it: int, t_start: float, recorder: Any = None,
              stage: Any = None) -> bool:
    """PPO iterations: rollout -> verify -> reward -> advantages -> update -> sync -> eval -> checkpoint.

    With `ppo.off_policy_steps = 1` the rollout of iteration k+1 runs (on weights one update old) while the
    learner trains on k; the update's truncated IS and the optional ratio mask correct for the staleness."""
    overlap = cfg.ppo.off_policy_steps > 0
    pending: asyncio.Task | None = None
    pending_version = 0
    version = start_it  # updates applied to the policy (as counted by this run's iterations)

    def start(it: int) -> asyncio.Task:
        sync = source.load_weights(learner.weights())                                      # sync
        metrics_sync.update({"time/sync_s": sync["seconds"], "sync/bytes": sync["bytes"]})
        log(f"weight sync: {sync['bytes'] / 1e6:.1f} MB in {sync['seconds']:.2f} s")
        tasks = sample_tasks(cfg, pool, it)
        label = f"PPO iteration {it + 1}/{cfg.ppo.iterations}"
        progress = recorder.rollout_progress(len(tasks) * cfg.ppo.n_per_task, label) if recorder else None
        return asyncio.ensure_future(source.rollouts(tasks, cfg.ppo.n_per_task, seed=it, on_done=progress))

    metrics_sync: dict[str, float] = {}
    durations: list[float] = []
    for it in range(start_it, cfg.ppo.iterations):
        t_it = time.monotonic()
        if stage is not None:
            stage(f"PPO iteration {it + 1}/{cfg.ppo.iterations}")
        if pending is None:
            pending, pending_version = start(it), version
        rollout = await pending                                                            # rollout + verify
        staleness = version - pending_version
        pending = None
        if overlap and it + 1 < cfg.ppo.iterations:
            pending, pending_version = start(it + 1), version                              # k+1 overlaps update k
        m, scored = await iteration(cfg, learner, rollout, sample_tasks(cfg, pool, it), update_policy=True, seed=it)
        version += 1
        if recorder is not None:                                                           # RUNDIR/trajectories
            m["time/trajectory_write_s"] = recorder.ppo_iteration(it, scored.prepared, scored.excluded)
        m.update(metrics_sync)
        m["mismatch/staleness"] = staleness
        m["time/iteration_s"] = time.monotonic() - t_it
        m["rollout/excluded"] = m.get("reward/excluded", 0.0)
        due = cfg.ppo.eval_every and (it + 1) % cfg.ppo.eval_every == 0
        if due and it + 1 < cfg.ppo.iterations:                                            # eval
            if pending is not None:
                await asyncio.wait([pending])  # the engine must be idle before it takes the newest weights
            res = await evals.run(f"iter{it + 1}", eval_tasks, seed=11)
            if res is not None:
                m["eval/pass_rate"], m["eval/tests_passed_mean"] = res.pass_rate, res.tests_passed_mean
        metrics.log(it, m)
        durations.append(time.monotonic() - t_it)
        log(iteration_line(it, cfg, m, durations, time.monotonic() - t_start))
        over = cfg.run.time_budget_minutes and (time.monotonic() - t_start) / 60 > cfg.run.time_budget_minutes
        if (it + 1) % cfg.ppo.checkpoint_every == 0 or it + 1 == cfg.ppo.iterations or over:  # checkpoint
            learner.save(run_dir, it)
        if over:
            log(f"time budget of {cfg.run.time_budget_minutes} min reached after iteration {it + 1}")
            if pending is not None:
                pending.cancel()
            return True
    return False


async def iteration(cfg: Config, learner: Any, rollout: tuple, tasks: list, update_policy: bool,
                    seed: int) -> tuple[dict[str, float], Any]:
    """One learner step on a finished rollout: score (errors excluded; rewards, GAE), then update. The update
    runs in a thread so a rollout already in flight (off-policy overlap) keeps sampling meanwhile."""
    from conch.rl.rewards import reward_metrics

    trajs, rstats = rollout
    if cfg.reward.mode == "count_over_nop":  # each task's do-nothing count, measured once and cached
        from conch.tasks import nop

        await nop.attach(trajs, tasks, backend=cfg.run.sandbox, jobs=cfg.ppo.concurrency, network=cfg.sandbox.network)
    scored = learner.score(trajs)
    t_upd = time.monotonic()
    stats = await asyncio.to_thread(learner.update, scored, update_policy, seed)
    update_s = time.monotonic() - t_upd
    m = {**reward_metrics(trajs, cfg.reward.mode), **scored.mismatch, **stats, **rollout_metrics(trajs, rstats)}
    m["time/update_s"] = update_s
    epochs = cfg.ppo.epochs if update_policy else cfg.critic.epochs
    m["train/tokens_per_s"] = sum(len(p.traj.tokens) for p in scored.prepared) * max(1, epochs) / max(update_s, 1e-9)
    return m, scored


def warm_start_sft(cfg: Config, policy: Any, codec: Any, trajectories: Path | None, pad_id: int,
                   on_step: Any = None) -> dict:
    from conch.rl.sft import build_example, train_sft

    if trajectories is None or not trajectories.exists():
        log("no demonstrations (no SFT task's solution passed when run one command per turn, and no "
            "corpus.sft_data): SFT skipped")
        return {"skipped": True}
    chats = [json.loads(line) for line in trajectories.read_text().splitlines() if line.strip()]
    chats = [c for c in chats if c.get("split", "train") == "train"]
    available = len(chats)
    if cfg.sft.demos:
        chats = balanced_subset(chats, cfg.sft.demos, seed=cfg.run.seed)
    from conch.model.context import context_length

    limit = context_length(cfg.agent.max_context, policy)
    examples = [build_example(codec, c["messages"], limit) for c in chats]
    log(f"SFT warm start on {len(examples)} of {available} expert trajectories (budget {cfg.sft.steps} steps)")
    rep = train_sft(policy, examples, pad_id, cfg.sft.steps, cfg.sft.lr, cfg.sft.batch_size, cfg.sft.val_fraction,
                    cfg.sft.eval_every, cfg.sft.patience, max_cuts=cfg.sft.lr_cuts, seed=cfg.run.seed,
                    on_step=on_step)
    val = (f"best validation loss {rep.best_val:.3f}" if math.isfinite(rep.best_val)
           else "no validation split (sft.val_fraction = 0 or too few demonstrations)")
    cuts = f"learning rate cut at steps {', '.join(map(str, rep.lr_cuts))}" if rep.lr_cuts else "no learning-rate cut"
    log(f"SFT: {rep.steps} steps, {val}, stopped at {rep.stopped} ({cuts})")
    best = rep.best_val if math.isfinite(rep.best_val) else None  # JSON has no infinity
    return {"steps": rep.steps, "best_val": best, "stopped": rep.stopped, "seconds": rep.seconds,
            "lr_cuts": rep.lr_cuts, "train_curve": rep.train_loss,
            "val_curve": rep.val_loss, "examples": rep.examples, "val_examples": rep.val_examples}


def balanced_subset(chats: list[dict], n: int, seed: int) -> list[dict]:
    """`n` chats taken round-robin over families (each family's order shuffled by `seed`), in corpus order.
    Every expert chat conch writes names its family (`tasks/synth/trajectories.py`)."""
    by_family: dict[str, list[int]] = {}
    for i, c in enumerate(chats):
        by_family.setdefault(c.get("family", ""), []).append(i)
    rng = random.Random(seed)
    queues = [rng.sample(idx, len(idx)) for _, idx in sorted(by_family.items())]
    picked: list[int] = []
    while len(picked) < min(n, len(chats)):
        for q in queues:
            if q and len(picked) < n:
                picked.append(q.pop())
    return [chats[i] for i in sorted(picked)]


def rollout_metrics(trajs: list, rstats: Any) -> dict[str, float]:
    n = len(trajs) or 1
    m: dict[str, float] = {
        "rollout/trajectories": len(trajs),
        "rollout/turns_mean": sum(len(t.turns) for t in trajs) / n,
        "rollout/tokens_mean": sum(len(t.tokens) for t in trajs) / n,
        "rollout/sampled_tokens": rstats.sampled_tokens,
        "rollout/tokens_per_s": rstats.tokens_per_s,
        "rollout/env_steps_per_s": rstats.steps_per_s,
        "time/rollout_s": rstats.seconds,
        "sandbox/start_s_mean": sum(t.timings.get("sandbox_start_seconds", 0.0) for t in trajs) / n,
        "sandbox/verify_s_mean": sum(t.timings.get("verify_seconds", 0.0) for t in trajs) / n,
    }
    for t in trajs:
        key = f"stop/{t.stop_reason.value}"
        m[key] = m.get(key, 0) + 1 / n
    return m
