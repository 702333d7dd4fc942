"""Rollouts on a real local Ray cluster: two raylets with different custom resources, real sandboxes, the real
tiny HF engine in every worker. Nothing about Ray is mocked.

The tiny model is randomly initialised and never emits a tool call, so episodes use the benchmarks' loop
(`conch.bench.agents.FallbackLoop`, a short sleep per turn): each turn still samples real tokens and runs a real command in the box.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

# One machine: every Ray process listens on 127.0.0.1 (must be set before ray is first imported).
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
ray = pytest.importorskip("ray", reason="ray is not installed (make install pins it)")

from conch.bench.agents import fallback_spec  # noqa: E402
from conch.cluster.ray_rollout import RayRolloutSource  # noqa: E402
from conch.config import AgentLoopConfig, ClusterConfig  # noqa: E402
from conch.engine.registry import EngineOptions  # noqa: E402
from conch.tasks.loader import load_tasks  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
AGENT = AgentLoopConfig(max_turns=2, max_new_tokens=8, max_context=1024, command_timeout=20, obs_token_budget=512)
COMMAND = "sleep 0.3; echo ok"  # every turn's command (the model emits no tool call)


@pytest.fixture(scope="module")
def cluster():
    from ray.cluster_utils import Cluster

    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "resources": {"learner_node": 1}})
    sandbox_node = c.add_node(num_cpus=2, resources={"sandbox_node": 4})
    c.wait_for_nodes()
    ray.init(address=c.address, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": os.environ["PYTHONPATH"]}})
    yield c, sandbox_node.node_id
    ray.shutdown()
    c.shutdown()


@pytest.fixture(scope="module")
def tasks():
    return [t for t in load_tasks([REPO / "examples/tasks"]) if t.fmt == "harbor"][:2]


def source(model_dir: Path, workers: int = 2, slots: int = 2) -> RayRolloutSource:
    cfg = ClusterConfig(backend="ray", address="auto", rollout_workers=workers, sandboxes_per_worker=slots,
                        worker_cpus=0.5, worker_resources={"sandbox_node": 1}, start_timeout=180)
    return RayRolloutSource(model_dir, EngineOptions(), AGENT, cfg, loop=fallback_spec(COMMAND))


def pairs(trajs) -> list[tuple[str, int]]:
    return [(t.task, t.sample) for t in trajs]


@pytest.mark.slow
def test_workers_land_on_sandbox_nodes_and_return_each_pair_once(cluster, tasks):
    from conch.model.init import cached_model

    _, sandbox_node = cluster
    src = source(cached_model())
    try:
        assert {p["node_id"] for p in src.placement()} == {sandbox_node}
        trajs, stats = asyncio.run(src.rollouts(tasks, n_per_task=3, seed=5))
    finally:
        asyncio.run(src.aclose())
    assert pairs(trajs) == [(t.name, k) for t in tasks for k in range(3)]
    assert stats.trajectories == 6 and stats.sampled_tokens > 0
    assert all(t.error is None for t in trajs), [t.error for t in trajs]
    assert all(t.turns and t.turns[0].command == COMMAND for t in trajs)
    # each sampled token came back with its sampler log-prob and its experts
    t = trajs[0]
    assert t.routed_experts is not None and t.routed_experts.shape[0] == len(t.tokens)
    assert len(t.logprobs) == len(t.tokens)
    assert src.last["shipped_bytes"] <= 2 * src.last["raw_bytes"], src.last


@pytest.mark.slow
def test_a_killed_worker_reruns_its_jobs_elsewhere_each_pair_once(cluster, tasks):
    from conch.model.init import cached_model

    src = source(cached_model())
    dispatched = []
    victim = []

    def on_dispatch(job, worker):
        dispatched.append((job.index, worker))
        # Both workers are full (2 x 2 slots) and a result has come back: kill worker 0 with its jobs in flight.
        if len(dispatched) == 5 and not victim:
            victim.append([i for i, w in dispatched if w == 0][-2:])
            ray.kill(src.workers[0], no_restart=True)

    try:
        trajs, _ = asyncio.run(src.rollouts(tasks, n_per_task=4, seed=1, on_dispatch=on_dispatch))
    finally:
        asyncio.run(src.aclose())
    assert victim, "the fault was never injected"
    assert pairs(trajs) == [(t.name, k) for t in tasks for k in range(4)]
    assert src.last["requeued"] >= 1 and src.last["duplicated"] == 0
    assert src.restarts == 1
    assert all(t.error is None for t in trajs), [t.error for t in trajs]
