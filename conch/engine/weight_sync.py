"""Weight sync: after each PPO update the engine must sample from the trainer's new weights.

One interface, `WeightSync.push(model) -> {"seconds", "bytes", ...}`, chosen by the engine it syncs to:
- `InProcessSync` (HFEngine): copies the tensors into the engine's own model (`Engine.load_weights`).
- `VLLMDiskSync` (a vLLM server): writes the weights as safetensors, in the checkpoint's own tensor names, to a
  folder the server reads, then pause → reload (+ MoE re-pack on CPU) → reset prefix cache → resume. The reset
  makes every session re-prefill under the new weights, as the Engine protocol requires. On GPUs vLLM's NCCL
  transfer (`/update_weights`) would avoid the disk; it is not wired here (no GPU to test it on).
Both log seconds and bytes per sync (the trainer writes them as `sync/` metrics).
"""

from __future__ import annotations

import re
import tempfile
import time
from pathlib import Path
from typing import Any, Protocol


class WeightSync(Protocol):
    def push(self, model: Any) -> dict: ...


def tensor_bytes(state_dict: dict) -> int:
    return sum(t.numel() * t.element_size() for t in state_dict.values())


class InProcessSync:
    def __init__(self, engine: Any) -> None:
        self.engine = engine

    def push(self, model: Any) -> dict:
        sd = model.state_dict() if hasattr(model, "state_dict") else model
        t0 = time.perf_counter()
        self.engine.load_weights(sd)
        return {"seconds": time.perf_counter() - t0, "bytes": tensor_bytes(sd)}


def checkpoint_tensors(state_dict: dict) -> dict:
    """The trainer's tensors under the checkpoint's names: transformers ≥ 5 fuses each MoE layer's experts
    (`mlp.experts.gate_up_proj` [E, 2I, H], `mlp.experts.down_proj` [E, H, I]); checkpoints (and vLLM's loader)
    keep one gate/up/down weight per expert."""
    out = {}
    for name, t in state_dict.items():
        t = t.detach().to("cpu").contiguous()
        if name.endswith("mlp.experts.gate_up_proj"):
            base, half = name[: -len("gate_up_proj")], t.shape[1] // 2
            for e in range(t.shape[0]):
                out[f"{base}{e}.gate_proj.weight"] = t[e, :half].contiguous()
                out[f"{base}{e}.up_proj.weight"] = t[e, half:].contiguous()
        elif name.endswith("mlp.experts.down_proj"):
            base = name[: -len("down_proj")]
            for e in range(t.shape[0]):
                out[f"{base}{e}.down_proj.weight"] = t[e].contiguous()
        else:
            out[name] = t
    return out


class VLLMDiskSync:
    """Push weights to a vLLM server through a safetensors folder and its dev-mode endpoints
    (the server runs with VLLM_SERVER_DEV_MODE=1, which conch sets when it launches one)."""

    def __init__(self, engine: Any, folder: str | Path | None = None) -> None:
        self.engine = engine
        if folder is None and getattr(engine, "sync_dir", None) is None:
            engine.sync_dir = Path(tempfile.mkdtemp(prefix="conch-vllm-sync-"))
            engine.owns_sync_dir = True  # removed by the engine's aclose
        self.folder = Path(folder) if folder else engine.sync_dir

    def push(self, model: Any) -> dict:
        from safetensors.torch import save_file

        sd = model.state_dict() if hasattr(model, "state_dict") else model
        t0 = time.perf_counter()
        tensors = checkpoint_tensors(sd)
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.folder / "model.safetensors"
        save_file(tensors, str(path), metadata={"format": "pt"})
        t_write = time.perf_counter() - t0
        http = self.engine.http
        method = "reload_and_repack" if self.engine.device == "cpu" else "reload_weights"
        http.call("POST", "/pause?mode=wait")
        try:
            result = http.call("POST", "/collective_rpc", {"method": method,
                                                           "kwargs": {"weights_path": str(self.folder)}})
            http.call("POST", "/reset_prefix_cache")
        finally:
            http.call("POST", "/resume")
        return {"seconds": time.perf_counter() - t0, "write_seconds": t_write, "bytes": path.stat().st_size,
                "server": result}


def sync_for(engine: Any) -> WeightSync:
    """The WeightSync that fits `engine`."""
    return VLLMDiskSync(engine) if hasattr(engine, "http") else InProcessSync(engine)


_METRIC = re.compile(r"^(vllm:[a-z_]+)(?:\{[^}]*\})? ([0-9.eE+-]+)$", re.M)


def parse_metrics(text: str) -> dict[str, float]:
    """Sum each `vllm:` counter (and histogram sum/count) of a Prometheus text page over its labels."""
    out: dict[str, float] = {}
    for name, value in _METRIC.findall(text):
        if not name.endswith(("_total", "_sum", "_count")) or "_bucket" in name:
            continue
        out[name] = out.get(name, 0.0) + float(value)
    return out
