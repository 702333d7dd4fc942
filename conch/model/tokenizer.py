"""Tokenizer for conch's own models: byte-level BPE trained locally, Qwen3-style special tokens and chat template.

Why train our own: the randomly initialised policy must be usable with no download, so its tokenizer is built
from a corpus that exists offline (`conch.model.corpus`) plus anything the user adds (task corpora, expert
trajectories). Why Qwen3's format: real checkpoints the agent will run (Qwen3-MoE) use the same chat markers and
`<tool_call>` JSON, so the agent loop and trajectory code never branch on which model is loaded.

Real checkpoints keep their own tokenizer and template; `render` and `special_token_ids` work for both.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Special tokens get ids 0..8 in this order. Chat markers and <|endoftext|> are "special" (skipped by
# decode(skip_special_tokens=True)); tool/think tags are atomic but not special, so they survive decoding,
# exactly as in Qwen3's tokenizer.
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
TAG_TOKENS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>")
DEFAULT_VOCAB_SIZE = 4096
CHAT_TEMPLATE_PATH = Path(__file__).with_name("chat_template.jinja")

# Qwen2/3 pre-tokenizer split: words with one leading non-letter, single digits, punctuation runs, newlines.
SPLIT_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")


@dataclass(frozen=True)
class SpecialTokenIds:
    """Ids the agent loop and engine need. Fields are None when the tokenizer lacks the token."""

    im_start: int | None
    im_end: int | None
    endoftext: int | None
    eos_ids: tuple[int, ...]  # stop ids for an assistant turn: im_end and the tokenizer's eos, deduplicated
    pad: int | None
    tool_call_start: int | None
    tool_call_end: int | None
    think_start: int | None
    think_end: int | None


@functools.cache
def chat_template() -> str:
    return CHAT_TEMPLATE_PATH.read_text(encoding="utf-8")


def _texts(extra_paths: Iterable[Path], seed: int) -> Iterator[str]:
    from conch.model.corpus import generated_corpus, read_corpus_path, shipped_texts

    yield from shipped_texts()
    yield from generated_corpus(seed=0)  # fixed: the default vocabulary does not depend on the model seed
    for p in extra_paths:
        yield from read_corpus_path(Path(p))


def train_tokenizer(extra_paths: Iterable[Path] = (), vocab_size: int = DEFAULT_VOCAB_SIZE, seed: int = 0):
    """Train a byte-level BPE tokenizer and wrap it as a `PreTrainedTokenizerFast` with the chat template.

    Deterministic: the corpus order is fixed (sorted paths) and BPE training breaks ties deterministically."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    if not 512 <= vocab_size <= 262144:
        raise ValueError(f"vocab_size must be within [512, 262144], got {vocab_size}")
    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(SPLIT_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS + TAG_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_texts(extra_paths, seed), trainer=trainer)
    # Mark tag tokens non-special (kept by skip_special_tokens) while staying atomic added tokens.
    spec = json.loads(tok.to_str())
    for added in spec["added_tokens"]:
        added["special"] = added["content"] in SPECIAL_TOKENS
        added["normalized"] = False
    tok = Tokenizer.from_str(json.dumps(spec))
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
        unk_token=None,
        additional_special_tokens=[t for t in SPECIAL_TOKENS if t not in ("<|im_end|>", "<|endoftext|>")],
        clean_up_tokenization_spaces=False,
        model_max_length=131072,
    )
    fast.chat_template = chat_template()
    return fast


def special_token_ids(tokenizer: Any) -> SpecialTokenIds:
    """Special-token ids of any HF tokenizer (ours or a real checkpoint's)."""
    vocab = tokenizer.get_vocab()

    def tid(token: str) -> int | None:
        return vocab.get(token)

    eos = []
    for candidate in (tid("<|im_end|>"), tokenizer.eos_token_id, tid("<|endoftext|>")):
        if candidate is not None and candidate not in eos:
            eos.append(int(candidate))
    return SpecialTokenIds(
        im_start=tid("<|im_start|>"),
        im_end=tid("<|im_end|>"),
        endoftext=tid("<|endoftext|>"),
        eos_ids=tuple(eos),
        pad=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tid("<|endoftext|>"),
        tool_call_start=tid("<tool_call>"),
        tool_call_end=tid("</tool_call>"),
        think_start=tid("<think>"),
        think_end=tid("</think>"),
    )


def _canonical_messages(messages: list[dict]) -> list[dict]:
    """Tool-call arguments given as JSON strings become objects, so both spellings render identically."""
    out = []
    for m in messages:
        calls = m.get("tool_calls")
        if calls:
            m = dict(m)
            fixed = []
            for call in calls:
                fn = call.get("function", call)
                args = fn.get("arguments")
                if isinstance(args, str):
                    try:
                        parsed = json.loads(args)
                    except json.JSONDecodeError:
                        parsed = None
                    if isinstance(parsed, dict):
                        fn = {**fn, "arguments": parsed}
                fixed.append({**call, "function": fn} if "function" in call else fn)
            m["tool_calls"] = fixed
        out.append(m)
    return out


def render(tokenizer: Any, messages: list[dict], add_generation_prompt: bool = False,
           tools: list[dict] | None = None) -> str:
    """Render OpenAI-style messages with the tokenizer's own chat template (ours, or a checkpoint's).

    A checkpoint's template runs through transformers' `apply_chat_template` (a sandboxed Jinja environment: a
    downloaded template is untrusted code). conch's own template is trusted, so it is compiled once in a plain
    Jinja environment with the same options and `tojson`; that renders the same text about 2.5x faster, which
    matters because the agent loop renders a window of the conversation several times per turn
    (tests/test_tokenizer.py checks both paths agree)."""
    template = getattr(tokenizer, "chat_template", None)
    if not template:
        raise ValueError("tokenizer has no chat_template; cannot render messages")
    if template == chat_template():
        return _own_template().render(messages=_canonical_messages(messages), tools=tools,
                                      add_generation_prompt=add_generation_prompt)
    return tokenizer.apply_chat_template(
        _canonical_messages(messages), tools=tools, tokenize=False, add_generation_prompt=add_generation_prompt
    )


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None,
            sort_keys: bool = False) -> str:
    """transformers' chat-template `tojson` (Jinja's own escapes HTML characters, which a prompt must not)."""
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


@functools.cache
def _own_template() -> Any:
    import jinja2
    import jinja2.ext

    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    return env.from_string(chat_template())
