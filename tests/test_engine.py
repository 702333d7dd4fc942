"""HFEngine: sessions, continuous batching, routing capture, sampling, weight sync — on the real tiny model."""

from __future__ import annotations

import asyncio
import gc
import weakref

import numpy as np
import pytest
import torch

from conch.engine.base import Engine, SamplingParams
from conch.engine.hf import HFEngine
from conch.model.init import init_model
from conch.model.loading import load_policy
from conch.moe.routing import capture_routing


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("tiny")
    init_model(out, size="tiny", seed=0)
    return out


@pytest.fixture(scope="module")
def reference(model_dir):
    """The trainer's view: the same checkpoint loaded plainly (sdpa attention, no cache), fp32."""
    return load_policy(model_dir, dtype="float32")


def full_forward(model, ids: list[int], temperature: float = 1.0):
    """Log-prob of every next token and the experts of every token, from one full-sequence forward pass."""
    with capture_routing(model) as cap, torch.no_grad():
        logits = model(torch.tensor([ids], device=model.device)).logits[0].float()
        experts = cap.take()
    t = temperature if temperature > 0 else 1.0
    logp = torch.log_softmax(logits / t, dim=-1)
    return logp, None if experts is None else experts.numpy()


def run(coro):
    return asyncio.run(coro)


def prompt(tok, text: str) -> list[int]:
    return tok.encode(f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n")


def test_engine_satisfies_protocol(model_dir):
    async def go():
        eng = HFEngine(model_dir)
        assert isinstance(eng, Engine)
        assert (eng.num_experts, eng.top_k, eng.num_moe_layers) == (8, 2, 4)
        await eng.aclose()
    run(go())


def test_multi_turn_session_matches_full_forward(model_dir, reference):
    """Cache reuse + packed attention + capture equal a plain full-sequence forward (fp32)."""
    tok = reference.tokenizer

    async def go():
        eng = HFEngine(model_dir, max_step_tokens=16)  # small chunks: prefill spans several steps
        ids = prompt(tok, "List the files in /app and count them.")
        sid = await eng.open_session(ids)
        turns = [
            ([], SamplingParams(temperature=1.0, max_new_tokens=12, seed=3)),
            (tok.encode("<|im_end|>\n<|im_start|>user\n<tool_response>\na.txt\nb.txt\n</tool_response><|im_end|>\n"
                        "<|im_start|>assistant\n"), SamplingParams(temperature=0.7, top_p=0.8, max_new_tokens=9)),
            (tok.encode("ok\n"), SamplingParams(temperature=0.0, max_new_tokens=7)),
        ]
        checks = []
        for new_ids, params in turns:
            res = await eng.generate(sid, new_ids, params)
            start = len(ids) + len(new_ids)
            assert res.prompt_tokens == (len(new_ids) if checks else len(ids))
            checks.append((start, res, params.temperature))
            ids = ids + new_ids + res.token_ids
            assert res.routed_experts.shape == (res.prompt_tokens + len(res.token_ids), 4, 2)
            assert res.routed_experts.dtype == np.uint8
        await eng.aclose()
        return ids, checks

    ids, checks = run(go())
    rows = np.concatenate([res.routed_experts for _, res, _ in checks])
    for start, res, temp in checks:
        logp, experts = full_forward(reference.model, ids, temp)
        positions = range(start, start + len(res.token_ids))
        ref = [logp[p - 1, ids[p]].item() for p in positions]
        assert np.allclose(res.logprobs, ref, atol=1e-4), (res.logprobs, ref)
        if temp == 0:  # greedy picks the full forward's argmax
            assert [int(logp[p - 1].argmax()) for p in positions] == res.token_ids
    assert rows.shape[0] == len(ids)
    assert np.array_equal(np.sort(rows, -1), np.sort(experts, -1))


def test_batching_does_not_change_results(model_dir):
    """Sessions of different lengths joining and leaving a shared batch give what each gives alone.

    The overlap is made deterministic, not left to timing: the engine's worker is held off (its condition
    lock, which the event-loop thread may re-enter) until the four first requests are all queued, so the
    first step batches them; the second turns then join while longer sessions are still decoding."""
    specs = [("short", 5, 8), ("a much longer prompt about compressing logs " * 3, 12, 20),
             ("mid sized prompt here", 9, 3), ("x", 7, 14)]

    async def one(eng, text, seed, n):
        sid = await eng.open_session(prompt(eng.tokenizer, text))
        r1 = await eng.generate(sid, [], SamplingParams(temperature=1.0, max_new_tokens=n, seed=seed))
        r2 = await eng.generate(sid, eng.tokenizer.encode("\nnext"),
                                SamplingParams(temperature=0.9, top_k=50, max_new_tokens=n // 2 + 1, seed=seed))
        await eng.close_session(sid)
        return r1, r2

    async def together():
        eng = HFEngine(model_dir)
        with eng._cond:  # the worker waits on this lock: nothing runs until every first request is queued
            tasks = [asyncio.ensure_future(one(eng, *s)) for s in specs]
            while len(eng._inbox) < len(specs) and not any(t.done() for t in tasks):
                await asyncio.sleep(0)
        out = await asyncio.gather(*tasks)
        stats = dict(eng.stats)
        await eng.aclose()
        return out, stats

    async def alone():
        outs = []
        for s in specs:
            eng = HFEngine(model_dir)
            outs.append(await one(eng, *s))
            await eng.aclose()
        return outs

    batched, stats = run(together())
    assert stats["max_step_requests"] == len(specs)  # they really shared steps
    for (b1, b2), (a1, a2) in zip(batched, run(alone())):
        for b, a in ((b1, a1), (b2, a2)):
            assert b.token_ids == a.token_ids
            assert np.allclose(b.logprobs, a.logprobs, atol=1e-4)
            assert np.array_equal(b.routed_experts, a.routed_experts)


def test_close_frees_cache(model_dir):
    async def go():
        eng = HFEngine(model_dir)
        sid = await eng.open_session(prompt(eng.tokenizer, "hello"))
        await eng.generate(sid, [], SamplingParams(max_new_tokens=4, seed=1))
        assert eng.cache_bytes(sid) > 0
        kv_ref = weakref.ref(eng._sessions[sid].kv)
        await eng.close_session(sid)
        assert eng.cache_bytes() == 0 and eng.num_sessions == 0
        with pytest.raises(KeyError):
            await eng.generate(sid, [1, 2], SamplingParams(max_new_tokens=1))
        await eng.aclose()
        return kv_ref

    kv_ref = run(go())
    gc.collect()
    assert kv_ref() is None


def test_load_weights_changes_outputs_and_reprefills(model_dir):
    async def go():
        eng = HFEngine(model_dir)
        ids = prompt(eng.tokenizer, "weights")
        greedy = SamplingParams(temperature=0.0, max_new_tokens=8)
        s1 = await eng.open_session(ids)
        before = await eng.generate(s1, [], greedy)
        live = await eng.open_session(ids)
        await eng.generate(live, [], greedy)  # a session alive across the weight sync
        new_sd = {k: v + 0.05 * torch.randn_like(v) for k, v in eng.model.state_dict().items() if "embed" in k
                  or "lm_head" in k}
        eng.load_weights(new_sd)
        s2 = await eng.open_session(ids)
        after = await eng.generate(s2, [], greedy)
        cont = await eng.generate(live, [5, 6], SamplingParams(temperature=1.0, max_new_tokens=5, seed=2))
        history = ids + before.token_ids + [5, 6] + cont.token_ids
        with pytest.raises(KeyError):
            eng.load_weights({"no.such.weight": torch.zeros(1)})
        await eng.aclose()
        return before, after, cont, history, new_sd

    before, after, cont, history, new_sd = run(go())
    assert before.token_ids != after.token_ids or not np.allclose(before.logprobs, after.logprobs, atol=1e-3)
    # the live session was re-prefilled under the new weights: its log-probs match a fresh full forward
    trainer = load_policy(model_dir, with_tokenizer=False).model
    trainer.load_state_dict(new_sd, strict=False)
    logp, _ = full_forward(trainer, history)
    start = len(history) - len(cont.token_ids)
    ref = [logp[p - 1, history[p]].item() for p in range(start, len(history))]
    assert np.allclose(cont.logprobs, ref, atol=1e-4)
    assert cont.routed_experts.shape[0] == 2 + len(cont.token_ids)  # re-prefilled history rows not reported


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_dtypes(model_dir, dtype):
    async def go():
        eng = HFEngine(model_dir, dtype=dtype)
        assert eng.model.dtype == getattr(torch, dtype)
        ids = prompt(eng.tokenizer, "dtype check")
        sid = await eng.open_session(ids)
        res = await eng.generate(sid, [], SamplingParams(temperature=1.0, max_new_tokens=10, seed=4))
        await eng.aclose()
        return ids, res

    ids, res = run(go())
    assert len(res.token_ids) == 10 and all(lp <= 0 for lp in res.logprobs)
    model = load_policy(model_dir, dtype=dtype, with_tokenizer=False).model
    seq = ids + res.token_ids
    logp, experts = full_forward(model, seq)
    ref = [logp[p - 1, seq[p]].item() for p in range(len(ids), len(seq))]
    tol = 1e-4 if dtype == "float32" else 0.15  # bf16: different kernels round differently
    assert np.allclose(res.logprobs, ref, atol=tol), (res.logprobs, ref)
    agree = (np.sort(res.routed_experts, -1) == np.sort(experts, -1)).all(-1).mean()
    assert agree >= (1.0 if dtype == "float32" else 0.8)


def test_greedy_and_seeds_are_deterministic(model_dir):
    async def go():
        eng = HFEngine(model_dir)
        ids = prompt(eng.tokenizer, "determinism")
        out = {}
        for name, params in [("g1", SamplingParams(temperature=0.0, max_new_tokens=10)),
                             ("g2", SamplingParams(temperature=0.0, max_new_tokens=10)),
                             ("s1", SamplingParams(temperature=1.0, max_new_tokens=20, seed=11)),
                             ("s2", SamplingParams(temperature=1.0, max_new_tokens=20, seed=11)),
                             ("s3", SamplingParams(temperature=1.0, max_new_tokens=20, seed=12))]:
            sid = await eng.open_session(ids)
            out[name] = (await eng.generate(sid, [], params)).token_ids
            await eng.close_session(sid)
        await eng.aclose()
        return out

    out = run(go())
    assert out["g1"] == out["g2"] and out["s1"] == out["s2"] and out["s1"] != out["s3"]


def test_stop_strings_and_stop_tokens(model_dir):
    async def go():
        eng = HFEngine(model_dir)
        tok = eng.tokenizer
        ids = prompt(tok, "stop test")
        free = SamplingParams(temperature=1.0, max_new_tokens=40, seed=21)
        sid = await eng.open_session(ids)
        base = await eng.generate(sid, [], free)
        await eng.close_session(sid)
        text = tok.decode(base.token_ids)
        stop = text[len(text) // 2: len(text) // 2 + 3]
        sid = await eng.open_session(ids)
        by_string = await eng.generate(sid, [], SamplingParams(temperature=1.0, max_new_tokens=40, seed=21,
                                                                 stop_strings=(stop,)))
        await eng.close_session(sid)
        stop_tok = base.token_ids[10]
        sid = await eng.open_session(ids)
        by_token = await eng.generate(sid, [], SamplingParams(temperature=1.0, max_new_tokens=40, seed=21,
                                                                stop_token_ids=(stop_tok,)))
        await eng.aclose()
        return tok, base, stop, by_string, by_token, stop_tok

    tok, base, stop, by_string, by_token, stop_tok = run(go())
    assert base.finish_reason == "length" and len(base.token_ids) == 40
    assert by_string.finish_reason == "stop" and by_string.stop_reason_detail == stop
    n = len(by_string.token_ids)
    assert by_string.token_ids == base.token_ids[:n]
    out_text = tok.decode(by_string.token_ids)
    assert out_text.find(stop) >= 0 and tok.decode(by_string.token_ids[:-1]).find(stop) < 0
    first = base.token_ids.index(stop_tok)
    assert by_token.finish_reason == "stop" and by_token.token_ids == base.token_ids[: first + 1]
    assert by_token.routed_experts.shape[0] == by_token.prompt_tokens + first + 1


def test_prefill_only_and_errors(model_dir):
    async def go():
        eng = HFEngine(model_dir)
        ids = prompt(eng.tokenizer, "prefill only")
        sid = await eng.open_session(ids)
        res = await eng.generate(sid, [], SamplingParams(max_new_tokens=0))
        assert res.token_ids == [] and res.routed_experts.shape[0] == len(ids)
        task = asyncio.create_task(eng.generate(sid, [7], SamplingParams(max_new_tokens=30, seed=1)))
        await asyncio.sleep(0)
        with pytest.raises(RuntimeError):
            await eng.generate(sid, [8], SamplingParams(max_new_tokens=1))
        with pytest.raises(RuntimeError):
            await eng.close_session(sid)
        await task
        with pytest.raises(ValueError):
            await eng.generate(sid, [], SamplingParams(top_p=0.0))
        empty = await eng.open_session([])
        with pytest.raises(ValueError):
            await eng.generate(empty, [], SamplingParams(max_new_tokens=1))
        await eng.aclose()
    run(go())


def test_dense_model_has_no_routing(model_dir):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    dense = Qwen3ForCausalLM(Qwen3Config(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, head_dim=16))

    async def go():
        eng = HFEngine(dense)
        sid = await eng.open_session([1, 2, 3, 4])
        res = await eng.generate(sid, [], SamplingParams(max_new_tokens=5, seed=0))
        await eng.aclose()
        return eng, res

    eng, res = run(go())
    assert eng.num_experts == 0 and eng.num_moe_layers == 0 and res.routed_experts is None
    seq = [1, 2, 3, 4] + res.token_ids
    logp, experts = full_forward(dense, seq)
    assert experts is None
    assert np.allclose(res.logprobs, [logp[p - 1, seq[p]].item() for p in range(4, len(seq))], atol=1e-4)


def test_capture_can_be_switched(model_dir):
    async def go():
        eng = HFEngine(model_dir, capture_routing=False)
        sid = await eng.open_session([5, 6, 7])
        off = await eng.generate(sid, [], SamplingParams(max_new_tokens=3, seed=0))
        eng.set_capture_routing(True)
        on = await eng.generate(sid, [8], SamplingParams(max_new_tokens=3, seed=0))
        await eng.aclose()
        return off, on

    off, on = run(go())
    assert off.routed_experts is None and on.routed_experts.shape == (1 + 3, 4, 2)


def test_sampler_distribution_and_truncation():
    from conch.engine.sampling import RowSpec, make_generator, sample

    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0, -3.0]])
    g = make_generator(0, torch.device("cpu"))

    def draws(params, n=6000):
        counts = torch.zeros(6)
        for _ in range(n):
            tok, lp = sample(logits, [RowSpec(params, g)])
            counts[tok[0]] += 1
        return counts / n, lp[0], tok[0]

    freq, lp, tok = draws(SamplingParams(temperature=0.8))
    expect = torch.softmax(logits[0] / 0.8, -1)
    assert (freq - expect).abs().max() < 0.03
    assert abs(lp - float(torch.log_softmax(logits[0] / 0.8, -1)[tok])) < 1e-6  # before truncation
    freq, lp, tok = draws(SamplingParams(temperature=1.0, top_k=2), n=2000)
    assert freq[2:].sum() == 0 and freq[:2].min() > 0.1
    assert abs(lp - float(torch.log_softmax(logits[0], -1)[tok])) < 1e-6
    p = torch.softmax(logits[0], -1)  # ≈ [.57, .21, .13, .08, .03, .001]: top_p=0.7 keeps the first two
    freq, _, _ = draws(SamplingParams(temperature=1.0, top_p=0.7), n=2000)
    assert float(p[0]) < 0.7 < float(p[:2].sum()) and freq[2:].sum() == 0 and freq[1] > 0.1
    greedy, _ = sample(logits, [RowSpec(SamplingParams(temperature=0.0), g)])
    assert greedy == [0]


@pytest.mark.parametrize("family,window", [("qwen2_moe", None), ("olmoe", None), ("mixtral", None), ("mixtral", 8)])
def test_other_moe_families_match_full_forward(family, window):
    """GQA with several KV heads, shared experts, sliding windows: chunked multi-turn equals a full forward."""
    from tests.test_routing import tiny

    model = tiny(family)
    if window:
        model.config.sliding_window = window
    prompt_ids = list(range(3, 20))

    async def go():
        eng = HFEngine(model, max_step_tokens=5)
        sid = await eng.open_session(prompt_ids)
        r1 = await eng.generate(sid, [], SamplingParams(max_new_tokens=6, seed=1))
        r2 = await eng.generate(sid, [30, 31, 32, 33], SamplingParams(max_new_tokens=6, seed=1))
        await eng.aclose()
        return r1, r2

    r1, r2 = run(go())
    seq = prompt_ids + r1.token_ids + [30, 31, 32, 33] + r2.token_ids
    logp, experts = full_forward(model, seq)
    pos = list(range(17, 23)) + list(range(len(seq) - 6, len(seq)))
    assert np.allclose(r1.logprobs + r2.logprobs, [logp[p - 1, seq[p]].item() for p in pos], atol=1e-4)
    rows = np.concatenate([r1.routed_experts, r2.routed_experts])
    assert np.array_equal(np.sort(rows, -1), np.sort(experts, -1))


def test_benches_run(model_dir, capsys):
    """Smoke test of `conch bench engine` and `conch bench horizon` on small settings (real runs)."""
    import json

    from conch.cli import main as conch_main

    assert conch_main(["bench", "engine", "--json", "--model", str(model_dir), "--batch-sizes", "1,2",
                       "--new-tokens", "4", "--capture-tokens", "4", "--repeats", "2", "--decode-repeats", "1",
                       "--capture-batch", "2", "--horizon-turns", "2,3"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert [r["batch"] for r in out["decode"]] == [1, 2] and all(r["tokens_per_s"] > 0 for r in out["decode"])
    assert out["horizon"]["turns"] == [2, 3] and 0 < out["horizon"]["seconds_reuse"][0] <= out["horizon"]["seconds_reuse"][1]
    assert len(out["horizon"]["seconds_reuse_runs"]) == 1 and len(out["horizon"]["seconds_no_reuse"]) == 2
    cap = out["capture"]
    assert cap["tokens_per_s_capture"] > 0 and cap["tokens_per_s_no_capture"] > 0
    assert cap["pairs"] == 2 and len(cap["overhead_wall_pairs"]) == 2 and cap["steps_per_side"] == 2 * 4
    assert conch_main(["bench", "horizon", "--json", "--model", str(model_dir), "--turns", "2,4", "--repeats", "3"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["turns"] == [2, 4] and len(out["seconds_reuse"]) == 2 and len(out["seconds_no_reuse"]) == 2
    assert 0 < out["seconds_reuse"][0] <= out["seconds_reuse"][1]
    runs = out["seconds_reuse_runs"]
    assert len(runs) == 3 and out["seconds_reuse"][1] == sorted(r[1] for r in runs)[1]  # the median run
    assert out["attention"].startswith(("conch native", "torch sdpa"))
