"""Create conch's own randomly initialised Qwen3-MoE policy model, with its tokenizer, in HF format.

Why: every part of conch (engine, R3, PPO, the agent loop) must run end to end on a laptop CPU with nothing
downloaded. A tiny model of the real Qwen3-MoE architecture exercises exactly the code paths a real checkpoint
does (router modules, expert tensors, chat template), so what passes here holds for Qwen3-30B-A3B too.
Deterministic: the same seed and corpus give byte-identical weight files.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

# Sizes. tiny ≈ 5.6M parameters (fast CPU tests), small ≈ 60M (CPU experiments). tiny uses one KV head of
# width 32 (multi-query attention): 1 KiB of fp32 cache per token, so a 300-turn, 16k-token session costs 16 MiB
# and decode attention stays cheap next to the rest of a step on CPU (see `conch bench horizon`).
SIZES: dict[str, dict] = {
    "tiny": dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=1, head_dim=32,
                 moe_intermediate_size=128, intermediate_size=512, num_experts=8, num_experts_per_tok=2),
    "small": dict(hidden_size=512, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=4, head_dim=64,
                  moe_intermediate_size=256, intermediate_size=1024, num_experts=16, num_experts_per_tok=2),
}
MAX_POSITIONS = 32768  # enough for 300-turn conversations
INIT_VERSION = 3  # bump when SIZES, the chat template or the tokenizer corpus change: cached models are keyed by it


@dataclass(frozen=True)
class InitReport:
    out_dir: str
    size: str
    seed: int
    parameters: int
    vocab_size: int
    num_experts: int
    top_k: int
    moe_layers: int
    seconds: float


def qwen3_moe_config(size: str, vocab_size: int, special: "object"):
    from transformers import Qwen3MoeConfig

    if size not in SIZES:
        raise ValueError(f"unknown model size {size!r}; choose one of {', '.join(SIZES)}")
    return Qwen3MoeConfig(
        vocab_size=vocab_size,
        max_position_embeddings=MAX_POSITIONS,
        rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
        norm_topk_prob=True,
        tie_word_embeddings=False,
        rms_norm_eps=1e-6,
        initializer_range=0.02,
        bos_token_id=None,
        eos_token_id=special.im_end,
        pad_token_id=special.pad,
        dtype="float32",
        **SIZES[size],
    )


def init_model(out_dir: Path, size: str = "tiny", seed: int = 0, tokenizer_corpus: list[Path] | tuple = (),
               vocab_size: int | None = None) -> InitReport:
    """Train the tokenizer, build the model with weights drawn from `seed`, save both to `out_dir`."""
    import time

    from transformers.utils import logging as hf_logging

    import torch
    from transformers import GenerationConfig, Qwen3MoeForCausalLM

    from conch.model.tokenizer import DEFAULT_VOCAB_SIZE, special_token_ids, train_tokenizer
    from conch.moe.routing import moe_layer_count

    t0 = time.perf_counter()
    hf_logging.disable_progress_bar()
    out_dir = Path(out_dir)
    print(f"training tokenizer ({len(tokenizer_corpus)} extra corpus paths)", file=sys.stderr)
    tokenizer = train_tokenizer(tokenizer_corpus, vocab_size=vocab_size or DEFAULT_VOCAB_SIZE, seed=seed)
    special = special_token_ids(tokenizer)
    config = qwen3_moe_config(size, len(tokenizer), special)
    print(f"initialising {size} Qwen3-MoE model (seed {seed})", file=sys.stderr)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen3MoeForCausalLM(config).to(torch.float32)
    model.generation_config = GenerationConfig(
        eos_token_id=list(special.eos_ids), pad_token_id=special.pad, do_sample=True, temperature=1.0, top_p=1.0
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    report = InitReport(
        out_dir=str(out_dir), size=size, seed=seed, parameters=sum(p.numel() for p in model.parameters()),
        vocab_size=len(tokenizer), num_experts=config.num_experts, top_k=config.num_experts_per_tok,
        moe_layers=moe_layer_count(model), seconds=round(time.perf_counter() - t0, 3),
    )
    (out_dir / "conch_init.json").write_text(json.dumps({k: v for k, v in asdict(report).items()
                                                         if k not in ("out_dir", "seconds")}, indent=2) + "\n")
    return report


def conch_home() -> Path:
    import os

    return Path(os.environ.get("CONCH_HOME") or Path.home() / ".cache" / "conch")


def cached_model(size: str = "tiny", seed: int = 0) -> Path:
    """A model folder under CONCH_HOME/models, created on first use (benchmarks and tests share it)."""
    import os
    import tempfile

    target = conch_home() / "models" / f"{size}-seed{seed}-v{INIT_VERSION}"
    if (target / "conch_init.json").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{size}-", dir=target.parent))
    init_model(tmp, size=size, seed=seed)
    try:
        os.rename(tmp, target)  # atomic publish; a concurrent creator may have won the race
    except OSError:
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    return target
