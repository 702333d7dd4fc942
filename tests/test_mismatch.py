"""Train/inference mismatch metrics on hand-made tensors."""

import math

import pytest
import torch

from conch.rl.mismatch import (k1_kl, k3_kl, logprob_abs_diff, mismatch_metrics, prob_ratio_max,
                               routing_disagreement, routing_disagreement_per_layer)

TRAINER = torch.tensor([[-1.0, -2.0, -0.5, -9.0]])
SAMPLER = torch.tensor([[-1.5, -2.0, -0.25, 0.0]])
MASK = torch.tensor([[1, 1, 1, 0]])  # the last token is inserted: its huge gap must not count


def test_logprob_abs_diff():
    assert float(logprob_abs_diff(TRAINER, SAMPLER, MASK)) == pytest.approx((0.5 + 0 + 0.25) / 3)


def test_k3_direction_and_value():
    r = torch.tensor([0.5, 0.0, -0.25])  # trainer - sampler
    expected = float((torch.exp(r) - 1 - r).mean())
    assert float(k3_kl(TRAINER, SAMPLER, MASK)) == pytest.approx(expected)
    # Swapping the arguments gives a different number: the direction is part of the definition.
    assert float(k3_kl(SAMPLER, TRAINER, MASK)) != pytest.approx(expected)
    assert float(k1_kl(TRAINER, SAMPLER, MASK)) == pytest.approx(float((-r).mean()))
    assert float(k3_kl(TRAINER, TRAINER, MASK)) == 0.0


def test_k3_is_unbiased_for_kl_sampler_trainer():
    # Sampler mu and trainer pi over 3 symbols; sample from mu and compare the estimate to the exact KL(mu||pi).
    mu = torch.tensor([0.6, 0.3, 0.1])
    pi = torch.tensor([0.4, 0.4, 0.2])
    g = torch.Generator().manual_seed(0)
    x = torch.multinomial(mu, 200_000, replacement=True, generator=g)[None]
    est = float(k3_kl(pi.log()[x], mu.log()[x], torch.ones_like(x)))
    exact = float((mu * (mu / pi).log()).sum())
    assert est == pytest.approx(exact, rel=0.03)


def test_prob_ratio_max():
    assert float(prob_ratio_max(TRAINER, SAMPLER, MASK)) == pytest.approx(math.exp(0.5))
    assert float(prob_ratio_max(TRAINER, SAMPLER, torch.zeros_like(MASK))) == 1.0


def test_routing_disagreement_sets_and_ignored_rows():
    # [tokens=4, layers=2, k=2]
    recorded = torch.tensor([
        [[0, 1], [2, 3]],
        [[4, 5], [6, 7]],
        [[-1, -1], [1, 2]],   # layer 0 never routed by the sampler: ignored
        [[0, 1], [0, 1]],
    ], dtype=torch.int16)
    own = torch.tensor([
        [[1, 0], [2, 3]],     # same sets, different order: agree
        [[4, 6], [6, 7]],     # layer 0 differs
        [[3, 4], [2, 1]],     # layer 0 ignored; layer 1 agrees
        [[0, 2], [1, 3]],     # both differ
    ])
    # valid rows: 2 + 2 + 1 + 2 = 7, differing: 1 + 2 = 3
    assert float(routing_disagreement(own, recorded)) == pytest.approx(3 / 7)
    per_layer = routing_disagreement_per_layer(own, recorded)
    assert torch.allclose(per_layer, torch.tensor([2 / 3, 1 / 4]))
    # Only sampled tokens: tokens 0 and 1 -> 1 of 4 rows differ.
    mask = torch.tensor([1, 1, 0, 0])
    assert float(routing_disagreement(own, recorded, mask)) == pytest.approx(1 / 4)
    assert float(routing_disagreement(own, torch.full_like(recorded, -1))) == 0.0
    with pytest.raises(ValueError, match="routing shapes"):
        routing_disagreement(own[:, :1], recorded)


def test_metrics_dict():
    own = torch.zeros(1, 4, 2, 2, dtype=torch.long)
    rec = own.clone()
    rec[0, 1, 0] = torch.tensor([0, 3])
    m = mismatch_metrics(TRAINER, SAMPLER, MASK, own, rec)
    assert set(m) == {"mismatch/logprob_abs_diff", "mismatch/k1_kl", "mismatch/k3_kl", "mismatch/prob_ratio_max",
                      "mismatch/routing_disagreement"}
    assert m["mismatch/routing_disagreement"] == pytest.approx(1 / 6)  # 3 sampled tokens x 2 layers
    assert all(isinstance(v, float) for v in m.values())
