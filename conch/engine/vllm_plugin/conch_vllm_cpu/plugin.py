"""The `vllm.general_plugins` entry point: vLLM calls `register()` in every process it starts."""

from __future__ import annotations


def register() -> None:
    from conch_vllm_cpu import activate, enabled

    if not enabled():
        return
    activate()  # idempotent; covers processes that did not start through `python -m conch_vllm_cpu`
    from vllm.triton_utils.dispatcher import register_kernels

    from conch_vllm_cpu import bookkeeping, kernels

    register_kernels(kernels.OVERRIDES)
    register_kernels(bookkeeping.OVERRIDES)
    bookkeeping.patch_block_tables()
