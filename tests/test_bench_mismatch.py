"""`conch bench mismatch`: a smoke run of the real path (tiny model, local sandboxes, both agent modes, the
trainer's forward in four settings), and the replay-aware forward it measures routing with."""

from __future__ import annotations

import json
import math

import torch

from conch.bench.mismatch import SETTINGS, forward
from conch.cli import main as conch_main


def test_bench_mismatch_quick_json(capsys, base_root):
    assert conch_main(["bench", "mismatch", "--quick", "--json"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    for s in SETTINGS:
        assert set(out[s]) == {"logprob_abs_diff", "k3_kl", "routing_disagreement"}
        for v in out[s].values():
            assert math.isfinite(v) and v >= 0.0, (s, out[s])
    assert isinstance(out["tokens"], int) and out["tokens"] > 0
    # R3 replays the sampler's experts wherever it recorded them: the trainer routed exactly the same.
    assert out["r3"]["routing_disagreement"] == 0.0 and out["both"]["routing_disagreement"] == 0.0
    assert out["aligned_only"]["r3"]["routing_disagreement"] == 0.0
    # bfloat16 sampler vs float32 trainer: some numeric gap is always there.
    assert out["tito"]["logprob_abs_diff"] > 0.0 and out["both"]["logprob_abs_diff"] > 0.0
    # Every sampled retokenize-mode token is counted once, aligned or in a realigned tail.
    r = out["retokenize"]
    assert r["aligned_tokens"] + r["realigned_tokens"] == out["tokens_retokenize"] > 0
    assert out["trajectories"]["tito"] == out["trajectories"]["retokenize"] == 2


def test_forward_with_replay_is_the_trainers_and_reports_the_routing_used():
    from conch.model.init import cached_model
    from conch.model.loading import load_policy
    from conch.rl.batch import Batch, policy_forward

    model = load_policy(cached_model(), dtype="float32", with_tokenizer=False).model
    gen = torch.Generator().manual_seed(3)
    T, layers, k, experts = 40, model.config.num_hidden_layers, model.config.num_experts_per_tok, 8
    ids = torch.randint(16, model.config.vocab_size, (1, T), generator=gen)
    rec = torch.stack([torch.randperm(experts, generator=gen)[:k] for _ in range(T * layers)]).view(1, T, layers, k)
    rec[0, 30:] = -1  # never routed by the sampler: the trainer keeps its own choice there
    batch = Batch(ids, torch.ones_like(ids), torch.ones(1, T), torch.zeros(1, T), rec)
    with torch.no_grad():
        ref_lp, _, ref_own = policy_forward(model, batch, replay=True)
        plain_lp, _, plain_own = policy_forward(model, batch, replay=False)
    lp, used, own = forward(model, batch, rec)
    assert torch.equal(lp, ref_lp[0].float())
    assert torch.equal(own, ref_own[0])
    assert torch.equal(used[:30], rec[0, :30])
    assert torch.equal(used[30:], own[30:])
    assert not torch.allclose(lp, plain_lp[0])  # random experts change the log-probs: the replay took effect
    lp0, used0, own0 = forward(model, batch, None)
    assert torch.equal(lp0, plain_lp[0].float()) and torch.equal(used0, own0) and torch.equal(own0, plain_own[0])
