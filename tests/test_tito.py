"""TITO drift: every DriftKind produced on purpose, repaired at the boundary and counted; retokenize mode
differs from TITO exactly at the turns where drift occurred.

Real tokenizer, chat template (ours, or a variant that drops earlier thinking as several real templates do),
TokenBuilder and local sandbox; the model is a ScriptedEngine returning chosen ids (canonical or deliberately
not).
"""

from __future__ import annotations

import asyncio
import copy

import pytest

from conch.agent.loop import run_loop
from conch.agent.scripted import ScriptedEngine, tool_call_text
from conch.agent.tito import ChatCodec
from conch.agent.trajectory import DriftKind, StopReason, Trajectory
from conch.config import AgentLoopConfig
from conch.tasks.synth.trajectories import BASH_TOOL, SYSTEM_PROMPT


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from conch.model.init import cached_model

    return AutoTokenizer.from_pretrained(cached_model())


@pytest.fixture(scope="module")
def codec(tokenizer) -> ChatCodec:
    return ChatCodec(tokenizer, tools=[BASH_TOOL])


def run(codec: ChatCodec, turns: list[list[int]], mode: str = "tito") -> tuple[Trajectory, ScriptedEngine]:
    """One episode whose k-th generate call returns turns[k] (in either mode), in a fresh local sandbox."""
    from conch.sandbox import SandboxSpec, make_sandbox

    it = iter(turns)
    engine = ScriptedEngine(lambda turn, history: next(it))

    async def main() -> Trajectory:
        sb = make_sandbox("local", SandboxSpec(name="tito-test"))
        await sb.start()
        try:
            shell = await sb.shell()
            traj = Trajectory(task="t", sample=0, mode=mode)
            cfg = AgentLoopConfig(mode=mode, max_turns=300, max_context=32768, max_new_tokens=256,
                                  obs_token_budget=512, command_timeout=60.0)
            await run_loop(engine, codec, shell, SYSTEM_PROMPT, "List the files.", cfg, traj)
            return traj
        finally:
            await sb.stop()

    return asyncio.run(main()), engine


def ids(codec: ChatCodec, text: str, end: bool = True) -> list[int]:
    return codec.encode(text) + ([codec.end_id] if end else [])


def split_first_long_token(codec: ChatCodec, token_ids: list[int], word: str) -> list[int]:
    """Replace the first id whose text is `word` by one id per character: same text, non-canonical ids."""
    for i, t in enumerate(token_ids):
        if codec.decode([t]) == word:
            pieces = [p for ch in word for p in codec.encode(ch)]
            assert len(pieces) > 1 and codec.decode(pieces) == word
            return token_ids[:i] + pieces + token_ids[i + 1 :]
    raise AssertionError(f"no token spells {word!r} in {codec.decode(token_ids)!r}")


def sampled_kept(traj: Trajectory, engine: ScriptedEngine) -> None:
    ones = [i for i, m in enumerate(traj.mask) if m]
    assert [traj.tokens[i] for i in ones] == [t for c in engine.calls for t in c.sampled]
    assert [traj.logprobs[i] for i in ones] == [x for c in engine.calls for x in c.logprobs]
    (history,) = engine.closed.values()
    assert history == traj.tokens[: len(history)]


def per_turn(traj: Trajectory) -> tuple[list, list[list]]:
    """((id, mask) pairs before the first turn, [each turn's pairs through the ids inserted after it])."""
    pairs = list(zip(traj.tokens, traj.mask))
    starts = [t.start for t in traj.turns] + [len(pairs)]
    return pairs[: starts[0]], [pairs[a:b] for a, b in zip(starts, starts[1:])]


def compare_modes(codec: ChatCodec, turns: list[list[int]]) -> tuple[Trajectory, Trajectory, ScriptedEngine]:
    tito, engine = run(codec, turns, "tito")
    retok, _ = run(codec, turns, "retokenize")
    sampled_kept(tito, engine)
    assert tito.error is None and retok.error is None
    assert [t.drift for t in tito.turns] == [t.drift for t in retok.turns]  # same checks, same counts
    assert tito.drift == retok.drift
    head_t, segs_t = per_turn(tito)
    head_r, segs_r = per_turn(retok)
    assert head_t == head_r and len(segs_t) == len(segs_r) == len(turns)
    for k, (a, b) in enumerate(zip(segs_t, segs_r)):
        assert (a == b) == (not tito.turns[k].drift), f"turn {k}: drift {tito.turns[k].drift}"
    return tito, retok, engine


def test_no_drift_tito_and_retokenize_are_identical(codec):
    turns = [ids(codec, tool_call_text("ls /")), ids(codec, "Let me count.\n" + tool_call_text("ls / | wc -l")),
             ids(codec, "There are some files.")]
    tito, retok, _ = compare_modes(codec, turns)
    assert not tito.drift and tito.stop_reason == StopReason.FINISHED
    assert (tito.tokens, tito.mask, tito.logprobs) == (retok.tokens, retok.mask, retok.logprobs)
    assert tito.tokens == codec.encode(codec.render(tito.messages))


def test_missing_end_token_after_a_length_stop(codec):
    cut = ids(codec, tool_call_text("echo cut"), end=False)  # no end token sampled: a length stop
    turns = [ids(codec, tool_call_text("echo a")), cut, ids(codec, "Done.")]
    tito, retok, engine = compare_modes(codec, turns)
    assert tito.drift == {DriftKind.MISSING_END.value: 1}
    assert [t.drift for t in tito.turns] == [[], ["missing_end_token"], []]
    t1 = tito.turns[1]
    assert t1.finish_reason == "length" and tito.tokens[t1.start : t1.end] == cut
    assert tito.tokens[t1.end] == codec.end_id and tito.mask[t1.end] == 0  # repaired, masked out
    assert t1.command == "echo cut" and tito.messages[5]["content"] == "cut\n[exit code: 0]"
    # The engine was fed the inserted end token before the observation.
    assert engine.calls[2].fed[0] == codec.end_id
    # Retokenize: the end token is part of the re-rendered turn (and gets the naive loop's mask 1).
    r1 = retok.turns[1]
    assert retok.tokens[r1.end - 1] == codec.end_id and retok.mask[r1.end - 1] == 1


def test_missing_end_token_when_another_stop_id_ends_the_turn(tokenizer):
    tok = copy.deepcopy(tokenizer)
    tok.eos_token = "<|endoftext|>"
    codec = ChatCodec(tok, tools=[BASH_TOOL])
    eos = tok.eos_token_id
    assert eos in codec.stop_ids and eos != codec.end_id
    turns = [ids(codec, tool_call_text("echo a"), end=False) + [eos], ids(codec, "Done.")]
    tito, engine = run(codec, turns)
    sampled_kept(tito, engine)
    assert tito.drift == {DriftKind.MISSING_END.value: 1}
    t0 = tito.turns[0]
    assert t0.finish_reason == "stop" and tito.tokens[t0.end - 1] == eos and tito.mask[t0.end - 1] == 1
    assert tito.tokens[t0.end] == codec.end_id and tito.mask[t0.end] == 0
    assert t0.command == "echo a" and t0.exit_code == 0


def test_noncanonical_sampled_ids_are_kept(codec):
    canonical = ids(codec, tool_call_text("echo hello"))
    odd = split_first_long_token(codec, canonical, codec.decode([t for t in canonical if "hello" in codec.decode([t])]))
    assert odd != canonical and codec.decode(odd) == codec.decode(canonical)
    turns = [ids(codec, tool_call_text("ls")), odd, ids(codec, "Done.")]
    tito, retok, _ = compare_modes(codec, turns)
    assert tito.drift == {DriftKind.NONCANONICAL.value: 1}
    t1 = tito.turns[1]
    assert tito.tokens[t1.start : t1.end] == odd and all(tito.mask[t1.start : t1.end])
    assert t1.command == "echo hello" and t1.exit_code == 0
    r1 = retok.turns[1]
    assert retok.tokens[r1.start : r1.end] == canonical  # the naive loop trains on ids nobody sampled


def test_noncanonical_across_the_turn_boundary(codec):
    # "assistant\n" + "\n..." tokenizes as "assistant" + "\n\n" canonically, not "assistant\n" + "\n".
    merged = codec.encode("\n") + ids(codec, "Done.")
    tito, engine = run(codec, [merged])
    sampled_kept(tito, engine)
    assert tito.drift[DriftKind.NONCANONICAL.value] == 1
    assert tito.tokens[tito.turns[0].start : tito.turns[0].end] == merged


def test_template_mismatch(codec):
    compact = ids(codec, '<tool_call>{"name":"bash","arguments":{"command":"echo hi"}}</tool_call>')
    turns = [ids(codec, tool_call_text("ls")), compact, ids(codec, tool_call_text("echo b")), ids(codec, "Done.")]
    tito, retok, _ = compare_modes(codec, turns)
    assert tito.drift == {DriftKind.TEMPLATE.value: 1}
    assert tito.turns[1].command == "echo hi" and tito.turns[2].command == "echo b"
    t1 = tito.turns[1]
    assert tito.tokens[t1.start : t1.end] == compact
    # The naive loop re-renders the call the template's way.
    r1 = retok.turns[1]
    assert codec.decode(retok.tokens[r1.start : r1.end]) == tool_call_text("echo hi") + "<|im_end|>"


@pytest.mark.parametrize("condition", [
    "{%- if loop.last and reasoning %}",  # drops a turn's thinking once anything follows it
    "{%- if false and reasoning %}",  # QwQ-style: never renders thinking, not even of the turn just sampled
])
def test_think_dropped_by_templates_that_drop_thinking(tokenizer, condition):
    tok = copy.deepcopy(tokenizer)
    tok.chat_template = tok.chat_template.replace("{%- if loop.index0 > ns.last_query_index and reasoning %}",
                                                  condition)
    assert condition in tok.chat_template
    codec = ChatCodec(tok, tools=[BASH_TOOL])

    def thinking(plan: str, command: str) -> list[int]:
        return ids(codec, f"<think>\n{plan}\n</think>\n\n" + tool_call_text(command))

    turns = [thinking("Look around.", "ls /"), thinking("Count them.", "ls / | wc -l"), ids(codec, "Done.")]
    tito, retok, _ = compare_modes(codec, turns)
    assert tito.drift == {DriftKind.THINK_DROPPED.value: 2}
    assert [t.drift for t in tito.turns] == [["think_dropped"], ["think_dropped"], []]
    # TITO keeps the sampled thinking; the naive loop's re-rendered conversation has lost it.
    assert codec.decode(tito.tokens).count("<think>") == 2 and codec.decode(retok.tokens).count("<think>") == 0
    assert tito.turns[1].command == "ls / | wc -l"


def test_think_kept_by_our_template_is_not_drift(codec):
    turns = [ids(codec, "<think>\nLook around.\n</think>\n\n" + tool_call_text("ls /")), ids(codec, "Done.")]
    tito, retok, _ = compare_modes(codec, turns)
    assert not tito.drift and tito.tokens == retok.tokens


def test_codec_encode_decode_match_the_tokenizer(codec, tokenizer):
    """The codec calls the Rust tokenizer directly; it must give the ids and text transformers gives."""
    texts = ["", "ls -la /app && echo 'done'", "<|im_start|>user\nhé <tool_response>\nx\n</tool_response><|im_end|>\n",
             "  leading spaces\n\n\ttabs", "emoji 🐚 and 中文", "<think>\nplan\n</think>\n\nok<|im_end|>"]
    for text in texts:
        ids = codec.encode(text)
        assert ids == tokenizer.encode(text, add_special_tokens=False)
        assert codec.decode(ids) == tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        assert codec.decode(ids) == text
