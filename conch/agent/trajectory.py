"""The trajectory: one token sequence per episode, as the sampler produced it (TITO).

Why one sequence: the trainer must grade exactly the ids the sampler emitted. Every id is either sampled
(`mask=1`, with the sampler's log-prob and routed experts) or inserted by conch for prompts, observations and
boundary repairs (`mask=0`). Everything here is plain data so trajectories can be written as JSONL and shipped
between Ray workers; routed experts travel compactly as base64 of a uint8/int16 array.
"""

from __future__ import annotations

import base64
import enum
import json
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np


class StopReason(str, enum.Enum):
    FINISHED = "finished"  # answered without a tool call
    SUBMITTED = "submitted"  # called the submit tool
    MAX_TURNS = "max_turns"
    CONTEXT = "context_limit"
    TIMEOUT = "agent_timeout"
    PARSE_ERRORS = "parse_errors"  # too many malformed tool calls in a row
    ERROR = "error"  # the sandbox or engine failed


class DriftKind(str, enum.Enum):
    """Ways the template's rendering of the conversation departs from the ids actually sampled."""

    MISSING_END = "missing_end_token"  # length stop: no end-of-turn token was sampled; inserted, masked out
    NONCANONICAL = "noncanonical_tokens"  # sampled ids differ from the canonical tokenization of their text
    THINK_DROPPED = "think_dropped"  # the template drops <think> of earlier turns; sampled ids kept
    TEMPLATE = "template_mismatch"  # re-rendered text of the turn differs from the sampled text


@dataclass
class Turn:
    """Bookkeeping of one assistant turn: its span in `tokens` and what happened."""

    start: int  # first sampled token index
    end: int  # one past the last sampled token
    finish_reason: str
    command: str | None = None
    exit_code: int | None = None
    timed_out: bool = False
    parse_error: str | None = None
    gen_seconds: float = 0.0
    env_seconds: float = 0.0
    sampled_ids: list[int] | None = None  # retokenize mode only: the ids as sampled
    drift: list[str] = field(default_factory=list)  # DriftKind values counted at this turn's boundaries


def encode_routing(arr: np.ndarray | None) -> dict | None:
    if arr is None:
        return None
    return {"dtype": str(arr.dtype), "shape": list(arr.shape), "b64": base64.b64encode(arr.tobytes()).decode()}


def decode_routing(obj: dict | None) -> np.ndarray | None:
    if obj is None:
        return None
    return np.frombuffer(base64.b64decode(obj["b64"]), dtype=obj["dtype"]).reshape(obj["shape"]).copy()


@dataclass
class Trajectory:
    task: str
    sample: int
    tokens: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)  # sampler log-prob for mask=1, 0.0 elsewhere
    routed_experts: np.ndarray | None = None  # [len(tokens), layers, k]; rows of -1 were never routed
    messages: list[dict[str, Any]] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    stop_reason: StopReason = StopReason.FINISHED
    drift: Counter = field(default_factory=Counter)
    mode: str = "tito"
    n_passed: int = 0
    n_total: int = 0
    reward: float | None = None
    verifier_error: str | None = None
    # With `verifier_error`: "agent" (the agent broke its verification: scored as a failure, trained on) or
    # "infra" (excluded); `tampered` says why the verifier's results could not be the task's tests' (excluded).
    verifier_fault: str | None = None
    tampered: str | None = None
    error: str | None = None
    timings: dict[str, float] = field(default_factory=dict)
    # Passing counts measured during the episode (reward mode `progress`): (turn index, n_passed).
    progress: list[tuple[int, int]] = field(default_factory=list)
    # Tests of this task that pass with no action (reward mode `count_over_nop`; conch.tasks.nop).
    nop_passed: int | None = None
    tests: list[dict[str, str]] = field(default_factory=list)  # the verifier's per-test {"name", "status"}

    @property
    def num_sampled(self) -> int:
        return sum(self.mask)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["routed_experts"] = encode_routing(self.routed_experts)
        d["stop_reason"] = self.stop_reason.value
        d["drift"] = dict(self.drift)
        return d

    def dumps(self) -> str:
        return json.dumps(self.to_json())

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "Trajectory":
        d = dict(d)
        d["routed_experts"] = decode_routing(d.get("routed_experts"))
        d["stop_reason"] = StopReason(d["stop_reason"])
        d["drift"] = Counter(d.get("drift", {}))
        d["turns"] = [Turn(**t) for t in d.get("turns", [])]
        d["progress"] = [tuple(p) for p in d.get("progress", [])]
        return cls(**d)


def error_reason(traj: Trajectory) -> str | None:
    """Why the episode did not run to a measured outcome (a sandbox or engine failure, a verifier error not of
    the agent's making, a tampered verification), or None. Such an episode is never scored: neither trained on
    nor counted in an evaluation's figures (errors the agent caused are scored as failures)."""
    if traj.error or traj.stop_reason == StopReason.ERROR:
        return f"episode error: {traj.error or 'stop reason error'}"
    if traj.tampered:
        return f"verifier tampered: {traj.tampered}"
    if traj.verifier_error and getattr(traj, "verifier_fault", None) != "agent":
        return f"verifier error: {traj.verifier_error}"
    return None
