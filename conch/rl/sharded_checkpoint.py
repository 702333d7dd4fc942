"""Sharded training checkpoints for the learner on N ranks, written with torch.distributed.checkpoint (DCP).

Why: with FSDP2 no rank holds the whole policy, critic or Adam state, and gathering them onto one rank to
write a checkpoint needs the memory sharding exists to avoid. DCP has every rank write its own shards (and can
read them back into a different number of ranks, one included). The folder keeps the protocol of
`rl/checkpoint.py` so `latest_complete` and `--resume` treat both kinds alike: every rank writes into one temp
dir that rank 0 named, then rank 0 alone writes trainer_state.pt (iteration, RNG), the manifest last, and
publishes the dir with one rename. A rank that dies mid-save leaves a temp dir, never a complete-looking
checkpoint.

Layout: iter-000012/{dcp/ (DCP shards and .metadata), trainer_state.pt, manifest.json}; the manifest carries
"sharded": {"world": N}. No HF model/ folder: the run's final policy is published whole (`run_dir/final`).
"""

from __future__ import annotations

import os
import secrets
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from conch.rl import checkpoint as ck

DCP_DIR = "dcp"


def _state(models: dict[str, Any], optimizers: dict[str, Any]) -> dict[str, Any]:
    """{name: model state, "opt/" + name: optimizer state}, as DCP wants them (sharded DTensors)."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    out: dict[str, Any] = {}
    for name, model in models.items():
        msd, osd = get_state_dict(model, optimizers=optimizers[name])
        out[name], out[f"opt/{name}"] = msd, osd
    return out


def save_sharded(run_dir: Path, iteration: int, models: dict[str, Any], optimizers: dict[str, Any],
                 keep: int) -> Path:
    """Collective: every rank calls it with its own shards. Returns the published folder (on every rank)."""
    import torch.distributed.checkpoint as dcp

    t0 = time.monotonic()
    rank = dist.get_rank()
    root = ck.checkpoint_root(run_dir)
    name = ck.checkpoint_name(iteration)
    box: list[Any] = [None]
    if rank == 0:
        root.mkdir(parents=True, exist_ok=True)
        ck._remove_stale_temps(root)
        box[0] = str(root / f".tmp-{name}-{os.getpid()}-{secrets.token_hex(4)}")
    dist.broadcast_object_list(box, src=0)
    tmp = Path(box[0])
    dcp.save(_state(models, optimizers), checkpoint_id=str(tmp / DCP_DIR))
    dist.barrier()  # every rank's shards are on disk before rank 0 seals the folder
    final = root / name
    if rank == 0:
        _seal(tmp, final, iteration, dist.get_world_size())
        ck.atomic_write_text(root / ck.POINTER, name + "\n")
        ck.prune_checkpoints(run_dir, keep, protect=final)
        print(f"conch: saved sharded checkpoint {final} ({dist.get_world_size()} ranks) in "
              f"{time.monotonic() - t0:.1f}s", file=sys.stderr)
    dist.barrier()
    return final


def _seal(tmp: Path, final: Path, iteration: int, world: int) -> None:
    """Rank 0: trainer state, then the manifest and the rename of `rl/checkpoint.py`'s protocol."""
    import shutil

    try:
        torch.save({"iteration": iteration, "optimizer": None, "scheduler": None, "rng": ck.rng_state(),
                    "extra": {}}, tmp / ck.STATE_FILE)
        ck.seal(tmp, final, iteration, {"sharded": {"world": world, "writer": "torch.distributed.checkpoint"}})
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def is_sharded(path: Path) -> bool:
    return "sharded" in ck.read_manifest(path)


def check_loadable(path: Path, world: int) -> None:
    """A sharded checkpoint loads into any number of ranks; a one-process one only into one process."""
    if world > 1 and not is_sharded(path):
        raise ck.CheckpointError(f"{path} was written by a one-process learner; resume it with "
                                 f"cluster.learner_ranks = 1")


def load_sharded(path: Path, models: dict[str, Any], optimizers: dict[str, Any]) -> int:
    """Collective (or one process without a group): restore every model and optimizer in place; returns the
    iteration. DCP reshards, so the world size may differ from the one that saved."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_state_dict

    manifest = ck.read_manifest(path)
    state = _state(models, optimizers)
    dcp.load(state, checkpoint_id=str(path / DCP_DIR))
    for name, model in models.items():
        set_state_dict(model, optimizers[name], model_state_dict=state[name], optim_state_dict=state[f"opt/{name}"])
    saved = torch.load(path / ck.STATE_FILE, map_location="cpu", weights_only=True)
    ck.set_rng_state(saved["rng"])
    return int(manifest["iteration"])
