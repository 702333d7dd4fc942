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
import random
import time
from pathlib import Path
from typing import Any

from conch.config import Config, ConfigError, describe
from conch.rl.stages import (
    Corpus,
    EvalResult,
    agent_config,
    build_corpus,
    evaluate,
    init_or_load_model,
    load_task_list,
    log,
    mark_done,
    marker,
)


def check_config(cfg: Config) -> None:
    """Fail before any work when the config cannot run (e.g. routing replay on a dense model)."""
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


def train(cfg: Config, run_dir: Path) -> dict[str, Any]:
    check_config(cfg)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.toml").write_text(describe(cfg))
    t_start = time.monotonic()
    corpus = build_corpus(cfg, run_dir)  # synchronous: it validates tasks with its own event loop
    return asyncio.run(_train(cfg, run_dir, corpus, t_start))


async def _train(cfg: Config, run_dir: Path, corpus: Corpus, t_start: float) -> dict[str, Any]:
    import torch

    from conch.agent.rollout import progress_printer, run_rollouts
    from conch.agent.tito import ChatCodec
    from conch.engine.registry import build_engine, options_from_config
    from conch.engine.weight_sync import sync_for
    from conch.model.loading import load_policy
    from conch.moe.routing import moe_layer_count
    from conch.rl.checkpoint import latest_complete, load_checkpoint, publish_model, save_checkpoint
    from conch.rl.critic import ValueModel
    from conch.rl.losses import LossConfig
    from conch.rl.metrics import MetricsLogger
    from conch.rl.plateau import Plateau
    from conch.rl.rewards import partition, reward_metrics
    from conch.rl.update import ppo_update, prepare
    from conch.tasks.synth.trajectories import BASH_TOOL

    torch.manual_seed(cfg.run.seed)
    train_tasks = load_task_list(corpus.train)
    pool = load_task_list(corpus.rl) if corpus.rl else train_tasks  # what the critic warm-up and PPO roll out on
    eval_tasks = load_task_list(corpus.eval)
    heldout_tasks = load_task_list(corpus.heldout)
    if not train_tasks:
        raise ConfigError(f"no loadable training tasks in {corpus.train}")
    if not pool:
        raise ConfigError(f"no loadable PPO tasks in {corpus.rl}")
    model_dir = init_or_load_model(cfg, run_dir, corpus)
    loaded = load_policy(model_dir, dtype=cfg.model.trainer_dtype, device=cfg.model.trainer_device)
    policy, tok = loaded.model, loaded.tokenizer
    replay = cfg.ppo.routing_replay
    if replay and moe_layer_count(policy) == 0:
        raise ConfigError(f"ppo.routing_replay = true, but {model_dir} has no MoE layers")
    codec = ChatCodec(tok, tools=[BASH_TOOL])
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else codec.end_id
    engine = build_engine(options_from_config(cfg, run_dir), policy, tokenizer=tok, max_batch=cfg.ppo.concurrency,
                          model_dir=model_dir)
    sync = sync_for(engine)

    def push_weights() -> dict:
        info = sync.push(policy)
        log(f"weight sync: {info['bytes'] / 1e6:.1f} MB in {info['seconds']:.2f} s")
        return {"sync/seconds": info["seconds"], "sync/bytes": info["bytes"]}
    evals: dict[str, EvalResult] = {}
    (run_dir / "evals").mkdir(exist_ok=True)

    async def run_eval(name: str, tasks: list, seed: int) -> EvalResult | None:
        cache = run_dir / "evals" / f"{name}.json"
        if cache.exists():
            d = json.loads(cache.read_text())
            return EvalResult(**d)
        if not tasks:
            return None
        log(f"evaluating {name} on {len(tasks)} tasks x {cfg.eval.n_per_task}")
        res = await evaluate(engine, codec, tasks, cfg, seed=seed)
        cache.write_text(json.dumps(res.to_json()))
        log(f"eval {name}: pass rate {res.pass_rate:.3f}, tests passed {res.tests_passed_mean:.2f} ({res.samples} samples)")
        return res

    try:
        # ---- evaluation of the untrained model ------------------------------------------------------------
        evals["init"] = await run_eval("init", eval_tasks, seed=11)
        evals["heldout_init"] = await run_eval("heldout_init", heldout_tasks, seed=12)

        # ---- warm start 1: SFT on expert trajectories --------------------------------------------------------
        warm_dir = run_dir / "warm"
        if marker(run_dir, "sft"):
            policy = load_policy(warm_dir, dtype=cfg.model.trainer_dtype, device=cfg.model.trainer_device,
                                 with_tokenizer=False).model
        else:
            sft_report = warm_start_sft(cfg, policy, codec, corpus.trajectories, pad_id)
            publish_model(policy, tok, warm_dir)
            mark_done(run_dir, "sft", sft_report)
        push_weights()
        evals["warm"] = await run_eval("warm", eval_tasks, seed=11)
        evals["heldout_warm"] = await run_eval("heldout_warm", heldout_tasks, seed=12)

        # ---- warm start 2: critic warm-up with the actor frozen -------------------------------------------
        critic = ValueModel.from_policy(policy)
        opt_v = torch.optim.AdamW(critic.parameters(), lr=cfg.ppo.critic_lr)
        opt_pi = torch.optim.AdamW(policy.parameters(), lr=cfg.ppo.lr, betas=(0.9, 0.95))
        loss_cfg = LossConfig(clip_low=cfg.ppo.clip_low, clip_high=cfg.ppo.clip_high,
                              dual_clip=cfg.ppo.dual_clip or None, value_clip=cfg.ppo.value_clip or None,
                              entropy_coef=cfg.ppo.entropy_coef, kl_coef=cfg.ppo.kl_coef,
                              tis_cap=cfg.ppo.tis_cap or None, agg=cfg.ppo.loss_agg)
        ref_model = None
        if cfg.ppo.kl_coef:
            import copy

            ref_model = copy.deepcopy(policy).eval().requires_grad_(False)
        agent = agent_config(cfg)
        rng = random.Random(cfg.run.seed)
        metrics = MetricsLogger(run_dir, tensorboard=cfg.run.tensorboard, wandb=cfg.run.wandb, config=cfg.to_dict())

        async def rollout(tasks: list, it_seed: int) -> list:
            total = len(tasks) * cfg.ppo.n_per_task
            trajs, stats = await run_rollouts(
                engine, codec, tasks, cfg.ppo.n_per_task, agent, concurrency=cfg.ppo.concurrency,
                backend=cfg.run.sandbox, seed=it_seed, verify_every=cfg.reward.verify_every if cfg.reward.mode == "progress" else 0,
                on_done=progress_printer(total) if total <= 16 else None,
            )
            return trajs, stats

        start_it = 0
        latest = latest_complete(run_dir)
        if latest is not None:
            info = load_checkpoint(latest, model=policy, optimizer={"policy": opt_pi, "critic": opt_v},
                                   aux_models={"critic": critic})
            start_it = info.iteration + 1
            push_weights()
            log(f"resumed from {latest} (iteration {info.iteration})")
        elif marker(run_dir, "critic"):
            critic.load_state_dict(torch.load(run_dir / "critic.pt", weights_only=True))
        else:
            plateau = Plateau(patience=cfg.critic.patience, max_cuts=0)  # on -EV: lower is better
            curve = []
            for i in range(cfg.critic.iterations):
                tasks = rng.sample(pool, min(cfg.ppo.tasks_per_iter, len(pool)))
                trajs, _ = await rollout(tasks, it_seed=10_000 + i)                      # rollout + verify
                kept, _excluded = partition(trajs)
                prepared, _ = prepare(policy, critic, kept, pad_id, replay, cfg.reward.mode,    # reward + GAE
                                      cfg.ppo.gamma, cfg.ppo.lam, cfg.ppo.micro_batch,
                                      group_baseline=cfg.ppo.group_baseline)
                stats = ppo_update(policy, critic, None, opt_v, prepared, pad_id, replay, loss_cfg,  # critic only
                                   cfg.critic.epochs, cfg.ppo.micro_batch, cfg.ppo.grad_accum,
                                   cfg.ppo.max_grad_norm, update_policy=False, seed=i)
                ev = stats.get("train/explained_variance", float("nan"))
                curve.append(ev)
                log(f"critic warm-up {i + 1}/{cfg.critic.iterations}: explained variance {ev:.3f}")
                if plateau.observe(-ev) == "stop":
                    break
            torch.save(critic.state_dict(), run_dir / "critic.pt")
            mark_done(run_dir, "critic", {"explained_variance": curve})

        # ---- PPO ----------------------------------------------------------------------------------------------
        stopped_early = False
        for it in range(start_it, cfg.ppo.iterations):
            t_it = time.monotonic()
            it_rng = random.Random(cfg.run.seed * 7919 + it)
            tasks = it_rng.sample(pool, min(cfg.ppo.tasks_per_iter, len(pool)))
            trajs, rstats = await rollout(tasks, it_seed=it)                                   # rollout + verify
            kept, excluded = partition(trajs)                                                   # errors excluded
            prepared, mismatch = prepare(policy, critic, kept, pad_id, replay, cfg.reward.mode,  # reward + GAE
                                         cfg.ppo.gamma, cfg.ppo.lam, cfg.ppo.micro_batch,
                                         group_baseline=cfg.ppo.group_baseline)
            t_upd = time.monotonic()
            stats = ppo_update(policy, critic, opt_pi, opt_v, prepared, pad_id, replay, loss_cfg,  # update
                               cfg.ppo.epochs, cfg.ppo.micro_batch, cfg.ppo.grad_accum, cfg.ppo.max_grad_norm,
                               seed=it, ref_model=ref_model)
            update_s = time.monotonic() - t_upd
            synced = push_weights()                                                             # sync
            m = {**reward_metrics(trajs, cfg.reward.mode), **mismatch, **stats, **synced}
            m.update(rollout_metrics(trajs, rstats))
            m["time/update_s"] = update_s
            m["time/iteration_s"] = time.monotonic() - t_it
            m["train/tokens_per_s"] = sum(len(p.traj.tokens) for p in prepared) * max(1, cfg.ppo.epochs) / max(update_s, 1e-9)
            due = cfg.ppo.eval_every and (it + 1) % cfg.ppo.eval_every == 0
            if due and it + 1 < cfg.ppo.iterations:                                             # eval
                res = await run_eval(f"iter{it + 1}", eval_tasks, seed=11)
                if res is not None:
                    m["eval/pass_rate"], m["eval/tests_passed_mean"] = res.pass_rate, res.tests_passed_mean
            metrics.log(it, m)
            if (it + 1) % cfg.ppo.checkpoint_every == 0 or it + 1 == cfg.ppo.iterations:           # checkpoint
                save_checkpoint(run_dir, it, policy, tokenizer=tok, optimizer={"policy": opt_pi, "critic": opt_v},
                                aux_models={"critic": critic}, keep=cfg.ppo.keep_checkpoints, overwrite=True)
            if cfg.run.time_budget_minutes and (time.monotonic() - t_start) / 60 > cfg.run.time_budget_minutes:
                log(f"time budget of {cfg.run.time_budget_minutes} min reached after iteration {it + 1}")
                save_checkpoint(run_dir, it, policy, tokenizer=tok, optimizer={"policy": opt_pi, "critic": opt_v},
                                aux_models={"critic": critic}, keep=cfg.ppo.keep_checkpoints, overwrite=True)
                stopped_early = True
                break
        metrics.close()
        publish_model(policy, tok, run_dir / "final")  # the trained policy, for `conch eval --model RUNDIR/final`

        # ---- final evaluation and summary -----------------------------------------------------------------------
        evals["final"] = await run_eval("final", eval_tasks, seed=11)
        evals["heldout_final"] = await run_eval("heldout_final", heldout_tasks, seed=12)
        final_mismatch = last_mismatch(run_dir)
    finally:
        await engine.aclose()
    summary = make_summary(evals, final_mismatch, time.monotonic() - t_start, stopped_early)
    from conch.rl.checkpoint import atomic_write_text

    atomic_write_text(run_dir / "summary.json", json.dumps(summary, indent=2))
    return summary


def warm_start_sft(cfg: Config, policy: Any, codec: Any, trajectories: Path | None, pad_id: int) -> dict:
    from conch.rl.sft import build_example, train_sft

    if trajectories is None or not trajectories.exists():
        log("no expert trajectories (user-supplied train tasks without a synthesized corpus): SFT skipped")
        return {"skipped": True}
    chats = [json.loads(line) for line in trajectories.read_text().splitlines() if line.strip()]
    chats = [c for c in chats if c.get("split", "train") == "train"]
    available = len(chats)
    if cfg.sft.demos:
        chats = balanced_subset(chats, cfg.sft.demos, seed=cfg.run.seed)
    examples = [build_example(codec, c["messages"], cfg.agent.max_context) for c in chats]
    log(f"SFT warm start on {len(examples)} of {available} expert trajectories (budget {cfg.sft.steps} steps)")
    rep = train_sft(policy, examples, pad_id, cfg.sft.steps, cfg.sft.lr, cfg.sft.batch_size, cfg.sft.val_fraction,
                    cfg.sft.eval_every, cfg.sft.patience, max_cuts=cfg.sft.lr_cuts, seed=cfg.run.seed)
    log(f"SFT: {rep.steps} steps, best validation loss {rep.best_val:.3f}, stopped at {rep.stopped} "
        f"(learning rate cut at steps {rep.lr_cuts})")
    return {"steps": rep.steps, "best_val": rep.best_val, "stopped": rep.stopped, "seconds": rep.seconds,
            "lr_cuts": rep.lr_cuts,
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
    lines.append(f"eval: {summary['eval_tasks']} tasks, {summary['eval_samples']} samples; "
                 f"mismatch {summary['mismatch']}; {summary['minutes']:.1f} min")
    return "\n".join(lines)
