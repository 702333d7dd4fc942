"""Trajectories as they cross the Ray boundary: arrays for the per-token data, zlib'd JSON for the rest.

Why not `Trajectory.to_json()`: JSON writes a token id as ~6 characters and a log-prob as ~20, and base64 adds a
third to the experts, so a trajectory would ship at ~4x its raw size. Here ids travel as int32, the mask as
uint8, log-probs as float32 (the sampler computes them in float32, so nothing is lost) and experts as their own
uint8/int16 array; Ray moves numpy arrays without copying them through pickle.
"""

from __future__ import annotations

import json
import zlib
from typing import Any

import numpy as np

from conch.agent.trajectory import Trajectory

PER_TOKEN = ("tokens", "mask", "logprobs", "routed_experts")


def pack(traj: Trajectory) -> dict[str, Any]:
    d = traj.to_json()
    meta = {k: v for k, v in d.items() if k not in PER_TOKEN}
    return {
        "tokens": np.asarray(traj.tokens, dtype=np.int32),
        "mask": np.asarray(traj.mask, dtype=np.uint8),
        "logprobs": np.asarray(traj.logprobs, dtype=np.float32),
        "routed_experts": traj.routed_experts,
        "meta": zlib.compress(json.dumps(meta).encode(), 3),
    }


def unpack(p: dict[str, Any]) -> Trajectory:
    d = json.loads(zlib.decompress(p["meta"]))
    d["tokens"] = p["tokens"].tolist()
    d["mask"] = p["mask"].tolist()
    d["logprobs"] = [float(x) for x in p["logprobs"]]
    d["routed_experts"] = None
    traj = Trajectory.from_json(d)
    traj.routed_experts = p["routed_experts"]
    return traj


def sizes(p: dict[str, Any]) -> dict[str, int]:
    """Shipped bytes of a packed trajectory, and the raw bytes of its ids, log-probs and experts."""
    experts = p["routed_experts"]
    ex = int(experts.nbytes) if experts is not None else 0
    n = int(p["tokens"].size)
    shipped = int(p["tokens"].nbytes + p["mask"].nbytes + p["logprobs"].nbytes) + ex + len(p["meta"])
    return {"shipped": shipped, "raw": n * 4 + n * 4 + ex, "tokens": n}
