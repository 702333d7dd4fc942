"""Torch versions of Model Runner V2's sampling Triton kernels, for CPU (registered through vLLM's own kernel
dispatcher, `vllm.triton_utils.dispatcher.register_kernels`, which calls them with the kernels' launch arguments;
`**_launch` takes launch options such as num_warps).

Gumbel-max sampling must draw the very noise the Triton kernel draws (murmur3 of seed, position and token id,
`vllm/v1/worker/gpu/sample/gumbel.py`), or a seeded request would sample other tokens here than on a GPU. Only
the float32 path without a draft-logits cache is covered (no speculative decoding); anything else fails loudly.
"""

from __future__ import annotations

import torch

_M32 = 0xFFFFFFFF
_PREFIX = "vllm.v1.worker.gpu.sample."


def _rotl(x: torch.Tensor, s: int) -> torch.Tensor:
    return ((x << s) | (x >> (32 - s))) & _M32


def _mix(h: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
    # uint32 arithmetic in int64: products wrap, the low 32 bits (all that is kept) stay exact
    key = _rotl((key * 0xCC9E2D51) & _M32, 15)
    h = h ^ ((key * 0x1B873593) & _M32)
    return (_rotl(h, 13) * 5 + 0xE6546B64) & _M32


def _fmix(h: torch.Tensor) -> torch.Tensor:
    h = h ^ (h >> 16)
    h = (h * 0x85EBCA6B) & _M32
    h = h ^ (h >> 13)
    h = (h * 0xC2B2AE35) & _M32
    return h ^ (h >> 16)


def murmur3_uniform32(seed: torch.Tensor, pos: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """[T, 1] seeds and positions, [V] token ids -> [T, V] uniforms in (0, 1), as `murmur3_uniform32` (domain 0)."""
    h = torch.zeros_like(seed)
    for part in (seed & _M32, (seed >> 32) & _M32, pos & _M32):
        h = _mix(h, part)
    r = _fmix(_mix(h, (keys & _M32).unsqueeze(0)) ^ 16)
    return (r >> 16).float() * 1.52587890625e-05 + ((r & 0xFFFF).float() + 0.5) * 2.3283064365386963e-10


def _log1p_neg(u: torch.Tensor) -> torch.Tensor:
    """log(1 - u) as the kernel computes it: a degree-8 series below 0.25, the direct log above."""
    poly = torch.full_like(u, 1.0 / 8.0)
    for c in (7, 6, 5, 4, 3, 2):
        poly = 1.0 / c + u * poly
    series = -u * (1.0 + u * poly)
    return torch.where(u < 0.25, series, torch.log(torch.clamp(1.0 - u, min=5.960464477539063e-08)))


def gumbel_sample_kernel(local_argmax_ptr, local_argmax_stride, local_max_ptr, local_max_stride, logits_cache_ptr,
                         logits_cache_stride_0, logits_cache_stride_1, logits_cache_col_ptr, logits_cache_source_ptr,
                         logits_cache_source_stride, logits_ptr, logits_stride, expanded_idx_mapping_ptr, seeds_ptr,
                         pos_ptr, temp_ptr, vocab_size, BLOCK_SIZE, IS_DRAFTING, APPLY_TEMPERATURE, USE_FP64,
                         PER_TOKEN_COL, **_launch):
    if logits_cache_ptr is not None or USE_FP64:
        raise NotImplementedError("conch_vllm_cpu: gumbel sampling covers the float32 path without a draft cache")
    logits = logits_ptr[:, :vocab_size].float()
    req = expanded_idx_mapping_ptr.long()
    valid = req >= 0
    safe = req.clamp(min=0)
    temp = torch.where(valid, temp_ptr[safe].float(), torch.zeros_like(safe, dtype=torch.float32)).unsqueeze(1)
    seed = torch.where(valid, seeds_ptr[safe].long(), torch.zeros_like(safe)).unsqueeze(1)
    pos = pos_ptr[: logits.shape[0]].long().unsqueeze(1) + ((1 << 30) if IS_DRAFTING else 0)
    noisy = temp != 0.0
    if APPLY_TEMPERATURE:
        logits = torch.where(noisy, logits / torch.where(noisy, temp, torch.ones_like(temp)), logits)
    u = murmur3_uniform32(seed, pos, torch.arange(vocab_size, dtype=torch.int64))
    logits = torch.where(noisy, logits - torch.log(-_log1p_neg(u)), logits)
    value, index = logits.max(dim=1)
    # one winner per row: block 0 holds it, the other blocks can never win the caller's argmax
    local_max_ptr.fill_(float("-inf"))
    local_max_ptr[:, 0] = value.to(local_max_ptr.dtype)
    local_argmax_ptr.zero_()
    local_argmax_ptr[:, 0] = index


def topk_log_softmax_kernel(output_ptr, logits_ptr, logits_stride, topk_ids_ptr, topk_ids_stride, topk, vocab_size,
                            BLOCK_SIZE, TOPK_BLOCK_SIZE, **_launch):
    """log softmax over the vocabulary (float32) at the requested token ids."""
    logits = logits_ptr[:, :vocab_size].float()
    lse = torch.logsumexp(logits, dim=-1, keepdim=True)
    output_ptr.view(-1, topk).copy_(logits.gather(1, topk_ids_ptr[:, :topk].long()) - lse)


def ranks_kernel(output_ptr, logits_ptr, logits_stride, token_ids_ptr, vocab_size, BLOCK_SIZE, **_launch):
    n = output_ptr.shape[0]
    logits = logits_ptr[:n, :vocab_size]
    x = logits.gather(1, token_ids_ptr[:n].long().view(-1, 1))
    output_ptr.copy_((logits >= x).sum(1).to(output_ptr.dtype))


OVERRIDES = {
    _PREFIX + "gumbel._gumbel_sample_kernel": gumbel_sample_kernel,
    _PREFIX + "logprob._topk_log_softmax_kernel": topk_log_softmax_kernel,
    _PREFIX + "logprob._ranks_kernel": ranks_kernel,
}
