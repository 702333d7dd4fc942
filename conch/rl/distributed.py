"""The learner on torch.distributed: FSDP2 (`fully_shard`) over data-parallel ranks.

Why FSDP2: a real MoE checkpoint does not fit one device with its optimizer state; sharding parameters,
gradients and Adam moments over ranks does, and `fully_shard` keeps each module a plain `nn.Module` whose
forward hooks gather its parameters. That matters for R3: routing replay swaps the routers' forward, which
works the same on a sharded model. gloo on CPU, NCCL on GPU; the update itself splits each optimizer step's
micro-batches over the ranks (`rl/update.py`, `dp=`), so a sharded update equals the one-process update.
"""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.distributed as dist


def dp_info() -> tuple[int, int]:
    """(rank, world size) of the default process group, or (0, 1) without one."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def init_process_group(rank: int, world: int, device: str = "cpu", port: int | None = None) -> None:
    """Join the group on 127.0.0.1 (single node); torchrun sets MASTER_ADDR/PORT itself on a cluster."""
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    if port is not None:
        os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("nccl" if device == "cuda" else "gloo", rank=rank, world_size=world)


def decoder_layers(model: Any) -> list[torch.nn.Module]:
    """The transformer blocks of an HF causal LM or of its bare decoder (the critic's backbone)."""
    inner = getattr(model, "model", model)
    layers = getattr(inner, "layers", None)
    if layers is None:
        raise TypeError(f"{type(model).__name__}: no decoder layers found (expected .model.layers or .layers)")
    return list(layers)


def shard(model: torch.nn.Module) -> torch.nn.Module:
    """FSDP2: each decoder block is its own unit (gathered just for its forward/backward), then the root."""
    from torch.distributed.fsdp import fully_shard

    backbone = getattr(model, "backbone", model)  # the critic wraps a decoder and a scalar head
    for layer in decoder_layers(backbone):
        fully_shard(layer)
    fully_shard(model)
    return model


def full_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter whole, on CPU, on every rank (weight sync and HF-format checkpoints need full tensors)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    if dp_info()[1] == 1:
        return {k: v.detach().cpu() for k, v in model.state_dict().items()}
    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True,
                                                                broadcast_from_rank0=False))
