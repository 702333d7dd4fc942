"""Where the PPO driver gets its trajectories from: a rollout source.

Why an object: the driver should not care whether episodes run in this process (one engine, one sandbox pool)
or on Ray workers spread over machines (an engine replica and a sandbox pool each). Both take the same
(task, sample, seed) jobs (`conch.agent.executor.plan_jobs`), return the same plain `Trajectory` data in
(task, sample) order, and take new weights after each update through `load_weights`.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol, Sequence

from conch.agent.executor import Job, RolloutStats, plan_jobs
from conch.agent.rollout import run_rollouts
from conch.agent.trajectory import Trajectory
from conch.config import AgentLoopConfig
from conch.tasks.model import Task

__all__ = ["Job", "LocalRolloutSource", "RolloutSource", "plan_jobs"]


class RolloutSource(Protocol):
    async def rollouts(self, tasks: Sequence[Task], n_per_task: int, seed: int,
                       on_done: Callable[[Trajectory], None] | None = None) -> tuple[list[Trajectory], RolloutStats]:
        ...

    def load_weights(self, state_dict: dict) -> dict[str, float]:
        """Push new policy weights to every engine; returns {"seconds": s, "bytes": n}."""
        ...

    async def aclose(self) -> None: ...


class LocalRolloutSource:
    """Episodes in this process: one engine (continuous batching) and up to `concurrency` sandboxes at once."""

    def __init__(self, engine: Any, codec: Any, agent: AgentLoopConfig, backend: str = "local", concurrency: int = 8,
                 verify_every: int = 0, network: str = "never") -> None:
        self.engine, self.codec, self.agent = engine, codec, agent
        self.backend, self.concurrency, self.verify_every = backend, concurrency, verify_every
        self.network = network

    async def rollouts(self, tasks: Sequence[Task], n_per_task: int, seed: int,
                       on_done: Callable[[Trajectory], None] | None = None) -> tuple[list[Trajectory], RolloutStats]:
        return await run_rollouts(self.engine, self.codec, tasks, n_per_task, self.agent,
                                  concurrency=self.concurrency, backend=self.backend, seed=seed,
                                  verify_every=self.verify_every, on_done=on_done, network=self.network)

    def load_weights(self, state_dict: dict) -> dict[str, float]:
        """Through the engine's WeightSync: in place for the HF engine, a safetensors reload for a vLLM server."""
        from conch.engine.weight_sync import sync_for

        info = sync_for(self.engine).push(state_dict)
        return {"seconds": float(info["seconds"]), "bytes": float(info["bytes"])}

    async def aclose(self) -> None:
        await self.engine.aclose()

