"""Rollout workers as Ray actors: each holds an engine replica and a pool of sandbox slots.

Scheduling: every (task, sample) pair is one job in a single queue; whenever a slot of any worker is idle it
takes the next job. A slow 300-turn episode therefore holds one slot, never a worker's whole share of the batch.

Exactly once: results are keyed by job index. A worker that dies (its node lost, its process killed) fails all
its in-flight calls with `RayActorError`; those jobs go back to the front of the queue and a replacement worker
(started with the latest weights) takes the dead one's place. A job whose result has arrived is never run again,
so the returned list holds each scheduled pair exactly once. An episode whose sandbox or engine failed inside a
live worker is not a worker failure: it comes back as a trajectory with `stop_reason = error`, which the trainer
excludes (never a reward of 0).
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import importlib
import os
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from conch.agent.executor import Job, RolloutStats, plan_jobs
from conch.agent.trajectory import Trajectory
from conch.config import AgentLoopConfig
from conch.engine.registry import EngineOptions
from conch.engine.weight_sync import tensor_bytes
from conch.tasks.model import Task

# An agent loop other than the production one, as plain data that crosses to the workers: ("module:Class",
# keyword arguments of its constructor). Benchmarks only (conch/bench/agents.py).
LoopSpec = tuple[str, dict[str, Any]]


def loop_from_spec(spec: LoopSpec | None) -> Any:
    """The loop constructor a `LoopSpec` names (the production `AgentLoop` for None)."""
    from functools import partial

    from conch.agent.loop import AgentLoop

    if spec is None:
        return AgentLoop
    module, _, name = spec[0].partition(":")
    return partial(getattr(importlib.import_module(module), name), **spec[1])


class ClusterError(RuntimeError):
    """The cluster cannot run the rollouts (no worker could be placed, every worker died, ...)."""


def _worker_class():
    import ray

    @ray.remote
    class RolloutWorker:
        """One engine replica and its sandbox slots; `run` calls interleave on the actor's event loop."""

        def __init__(self, model_dir: str, engine: EngineOptions, agent: dict, backend: str, slots: int,
                     threads: int, verify_every: int, network: str, weights: Any = None,
                     loop: LoopSpec | None = None) -> None:
            import torch

            from conch.agent.episode import PolicyAgent, sandbox_factory
            from conch.agent.tito import ChatCodec
            from conch.engine.registry import build_engine
            from conch.tasks.synth.trajectories import BASH_TOOL

            torch.set_num_threads(max(1, threads))
            self.engine = build_engine(engine, model_dir, max_batch=max(1, slots))
            if weights is not None:
                self.engine.load_weights(weights)
            self.codec = ChatCodec(self.engine.tokenizer, tools=[BASH_TOOL])
            self.agent = PolicyAgent(self.engine, self.codec, AgentLoopConfig(**agent), verify_every=verify_every,
                                     loop=loop_from_spec(loop))
            self.sandboxes = sandbox_factory(backend, network)

        async def run(self, task: Task, sample: int, seed: int) -> dict:
            from conch.agent.episode import run_episode
            from conch.cluster.payload import pack

            return pack(await run_episode(task, self.agent, self.sandboxes, sample=sample, seed=seed))

        async def load_weights(self, state_dict: dict) -> float:
            t0 = time.monotonic()
            self.engine.load_weights(state_dict)
            return time.monotonic() - t0

        async def where(self) -> dict:
            return {"node_id": ray.get_runtime_context().get_node_id(), "pid": os.getpid()}

    return RolloutWorker


def connect(address: str = "", num_cpus: int | None = None) -> None:
    """Join the cluster at `address` ("auto", "ray://host:port", a GCS address) or start a local Ray instance.

    Workers import the same conch as this process: its folder goes on their PYTHONPATH (a path missing on a
    remote node is ignored there; install conch on every node of a real cluster)."""
    if not address:
        # One machine: Ray's node address becomes 127.0.0.1 (it would pick the machine's network address and
        # bind the GCS and raylets there). Read when ray is first imported, and inherited by its processes.
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    import ray

    if ray.is_initialized():
        return
    import conch

    root = str(Path(conch.__file__).resolve().parent.parent)
    env = {"PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)}
    kwargs: dict[str, Any] = {"runtime_env": {"env_vars": env}, "log_to_driver": False,
                              "include_dashboard": False}
    if address:
        ray.init(address=address, **kwargs)
    else:
        ray.init(num_cpus=num_cpus, **kwargs)


class RayRolloutSource:
    """`RolloutSource` over Ray actors (see the module docstring for scheduling and fault handling)."""

    def __init__(self, model_dir: str | Path, engine: EngineOptions, agent: AgentLoopConfig, cluster: Any,
                 backend: str = "local", verify_every: int = 0, network: str = "never",
                 loop: LoopSpec | None = None) -> None:
        import ray

        connect(cluster.address)
        self._ray = ray
        self.model_dir, self.engine_options, self.backend = str(model_dir), engine, backend
        self.agent, self.verify_every, self.cluster, self.network = agent, verify_every, cluster, network
        self.loop = loop
        self.slots = cluster.sandboxes_per_worker
        self._weights: Any = None  # object ref of the latest pushed weights (replacement workers start from it)
        self.workers: list[Any] = [self._start() for _ in range(cluster.rollout_workers)]
        self.restarts = 0
        try:
            ray.get([w.where.remote() for w in self.workers], timeout=cluster.start_timeout)
        except ray.exceptions.GetTimeoutError:
            raise ClusterError(f"no room for {cluster.rollout_workers} rollout workers within "
                               f"{cluster.start_timeout:.0f} s (each needs {self._resources_text()}); "
                               f"cluster resources: {ray.cluster_resources()}") from None

    def _resources_text(self) -> str:
        c = self.cluster
        return f"{c.worker_cpus} CPU, {c.worker_gpus} GPU" + "".join(f", {v} {k}" for k, v in c.worker_resources.items())

    def _start(self) -> Any:
        c = self.cluster
        opts: dict[str, Any] = {"num_cpus": c.worker_cpus, "num_gpus": c.worker_gpus,
                                "max_concurrency": self.slots + 4}
        if c.worker_resources:
            opts["resources"] = dict(c.worker_resources)
        return _worker_class().options(**opts).remote(
            self.model_dir, self.engine_options, dataclasses.asdict(self.agent), self.backend, self.slots,
            max(1, int(c.worker_cpus)), self.verify_every, self.network, self._weights, self.loop)

    def placement(self) -> list[dict]:
        return self._ray.get([w.where.remote() for w in self.workers])

    async def rollouts(self, tasks: Sequence[Task], n_per_task: int, seed: int,
                       on_done: Callable[[Trajectory], None] | None = None,
                       on_dispatch: Callable[[Job, int], None] | None = None) -> tuple[list[Trajectory], RolloutStats]:
        """Run every (task, sample) pair once over the workers; results in (task, sample) order."""
        from conch.cluster.payload import sizes, unpack

        ray = self._ray
        t0 = time.monotonic()
        queue: collections.deque[Job] = collections.deque(plan_jobs(tasks, n_per_task))
        total = len(queue)
        results: dict[int, Trajectory] = {}
        inflight: dict[Any, tuple[Job, int, int]] = {}  # ref -> (job, worker slot, worker generation)
        gen = [0] * len(self.workers)
        load = [0] * len(self.workers)
        self.last = {"requeued": 0, "duplicated": 0, "shipped_bytes": 0, "raw_bytes": 0, "tokens": 0}
        while queue or inflight:
            for w in range(len(self.workers)):
                while load[w] < self.slots and queue:
                    job = queue.popleft()
                    ref = self.workers[w].run.remote(job.task, job.sample, job.seed(seed))
                    inflight[ref] = (job, w, gen[w])
                    load[w] += 1
                    if on_dispatch is not None:
                        on_dispatch(job, w)
            done, _ = await asyncio.to_thread(ray.wait, list(inflight), num_returns=1, timeout=None)
            for ref in done:
                job, w, g = inflight.pop(ref)
                current = g == gen[w]
                load[w] -= current
                try:
                    packed = await asyncio.to_thread(ray.get, ref)
                except ray.exceptions.RayActorError:
                    queue.appendleft(job)
                    self.last["requeued"] += 1
                    if current:  # the first failure seen of this worker: replace it; later ones only requeue
                        self._replace(w)
                        gen[w] += 1
                        load[w] = 0
                    continue
                if job.index in results:
                    self.last["duplicated"] += 1
                    continue
                for k, v in sizes(packed).items():
                    self.last[{"shipped": "shipped_bytes", "raw": "raw_bytes"}.get(k, k)] += v
                results[job.index] = traj = unpack(packed)
                if on_done is not None:
                    on_done(traj)
        trajs = [results[i] for i in range(total)]
        return trajs, RolloutStats.of(trajs, time.monotonic() - t0)

    def _replace(self, w: int) -> None:
        """Worker `w` died: a new actor, started from the latest weights, takes its place."""
        self.restarts += 1
        if self.restarts > 4 * max(1, len(self.workers)):
            raise ClusterError(f"rollout workers keep dying ({self.restarts} restarts); see the Ray logs")
        self._ray.kill(self.workers[w])
        self.workers[w] = self._start()

    def load_weights(self, state_dict: dict) -> dict[str, float]:
        """Put the weights in the object store once; every worker loads them (and replacements start from them)."""
        ray = self._ray
        t0 = time.monotonic()
        self._weights = ray.put({k: v.detach().cpu() for k, v in state_dict.items()})
        ray.get([w.load_weights.remote(self._weights) for w in self.workers])
        return {"seconds": time.monotonic() - t0, "bytes": float(tensor_bytes(state_dict))}

    async def aclose(self) -> None:
        for w in self.workers:
            self._ray.kill(w)
        self.workers = []
