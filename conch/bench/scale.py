"""`conch bench scale`: rollouts over Ray workers (scaling, a killed worker), off-policy overlap, weight sync.

What it measures, on a local Ray cluster (this machine):
- rollout: the same batch of sandbox-bound episodes (every command sleeps, so the cores are not the limit) on
  1, 2, 4 workers; the ideal time is the best a perfect scheduler could do with the episodes' own durations:
  max(longest episode, total episode time / slots);
- fault: one worker killed while it has episodes in flight; every scheduled (task, sample) must come back once;
- async: PPO iterations of the real driver (`rl/train.ppo`) with `off_policy_steps` 0 and 1, the commands'
  sleep calibrated (one iteration first) so the rollout takes about as long as the update;
- sync: seconds and bytes to push the policy to every worker.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from conch.engine.registry import EngineOptions  # plain data, no heavy imports

TEST_SH = """#!/bin/bash
mkdir -p /logs/verifier
status=failed; [ -f /app/done ] && status=passed
echo '{"results": {"tests": [{"name": "done", "status": "'$status'"}]}}' > /logs/verifier/ctrf.json
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workers", default="1,2,4", help="rollout worker counts to compare (default 1,2,4)")
    parser.add_argument("--trajectories", type=int, default=256, help="episodes per rollout run (default 256)")
    parser.add_argument("--slots", type=int, default=8, help="sandboxes per worker (default 8)")
    parser.add_argument("--sleep", type=float, default=2.0, help="seconds each command sleeps (default 2)")
    parser.add_argument("--turns", type=int, default=2, help="commands per episode (default 2)")
    parser.add_argument("--iterations", type=int, default=3, help="PPO iterations per async mode (default 3)")


def write_task(root: Path) -> Path:
    """A minimal Harbor task: the verifier passes when /app/done exists."""
    task = root / "sleepy"
    (task / "environment").mkdir(parents=True)
    (task / "tests").mkdir()
    (task / "task.toml").write_text('version = "1.0"\n[verifier]\ntimeout_sec = 60.0\n[agent]\ntimeout_sec = 600.0\n')
    (task / "instruction.md").write_text("Create the file /app/done.\n")
    (task / "environment" / "Dockerfile").write_text("FROM python:3.11-slim-bookworm\nWORKDIR /app\n")
    (task / "tests" / "test.sh").write_text(TEST_SH)
    return task


def _cluster(workers: int, slots: int) -> Any:
    from conch.config import ClusterConfig

    return ClusterConfig(backend="ray", rollout_workers=workers, sandboxes_per_worker=slots, worker_cpus=0.01,
                         start_timeout=300)


def _ideal(trajs: list, slots: int) -> float:
    times = [t.timings.get("total_seconds", 0.0) for t in trajs]
    return max(max(times, default=0.0), sum(times) / max(1, slots))


async def _rollout_runs(args: argparse.Namespace, model_dir: Path, agent: Any, tasks: list) -> dict:
    from conch.cluster.ray_rollout import RayRolloutSource

    out: dict[str, Any] = {"workers": [], "trajectories": args.trajectories, "seconds": [], "ideal_seconds": [],
                           "lost": 0, "duplicated": 0, "payload_bytes_per_1k_tokens": None}
    for w in [int(x) for x in args.workers.split(",") if x.strip()]:
        src = RayRolloutSource(model_dir, EngineOptions(), agent, _cluster(w, args.slots), loop=_loop(args))
        try:
            t0 = time.monotonic()
            trajs, _ = await src.rollouts(tasks, args.trajectories, seed=w)
            seconds = time.monotonic() - t0
        finally:
            await src.aclose()
        want = {(tasks[0].name, k) for k in range(args.trajectories)}
        got = [(t.task, t.sample) for t in trajs]
        out["lost"] += len(want - set(got))
        out["duplicated"] += len(got) - len(set(got)) + src.last["duplicated"]
        out["workers"].append(w)
        out["seconds"].append(round(seconds, 2))
        out["ideal_seconds"].append(round(_ideal(trajs, w * args.slots), 2))
        out["payload_bytes_per_1k_tokens"] = round(1000 * src.last["shipped_bytes"] / max(1, src.last["tokens"]))
        out["payload_over_raw"] = round(src.last["shipped_bytes"] / max(1, src.last["raw_bytes"]), 3)
        print(f"bench scale: {w} workers: {seconds:.1f} s (ideal {out['ideal_seconds'][-1]:.1f} s)", file=sys.stderr)
    return out


async def _fault_run(args: argparse.Namespace, model_dir: Path, agent: Any, tasks: list) -> dict:
    import ray

    from conch.cluster.ray_rollout import RayRolloutSource

    src = RayRolloutSource(model_dir, EngineOptions(), agent, _cluster(2, args.slots), loop=_loop(args))
    n = 4 * args.slots
    killed: list[int] = []

    def on_dispatch(job: Any, worker: int) -> None:
        if len(killed) == 0 and job.index == 2 * args.slots:  # both workers full, a result came back
            killed.append(worker)
            ray.kill(src.workers[0], no_restart=True)

    try:
        trajs, _ = await src.rollouts(tasks, n, seed=99, on_dispatch=on_dispatch)
    finally:
        await src.aclose()
    got = [(t.task, t.sample) for t in trajs]
    want = {(tasks[0].name, k) for k in range(n)}
    return {"killed_workers": len(killed), "requeued": src.last["requeued"], "lost": len(want - set(got)),
            "duplicated": len(got) - len(set(got)) + src.last["duplicated"]}


async def _ppo_rows(args: argparse.Namespace, model_dir: Path, tasks: list, run_dir: Path, steps: int,
                    iterations: int, sleep: float) -> tuple[list[dict], float]:
    """PPO iterations of the real driver on 2 Ray workers: (metrics rows, wall seconds)."""
    from conch.config import load_config
    from conch.model.loading import load_policy
    from conch.rl.learner import Learner
    from conch.rl.metrics import MetricsLogger
    from conch.cluster.ray_rollout import RayRolloutSource
    from conch.rl.train import ppo

    cfg = load_config(overrides=[
        "cluster.backend=ray", "cluster.rollout_workers=2", f"cluster.sandboxes_per_worker={args.slots}",
        "cluster.worker_cpus=0.01", f"ppo.off_policy_steps={steps}", f"ppo.iterations={iterations}",
        "ppo.tasks_per_iter=1", f"ppo.n_per_task={2 * args.slots}", "ppo.micro_batch=4", "ppo.grad_accum=2",
        "ppo.epochs=2", "ppo.checkpoint_every=1000", f"agent.max_turns={args.turns}", "agent.max_new_tokens=8",
        "run.time_budget_minutes=0"])
    loaded = load_policy(model_dir)
    learner = Learner(cfg, loaded.model, loaded.tokenizer, pad_id=loaded.tokenizer.pad_token_id or 0)
    source = RayRolloutSource(model_dir, EngineOptions(), _agent(args), cfg.cluster, loop=_loop(args, sleep))
    run_dir.mkdir()
    metrics = MetricsLogger(run_dir)
    try:
        t0 = time.monotonic()
        await ppo(cfg, run_dir, learner, source, tasks, None, [], metrics, 0, t0)
        total = time.monotonic() - t0
    finally:
        metrics.close()
        await source.aclose()
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()], total


async def _async_runs(args: argparse.Namespace, model_dir: Path, tasks: list, tmp: Path) -> tuple[dict, dict]:
    """Overlap pays most when rollout and update take equally long, so one calibration iteration measures both
    and the commands' sleep is set to make the rollout last about as long as the update (`--sleep` otherwise)."""
    rows, _ = await _ppo_rows(args, model_dir, tasks, tmp / "calibrate", 0, 1, args.sleep)
    update_s, rollout_s = rows[-1]["time/update_s"], rows[-1]["time/rollout_s"]
    overhead = max(0.0, rollout_s - args.turns * args.sleep)  # sampling, sandbox start, verification
    sleep = round(max(0.1, (update_s - overhead) / args.turns), 2)
    result: dict[str, float] = {"sleep_s": sleep}
    sync: dict[str, float] = {}
    for steps in (0, 1):
        rows, total = await _ppo_rows(args, model_dir, tasks, tmp / f"async{steps}", steps, args.iterations, sleep)
        mode = "async" if steps else "sync"
        result[f"{mode}_iteration_s"] = round(total / max(1, len(rows)), 2)
        result[f"{mode}_update_s"] = round(sum(r["time/update_s"] for r in rows) / len(rows), 2)
        result[f"{mode}_rollout_s"] = round(sum(r["time/rollout_s"] for r in rows) / len(rows), 2)
        sync = {"seconds": round(max(r.get("time/sync_s", 0.0) for r in rows), 4),
                "bytes": int(max(r.get("sync/bytes", 0) for r in rows))}
        print(f"bench scale: off_policy_steps={steps}: {result} ", file=sys.stderr)
    return result, sync


def _agent(args: argparse.Namespace) -> Any:
    from conch.bench.agents import bench_agent

    return bench_agent(max_turns=args.turns, max_new_tokens=8, max_context=1024, command_timeout=60)


def _loop(args: argparse.Namespace, sleep: float | None = None) -> Any:
    """Every turn sleeps, then marks the task done (the model emits no tool call)."""
    from conch.bench.agents import fallback_spec

    return fallback_spec(f"sleep {args.sleep if sleep is None else sleep}; touch /app/done")


async def _bench(args: argparse.Namespace) -> dict:
    from conch.cluster.ray_rollout import connect
    from conch.model.init import cached_model
    from conch.tasks.loader import load_tasks

    connect("")
    model_dir = cached_model()
    with tempfile.TemporaryDirectory(prefix="conch-bench-scale-") as tmp:
        tasks = load_tasks([write_task(Path(tmp))])
        agent = _agent(args)
        rollout = await _rollout_runs(args, model_dir, agent, tasks)
        fault = await _fault_run(args, model_dir, agent, tasks)
        async_part, sync = await _async_runs(args, model_dir, tasks, Path(tmp))
    return {"rollout": rollout, "fault": fault, "async": async_part, "sync": sync}


def run(args: argparse.Namespace) -> int:
    try:
        import ray  # noqa: F401
    except ImportError:
        print("conch bench scale: needs ray (pinned in pyproject; `make install`)", file=sys.stderr)
        return 2
    result = asyncio.run(_bench(args))
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))
    return 0
