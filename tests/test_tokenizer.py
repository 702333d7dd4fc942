"""Offline BPE tokenizer: determinism, round trips, special tokens, chat template, extra corpus."""

from __future__ import annotations

import json

import pytest

from conch.model.tokenizer import (
    SPECIAL_TOKENS,
    TAG_TOKENS,
    render,
    special_token_ids,
    train_tokenizer,
)


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer()


def test_deterministic_and_sized(tok):
    again = train_tokenizer()
    assert tok.backend_tokenizer.to_str() == again.backend_tokenizer.to_str()
    assert len(tok) == 4096


@pytest.mark.parametrize("text", [
    "ls -la /app && cat README.md | grep -n 'error' > /tmp/out.txt 2>&1",
    "Traceback (most recent call last):\n  File \"x.py\", line 3\nKeyError: 'k'\n",
    "unicode: naïve café — 日本語 🙂 tabs\tand\r\nCRLF",
    '{"name": "bash", "arguments": {"command": "echo \\"hi\\""}}',
    "",
])
def test_round_trip(tok, text):
    assert tok.decode(tok.encode(text)) == text


def test_special_tokens_are_atomic(tok):
    ids = special_token_ids(tok)
    for t in SPECIAL_TOKENS + TAG_TOKENS:
        assert len(tok.encode(t)) == 1, t
    assert ids.im_end == tok.convert_tokens_to_ids("<|im_end|>") and ids.im_end in ids.eos_ids
    assert ids.endoftext in ids.eos_ids and ids.pad == ids.endoftext
    assert ids.tool_call_start == tok.convert_tokens_to_ids("<tool_call>")
    assert tok.eos_token == "<|im_end|>"
    text = "<|im_start|>assistant\n<think>x</think><tool_call>\n{}\n</tool_call><|im_end|>"
    # chat markers are special (skipped), tool/think tags are kept like Qwen3's
    kept = "assistant\n<think>x</think><tool_call>\n{}\n</tool_call>"
    assert tok.decode(tok.encode(text), skip_special_tokens=True) == kept


CONVERSATION = [
    {"role": "system", "content": "You are an agent."},
    {"role": "user", "content": "Count the files."},
    {"role": "assistant", "content": "<think>\nlook first\n</think>\n\nLet me look.",
     "tool_calls": [{"type": "function", "function": {"name": "bash", "arguments": '{"command": "ls"}'}}]},
    {"role": "tool", "content": "a\nb"},
    {"role": "tool", "content": "[exit 0]"},
    {"role": "assistant", "content": "<think>two</think>There are 2."},
    {"role": "user", "content": "Now delete them."},
    {"role": "assistant", "content": "<think>\nrm them\n</think>\n\n",
     "tool_calls": [{"type": "function", "function": {"name": "bash", "arguments": {"command": "rm a b"}}}]},
    {"role": "tool", "content": ""},
]

EXPECTED = (
    "<|im_start|>system\nYou are an agent.<|im_end|>\n"
    "<|im_start|>user\nCount the files.<|im_end|>\n"
    "<|im_start|>assistant\nLet me look.\n<tool_call>\n{\"name\": \"bash\", \"arguments\": {\"command\": \"ls\"}}\n"
    "</tool_call><|im_end|>\n"
    "<|im_start|>user\n<tool_response>\na\nb\n</tool_response>\n<tool_response>\n[exit 0]\n</tool_response><|im_end|>\n"
    "<|im_start|>assistant\nThere are 2.<|im_end|>\n"
    "<|im_start|>user\nNow delete them.<|im_end|>\n"
    "<|im_start|>assistant\n<think>\nrm them\n</think>\n\n<tool_call>\n"
    "{\"name\": \"bash\", \"arguments\": {\"command\": \"rm a b\"}}\n</tool_call><|im_end|>\n"
    "<|im_start|>user\n<tool_response>\n\n</tool_response><|im_end|>\n"
)


def test_chat_template_format(tok):
    assert render(tok, CONVERSATION) == EXPECTED
    assert render(tok, CONVERSATION, add_generation_prompt=True) == EXPECTED + "<|im_start|>assistant\n"
    # think is dropped before the last user query, kept after it
    out = render(tok, CONVERSATION)
    assert "look first" not in out and "two" not in out and "rm them" in out
    ids = tok.encode(out)
    assert tok.decode(ids) == out


def test_tools_section(tok):
    schema = {"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}
    out = render(tok, CONVERSATION[:2], tools=[schema], add_generation_prompt=True)
    assert out.startswith("<|im_start|>system\nYou are an agent.\n\n# Tools\n")
    assert json.dumps(schema) in out and out.endswith("<|im_start|>assistant\n")


def test_extra_corpus_shapes_vocabulary(tmp_path):
    word = "zyqxwvortexium"
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "a.txt").write_text((f"run {word} now\n") * 400)
    (tmp_path / "traj.jsonl").write_text("\n".join(json.dumps({"messages": [{"content": f"{word}!"}]})
                                                   for _ in range(400)))
    base = train_tokenizer()
    extra = train_tokenizer([tmp_path / "tasks", tmp_path / "traj.jsonl"])
    assert len(extra.encode(" " + word)) < len(base.encode(" " + word))
    with pytest.raises(FileNotFoundError):
        train_tokenizer([tmp_path / "missing"])


def test_saved_tokenizer_round_trip(tok, tmp_path):
    from conch.model.loading import load_tokenizer

    tok.save_pretrained(tmp_path)
    loaded = load_tokenizer(tmp_path)
    assert render(loaded, CONVERSATION, add_generation_prompt=True) == EXPECTED + "<|im_start|>assistant\n"
    assert special_token_ids(loaded) == special_token_ids(tok)


def test_own_template_fast_path_matches_transformers(tok):
    """conch's own template renders through a plain compiled Jinja environment; it must give exactly what
    transformers' sandboxed `apply_chat_template` gives, for every shape of conversation the loop renders."""
    from conch.model.tokenizer import _canonical_messages, chat_template

    assert tok.chat_template == chat_template()  # the fast path is the one taken
    schema = {"type": "function", "function": {"name": "bash", "description": "Run <cmd> & 'quote'",
                                                "parameters": {"type": "object"}}}
    calls = [{"type": "function", "function": {"name": "bash", "arguments": {"command": "ls é < x"}}},
             {"type": "function", "function": {"name": "bash", "arguments": '{"command": "pwd"}'}}]
    conversations = [
        CONVERSATION,
        CONVERSATION[:2],
        [{"role": "user", "content": "hi"}],
        CONVERSATION[:2] + [{"role": "assistant", "content": "", "tool_calls": calls},
                            {"role": "tool", "content": "a\nb"}, {"role": "tool", "content": "<x>"}],
    ]
    for conv in conversations:
        for tools in (None, [schema]):
            for gen in (False, True):
                expected = tok.apply_chat_template(_canonical_messages(conv), tools=tools, tokenize=False,
                                                   add_generation_prompt=gen)
                assert render(tok, conv, add_generation_prompt=gen, tools=tools) == expected
