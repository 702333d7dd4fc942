"""Load any local HF checkpoint folder as a policy: causal-LM model + tokenizer, in a chosen dtype.

Why one loader: the engine, the trainer and the benchmarks must agree on how a checkpoint becomes a model
(dtype, attention implementation, MoE detection), or their log-probs drift apart for reasons that have nothing
to do with learning. Nothing is ever downloaded: the folder must hold config.json and the weights.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

DTYPES = ("float32", "bfloat16", "float16")


@dataclass
class LoadedPolicy:
    model: Any  # transformers PreTrainedModel (causal LM), in eval mode
    tokenizer: Any | None
    dtype: str
    path: str | None
    num_moe_layers: int
    num_experts: int
    top_k: int


def torch_dtype(name: str):
    import torch

    if name not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}; got {name!r}")
    return getattr(torch, name)


def check_checkpoint_dir(path: Path) -> Path:
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"model folder does not exist: {path}")
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"{path} is not a HF checkpoint folder: config.json is missing")
    weights = list(path.glob("*.safetensors")) + list(path.glob("*.bin"))
    if not weights:
        raise FileNotFoundError(f"{path} holds no weights (*.safetensors or *.bin)")
    return path


def load_tokenizer(path: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path), local_files_only=True)


def load_policy(path: str | Path, dtype: str = "float32", device: str = "cpu", with_tokenizer: bool = True,
                attn_implementation: str = "sdpa") -> LoadedPolicy:
    """Load model (+ tokenizer) from a local folder. Raises FileNotFoundError / UnsupportedMoeError clearly."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    from conch.moe.routing import moe_shape

    path = check_checkpoint_dir(Path(path))
    hf_logging.disable_progress_bar()
    model = AutoModelForCausalLM.from_pretrained(
        str(path), dtype=torch_dtype(dtype), local_files_only=True, attn_implementation=attn_implementation
    )
    model.to(torch.device(device))
    model.eval()
    shape = moe_shape(model)
    tokenizer = load_tokenizer(path) if with_tokenizer else None
    return LoadedPolicy(model=model, tokenizer=tokenizer, dtype=dtype, path=str(path), num_moe_layers=shape.num_layers,
                        num_experts=shape.num_experts, top_k=shape.top_k)
