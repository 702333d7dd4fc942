"""Per-session KV buffers and a packed ("varlen") attention function plugged into HF models.

Why: the engine runs many sessions of different lengths in one forward pass. Instead of padding them into a
rectangular batch (which copies every cache every step and wastes compute on padding), all new tokens of a
step are packed into one row `[1, N]` with their own position ids; the MoE and MLP layers are per-token anyway,
and this attention function gives each session's queries exactly its own keys. Each session's cache is a
growable buffer (capacity doubles), so appending a token is amortised O(1) and a 300-turn conversation costs
each turn only its new tokens.

It is registered in transformers' AttentionInterface as "conch_sessions". Because it is not registered as a
mask function, HF skips building any attention mask; masks are built here, once per step, only for segments
that need them (chunked prefill behind an existing cache).

On CPU, where the compiled kernels (native.py) are available, the single-token (decoding) segments of a step
go to one kernel call per layer, which writes their new key/value rows and attends over their caches in one
pass, and a chunk behind a cache (a turn's observation) goes to a fused chunk kernel; both are measured against
torch's SDPA in benchmarks/README.md. Sliding windows on chunks, first prefills and other devices use SDPA.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn.functional as F

if TYPE_CHECKING:
    from conch.engine.native import NativeAttention

ATTN_NAME = "conch_sessions"


class SessionKV:
    """K/V of one session for all layers: [layers, kv_heads, capacity, head_dim] each; `length` tokens valid."""

    def __init__(self, layers: int, kv_heads: int, head_dim: int, dtype: torch.dtype, device: torch.device,
                 capacity: int = 128) -> None:
        self.shape = (layers, kv_heads, head_dim)
        self.dtype, self.device = dtype, device
        self.length = 0
        self.k = torch.empty(layers, kv_heads, capacity, head_dim, dtype=dtype, device=device)
        self.v = torch.empty_like(self.k)

    @property
    def capacity(self) -> int:
        return self.k.shape[2]

    def reserve(self, extra: int) -> None:
        need = self.length + extra
        if need <= self.capacity:
            return
        cap = self.capacity
        while cap < need:
            cap *= 2
        k = torch.empty(self.k.shape[0], self.k.shape[1], cap, self.k.shape[3], dtype=self.dtype, device=self.device)
        v = torch.empty_like(k)
        k[:, :, : self.length] = self.k[:, :, : self.length]
        v[:, :, : self.length] = self.v[:, :, : self.length]
        self.k, self.v = k, v

    def nbytes(self) -> int:
        return self.k.numel() * self.k.element_size() * 2


@dataclass
class Segment:
    """One session's new tokens inside a packed step: rows [row0, row0+n) of the packed batch."""

    kv: SessionKV
    start: int  # cache position of the first new token (= kv.length before the step)
    row0: int
    n: int
    _mask: torch.Tensor | None = field(default=None, repr=False)

    def mask(self, window: int | None) -> torch.Tensor | None:
        """Bool [n, start+n] (True = attend), or None when plain causal / single-token attention suffices."""
        if self.n == 1 and not window:
            return None
        if self._mask is None:
            total = self.start + self.n
            q_pos = torch.arange(self.start, total, device=self.kv.device)[:, None]
            k_pos = torch.arange(total, device=self.kv.device)[None, :]
            m = k_pos <= q_pos
            if window:
                m &= k_pos > q_pos - window
            self._mask = m
        return self._mask


@dataclass
class PackedBatch:
    """Passed through the model's forward kwargs down to `session_attention`.

    With the native kernels, `table` lists the single-token segments for it (see native.SEG_FIELDS) and `rest` the
    others; without one, `rest` is every segment."""

    segments: list[Segment]
    kernel: "NativeAttention | None" = None
    table: np.ndarray | None = None
    rest: list[Segment] = field(default_factory=list)

    @classmethod
    def build(cls, segments: list[Segment], kernel: "NativeAttention | None" = None) -> "PackedBatch":
        decoding = [s for s in segments if s.n == 1] if kernel is not None else []
        if not decoding:
            return cls(segments, kernel, rest=segments)
        table = np.array([(s.kv.k.data_ptr(), s.kv.v.data_ptr(), s.kv.capacity, s.start, s.row0) for s in decoding],
                         dtype=np.int64)
        return cls(segments, kernel, table, [s for s in segments if s.n != 1])


def session_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, sliding_window=None,
                      conch_batch: PackedBatch | None = None, **kwargs):
    """query [1, H, N, D], key/value [1, Hkv, N, D] for the packed new tokens -> output [1, N, H, D]."""
    if conch_batch is None:
        raise RuntimeError(f"attention implementation {ATTN_NAME!r} needs the engine's packed batch; this model "
                           "belongs to an HFEngine (use a separate model object for training)")
    layer = module.layer_idx
    out = torch.empty_like(query)
    heads, kv_heads, dim = query.shape[1], key.shape[1], query.shape[3]
    groups = heads // kv_heads
    scale = dim**-0.5 if scaling is None else scaling
    segments = conch_batch.segments
    if conch_batch.table is not None and all(t.stride(3) == 1 for t in (query, key, value, out)):
        conch_batch.kernel.decode(layer, conch_batch.table, query, key, value, out, scale, sliding_window)
        segments = conch_batch.rest
    for seg in segments:
        kv, s, r, n = seg.kv, seg.start, seg.row0, seg.n
        kv.k[layer, :, s : s + n] = key[0, :, r : r + n]
        kv.v[layer, :, s : s + n] = value[0, :, r : r + n]
        lo = max(0, s + 1 - sliding_window) if sliding_window and n == 1 else 0
        k = kv.k[layer, :, lo : s + n].unsqueeze(0)
        v = kv.v[layer, :, lo : s + n].unsqueeze(0)
        q = query[:, :, r : r + n]
        if n > 1 and s == 0 and not sliding_window:
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scaling, enable_gqa=groups > 1)
        elif n > 1 and not sliding_window and conch_batch.kernel is not None and q.stride(3) == out.stride(3) == 1:
            conch_batch.kernel.chunk(kv.k[layer], kv.v[layer], s, q[0], out[0, :, r : r + n], scale)
            continue
        elif n > 1 and not sliding_window and q.device.type == "cpu" and _FLASH_CPU is not None:
            o = _chunk_behind_cache(q, k, v, s, scaling, groups)
        else:
            # GQA without copying K/V: fold each KV head's query heads into the query axis (row j*n+t is
            # query head j of the group at token t); the mask is per query row, so it is tiled `groups` times.
            qf = q.reshape(1, kv_heads, groups * n, dim)
            mask = seg.mask(sliding_window) if n > 1 else None
            if mask is not None and groups > 1:
                mask = mask.repeat(groups, 1)
            o = F.scaled_dot_product_attention(qf, k, v, attn_mask=mask, scale=scaling).view(1, heads, n, dim)
        out[:, :, r : r + n] = o
    return out.transpose(1, 2), None


_FLASH_CPU = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


def _chunk_behind_cache(q, k, v, s: int, scaling, groups: int) -> torch.Tensor:
    """Attention of a prefill chunk (queries at positions s..s+n-1) over s cached keys plus itself.

    Split into the cached part (every query sees all of it: no mask, GQA folded) and the chunk part (causal),
    each with the flash kernel, merged with their log-sum-exps. Measured ~1.8x faster than one masked call
    (which falls back to the math kernel), and equal to it within 1e-7."""
    _, heads, n, dim = q.shape
    kv_heads = k.shape[1]
    o1, l1 = _FLASH_CPU(q.reshape(1, kv_heads, groups * n, dim), k[:, :, :s], v[:, :, :s], scale=scaling)
    kc, vc = k[:, :, s:], v[:, :, s:]
    if groups > 1:
        kc, vc = kc.repeat_interleave(groups, 1), vc.repeat_interleave(groups, 1)
    o2, l2 = _FLASH_CPU(q, kc, vc, is_causal=True, scale=scaling)
    l1, l2 = l1.reshape(1, heads, n, 1).float(), l2.reshape(1, heads, n, 1).float()
    top = torch.maximum(l1, l2)
    w1, w2 = (l1 - top).exp(), (l2 - top).exp()
    return ((o1.reshape(1, heads, n, dim).float() * w1 + o2.float() * w2) / (w1 + w2)).to(q.dtype)


def register() -> str:
    from transformers import AttentionInterface

    AttentionInterface.register(ATTN_NAME, session_attention)
    return ATTN_NAME
