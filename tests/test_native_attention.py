"""The compiled attention kernels (conch/engine/native.py) against torch's SDPA, and inside the engine."""

from __future__ import annotations

import asyncio
import os

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from conch.engine.base import SamplingParams
from conch.engine.hf import HFEngine
from conch.engine.native import native_attention, supports
from conch.engine.session_attention import PackedBatch, Segment, SessionKV


def cpu_has_avx512f() -> bool:
    try:
        with open("/proc/cpuinfo") as fh:
            return any(line.startswith("flags") and " avx512f" in line for line in fh)
    except OSError:
        return False


def kernel_or_skip(dtype: torch.dtype, threads: int = 1):
    kernel, why = native_attention(dtype, torch.device("cpu"), threads)
    if kernel is None:
        # In CI a compiler is installed, so on a CPU with AVX-512F a missing kernel is a bug; a CPU without it
        # cannot run the kernels at all (the engine falls back to torch's attention), so that is a skip.
        if os.environ.get("CI") and cpu_has_avx512f():
            pytest.fail(f"attention kernels unavailable: {why}")
        pytest.skip(f"attention kernels unavailable: {why}")
    return kernel


def sdpa_reference(q, k, v, scale):
    """q [H, D], k/v [Hkv, T, D] -> [H, D] by torch in float32."""
    heads, kv_heads = q.shape[0], k.shape[0]
    return F.scaled_dot_product_attention(q.float()[None, :, None], k.float()[None], v.float()[None], scale=scale,
                                          enable_gqa=heads != kv_heads)[0, :, 0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("heads,kv_heads,dim", [(4, 1, 32), (8, 4, 64), (2, 2, 128), (6, 3, 16)])
def test_kernel_matches_sdpa_and_writes_the_cache(dtype, heads, kv_heads, dim):
    kernel = kernel_or_skip(dtype)
    torch.manual_seed(0)
    layers, layer = 3, 1
    lengths = [0, 16, 63, 64, 65, 300, 1000]  # tokens already cached: block edges and a one-token cache
    sessions = [SessionKV(layers, kv_heads, dim, dtype, torch.device("cpu"), capacity=8) for _ in lengths]
    for kv, n in zip(sessions, lengths):
        kv.reserve(n + 1)
        kv.k[:, :, :n] = torch.randn(layers, kv_heads, n, dim).to(dtype) * 2  # spread scores: a peaked softmax
        kv.v[:, :, :n] = torch.randn(layers, kv_heads, n, dim).to(dtype)
        kv.length = n
    rows = len(lengths) + 2  # two rows of the packed step belong to no decoding session
    query = torch.randn(1, rows, heads, dim).to(dtype).transpose(1, 2)  # HF's layout: strided, not contiguous
    key = torch.randn(1, rows, kv_heads, dim).to(dtype).transpose(1, 2)
    value = torch.randn(1, kv_heads, rows, dim).to(dtype)
    out = torch.zeros_like(query)
    segs = [Segment(kv, kv.length, row0=i + 2, n=1) for i, kv in enumerate(sessions)]
    batch = PackedBatch.build(segs, kernel)
    scale = dim**-0.5
    kernel.decode(layer, batch.table, query, key, value, out, scale, None)
    tol = 2e-6 if dtype == torch.float32 else 2e-2
    for seg, kv, n in zip(segs, sessions, lengths):
        r = seg.row0
        assert torch.equal(kv.k[layer, :, n], key[0, :, r]) and torch.equal(kv.v[layer, :, n], value[0, :, r])
        ref = sdpa_reference(query[0, :, r], kv.k[layer, :, : n + 1], kv.v[layer, :, : n + 1], scale)
        assert torch.allclose(out[0, :, r].float(), ref, atol=tol, rtol=0), (n, (out[0, :, r].float() - ref).abs().max())
    assert out[0, :, :2].abs().sum() == 0  # rows of no decoding session are left alone


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("heads,kv_heads,dim", [(4, 1, 32), (8, 4, 64), (2, 2, 128), (6, 3, 16)])
@pytest.mark.parametrize("start,n", [(1, 2), (5, 3), (64, 64), (130, 35), (1000, 7), (37, 150)])
def test_chunk_kernel_matches_causal_sdpa(dtype, heads, kv_heads, dim, start, n):
    """n new tokens behind `start` cached ones: block edges inside the chunk, tiles across tokens, chunks longer
    than a block, GQA."""
    kernel = kernel_or_skip(dtype)
    torch.manual_seed(1)
    total = start + n
    k = torch.zeros(kv_heads, total + 29, dim, dtype=dtype)  # capacity beyond the filled positions
    v = torch.zeros_like(k)
    k[:, :total] = (torch.randn(kv_heads, total, dim) * 2).to(dtype)
    v[:, :total] = torch.randn(kv_heads, total, dim).to(dtype)
    q = torch.randn(1, n, heads, dim).to(dtype).transpose(1, 2)[0]  # [H, n, D], strided as in HF
    out = torch.zeros(1, n + 3, heads, dim, dtype=dtype).transpose(1, 2)[0, :, 1 : n + 1]
    scale = 0.7 * dim**-0.5
    kernel.chunk(k, v, start, q, out, scale)
    groups = heads // kv_heads
    kk, vv = k[:, :total].float().repeat_interleave(groups, 0), v[:, :total].float().repeat_interleave(groups, 0)
    mask = torch.arange(total)[None, :] <= torch.arange(start, total)[:, None]
    ref = F.scaled_dot_product_attention(q.float(), kk, vv, attn_mask=mask, scale=scale)
    tol = 3e-6 if dtype == torch.float32 else 2e-2
    assert torch.allclose(out.float(), ref, atol=tol, rtol=0), (out.float() - ref).abs().max()


@pytest.mark.parametrize("threads", [2, 3])
def test_kernels_split_long_caches_across_threads(threads):
    """From 1M multiply-adds per call the kernels cut long caches into pieces (split-K, merged by log-sum-exp) that
    the calling thread and helper threads claim: several sessions of very different lengths (most pieces of a short
    one are empty), and a chunk whose later pieces some of its rows never see."""
    torch.manual_seed(2)
    kernel = kernel_or_skip(torch.float32, threads)
    for lengths in ([70000], [70000, 5, 3000, 700]):  # one session: split-K; several: sessions spread
        sessions = [SessionKV(1, 1, 32, torch.float32, torch.device("cpu"), capacity=8) for _ in lengths]
        for kv, n in zip(sessions, lengths):
            kv.reserve(n + 1)
            kv.k[:, :, :n], kv.v[:, :, :n] = torch.randn(1, 1, n, 32) * 2, torch.randn(1, 1, n, 32)
        q, k, v = torch.randn(1, 4, len(lengths), 32), torch.randn(1, 1, len(lengths), 32), torch.randn(1, 1, len(lengths), 32)
        out = torch.empty_like(q)
        kernel.decode(0, PackedBatch.build([Segment(kv, n, i, 1) for i, (kv, n) in enumerate(zip(sessions, lengths))],
                                           kernel).table, q, k, v, out, 0.18, None)
        for i, (kv, n) in enumerate(zip(sessions, lengths)):
            ref = sdpa_reference(q[0, :, i], kv.k[0, :, : n + 1], kv.v[0, :, : n + 1], 0.18)
            assert torch.allclose(out[0, :, i], ref, atol=2e-6), (lengths, i)
    for start, n in ((16000, 30), (300, 2700)):  # the second: rows near the start see only the first pieces
        k = torch.randn(1, start + n, 32) * 2
        v = torch.randn(1, start + n, 32)
        q = torch.randn(4, n, 32)
        out = torch.empty_like(q)
        kernel.chunk(k, v, start, q, out, 0.18)
        mask = torch.arange(start + n)[None, :] <= torch.arange(start, start + n)[:, None]
        ref = F.scaled_dot_product_attention(q, k.expand(4, -1, -1), v.expand(4, -1, -1), attn_mask=mask, scale=0.18)
        assert torch.allclose(out, ref, atol=2e-6), (start, n)


def test_kernel_calls_from_several_threads_at_once():
    """Two engines in one process call the kernels concurrently (ctypes drops the GIL): one call holds the helper
    pool, the other runs alone; both must be right."""
    import threading

    kernel = kernel_or_skip(torch.float32, 2)
    torch.manual_seed(4)
    start, n = 12000, 20
    k, v = torch.randn(1, start + n, 32) * 2, torch.randn(1, start + n, 32)
    mask = torch.arange(start + n)[None, :] <= torch.arange(start, start + n)[:, None]
    qs = [torch.randn(4, n, 32) for _ in range(2)]
    refs = [F.scaled_dot_product_attention(q, k.expand(4, -1, -1), v.expand(4, -1, -1), attn_mask=mask, scale=0.2)
            for q in qs]
    errors: list[str] = []

    def worker(i: int) -> None:
        out = torch.empty_like(qs[i])
        for rep in range(30):
            kernel.chunk(k, v, start, qs[i], out, 0.2)
            if not torch.allclose(out, refs[i], atol=2e-6):
                errors.append(f"thread {i} call {rep}: off by {(out - refs[i]).abs().max():.2e}")

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:3]


def _single_cpu_threads() -> dict[int, int]:
    """Threads of this process whose affinity is one CPU: {thread id: cpu}."""
    found = {}
    for task in os.listdir("/proc/self/task"):
        try:
            status = open(f"/proc/self/task/{task}/status").read()
        except OSError:  # the thread ended
            continue
        allowed = next(line.split()[1] for line in status.splitlines() if line.startswith("Cpus_allowed_list"))
        if allowed.isdigit():
            found[int(task)] = int(allowed)
    return found


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs")
def test_pool_helpers_run_on_another_cpu_than_the_caller():
    """A woken helper may otherwise be queued on the caller's busy CPU (pool.h): helpers are pinned elsewhere, and
    follow when the caller moves."""
    import threading

    kernel = kernel_or_skip(torch.float32, 2)
    k, v = torch.randn(1, 9000, 32), torch.randn(1, 9000, 32)
    q, out = torch.randn(4, 20, 32), torch.empty(4, 20, 32)
    first, second = sorted(os.sched_getaffinity(0))[:2]
    seen: dict[int, set[int]] = {}

    def caller() -> None:  # a thread of its own, so that pinning it leaves the test process alone
        me = threading.get_native_id()
        for cpu in (first, second):
            os.sched_setaffinity(0, {cpu})
            kernel.chunk(k, v, 8980, q, out, 0.2)
            seen[cpu] = {c for tid, c in _single_cpu_threads().items() if tid != me}

    t = threading.Thread(target=caller)
    t.start()
    t.join()
    assert seen[first] and first not in seen[first], seen
    assert seen[second] and second not in seen[second], seen


def test_kernel_sliding_window():
    kernel = kernel_or_skip(torch.float32)
    kv = SessionKV(1, 2, 32, torch.float32, torch.device("cpu"), capacity=512)
    kv.k[0, :, :400] = torch.randn(2, 400, 32)
    kv.v[0, :, :400] = torch.randn(2, 400, 32)
    q, k, v = torch.randn(1, 4, 1, 32), torch.randn(1, 2, 1, 32), torch.randn(1, 2, 1, 32)
    out = torch.empty_like(q)
    kernel.decode(0, PackedBatch.build([Segment(kv, 400, 0, 1)], kernel).table, q, k, v, out, 0.2, 100)
    ref = sdpa_reference(q[0, :, 0], kv.k[0, :, 301:401], kv.v[0, :, 301:401], 0.2)
    assert torch.allclose(out[0, :, 0], ref, atol=2e-6)


def test_supported_shapes():
    assert supports(4, 1, 32) == "" and supports(64, 1, 256) == ""
    assert "head_dim" in supports(4, 1, 24) and "head_dim" in supports(4, 1, 512)
    assert "KV heads" in supports(128, 1, 64)


def test_engine_with_and_without_kernel_agree(tmp_path):
    """Multi-turn, several sessions decoding and prefilling together (chunks behind caches included): same tokens
    and log-probs with either attention path."""
    from conch.model.init import init_model

    kernel_or_skip(torch.float32)
    init_model(tmp_path, size="tiny", seed=0)

    async def go(native: bool):
        eng = HFEngine(tmp_path, native_attention=native, max_step_tokens=48)  # prompts prefill in chunks
        sids = [await eng.open_session(list(range(5, 5 + 40 * (i + 1)))) for i in range(3)]
        out = []
        for turn in range(3):
            res = await asyncio.gather(*(eng.generate(s, [7, 8, 9] if turn else [],
                                                      SamplingParams(max_new_tokens=12, seed=i)) for i, s in enumerate(sids)))
            out += [(r.token_ids, r.logprobs, r.routed_experts) for r in res]
        kind = eng.attention_kernel
        await eng.aclose()
        return kind, out

    kind_on, on = asyncio.run(go(True))
    kind_off, off = asyncio.run(go(False))
    assert kind_on.startswith("conch native") and kind_off.startswith("torch")
    for (t1, l1, e1), (t2, l2, e2) in zip(on, off):
        assert t1 == t2
        assert np.allclose(l1, l2, atol=1e-5)
        assert np.array_equal(e1, e2)


def test_engine_falls_back_for_unsupported_shapes():
    import transformers as tf

    cfg = tf.Qwen3MoeConfig(vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                            num_key_value_heads=2, head_dim=8, num_experts=4, num_experts_per_tok=2,
                            moe_intermediate_size=16, intermediate_size=32, max_position_embeddings=64)
    model = tf.Qwen3MoeForCausalLM(cfg).eval()

    async def go():
        eng = HFEngine(model, native_attention=True)
        sid = await eng.open_session([1, 2, 3])
        res = await eng.generate(sid, [], SamplingParams(max_new_tokens=4, seed=0))
        await eng.aclose()
        return eng.attention_kernel, res

    kind, res = asyncio.run(go())
    assert kind.startswith("torch sdpa (head_dim 8")  # not a multiple of 16: torch's kernel, and why
    assert len(res.token_ids) == 4
