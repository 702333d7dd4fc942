"""Exact token-in/token-out (TITO) bookkeeping.

The sequence grows by two kinds of spans: ids the engine sampled (kept verbatim, never decoded and re-encoded)
and ids conch inserts (the prompt, each observation as a chat-template delta, boundary repairs). At each turn
boundary we check that what we hold is still what the chat template would produce, count each way it is not
(`DriftKind`), and repair only the boundary: the trainer always sees the sampled ids.

Why the checks are local: special tokens (`<|im_start|>`, `<|im_end|>`, tag tokens) are split out before BPE
runs, so the canonical tokenization of a conversation is the concatenation of the tokenizations of the pieces
between them. A turn can therefore be checked against the text since the last special token before it, and an
observation delta can be tokenized alone, without re-tokenizing the conversation. The chat template is only
rendered over a window (the opening system/user messages plus the last turn), which gives the same delta for
templates whose rendering of a message depends on its neighbours and on "is this the last message" (ChatML,
Qwen3, Hermes) and keeps every turn O(1) instead of O(conversation) at 1,000 turns. `close_episode` renders the
whole conversation once at the end to catch later changes (a template dropping earlier thinking).

`ChatCodec` wraps a HF tokenizer's chat template: `render` is the template, `encode` tokenizes text with its
special tokens parsed (no BOS added), `decode` keeps special tokens so texts compare exactly.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Sequence

import numpy as np

from conch.agent.trajectory import DriftKind

END_OF_TURN = "<|im_end|>"
START_OF_TURN = "<|im_start|>"
ASSISTANT_HEADER = START_OF_TURN + "assistant"
THINK_OPEN = "<think>"
# Inserted after the first character of a control-token string found in text conch did not sample, so it is
# tokenized as plain text and cannot forge turn structure (an observation that prints "<|im_end|>").
_BREAK = "\u200b"


class ChatCodec:
    """Chat template, tokenizer and end-of-turn ids of one model."""

    def __init__(self, tokenizer: Any, tools: list[dict] | None = None) -> None:
        self.tok = tokenizer
        self.tools = tools
        # A fast tokenizer's Rust object: encode/decode are called several times per turn.
        self._rust = getattr(tokenizer, "backend_tokenizer", None) if getattr(tokenizer, "is_fast", False) else None
        vocab = tokenizer.get_vocab()
        if END_OF_TURN not in vocab:
            raise ValueError(f"tokenizer has no {END_OF_TURN} token: conch needs a ChatML-style chat template")
        self.end_id: int = vocab[END_OF_TURN]
        self.stop_ids: tuple[int, ...] = tuple(
            sorted({self.end_id} | ({tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()))
        )
        added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
        # Ids the tokenizer splits on before BPE: a canonical tokenization never merges across them.
        self.boundary_ids: frozenset[int] = frozenset(int(i) for i in added) | {self.end_id}
        self.control_strings: tuple[str, ...] = tuple(
            sorted({str(t) for t in added.values() if str(t).startswith("<|")} | {END_OF_TURN, START_OF_TURN})
        )

    def render(self, messages: Sequence[dict], add_generation_prompt: bool = False) -> str:
        from conch.model.tokenizer import render

        return render(self.tok, list(messages), add_generation_prompt=add_generation_prompt, tools=self.tools)

    def encode(self, text: str) -> list[int]:
        if self._rust is not None:  # the same ids as `tok.encode`, without its per-call Python layers
            return self._rust.encode(text, add_special_tokens=False).ids
        return self.tok.encode(text, add_special_tokens=False)

    def decode(self, ids: Sequence[int]) -> str:
        if self._rust is not None:
            return self._rust.decode(list(ids), skip_special_tokens=False)
        return self.tok.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def neutralize(self, text: str) -> str:
        """`text` with every control-token string (`<|...|>`) broken so it tokenizes as plain text."""
        for s in self.control_strings:
            if s in text:
                text = text.replace(s, s[0] + _BREAK + s[1:])
        return text


def _window(messages: Sequence[dict], last: int) -> list[dict]:
    """The opening messages (through the first user message) plus messages[last - 1:]: enough context for the
    template to render message `last` and everything after it as it does in the full conversation."""
    head = 0
    while head < len(messages) and messages[head].get("role") != "user":
        head += 1
    head += 1
    start = max(head, last - 1)
    return list(messages[:head]) + list(messages[start:])


def _nth_end(text: str, n: int) -> int:
    """Index just past the n-th END_OF_TURN in `text` (0 when n == 0)."""
    pos = 0
    for _ in range(n):
        pos = text.index(END_OF_TURN, pos) + len(END_OF_TURN)
    return pos


def assistant_bodies(rendered: str) -> list[tuple[int, int]]:
    """Character spans of every assistant turn's body in a rendered conversation: from after the
    "<|im_start|>assistant\\n" header through the END_OF_TURN token (included); open turns run to the end."""
    spans = []
    pos = rendered.find(ASSISTANT_HEADER)
    while pos >= 0:
        body = rendered.index("\n", pos) + 1 if "\n" in rendered[pos:] else len(rendered)
        end = rendered.find(END_OF_TURN, body)
        end = len(rendered) if end < 0 else end + len(END_OF_TURN)
        spans.append((body, end))
        pos = rendered.find(ASSISTANT_HEADER, end)
    return spans


def _think_turns(rendered: str) -> int:
    return sum(1 for a, b in assistant_bodies(rendered) if THINK_OPEN in rendered[a:b])


class TokenBuilder:
    """Accumulates one trajectory's ids, loss mask, sampler log-probs and routed experts, aligned by index."""

    def __init__(self, codec: ChatCodec, routing_shape: tuple[int, int] | None) -> None:
        self.codec = codec
        self.tokens: list[int] = []
        self.mask: list[int] = []
        self.logprobs: list[float] = []
        self._routing: list[np.ndarray] = []
        self._routing_shape = routing_shape  # (layers, k) for MoE models
        self.drift: Counter = Counter()
        self.turn_drift: list[str] = []  # drift kinds of the current turn (the loop takes them per turn)
        self.pending: list[int] = []  # inserted ids the engine has not processed yet
        self._think_turns = 0
        self._think_dropped = 0
        self._memo: tuple[list[dict], bool, str] | None = None  # the last window rendered (see `_render`)

    def note(self, kind: DriftKind, n: int = 1) -> None:
        self.drift[kind.value] += n
        self.turn_drift.extend([kind.value] * n)

    def take_turn_drift(self) -> list[str]:
        kinds, self.turn_drift = self.turn_drift, []
        return kinds

    # -- growing the sequence -------------------------------------------------------------------------------
    def insert(self, ids: Sequence[int]) -> None:
        """Ids conch adds (mask 0). They reach the engine with the next generate call."""
        ids = [int(i) for i in ids]
        self.tokens.extend(ids)
        self.mask.extend([0] * len(ids))
        self.logprobs.extend([0.0] * len(ids))
        self.pending.extend(ids)

    def take_pending(self) -> list[int]:
        ids, self.pending = self.pending, []
        return ids

    def add_sampled(self, ids: Sequence[int], logprobs: Sequence[float]) -> tuple[int, int]:
        if len(ids) != len(logprobs):
            raise ValueError(f"engine returned {len(ids)} ids but {len(logprobs)} log-probs")
        start = len(self.tokens)
        self.tokens.extend(int(i) for i in ids)
        self.mask.extend([1] * len(ids))
        self.logprobs.extend(float(x) for x in logprobs)
        return start, len(self.tokens)

    def add_routing(self, rows: np.ndarray | None) -> None:
        """Rows for the tokens processed by one engine call, in order (the engine's alignment contract)."""
        if rows is None or self._routing_shape is None:
            return
        self._routing.append(rows)

    def routed_experts(self) -> np.ndarray | None:
        """[len(tokens), layers, k]; tokens the engine never fed or reported (the final ones: inserted ids after the
        last call, the last sampled token whose row the engine still owes) get -1 rows."""
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
    def _context_ids(self, start: int) -> list[int]:
        """The ids between the last boundary (special) token before `start` and `start`: the text a canonical
        tokenization of the turn would be merged with (the "assistant\\n" of the generation prompt)."""
        i = start
        while i > 0 and self.tokens[i - 1] not in self.codec.boundary_ids:
            i -= 1
        return self.tokens[i:start]

    def close_turn(self, sampled: Sequence[int], finish_reason: str) -> str:
        """Check the assistant turn just added with `add_sampled`, repair its end, and return its text (without
        the end token). Drift counted here: a missing end-of-turn token (inserted, masked out) and sampled ids
        that are not the canonical tokenization of their text in context."""
        body = [int(i) for i in sampled]
        start = len(self.tokens) - len(body)
        ended = bool(body) and body[-1] == self.codec.end_id
        if body and body[-1] in self.codec.stop_ids:
            body = body[:-1]
        ctx = self._context_ids(start)
        text = self.codec.decode(body)
        if self.codec.encode(self.codec.decode(ctx + body)) != ctx + body:
            self.note(DriftKind.NONCANONICAL)
        if not ended:
            # Length stop, a stop string, or another stop id: the template closes the turn with END_OF_TURN.
            self.note(DriftKind.MISSING_END)
            self.insert([self.codec.end_id])
        if THINK_OPEN in text:
            self._think_turns += 1
        return text

    def _render(self, window: list[dict], add_generation_prompt: bool) -> str:
        """`codec.render`, remembering the last call: a turn renders the window that ends with its assistant
        message twice (the template check, then the observation delta). The memo compares the message objects
        by identity (messages are never mutated once appended) and holds them, so a hit is always exact."""
        m = self._memo
        if (m is not None and m[1] == add_generation_prompt and len(m[0]) == len(window)
                and all(a is b for a, b in zip(m[0], window))):
            return m[2]
        text = self.codec.render(window, add_generation_prompt=add_generation_prompt)
        self._memo = (window, add_generation_prompt, text)
        return text

    def check_template(self, messages: Sequence[dict], assistant_text: str) -> None:
        """Compare the template's rendering of the last (assistant) message with the text that was sampled."""
        win = _window(messages, len(messages) - 1)
        before = self.codec.render(win[:-1], add_generation_prompt=True)
        after = self._render(win, add_generation_prompt=False)
        if not after.startswith(before):
            self.note(DriftKind.TEMPLATE)
            return
        segment = after[len(before) :]
        end = segment.find(END_OF_TURN)
        rendered = segment if end < 0 else segment[:end]
        if rendered == assistant_text:
            return
        if THINK_OPEN in assistant_text and THINK_OPEN not in rendered:
            self.note(DriftKind.THINK_DROPPED)
            self._think_dropped += 1
        else:
            self.note(DriftKind.TEMPLATE)

    def observation_ids(self, with_assistant: Sequence[dict], with_observations: Sequence[dict]) -> list[int]:
        """The chat-template delta between the conversation ending with the assistant turn and the one that
        adds the observations and the next generation prompt: only these new ids are tokenized."""
        last = len(with_assistant) - 1
        before = self._render(_window(with_assistant, last), add_generation_prompt=False)
        after = self.codec.render(_window(with_observations, last), add_generation_prompt=True)
        dropped = _think_turns(before) - _think_turns(after)
        if dropped > 0:  # the template drops a turn's thinking once something follows it; sampled ids kept
            self.note(DriftKind.THINK_DROPPED, dropped)
            self._think_dropped += dropped
        # The delta starts right after the end token of the assistant turn. Locating it by counting end tokens
        # (not by string prefix) stays right when the template re-renders earlier turns differently.
        return self.codec.encode(after[_nth_end(after, before.count(END_OF_TURN)) :])

    def closing_ids(self, messages: Sequence[dict]) -> list[int]:
        """What the template renders after the final assistant turn's end token (ChatML: a newline)."""
        text = self.codec.render(_window(messages, len(messages) - 1), add_generation_prompt=False)
        return self.codec.encode(text[_nth_end(text, text.count(END_OF_TURN)) :])

    def check_earlier_thinking(self, full_render: str) -> None:
        """Count earlier turns whose thinking the full rendering no longer shows (Qwen3 drops it before the
        last user query). The sampled ids are kept; only the event is counted."""
        if self._think_turns == 0:
            return
        dropped = self._think_turns - _think_turns(full_render)
        if dropped > self._think_dropped:
            self.note(DriftKind.THINK_DROPPED, dropped - self._think_dropped)
            self._think_dropped = dropped

    def close_episode(self, messages: Sequence[dict]) -> None:
        """End the sequence as the template ends the final conversation, and check earlier thinking once over
        the whole rendering (the per-turn checks only see a window)."""
        if messages and messages[-1].get("role") == "assistant":
            self.insert(self.closing_ids(messages))
        if self._think_turns:
            self.check_earlier_thinking(self.codec.render(messages, add_generation_prompt=False))
