"""Compiled CPU attention kernels of the engine, built on first use with the machine's C compiler, loaded with ctypes.

Why compiled at run time: the kernels are one small C file (kernels/attention.c) tuned with
`-march=native`, so it is built for the machine that runs it and cached under CONCH_HOME/kernels, keyed by the
source, the compiler, the flags and the CPU. Building takes well under a second and needs no torch headers. Where
it cannot be built (no compiler, no AVX-512, another OS) the engine keeps torch's attention and says why once.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import numpy as np
import torch

SOURCE = Path(__file__).with_name("kernels") / "attention.c"
FLAGS = ["-O3", "-march=native", "-ffast-math", "-pthread", "-fPIC", "-shared"]
SEG_FIELDS = 5  # per decoding session: K buffer address, V buffer address, capacity, position, packed row

_lock = threading.Lock()
_loaded: dict[str, tuple[ctypes.CDLL | None, str]] = {}


def _cpu_id() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return platform.processor()


def _build(compiler: str) -> Path:
    from conch.model.init import conch_home

    version = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30).stdout
    sources = [p.read_text() for p in sorted(SOURCE.parent.glob("*.[ch]"))]  # the kernel and the headers it includes
    key = hashlib.sha256("\0".join([*sources, compiler, version, " ".join(FLAGS), platform.machine(),
                                    _cpu_id()]).encode()).hexdigest()[:16]
    target = conch_home() / "kernels" / f"{SOURCE.stem}-{key}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    try:
        done = subprocess.run([compiler, *FLAGS, "-o", tmp, str(SOURCE), "-lm"], capture_output=True, text=True,
                              timeout=120)
        if done.returncode != 0:
            lines = (done.stderr or done.stdout).strip().splitlines()
            first_error = next((ln for ln in lines if "error" in ln), lines[-1] if lines else "")
            raise RuntimeError(f"{compiler} failed: {first_error.strip()}")
        os.replace(tmp, target)  # atomic: concurrent builders never load a half-written file
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


def _library() -> tuple[ctypes.CDLL | None, str]:
    """The loaded kernel library, or None and the reason it is unavailable (built once per process)."""
    with _lock:
        if "lib" not in _loaded:
            compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
            if not compiler:
                _loaded["lib"] = (None, "no C compiler (cc/gcc) on PATH")
            else:
                try:
                    _loaded["lib"] = (ctypes.CDLL(str(_build(compiler))), "")
                except Exception as exc:  # any failure means: keep torch's kernel
                    _loaded["lib"] = (None, str(exc))
        return _loaded["lib"]


class NativeAttention:
    """The compiled kernels for one dtype.

    `decode`: one call per layer per engine step writes each decoding session's new key/value row into its cache
    and attends its query heads over the whole cache (positions [0, pos], or the sliding window).
    `chunk`: the causal attention of a chunk of n new tokens behind s cached ones (their K/V already written)."""

    _SUFFIX = {torch.float32: "f32", torch.bfloat16: "bf16"}

    def __init__(self, lib: ctypes.CDLL, dtype: torch.dtype, threads: int = 1) -> None:
        i32, i64, ptr, f32 = ctypes.c_int, ctypes.c_int64, ctypes.c_void_p, ctypes.c_float
        self._decode = getattr(lib, f"conch_decode_attention_{self._SUFFIX[dtype]}")
        self._decode.argtypes = [i32, ptr, i32, ptr, i64, i64, ptr, i64, i64, ptr, i64, i64, ptr, i64, i64,
                                 i32, i32, i32, i64, f32, i32]
        self._chunk = getattr(lib, f"conch_chunk_attention_{self._SUFFIX[dtype]}")
        self._chunk.argtypes = [ptr, i64, i64, ptr, ptr, i64, i64, i32, ptr, i64, i64, i32, i32, i32, f32, i32]
        for fn in (self._decode, self._chunk):
            fn.restype = i32
        self.dtype = dtype
        self.threads = max(1, int(threads))  # per call, on long caches only (kernels/pool.h)

    def decode(self, layer: int, table: np.ndarray, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
               out: torch.Tensor, scale: float, window: int | None) -> None:
        """query/out [1, H, N, D], key/value [1, Hkv, N, D] (packed step); table int64 [sessions, SEG_FIELDS]."""
        heads, kv_heads, dim = query.shape[1], key.shape[1], query.shape[3]
        rc = self._decode(table.shape[0], table.ctypes.data, layer,
                          query.data_ptr(), query.stride(1), query.stride(2),
                          key.data_ptr(), key.stride(1), key.stride(2),
                          value.data_ptr(), value.stride(1), value.stride(2),
                          out.data_ptr(), out.stride(1), out.stride(2),
                          kv_heads, heads // kv_heads, dim, int(window or 0), float(scale), self.threads)
        _check(rc, "decode", heads, kv_heads, dim)

    def chunk(self, k: torch.Tensor, v: torch.Tensor, start: int, query: torch.Tensor, out: torch.Tensor,
              scale: float) -> None:
        """k/v: one layer's buffers [Hkv, capacity, D] with positions [0, start + n) filled; query/out
        [H, n, D] views (last dim contiguous) of the chunk's rows."""
        heads, n, dim = query.shape
        kv_heads = k.shape[0]
        rc = self._chunk(query.data_ptr(), query.stride(0), query.stride(1), k.data_ptr(), v.data_ptr(), k.shape[1],
                         start, n, out.data_ptr(), out.stride(0), out.stride(1), kv_heads, heads // kv_heads, dim,
                         float(scale), self.threads)
        _check(rc, "chunk", heads, kv_heads, dim)


def _check(rc: int, which: str, heads: int, kv_heads: int, dim: int) -> None:
    if rc != 0:
        raise RuntimeError(f"{which} attention kernel failed (code {rc}): heads {heads}, kv heads {kv_heads}, "
                           f"head dim {dim}")


def default_threads() -> int:
    """Threads a kernel call may use on a long cache: the cores this process may run on, at most 4 (measured on a
    2-vCPU VM at 16k tokens: 2 threads cut a 35-token chunk's attention 1.85x and a decode step's 1.5-1.8x; more is
    untested)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return max(1, min(4, cores))


def native_attention(dtype: torch.dtype, device: torch.device, threads: int = 1) -> tuple[NativeAttention | None, str]:
    """The compiled attention kernels for this dtype on CPU, or None and why not."""
    if device.type != "cpu":
        return None, f"device {device.type} (the kernels are for CPU)"
    if dtype not in NativeAttention._SUFFIX:
        return None, f"dtype {dtype} (the kernels handle float32 and bfloat16)"
    lib, why = _library()
    if lib is None:
        return None, why
    return NativeAttention(lib, dtype, threads), ""


def supports(heads: int, kv_heads: int, head_dim: int) -> str:
    """Empty when the kernel handles this attention shape, else why not."""
    if head_dim % 16 or not 16 <= head_dim <= 256:
        return f"head_dim {head_dim} (the kernel needs a multiple of 16 up to 256)"
    if heads % kv_heads or heads // kv_heads > 64:
        return f"{heads} query heads over {kv_heads} KV heads (the kernel needs at most 64 per KV head)"
    return ""


if __name__ == "__main__":  # python -m conch.engine.native: build and report
    kernel, reason = native_attention(torch.float32, torch.device("cpu"))
    print("attention kernels: " + ("built" if kernel else f"unavailable ({reason})"), file=sys.stderr)
