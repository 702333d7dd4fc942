"""Many trajectories at once: while some episodes wait on their shell, others decode in the engine's batch.

Each (task, sample) pair runs in its own sandbox with its own engine session; an asyncio semaphore bounds the
number in flight. Finished trajectories are appended to the JSONL file as they complete, so an interrupted
rollout keeps everything that finished.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from conch.agent.loop import AgentConfig, run_episode
from conch.agent.tito import ChatCodec
from conch.agent.trajectory import StopReason, Trajectory
from conch.engine.base import Engine
from conch.tasks.model import Task


@dataclass(frozen=True)
class RolloutStats:
    trajectories: int
    sampled_tokens: int
    env_steps: int
    seconds: float

    @property
    def tokens_per_s(self) -> float:
        return self.sampled_tokens / self.seconds if self.seconds else 0.0

    @property
    def steps_per_s(self) -> float:
        return self.env_steps / self.seconds if self.seconds else 0.0


def episode_seed(base: int, index: int) -> int:
    """The sampling seed of the `index`-th (task, sample) episode of a rollout seeded `base` (every rollout
    path, local or on Ray workers, seeds its episodes this way, so a trajectory does not depend on where it ran)."""
    return base * 1_000_003 + index


def system_prompt() -> str:
    from conch.tasks.synth.trajectories import SYSTEM_PROMPT

    return SYSTEM_PROMPT


async def run_one(
    engine: Engine,
    codec: ChatCodec,
    task: Task,
    sample: int,
    cfg: AgentConfig,
    backend: str = "local",
    seed: int | None = None,
    verify_every: int = 0,
    network: str = "never",
) -> Trajectory:
    """One episode of `task` in a fresh sandbox, then its verifier. Never raises (except cancellation)."""
    from conch.sandbox import make_sandbox
    from conch.sandbox.network import granted
    from conch.verify import verify

    traj = Trajectory(task=task.name, sample=sample, mode=cfg.mode)
    sandbox = make_sandbox(backend, task.sandbox_spec(), registries=granted(network, task.allow_internet))
    t0 = time.monotonic()
    try:
        await sandbox.start()
        traj.timings["sandbox_start_seconds"] = time.monotonic() - t0
        shell = await sandbox.shell()

        async def measure_progress(turn_idx: int) -> None:
            # Reward mode `progress`: count passing tests every `verify_every` turns, in a verifier box over the
            # agent's filesystem while the agent is frozen (it never sees the tests).
            if verify_every and (turn_idx + 1) % verify_every == 0:
                res = await verify(sandbox, task, final=False)
                traj.progress.append((turn_idx, res.n_passed))

        await run_episode(
            engine,
            codec,
            shell,
            system_prompt(),
            task.instruction,
            cfg,
            traj,
            seed=seed,
            agent_timeout=cfg.agent_timeout or task.agent_timeout_sec,
            on_turn=measure_progress if verify_every else None,
        )
        await shell.close()
        t_v = time.monotonic()
        result = await verify(sandbox, task)
        traj.timings["verify_seconds"] = time.monotonic() - t_v
        traj.n_passed, traj.n_total, traj.reward, traj.verifier_error = (
            result.n_passed,
            result.n_total,
            result.reward,
            result.error,
        )
        traj.verifier_fault, traj.tampered = result.fault, result.tampered
        if result.error and result.fault == "agent":
            traj.n_passed = 0  # the agent broke its own verification: a failure, never its partial count
        traj.tests = [{"name": t.name, "status": t.status} for t in result.tests]
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        traj.stop_reason = StopReason.ERROR
        traj.error = f"{type(exc).__name__}: {exc}"
    finally:
        try:
            await sandbox.stop()
        except Exception:
            pass
    traj.timings["total_seconds"] = time.monotonic() - t0
    return traj


async def run_rollouts(
    engine: Engine,
    codec: ChatCodec,
    tasks: Sequence[Task],
    n_per_task: int,
    cfg: AgentConfig,
    concurrency: int = 8,
    backend: str = "local",
    seed: int = 0,
    out: Path | None = None,
    verify_every: int = 0,
    on_done: Callable[[Trajectory], None] | None = None,
    network: str = "never",
) -> tuple[list[Trajectory], RolloutStats]:
    """Run `n_per_task` episodes of every task, `concurrency` at a time; results in (task, sample) order."""
    gate = asyncio.Semaphore(max(1, concurrency))
    jobs = [(t, k) for t in tasks for k in range(n_per_task)]
    fh = open(out, "a") if out is not None else None
    t0 = time.monotonic()
    done = 0

    async def one(i: int, task: Task, k: int) -> Trajectory:
        nonlocal done
        async with gate:
            traj = await run_one(engine, codec, task, k, cfg, backend, seed=episode_seed(seed, i),
                                 verify_every=verify_every, network=network)
        done += 1
        if fh is not None:
            fh.write(traj.dumps() + "\n")
            fh.flush()
        if on_done is not None:
            on_done(traj)
        return traj

    try:
        trajs = list(await asyncio.gather(*(one(i, t, k) for i, (t, k) in enumerate(jobs))))
    finally:
        if fh is not None:
            fh.close()
    seconds = time.monotonic() - t0
    stats = RolloutStats(
        trajectories=len(trajs),
        sampled_tokens=sum(t.num_sampled for t in trajs),
        env_steps=sum(1 for t in trajs for turn in t.turns if turn.command is not None),
        seconds=seconds,
    )
    return trajs, stats


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
