"""The rollout placement registry: `cluster.backend` picks where PPO's rollouts run.

Why a registry: the driver asks for "a rollout source" and must not know how each placement is set up (this
process's engine and sandbox pool, or Ray worker actors with engine replicas of their own). Each placement is one
factory here, taking the run's config and the driver's engine; a new one (e.g. a remote sandbox fleet) is one more
entry in `PLACEMENTS`. `cluster.backend`'s choices in conch/config.py name the same entries (a test holds them
equal: the config cannot import this module, which builds on it). Ray is imported only by the "ray" factory.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from conch.rl.stages import log

Factory = Callable[[Any, Any, Any, Path], Any]  # (cfg, engine, codec, model_dir) -> a rollout source


def _verify_every(cfg: Any) -> int:
    return cfg.reward.verify_every if cfg.reward.mode == "progress" else 0


def _local(cfg: Any, engine: Any, codec: Any, model_dir: Path) -> Any:
    """This process: the driver's engine, one sandbox pool of `ppo.concurrency`."""
    from conch.rl.rollout_source import LocalRolloutSource

    return LocalRolloutSource(engine, codec, cfg.agent, backend=cfg.sandbox.backend,
                              concurrency=cfg.ppo.concurrency, verify_every=_verify_every(cfg),
                              network=cfg.sandbox.network)


def _ray(cfg: Any, engine: Any, codec: Any, model_dir: Path) -> Any:
    """Ray rollout workers, each with an engine replica and its own sandboxes (docs/cluster.md)."""
    from conch.cluster.ray_rollout import RayRolloutSource
    from conch.engine.registry import options_from_config

    log(f"starting {cfg.cluster.rollout_workers} Ray rollout workers x {cfg.cluster.sandboxes_per_worker} "
        f"sandboxes" + (f" on {cfg.cluster.address}" if cfg.cluster.address else " (local Ray instance)"))
    return RayRolloutSource(model_dir, options_from_config(cfg), cfg.agent, cfg.cluster,
                            backend=cfg.sandbox.backend, verify_every=_verify_every(cfg), network=cfg.sandbox.network)


PLACEMENTS: dict[str, Factory] = {"local": _local, "ray": _ray}


def rollout_source(cfg: Any, engine: Any, codec: Any, model_dir: Path) -> Any:
    """The rollout source `cluster.backend` names; ValueError naming the known placements otherwise."""
    factory = PLACEMENTS.get(cfg.cluster.backend)
    if factory is None:
        raise ValueError(f"unknown rollout placement {cfg.cluster.backend!r}; choose one of {', '.join(PLACEMENTS)}")
    return factory(cfg, engine, codec, model_dir)
