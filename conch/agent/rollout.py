"""Many trajectories at once: while some episodes wait on their shell, others decode in the engine's batch.

Each (task, sample) job runs in its own sandbox with its own engine session, through the one episode runner
(`conch.agent.episode.run_episode` with a `PolicyAgent`) and the one job executor (`conch.agent.executor`),
which bounds the number in flight. Finished trajectories are appended to the JSONL file as they complete, so
an interrupted rollout keeps everything that finished.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Callable, Sequence

from conch.agent.episode import PolicyAgent, run_episode, sandbox_factory, system_prompt
from conch.agent.executor import Job, RolloutStats, episode_seed, plan_jobs, run_jobs
from conch.agent.loop import AgentLoop
from conch.agent.tito import ChatCodec
from conch.agent.trajectory import StopReason, Trajectory
from conch.config import AgentLoopConfig
from conch.engine.base import Engine
from conch.tasks.model import Task

__all__ = ["RolloutStats", "dump_summary", "episode_seed", "progress_printer", "run_one", "run_rollouts",
           "summarize", "system_prompt"]


async def run_one(
    engine: Engine,
    codec: ChatCodec,
    task: Task,
    sample: int,
    cfg: AgentLoopConfig,
    backend: str = "local",
    seed: int | None = None,
    verify_every: int = 0,
    network: str = "never",
) -> Trajectory:
    """One episode of the policy on `task` in a fresh sandbox, then its verifier. Never raises (except
    cancellation). `run_episode` with a `PolicyAgent`, for callers holding an engine and a codec."""
    agent = PolicyAgent(engine, codec, cfg, verify_every=verify_every)
    return await run_episode(task, agent, sandbox_factory(backend, network), sample=sample, seed=seed)


async def run_rollouts(
    engine: Engine,
    codec: ChatCodec,
    tasks: Sequence[Task],
    n_per_task: int,
    cfg: AgentLoopConfig,
    concurrency: int = 8,
    backend: str = "local",
    seed: int = 0,
    out: Path | None = None,
    verify_every: int = 0,
    on_done: Callable[[Trajectory], None] | None = None,
    network: str = "never",
    loop: Callable[..., AgentLoop] = AgentLoop,
) -> tuple[list[Trajectory], RolloutStats]:
    """Run `n_per_task` episodes of every task, `concurrency` at a time; results in (task, sample) order.
    `loop` builds each episode's agent loop (a benchmark's subclass; production keeps `AgentLoop`)."""
    agent = PolicyAgent(engine, codec, cfg, verify_every=verify_every, loop=loop)
    sandboxes = sandbox_factory(backend, network)
    fh = open(out, "a") if out is not None else None
    t0 = time.monotonic()

    async def one(job: Job) -> Trajectory:
        return await run_episode(job.task, agent, sandboxes, sample=job.sample, seed=job.seed(seed))

    def done(traj: Trajectory) -> None:
        if fh is not None:
            fh.write(traj.dumps() + "\n")
            fh.flush()
        if on_done is not None:
            on_done(traj)

    try:
        trajs = await run_jobs(plan_jobs(tasks, n_per_task), one, concurrency, done)
    finally:
        if fh is not None:
            fh.close()
    return trajs, RolloutStats.of(trajs, time.monotonic() - t0)


def progress_printer(total: int) -> Callable[[Trajectory], None]:
    count = 0

    def show(traj: Trajectory) -> None:
        nonlocal count
        count += 1
        err = f"  error: {traj.error or traj.verifier_error}" if (traj.error or traj.verifier_error) else ""
        print(
            f"[{count}/{total}] {traj.task}#{traj.sample}  {traj.n_passed}/{traj.n_total}  "
            f"turns={len(traj.turns)}  stop={traj.stop_reason.value}{err}",
            file=sys.stderr,
            flush=True,
        )

    return show


def summarize(trajs: Sequence[Trajectory]) -> dict:
    n = len(trajs) or 1
    return {
        "trajectories": len(trajs),
        "pass_rate": sum(1 for t in trajs if t.n_total and t.n_passed == t.n_total) / n,
        "tests_passed_mean": sum(t.n_passed for t in trajs) / n,
        "stop_reasons": {r.value: sum(1 for t in trajs if t.stop_reason == r) for r in StopReason if any(t.stop_reason == r for t in trajs)},
        "drift": {k: sum(t.drift.get(k, 0) for t in trajs) for k in sorted({k for t in trajs for k in t.drift})},
    }


def dump_summary(trajs: Sequence[Trajectory]) -> str:
    return json.dumps(summarize(trajs), indent=2)
