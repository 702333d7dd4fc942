"""Routing capture and replay (R3) on every supported HF MoE family, and sampler -> trainer replay."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch
from torch import nn

from conch.moe.routing import (
    SUPPORTED_ROUTERS,
    RoutingReplay,
    UnsupportedMoeError,
    capture_routing,
    find_routers,
    moe_layer_count,
    moe_shape,
    replay_routing,
    routing_disagreement,
)


def tiny(family: str, experts: int = 8):
    """A random 2-layer model of each supported MoE family, built in memory."""
    import transformers as tf

    common = dict(vocab_size=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  num_experts_per_tok=2, max_position_embeddings=256)
    if family == "qwen3_moe":
        cfg = tf.Qwen3MoeConfig(num_experts=experts, moe_intermediate_size=32, intermediate_size=64, head_dim=16,
                                norm_topk_prob=True, **common)
        cls = tf.Qwen3MoeForCausalLM
    elif family == "qwen2_moe":
        cfg = tf.Qwen2MoeConfig(num_experts=experts, moe_intermediate_size=32, intermediate_size=64,
                                shared_expert_intermediate_size=32, norm_topk_prob=False, **common)
        cls = tf.Qwen2MoeForCausalLM
    elif family == "olmoe":
        cfg = tf.OlmoeConfig(num_experts=experts, intermediate_size=32, norm_topk_prob=False, **common)
        cls = tf.OlmoeForCausalLM
    else:
        cfg = tf.MixtralConfig(num_local_experts=experts, intermediate_size=32, **common)
        cls = tf.MixtralForCausalLM
    torch.manual_seed(0)
    model = cls(cfg).eval()
    with torch.no_grad():  # spread the router logits so top-k choices are not near ties
        for r in find_routers(model):
            r.weight.normal_(0, 0.5)
    return model


FAMILIES = ["qwen3_moe", "qwen2_moe", "olmoe", "mixtral"]


@pytest.mark.parametrize("family", FAMILIES)
def test_capture_and_replay_per_family(family):
    model = tiny(family)
    assert moe_layer_count(model) == 2 and moe_shape(model).num_experts == 8
    ids = torch.randint(0, 128, (2, 12))
    with capture_routing(model) as cap, torch.no_grad():
        base = model(ids).logits
        rec = cap.take()
    assert rec.shape == (24, 2, 2) and rec.dtype == torch.uint8
    recorded = rec.view(2, 12, 2, 2).long()

    # replaying the model's own routing reproduces it exactly
    with replay_routing(model, recorded) as state, torch.no_grad():
        same = model(ids).logits
    assert torch.allclose(same, base, atol=1e-5)
    assert routing_disagreement(state.own_experts(), recorded) == 0.0
    assert state.replayed_rows == 2 * 24 and state.fallback_rows == 0

    # a deliberately different set changes the outputs, and the replay state reports the disagreement
    other = (recorded + 3) % 8
    with replay_routing(model, other) as state, torch.no_grad():
        changed = model(ids).logits
    assert (changed - base).abs().max() > 1e-3
    assert routing_disagreement(state.own_experts(), other) > 0.9

    # -1 (unknown) falls back to the model's own routing
    with replay_routing(model, torch.full_like(recorded, -1)) as state, torch.no_grad():
        fallback = model(ids).logits
    assert torch.allclose(fallback, base, atol=1e-5) and state.fallback_rows == 2 * 24


@pytest.mark.parametrize("family", FAMILIES)
def test_router_gets_gradient_under_replay(family):
    model = tiny(family).train()
    ids = torch.randint(0, 128, (1, 10))
    other = torch.randint(0, 8, (1, 10, 2, 1)).repeat(1, 1, 1, 2)
    other[..., 1] = (other[..., 0] + 1) % 8  # distinct pair per token
    with replay_routing(model, other):
        loss = torch.log_softmax(model(ids).logits, -1)[0, :-1].gather(1, ids[0, 1:, None]).mean()
    loss.backward()
    for r in find_routers(model):
        assert r.weight.grad is not None and r.weight.grad.abs().sum() > 0


def test_replay_validates_shapes():
    model = tiny("qwen3_moe")
    ids = torch.randint(0, 128, (1, 6))
    with pytest.raises(ValueError, match="layers"):
        with replay_routing(model, torch.zeros(1, 6, 3, 2, dtype=torch.long)):
            pass
    with pytest.raises(ValueError, match="tokens"):
        with replay_routing(model, torch.zeros(1, 5, 2, 2, dtype=torch.long)), torch.no_grad():
            model(ids)
    with pytest.raises(ValueError, match="out of range"):
        with replay_routing(model, torch.full((1, 6, 2, 2), 9, dtype=torch.long)):
            pass


def test_disagreement_counts_sets():
    a = torch.tensor([[[0, 1]], [[2, 3]], [[4, 5]]])
    b = torch.tensor([[[1, 0]], [[2, 4]], [[-1, -1]]])
    assert routing_disagreement(a, b) == 0.5  # row 0 same set, row 1 differs, row 2 unknown (skipped)


def test_dense_and_unsupported_models():
    from transformers import Qwen3Config, Qwen3ForCausalLM

    dense = Qwen3ForCausalLM(Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1, head_dim=16))
    assert moe_layer_count(dense) == 0 and moe_shape(dense).num_layers == 0

    class FancyTopKRouter(nn.Module):
        pass

    class FancySparseMoeBlock(nn.Module):
        def __init__(self):
            super().__init__()
            self.gate = FancyTopKRouter()

    with pytest.raises(UnsupportedMoeError) as err:
        moe_layer_count(nn.Sequential(FancySparseMoeBlock()))
    for name in SUPPORTED_ROUTERS:
        assert name in str(err.value)


def test_engine_routing_replays_in_trainer(tmp_path):
    """The sampler's recorded experts, replayed in a plain trainer forward, route identically and give the
    sampler's log-probs; the trainer's own routing agrees with them too (same dtype)."""
    from conch.engine.base import SamplingParams
    from conch.engine.hf import HFEngine
    from conch.model.init import init_model
    from conch.model.loading import load_policy

    init_model(tmp_path, seed=1)

    async def sample():
        eng = HFEngine(tmp_path)
        ids = eng.tokenizer.encode("<|im_start|>user\nreplay me<|im_end|>\n<|im_start|>assistant\n")
        sid = await eng.open_session(ids)
        r1 = await eng.generate(sid, [], SamplingParams(temperature=1.0, max_new_tokens=10, seed=5))
        r2 = await eng.generate(sid, [11, 12, 13], SamplingParams(temperature=1.0, max_new_tokens=6, seed=5))
        await eng.aclose()
        return ids + r1.token_ids + [11, 12, 13] + r2.token_ids, r1, r2, len(ids)

    seq, r1, r2, n_prompt = asyncio.run(sample())
    recorded = torch.from_numpy(np.concatenate([r1.routed_experts, r2.routed_experts])).long()[None]
    trainer = load_policy(tmp_path, with_tokenizer=False).model
    with replay_routing(trainer, RoutingReplay(recorded)) as state, torch.no_grad():
        logp = torch.log_softmax(trainer(torch.tensor([seq])).logits[0].float(), -1)
    assert routing_disagreement(state.own_experts(), recorded) == 0.0
    sampled_at = list(range(n_prompt, n_prompt + 10)) + list(range(len(seq) - 6, len(seq)))
    ref = [logp[p - 1, seq[p]].item() for p in sampled_at]
    assert np.allclose(r1.logprobs + r2.logprobs, ref, atol=1e-4)
