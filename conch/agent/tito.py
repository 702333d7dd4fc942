"""Exact token-in/token-out (TITO) bookkeeping.

The sequence grows by two kinds of spans: ids the engine sampled (kept verbatim, never decoded and re-encoded)
and ids conch inserts (the prompt, each observation as a chat-template delta, boundary repairs). At each turn
boundary we check that what we hold is still what the chat template would produce, count each way it is not
(`DriftKind`), and repair only the boundary: the trainer always sees the sampled ids.

`ChatCodec` wraps a HF tokenizer's chat template: `render` is the template, `encode` tokenizes text with its
special tokens parsed (no BOS added), `decode` keeps special tokens so texts compare exactly.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Sequence

import numpy as np

from conch.agent.trajectory import DriftKind

END_OF_TURN = "<|im_end|>"
THINK_OPEN = "<think>"


class ChatCodec:
    """Chat template, tokenizer and end-of-turn ids of one model."""

    def __init__(self, tokenizer: Any, tools: list[dict] | None = None) -> None:
        self.tok = tokenizer
        self.tools = tools
        vocab = tokenizer.get_vocab()
        if END_OF_TURN not in vocab:
            raise ValueError(f"tokenizer has no {END_OF_TURN} token: conch needs a ChatML-style chat template")
        self.end_id: int = vocab[END_OF_TURN]
        self.stop_ids: tuple[int, ...] = tuple(
            sorted({self.end_id} | ({tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()))
        )

    def render(self, messages: Sequence[dict], add_generation_prompt: bool = False) -> str:
        from conch.model.tokenizer import render

        return render(self.tok, list(messages), add_generation_prompt=add_generation_prompt, tools=self.tools)

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False)

    def decode(self, ids: Sequence[int]) -> str:
        return self.tok.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)


class TokenBuilder:
    """Accumulates one trajectory's ids, loss mask, sampler log-probs and routed experts, aligned by index."""

    def __init__(self, codec: ChatCodec, routing_shape: tuple[int, int] | None) -> None:
        self.codec = codec
        self.tokens: list[int] = []
        self.mask: list[int] = []
        self.logprobs: list[float] = []
        self._routing: list[np.ndarray] = []
        self._routing_shape = routing_shape  # (layers, k) for MoE models
        self._routed_rows = 0
        self.drift: Counter = Counter()
        self.pending: list[int] = []  # inserted ids the engine has not processed yet
        self._think_turns = 0
        self._think_dropped = 0

    # -- growing the sequence -------------------------------------------------------------------------------
    def insert(self, ids: Sequence[int]) -> None:
        """Ids conch adds (mask 0). They reach the engine with the next generate call."""
        self.tokens.extend(ids)
        self.mask.extend([0] * len(ids))
        self.logprobs.extend([0.0] * len(ids))
        self.pending.extend(ids)

    def take_pending(self) -> list[int]:
        ids, self.pending = self.pending, []
        return ids

    def add_sampled(self, ids: Sequence[int], logprobs: Sequence[float]) -> tuple[int, int]:
        start = len(self.tokens)
        self.tokens.extend(ids)
        self.mask.extend([1] * len(ids))
        self.logprobs.extend(float(x) for x in logprobs)
        return start, len(self.tokens)

    def add_routing(self, rows: np.ndarray | None) -> None:
        """Rows for the tokens processed by one engine call, in order (the engine's alignment contract)."""
        if rows is None or self._routing_shape is None:
            return
        self._routing.append(rows)
        self._routed_rows += rows.shape[0]

    def routed_experts(self) -> np.ndarray | None:
        """[len(tokens), layers, k]; tokens the engine never processed (the final ones) get -1 rows."""
        if self._routing_shape is None or not self._routing:
            return None
        arr = np.concatenate(self._routing, axis=0)
        missing = len(self.tokens) - arr.shape[0]
        if missing < 0:
            raise AssertionError(f"engine returned {arr.shape[0]} routing rows for {len(self.tokens)} tokens")
        dtype = np.int16 if arr.dtype == np.uint8 else arr.dtype  # room for the -1 marker
        out = np.full((len(self.tokens), *self._routing_shape), -1, dtype=dtype)
        out[: arr.shape[0]] = arr
        return out

    # -- turn boundaries ------------------------------------------------------------------------------------
    def close_turn(self, sampled: Sequence[int], finish_reason: str) -> str:
        """Check one sampled assistant turn, repair its end, and return its text (without the end token)."""
        body = list(sampled)
        if body and body[-1] in self.codec.stop_ids:
            body = body[:-1]
        else:
            # Length stop (or a stop string): the template would end the turn; insert the end token, masked out.
            self.drift[DriftKind.MISSING_END.value] += 1
            self.insert([self.codec.end_id])
        text = self.codec.decode(body)
        if self.codec.encode(text) != body:
            self.drift[DriftKind.NONCANONICAL.value] += 1
        if THINK_OPEN in text:
            self._think_turns += 1
        return text

    def check_template(self, messages: Sequence[dict], assistant_text: str) -> None:
        """Compare the template's rendering of the last assistant message with the text that was sampled."""
        before = self.codec.render(messages[:-1], add_generation_prompt=True)
        after = self.codec.render(messages, add_generation_prompt=False)
        if not after.startswith(before):
            self.drift[DriftKind.TEMPLATE.value] += 1
            return
        segment = after[len(before) :]
        end = segment.find(END_OF_TURN)
        rendered = segment if end < 0 else segment[:end]
        if rendered == assistant_text:
            return
        if THINK_OPEN in assistant_text and THINK_OPEN not in rendered:
            self.drift[DriftKind.THINK_DROPPED.value] += 1
            self._think_dropped += 1
        else:
            self.drift[DriftKind.TEMPLATE.value] += 1

    def check_earlier_thinking(self, full_render: str) -> None:
        """Count earlier turns whose thinking the template has started to drop (Qwen3 drops it before the
        last user query). The sampled ids are kept; only the event is counted."""
        if self._think_turns == 0:
            return
        dropped = self._think_turns - full_render.count(THINK_OPEN)
        if dropped > self._think_dropped:
            self.drift[DriftKind.THINK_DROPPED.value] += dropped - self._think_dropped
            self._think_dropped = dropped

    def observation_ids(self, with_assistant: Sequence[dict], with_observations: Sequence[dict]) -> list[int]:
        """The chat-template delta between the conversation ending with the assistant turn and the one that
        adds the observations and the next generation prompt: only these new ids are tokenized."""
        before = self.codec.render(with_assistant, add_generation_prompt=False)
        after = self.codec.render(with_observations, add_generation_prompt=True)
        self.check_earlier_thinking(after)
        # The delta starts right after the end token of the assistant turn. Locating it by counting end tokens
        # (not by string prefix) stays right when the template re-renders earlier turns differently.
        n_ends = before.count(END_OF_TURN)
        pos = 0
        for _ in range(n_ends):
            pos = after.index(END_OF_TURN, pos) + len(END_OF_TURN)
        return self.codec.encode(after[pos:])
