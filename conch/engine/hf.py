"""HFEngine: an in-process inference engine over any HF causal LM, with sessions, continuous batching and
MoE routing capture.

Why in-process: conch must run end to end on one CPU box (and on one GPU) with no server to start, and the
trainer must be able to push new weights into the live engine (`load_weights`) without a restart.

Design (measured by `conch bench engine` / `conch bench horizon`):
- A worker thread runs the scheduler; `generate()` only enqueues a request and awaits its future, so the event
  loop (sandboxes, agent logic) keeps running while the model computes (torch releases the GIL).
- Every scheduler step packs the new tokens of all active requests into one row (see session_attention.py):
  decoding sessions contribute one token, sessions with pending input contribute a prefill chunk (bounded by
  `max_step_tokens`). Requests join and leave between steps (continuous batching); at most `max_batch`
  requests share a step.
- Each session keeps its own growable KV buffer, so a turn costs only its new tokens; closing frees it.
- On CPU, attention over a session's cache runs in compiled kernels (native.py; `native_attention=False` or a
  machine without a C compiler/AVX-512 keeps torch's SDPA). Late turns of a long episode are dominated by it.
- Sampling uses a per-session torch.Generator, so results do not depend on batch composition.

Contract (refines conch/engine/base.py):
- The model's logits are produced in the engine dtype; log-probs are log_softmax(logits / T) taken in float32
  over the full vocabulary before top-k/top-p (T = 1 for greedy).
- `routed_experts` rows = pending prompt ids + new ids + sampled ids (the last sampled token is fed before the
  call returns), [rows, moe_layers, top_k], uint8 (≤256 experts) else int16.
- Stop tokens/strings end the turn with finish_reason "stop"; their tokens stay in `token_ids`. Only the given
  stop ids stop generation (no implicit EOS). "length": max_new_tokens reached or the context is full.
- `seed` seeds the session's generator on its first call and whenever a call brings a different seed.
- `load_weights` marks live sessions stale: their next call re-prefills their whole history with the new weights
  (those re-processed rows are not returned), so log-probs always match the live weights. A generate that is
  running while weights change finishes with the cache it has.
- One generate at a time per session; cancelling one leaves the session undefined (close it).
"""

from __future__ import annotations

import asyncio
import collections
import copy
import itertools
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from conch.engine.base import GenerateResult, SamplingParams
from conch.engine.sampling import RowSpec, make_generator, sample, stop_string_hit, tail_tokens_for, validate
from conch.engine.session_attention import PackedBatch, Segment, SessionKV, register


@dataclass
class _Session:
    sid: int
    pending: list[int]
    history: list[int] = field(default_factory=list)  # every token in the cache, in order
    kv: SessionKV | None = None
    generator: torch.Generator | None = None
    seed: int | None = None
    stale: bool = False
    busy: bool = False


@dataclass
class _Request:
    session: _Session
    params: SamplingParams
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop
    to_feed: list[int]
    want_sample: bool
    prompt_tokens: int
    skip_rows: int  # re-prefilled history rows not to report
    t0: float
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    rows: list[np.ndarray] = field(default_factory=list)
    finish_reason: str = "length"
    stop_detail: str | None = None


class HFEngine:
    """Async engine over a local HF checkpoint folder or a model object (which is deep-copied).

    `native_attention`: use conch's compiled CPU attention kernels where they build (else torch's SDPA);
    `attention_threads`: threads one kernel call may use on a long cache (default: native.default_threads())."""

    def __init__(self, model: str | Path | Any, dtype: str = "float32", capture_routing: bool = True,
                 max_batch: int = 64, max_step_tokens: int = 1024, device: str = "cpu", tokenizer: Any = None,
                 kv_initial_capacity: int = 256, torch_threads: int | None = None,
                 native_attention: bool = True, attention_threads: int | None = None) -> None:
        from conch.model.loading import load_policy, torch_dtype
        from conch.moe.routing import RoutingCapture, moe_shape

        self.dtype = dtype
        self.device = torch.device(device)
        if isinstance(model, (str, Path)):
            loaded = load_policy(model, dtype=dtype, device=device, with_tokenizer=tokenizer is None)
            self.model, self.tokenizer = loaded.model, tokenizer or loaded.tokenizer
        else:
            self.model = copy.deepcopy(model).to(device=self.device, dtype=torch_dtype(dtype)).eval()
            self.tokenizer = tokenizer
        self.model.requires_grad_(False)
        self.model.set_attn_implementation(register())
        cfg = self.model.config
        self._layers = cfg.num_hidden_layers
        self._kv_heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
        self._head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.max_positions = int(getattr(cfg, "max_position_embeddings", 1 << 30))
        shape = moe_shape(self.model)
        self.num_experts, self.num_moe_layers, self.top_k = shape.num_experts, shape.num_layers, shape.top_k
        self._capture = RoutingCapture(self.model) if capture_routing and shape.num_layers else None
        self.max_batch, self.max_step_tokens = int(max_batch), int(max_step_tokens)
        self._kv_cap = int(kv_initial_capacity)
        self._native, self.attention_kernel = self._pick_native(native_attention, attention_threads)
        # Measured on a 2-core VM: the tiny model's decode step in this worker thread took ~35 ms with two
        # intra-op threads vs ~18 ms with one (the main thread was ~17 ms either way), so the worker defaults
        # to one thread on CPU. This sets the worker's own OpenMP thread count only, not the caller's.
        self._torch_threads = torch_threads if torch_threads is not None else (1 if self.device.type == "cpu" else 0)
        self._sessions: dict[int, _Session] = {}
        self._ids = itertools.count(1)
        self._inbox: list[_Request] = []
        self._active: list[_Request] = []
        self._cond = threading.Condition()
        self._model_lock = threading.Lock()
        self._closing = False
        self.stats = {"steps": 0, "tokens_fed": 0, "tokens_sampled": 0, "forward_seconds": 0.0,
                      "max_step_requests": 0}
        # Wall seconds of each recent scheduler step (forward, sampling and per-request bookkeeping), for
        # benchmarks that need a per-step figure robust to load spikes (a median over steps).
        self.step_times: collections.deque[float] = collections.deque(maxlen=16384)
        self._worker = threading.Thread(target=self._run, name="conch-engine", daemon=True)
        self._worker.start()

    # ---------------------------------------------------------------- public API (event-loop thread)
    async def open_session(self, prompt_ids: list[int]) -> int:
        sid = next(self._ids)
        with self._cond:
            self._sessions[sid] = _Session(sid=sid, pending=[int(t) for t in prompt_ids])
        return sid

    async def generate(self, session: int, new_token_ids: list[int], sampling: SamplingParams) -> GenerateResult:
        validate(sampling)
        if sampling.stop_strings and self.tokenizer is None:
            raise ValueError("stop_strings need a tokenizer; pass tokenizer= to HFEngine")
        loop = asyncio.get_running_loop()
        with self._cond:
            if self._closing:
                raise RuntimeError("engine is closed")
            s = self._sessions.get(session)
            if s is None:
                raise KeyError(f"unknown or closed session {session}")
            if s.busy:
                raise RuntimeError(f"session {session} already has a generate in flight")
            new = s.pending + [int(t) for t in new_token_ids]
            s.pending = []
            skip = 0
            if s.stale:
                skip, new = len(s.history), s.history + new
                s.history, s.stale = [], False
                if s.kv is not None:
                    s.kv.length = 0
            if not new and not s.history:
                raise ValueError(f"session {session}: nothing to condition on (empty prompt and no new ids)")
            if len(s.history) + len(new) > self.max_positions:
                raise ValueError(f"session {session}: {len(s.history) + len(new)} tokens exceed the model's "
                                 f"context of {self.max_positions}")
            if sampling.seed is not None and (s.generator is None or sampling.seed != s.seed):
                s.generator, s.seed = make_generator(sampling.seed, self.device), sampling.seed
            elif s.generator is None:
                s.generator = make_generator(None, self.device)
            s.busy = True
            req = _Request(session=s, params=sampling, future=loop.create_future(), loop=loop, to_feed=new,
                           want_sample=sampling.max_new_tokens > 0, prompt_tokens=len(new) - skip, skip_rows=skip,
                           t0=time.perf_counter())
            if not req.to_feed:  # nothing new: sample straight from the last cached token
                req.to_feed = [s.history.pop()]
                s.kv.length -= 1  # type: ignore[union-attr]
                req.skip_rows = 1
            self._inbox.append(req)
            self._cond.notify()
        return await req.future

    async def close_session(self, session: int) -> None:
        with self._cond:
            s = self._sessions.get(session)
            if s is None:
                return
            if s.busy:
                raise RuntimeError(f"session {session} has a generate in flight; await it before closing")
            del self._sessions[session]
            s.kv = None

    def load_weights(self, state_dict: dict) -> None:
        own = dict(self.model.named_parameters())
        own.update(dict(self.model.named_buffers()))
        unknown = [k for k in state_dict if k not in own]
        if unknown:
            raise KeyError(f"load_weights: {len(unknown)} unknown tensor names, e.g. {unknown[:3]}")
        with self._model_lock, torch.no_grad():
            for name, value in state_dict.items():
                target = own[name]
                if tuple(target.shape) != tuple(value.shape):
                    raise ValueError(f"load_weights: {name} has shape {tuple(value.shape)}, "
                                     f"expected {tuple(target.shape)}")
                target.copy_(value.detach().to(device=target.device, dtype=target.dtype))
        with self._cond:
            for s in self._sessions.values():
                if s.history:
                    s.stale = True

    async def aclose(self) -> None:
        with self._cond:
            self._closing = True
            self._cond.notify()
        await asyncio.to_thread(self._worker.join)
        for req in self._inbox + self._active:
            self._resolve(req, RuntimeError("engine closed"))
        self._inbox, self._active = [], []
        with self._cond:
            for s in self._sessions.values():
                s.kv = None
            self._sessions.clear()
        if self._capture is not None:
            self._capture.remove()

    def set_capture_routing(self, enabled: bool) -> None:
        """Attach or remove the routing-capture hooks (between steps); results then carry routed_experts or None."""
        from conch.moe.routing import RoutingCapture

        with self._model_lock:
            if enabled and self._capture is None and self.num_moe_layers:
                self._capture = RoutingCapture(self.model)
            elif not enabled and self._capture is not None:
                self._capture.remove()
                self._capture = None

    def cache_bytes(self, session: int | None = None) -> int:
        """Bytes held by KV buffers (one session, or all)."""
        with self._cond:
            sessions = [self._sessions[session]] if session is not None else list(self._sessions.values())
            return sum(s.kv.nbytes() for s in sessions if s.kv is not None)

    @property
    def num_sessions(self) -> int:
        return len(self._sessions)

    # ---------------------------------------------------------------- worker thread
    def _run(self) -> None:
        if self._torch_threads:
            torch.set_num_threads(self._torch_threads)
        while True:
            with self._cond:
                while not self._closing and not self._inbox and not self._active:
                    self._cond.wait()
                if self._closing:
                    return
                self._active.extend(self._inbox)
                self._inbox = []
            batch = self._active[: self.max_batch]
            try:
                t_step = time.perf_counter()
                with self._model_lock:
                    self._step(batch)
                self.step_times.append(time.perf_counter() - t_step)
            except Exception as exc:  # a failed step fails its requests, never the engine
                for req in batch:
                    self._active.remove(req)
                    self._finish(req, exc)
                continue
            for req in batch:
                if not req.to_feed and not req.want_sample:
                    self._active.remove(req)
                    self._finish(req, None)

    def _pick_native(self, wanted: bool, threads: int | None) -> tuple[Any, str]:
        """The compiled attention kernels (CPU) and a description of what attention runs on."""
        if not wanted:
            return None, "torch sdpa (native_attention off)"
        from conch.engine.native import default_threads, native_attention, supports

        threads = threads or default_threads()
        cfg = self.model.config
        why = supports(cfg.num_attention_heads, self._kv_heads, self._head_dim)
        kernel = None
        if not why:
            kernel, why = native_attention(self.model.dtype, self.device, threads)
        if kernel is None:
            if self.device.type == "cpu":
                print(f"conch engine: attention uses torch's kernels: {why}", file=sys.stderr)
            return None, f"torch sdpa ({why})"
        return kernel, f"conch native (CPU decode and chunk, up to {threads} threads on long caches)"

    def _step(self, batch: list[_Request]) -> None:
        budget = max(self.max_step_tokens, len(batch))
        decoding = [r for r in batch if len(r.to_feed) == 1]
        budget -= len(decoding)
        ids: list[int] = []
        pos: list[int] = []
        segs: list[tuple[_Request, Segment, bool]] = []  # (request, segment, sample after it)
        chunks: list[list[int]] = []
        for req in batch:
            n = len(req.to_feed) if len(req.to_feed) == 1 else min(len(req.to_feed), budget)
            if n <= 0:
                continue
            if n > 1:
                budget -= n
            s = req.session
            if s.kv is None:
                s.kv = SessionKV(self._layers, self._kv_heads, self._head_dim, self.model.dtype, self.device,
                                 capacity=max(self._kv_cap, n))
            s.kv.reserve(n)
            chunk, req.to_feed = req.to_feed[:n], req.to_feed[n:]
            start = s.kv.length
            segs.append((req, Segment(s.kv, start, len(ids), n), not req.to_feed and req.want_sample))
            ids.extend(chunk)
            chunks.append(chunk)
            pos.extend(range(start, start + n))
        if not segs:
            return
        keep = [seg.row0 + seg.n - 1 for _, seg, smp in segs if smp]
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = self.model(
                input_ids=torch.tensor([ids], device=self.device),
                position_ids=torch.tensor([pos], device=self.device),
                use_cache=False,
                logits_to_keep=torch.tensor(keep or [0], device=self.device),
                conch_batch=PackedBatch.build([seg for _, seg, _ in segs], self._native),
            )
            routed = self._capture.take() if self._capture is not None else None
            if routed is not None:
                routed = routed.numpy()  # numpy views: slicing per request costs far less than torch's
            sampled_reqs = [req for req, _, smp in segs if smp]
            if sampled_reqs:
                toks, lps = sample(out.logits[0], [RowSpec(r.params, r.session.generator) for r in sampled_reqs])
        self.stats["forward_seconds"] += time.perf_counter() - t0
        self.stats["steps"] += 1
        self.stats["tokens_fed"] += len(ids)
        self.stats["max_step_requests"] = max(self.stats["max_step_requests"], len(segs))
        for (req, seg, _), chunk in zip(segs, chunks):
            seg.kv.length += seg.n
            req.session.history.extend(chunk)
            if routed is not None:
                rows = routed[seg.row0 : seg.row0 + seg.n]
                if req.skip_rows:
                    dropped = min(req.skip_rows, seg.n)
                    rows, req.skip_rows = rows[dropped:], req.skip_rows - dropped
                if rows.shape[0]:
                    req.rows.append(rows)
        for i, req in enumerate(sampled_reqs):
            self._accept(req, toks[i], lps[i])

    def _accept(self, req: _Request, token: int, logprob: float) -> None:
        """Record a sampled token; decide whether to continue; the token is always fed on the next step."""
        p = req.params
        req.tokens.append(token)
        req.logprobs.append(logprob)
        self.stats["tokens_sampled"] += 1
        req.to_feed = [token]
        stop = None
        if token in p.stop_token_ids:
            stop = token
        elif p.stop_strings:
            tail = self.tokenizer.decode(req.tokens[-tail_tokens_for(p.stop_strings):])
            stop = stop_string_hit(tail, p.stop_strings)
        if stop is not None:
            req.want_sample, req.finish_reason, req.stop_detail = False, "stop", str(stop)
        elif len(req.tokens) >= p.max_new_tokens or len(req.session.history) + 1 >= self.max_positions:
            req.want_sample, req.finish_reason = False, "length"

    def _finish(self, req: _Request, error: BaseException | None) -> None:
        with self._cond:
            req.session.busy = False
        if error is not None:
            self._resolve(req, error)
            return
        routed = None
        if req.rows:
            routed = np.concatenate(req.rows)  # a copy: the rows are views of whole-step arrays
        elif self._capture is not None:
            routed = np.zeros((0, self.num_moe_layers, self.top_k), dtype=np.uint8 if self.num_experts <= 256
                              else np.int16)
        if req.params.max_new_tokens == 0:
            req.finish_reason = "length"
        self._resolve(req, GenerateResult(
            token_ids=req.tokens, logprobs=req.logprobs, finish_reason=req.finish_reason, routed_experts=routed,
            prompt_tokens=req.prompt_tokens, seconds=time.perf_counter() - req.t0,
            stop_reason_detail=req.stop_detail,
        ))

    @staticmethod
    def _resolve(req: _Request, value: Any) -> None:
        def setter() -> None:
            if req.future.done():
                return
            if isinstance(value, BaseException):
                req.future.set_exception(value)
            else:
                req.future.set_result(value)
        try:
            req.loop.call_soon_threadsafe(setter)
        except RuntimeError:
            pass  # the caller's event loop is gone
