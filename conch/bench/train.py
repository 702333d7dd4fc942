"""`conch bench train`: trainer tokens/s and peak memory against sequence length, for the policy and the critic.

Why: a terminal episode of hundreds of turns is one sequence of up to 32k tokens, and PPO trains on it whole.
Two things keep that within one device's memory: activation (gradient) checkpointing of the decoder layers and
a chunked LM head (log-prob and entropy computed a chunk of positions at a time, so the [T, vocab] logits never
exist at once). This bench shows what they cost in speed and save in memory as the sequence grows.

One measurement: one sequence of T random tokens (batch 1) with an agent-like mask (model turns of 20-200
tokens between observations of 50-600 tokens, about a quarter sampled), R3 routing replay of random recorded
experts on MoE models (`--no-replay` to skip), then forward + backward of the PPO policy loss (policy:
`policy_forward` + `ppo_loss` with entropy and TIS) or of the clipped value loss (critic: `value_forward`, a
`ValueModel` made from the policy). tokens/s = T / wall seconds of forward + backward, best of `--repeats`.
"lean" rows have checkpointing + chunked head on; "plain" rows (lengths up to `--plain-max`) have both off:
the model's full logits and stored activations.

Peak memory, per measurement, excluding weights and optimizer state that exist before the step:
- CUDA: torch.cuda.max_memory_allocated() minus memory_allocated() before the step (tensor bytes).
- CPU: the process's peak resident set during the step minus its resident set before it (Linux VmHWM after
  resetting it through /proc/self/clear_refs, following gc + malloc_trim), i.e. everything the step newly
  touched, allocator slack included. Where the reset is not possible: RSS sampled every 2 ms in a thread.
Parameter gradients (set to None before each step) are part of the step and so of the figure.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable

from conch.bench.engine import resolve_model

DEFAULT_LENGTHS = "1024,2048,4096,8192,16384,32768"
QUICK_LENGTHS = "128,256"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=None, help="HF checkpoint folder (default: conch's tiny model, cached)")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available, else cpu)")
    parser.add_argument("--lengths", default=DEFAULT_LENGTHS, help="comma-separated sequence lengths (tokens)")
    parser.add_argument("--plain-max", type=int, default=4096,
                        help="also measure with checkpointing and chunking off at lengths up to this (0: never)")
    parser.add_argument("--repeats", type=int, default=1, help="runs per measurement (the fastest is kept)")
    parser.add_argument("--chunk", type=int, default=1024, help="LM-head chunk (positions) on the lean path")
    parser.add_argument("--no-replay", action="store_true", help="do not replay recorded experts (R3 off)")
    parser.add_argument("--only", choices=("policy", "critic"), default=None, help="measure one model only")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true",
                        help=f"smoke run: lengths {QUICK_LENGTHS}, plain at all of them, one repeat")


@dataclass
class Row:
    seq_len: int
    checkpointing: bool
    chunked_logprobs: bool  # the policy's chunked LM head (critics have no vocabulary head: always False)
    seconds: float
    tokens_per_s: float
    peak_mem_mb: float
    sampled_tokens: int


def _lengths(text: str) -> list[int]:
    from conch.cli import UsageError

    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"--lengths must be comma-separated integers; got {text!r}") from None
    if not out or min(out) < 2:
        raise UsageError(f"--lengths needs lengths of at least 2 tokens; got {text!r}")
    return out


def agent_mask(T: int, rng: random.Random) -> list[int]:
    """1 for tokens the model sampled: alternating observations (50-600 tokens; the first, the prompt, at most
    T/4) and model turns (20-200 tokens), cut at T."""
    mask: list[int] = []
    sampled = False
    while len(mask) < T:
        n = rng.randint(20, 200) if sampled else rng.randint(50, 600)
        if not mask:
            n = min(n, max(1, T // 4))
        mask.extend([int(sampled)] * n)
        sampled = not sampled
    mask = mask[:T]
    mask[0] = 0
    return mask


def make_batch(T: int, vocab: int, routing: tuple[int, int, int], seed: int, replay: bool, device: Any):
    """One sequence of T tokens as a `conch.rl.batch.Batch` on `device`; routing = (layers, experts, k)."""
    import torch

    from conch.rl.batch import Batch

    rng = random.Random(seed * 1_000_003 + T)
    g = torch.Generator().manual_seed(seed * 1_000_003 + T)
    ids = torch.randint(16, vocab, (1, T), generator=g)
    mask = torch.tensor([agent_mask(T, rng)], dtype=torch.float32)
    sampler_lp = -torch.rand((1, T), generator=g) * 3 * mask
    experts = None
    layers, n_exp, k = routing
    if replay and layers:
        experts = torch.stack([torch.rand((T, n_exp), generator=g).topk(k, dim=-1).indices for _ in range(layers)],
                              dim=1).unsqueeze(0)
    batch = Batch(ids.to(device), torch.ones((1, T), dtype=torch.long, device=device), mask.to(device),
                  sampler_lp.to(device), experts)
    return batch


def policy_step(model: Any, batch: Any, replay: bool, chunk: int | None) -> None:
    import torch

    from conch.rl.batch import policy_forward
    from conch.rl.losses import LossConfig, ppo_loss

    lp, ent, _own = policy_forward(model, batch, replay=replay, chunk=chunk)
    old = (batch.sampler_logprobs + 0.05 * torch.randn_like(batch.sampler_logprobs)) * batch.mask
    adv = torch.randn_like(old) * batch.mask
    loss, _stats = ppo_loss(LossConfig(entropy_coef=0.001), lp, old, adv, batch.mask, entropy=ent,
                            sampler_logp=batch.sampler_logprobs)
    loss.backward()


def critic_step(critic: Any, batch: Any, replay: bool, chunk: int | None) -> None:
    import torch

    from conch.rl.advantages import values_before_tokens
    from conch.rl.critic import value_forward
    from conch.rl.losses import value_loss

    values = values_before_tokens(value_forward(critic, batch, replay=replay))
    returns = torch.randn_like(values) * batch.mask
    loss, _frac = value_loss(values, torch.zeros_like(values), returns, batch.mask, clip=0.2)
    loss.backward()


class PeakMemory:
    """Peak memory of one step above what was in use before it (see the module docstring)."""

    def __init__(self, device: Any) -> None:
        self.device = device
        self.method = ""

    def measure(self, fn: Callable[[], None]) -> tuple[float, float]:
        """Run fn; return (its wall seconds, its peak in MiB)."""
        import gc

        import torch

        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.empty_cache()
            base = torch.cuda.memory_allocated(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            t0 = time.perf_counter()
            fn()
            torch.cuda.synchronize(self.device)
            sec = time.perf_counter() - t0
            self.method = "torch.cuda.max_memory_allocated minus memory_allocated before the step"
            return sec, (torch.cuda.max_memory_allocated(self.device) - base) / 2**20
        _malloc_trim()
        base = _rss_kib("VmRSS")
        if base is not None and _reset_hwm():
            t0 = time.perf_counter()
            fn()
            sec = time.perf_counter() - t0
            self.method = "peak RSS (VmHWM, reset via /proc/self/clear_refs) minus RSS before the step"
            return sec, max(0, (_rss_kib("VmHWM") or base) - base) / 1024
        return self._sampled(fn)

    def _sampled(self, fn: Callable[[], None]) -> tuple[float, float]:
        import threading

        import psutil  # optional: only where /proc/self/clear_refs cannot be written

        proc = psutil.Process()
        base = peak = proc.memory_info().rss
        done = threading.Event()

        def sample() -> None:
            nonlocal peak
            while not done.is_set():
                peak = max(peak, proc.memory_info().rss)
                done.wait(0.002)

        t = threading.Thread(target=sample, daemon=True)
        t.start()
        t0 = time.perf_counter()
        try:
            fn()
        finally:
            sec = time.perf_counter() - t0
            done.set()
            t.join()
        peak = max(peak, proc.memory_info().rss)
        self.method = "peak RSS sampled every 2 ms (psutil) minus RSS before the step"
        return sec, (peak - base) / 2**20


def _rss_kib(field: str) -> int | None:
    try:
        for line in open("/proc/self/status"):
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def _reset_hwm() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _malloc_trim() -> None:
    import ctypes
    import ctypes.util

    try:
        ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def measure(kind: str, model: Any, T: int, lean: bool, args: argparse.Namespace, device: Any, vocab: int,
            routing: tuple[int, int, int], meter: PeakMemory) -> Row:
    from conch.rl.batch import set_gradient_checkpointing

    set_gradient_checkpointing(model, lean)
    model.train()
    chunk = args.chunk if lean else None
    step = policy_step if kind == "policy" else critic_step
    replay = not args.no_replay and routing[0] > 0
    best_s, best_mem = float("inf"), 0.0
    batch = make_batch(T, vocab, routing, args.seed, replay, device)
    for _ in range(max(1, args.repeats)):
        model.zero_grad(set_to_none=True)
        sec, mem = meter.measure(lambda: step(model, batch, replay, chunk))
        best_s, best_mem = min(best_s, sec), max(best_mem, mem)
    model.zero_grad(set_to_none=True)
    return Row(seq_len=T, checkpointing=lean, chunked_logprobs=lean and kind == "policy", seconds=round(best_s, 3),
               tokens_per_s=round(T / best_s, 1), peak_mem_mb=round(best_mem, 1),
               sampled_tokens=int(batch.mask.sum()))


def _bench(args: argparse.Namespace) -> dict:
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    from conch.cli import UsageError
    from conch.moe.routing import moe_shape
    from conch.rl.critic import ValueModel

    if args.quick:
        args.lengths, args.plain_max, args.repeats = QUICK_LENGTHS, max(args.plain_max, 256), 1
    lengths = _lengths(args.lengths)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda, but torch sees no CUDA device")
    hf_logging.disable_progress_bar()
    model_dir = resolve_model(args.model)
    dtype = getattr(torch, args.dtype)
    policy = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, local_files_only=True).to(device)
    max_pos = getattr(policy.config, "max_position_embeddings", None)
    if max_pos is not None and max(lengths) > max_pos:
        raise UsageError(f"--lengths: {max(lengths)} tokens exceed the model's max_position_embeddings {max_pos} "
                         f"({model_dir}/config.json)")
    vocab = int(policy.config.vocab_size)
    shape = moe_shape(policy)
    routing = (shape.num_layers, shape.num_experts, shape.top_k)
    meter = PeakMemory(device)
    models: dict[str, Any] = {}
    if args.only in (None, "policy"):
        models["policy"] = policy
    if args.only in (None, "critic"):
        models["critic"] = ValueModel.from_policy(policy).to(device=device, dtype=dtype)
    out: dict[str, Any] = {"model": model_dir, "device": str(device), "dtype": args.dtype,
                           "replay": not args.no_replay and shape.num_layers > 0, "chunk": args.chunk,
                           "parameters": sum(p.numel() for p in policy.parameters()), "vocab_size": vocab,
                           "threads": torch.get_num_threads(), "repeats": args.repeats}
    for kind, model in models.items():
        measure(kind, model, min(256, max(lengths)), True, args, device, vocab, routing, meter)  # warm-up
        rows: list[Row] = []
        for T in lengths:
            for lean in (True, False) if T <= args.plain_max else (True,):
                row = measure(kind, model, T, lean, args, device, vocab, routing, meter)
                rows.append(row)
                print(f"{kind:>6} T={T:>6} {'lean ' if lean else 'plain'}: {row.tokens_per_s:>9.1f} tokens/s, "
                      f"peak {row.peak_mem_mb:>8.1f} MiB ({row.seconds:.2f} s)", file=sys.stderr)
        out[kind] = [asdict(r) for r in rows]
        from conch.rl.batch import set_gradient_checkpointing

        set_gradient_checkpointing(model, False)
        model.eval()
    out["memory_measure"] = meter.method
    return out


def run(args: argparse.Namespace) -> int:
    result = _bench(args)
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"model {result['model']} ({result['dtype']}, {result['device']}, {result['threads']} threads, "
          f"R3 replay {'on' if result['replay'] else 'off'}, LM-head chunk {result['chunk']})")
    print("lean = activation checkpointing + chunked log-prob/entropy; plain = both off")
    print(f"peak memory: {result['memory_measure']}")
    for kind in ("policy", "critic"):
        if kind not in result:
            continue
        print(f"\n{kind}")
        print(f"{'tokens':>8} {'mode':>6} {'tokens/s':>10} {'seconds':>9} {'peak MiB':>10}")
        for r in result[kind]:
            mode = "lean" if r["checkpointing"] else "plain"
            print(f"{r['seq_len']:>8} {mode:>6} {r['tokens_per_s']:>10.1f} {r['seconds']:>9.2f} "
                  f"{r['peak_mem_mb']:>10.1f}")
    return 0
