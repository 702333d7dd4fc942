"""The one job executor: a list of (task, sample) jobs, run at most N at a time, results in job order.

Why one: `conch check`, SFT demonstrations, evaluation, rollouts and the benchmarks all fan a list of episodes
out over sandboxes the same way, and they must agree on the plan (which (task, sample) pairs, in what order),
on the seed of each episode (so a trajectory does not depend on where it ran) and on the figures of a batch
(`RolloutStats`). In this process the fan-out is `run_jobs` (asyncio, a semaphore bounds the episodes in
flight); on Ray workers it is `conch.cluster.ray_rollout.RayRolloutSource`, over the same `plan_jobs` plan and
the same `RolloutStats`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

J = TypeVar("J")
R = TypeVar("R")


def episode_seed(base: int, index: int) -> int:
    """The sampling seed of the `index`-th (task, sample) episode of a rollout seeded `base` (every rollout
    path, local or on Ray workers, seeds its episodes this way, so a trajectory does not depend on where it ran)."""
    return base * 1_000_003 + index


@dataclass(frozen=True)
class Job:
    """One episode to run: the `index` orders results and derives the episode's sampling seed."""

    index: int
    task: Any  # a Task (or, for `conch check`, a TaskLoadError reported as a result)
    sample: int

    def seed(self, base: int) -> int:
        return episode_seed(base, self.index)


def plan_jobs(tasks: Sequence[Any], n_per_task: int = 1) -> list[Job]:
    """Every (task, sample) pair once, in task order: the unit of scheduling and of exactly-once accounting."""
    return [Job(i, t, k) for i, (t, k) in enumerate((t, k) for t in tasks for k in range(n_per_task))]


@dataclass(frozen=True)
class RolloutStats:
    """What a batch of trajectories did: how many, tokens sampled, commands run, wall seconds."""

    trajectories: int
    sampled_tokens: int
    env_steps: int
    seconds: float

    @classmethod
    def of(cls, trajs: Sequence[Any], seconds: float) -> "RolloutStats":
        return cls(trajectories=len(trajs), sampled_tokens=sum(t.num_sampled for t in trajs),
                   env_steps=sum(1 for t in trajs for turn in t.turns if turn.command is not None), seconds=seconds)

    @property
    def tokens_per_s(self) -> float:
        return self.sampled_tokens / self.seconds if self.seconds else 0.0

    @property
    def steps_per_s(self) -> float:
        return self.env_steps / self.seconds if self.seconds else 0.0


async def run_jobs(jobs: Sequence[J], run: Callable[[J], Awaitable[R]], concurrency: int = 1,
                   on_done: Callable[[R], None] | None = None) -> list[R]:
    """`run(job)` for every job, at most `concurrency` at a time; results in job order, `on_done` as each ends
    (outside the bound, so a slow callback never holds a sandbox slot)."""
    gate = asyncio.Semaphore(max(1, concurrency))

    async def one(job: J) -> R:
        async with gate:
            result = await run(job)
        if on_done is not None:
            on_done(result)
        return result

    return list(await asyncio.gather(*(one(j) for j in jobs)))
