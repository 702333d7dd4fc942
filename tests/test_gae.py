"""GAE over sampled tokens: hand-computed cases, inserted-token invariance, gamma=lam=1, padding, whitening."""

import math

import pytest
import torch

from conch.rl.advantages import (discounted_reverse_cumsum, explained_variance, gae, gae_reference, masked_mean,
                                 whiten)


def t(rows):
    return torch.tensor(rows, dtype=torch.float32)


def test_hand_computed_all_sampled():
    # 3 steps, reward 1 at the end. gamma=0.9, lam=0.8.
    v = [0.5, 0.2, 0.4]
    gamma, lam = 0.9, 0.8
    d2 = 1.0 - v[2]
    d1 = 0.0 + gamma * v[2] - v[1]
    d0 = 0.0 + gamma * v[1] - v[0]
    a2 = d2
    a1 = d1 + gamma * lam * a2
    a0 = d0 + gamma * lam * a1
    adv, ret = gae(t([[0, 0, 1]]), t([v]), torch.ones(1, 3), gamma, lam)
    assert torch.allclose(adv, t([[a0, a1, a2]]), atol=1e-6)
    assert torch.allclose(ret, t([[a0 + v[0], a1 + v[1], a2 + v[2]]]), atol=1e-6)


def test_hand_computed_with_inserted_tokens():
    # tokens: S I I S I S (S sampled). Steps at 0, 3, 5. Reward 2 on the last token; value of I tokens ignored.
    mask = t([[1, 0, 0, 1, 0, 1]])
    values = t([[1.0, 9.0, 9.0, 0.5, 9.0, 0.25]])
    rewards = t([[0, 0, 0, 0, 0, 2.0]])
    gamma, lam = 0.5, 0.5
    d5 = 2.0 - 0.25
    d3 = gamma * 0.25 - 0.5
    d0 = gamma * 0.5 - 1.0
    a5 = d5
    a3 = d3 + gamma * lam * a5
    a0 = d0 + gamma * lam * a3
    adv, ret = gae(rewards, values, mask, gamma, lam)
    assert torch.allclose(adv, t([[a0, 0, 0, a3, 0, a5]]), atol=1e-6)
    assert torch.allclose(ret, t([[a0 + 1.0, 0, 0, a3 + 0.5, 0, a5 + 0.25]]), atol=1e-6)


def test_inserted_tokens_do_not_change_result():
    g = torch.Generator().manual_seed(0)
    n = 40
    v = torch.randn(1, n, generator=g)
    r = torch.zeros(1, n)
    r[0, torch.randint(0, n, (6,), generator=g)] = torch.randn(6, generator=g)
    r[0, -1] = 3.0
    plain_adv, plain_ret = gae(r, v, torch.ones(1, n), 0.97, 0.9)
    # Insert 0..4 observation tokens (random values, zero reward) after every sampled token.
    vals, rews, mask = [], [], []
    for i in range(n):
        vals.append(float(v[0, i])), rews.append(float(r[0, i])), mask.append(1)
        for _ in range(int(torch.randint(0, 5, (1,), generator=g))):
            vals.append(float(torch.randn(1, generator=g)) * 100), rews.append(0.0), mask.append(0)
    adv, ret = gae(t([rews]), t([vals]), t([mask]), 0.97, 0.9)
    m = torch.tensor(mask, dtype=torch.bool)
    assert torch.allclose(adv[0, m], plain_adv[0], atol=1e-5)
    assert torch.allclose(ret[0, m], plain_ret[0], atol=1e-5)
    assert torch.all(adv[0, ~m] == 0) and torch.all(ret[0, ~m] == 0)


def test_gamma_lambda_one_is_reward_to_go_minus_value():
    g = torch.Generator().manual_seed(1)
    mask = (torch.rand(3, 50, generator=g) < 0.6).float()
    rewards = torch.randn(3, 50, generator=g) * mask
    values = torch.randn(3, 50, generator=g)
    adv, ret = gae(rewards, values, mask, 1.0, 1.0)
    to_go = torch.flip(torch.cumsum(torch.flip(rewards, [1]), 1), [1])
    assert torch.allclose(adv, (to_go - values) * mask, atol=1e-4)
    assert torch.allclose(ret, to_go * mask, atol=1e-4)


def test_padding_and_empty_rows():
    # Row 0: 2 sampled then right padding; row 1: left padding; row 2: nothing sampled.
    mask = t([[1, 1, 0, 0], [0, 0, 1, 1], [0, 0, 0, 0]])
    values = t([[0.1, 0.2, 5.0, 5.0], [5.0, 5.0, 0.1, 0.2], [1.0, 1.0, 1.0, 1.0]])
    rewards = t([[0, 1, 0, 0], [0, 0, 0, 1], [0, 0, 0, 0]])
    adv, ret = gae(rewards, values, mask, 0.9, 0.95)
    assert torch.allclose(adv[0, :2], adv[1, 2:], atol=1e-6)
    assert torch.all(adv[0, 2:] == 0) and torch.all(adv[1, :2] == 0) and torch.all(adv[2] == 0)
    assert torch.all(ret[2] == 0)


def test_reward_on_inserted_token_goes_to_previous_action():
    mask = t([[1, 0, 1, 0]])
    values = torch.zeros(1, 4)
    a, _ = gae(t([[0, 1.0, 0, 2.0]]), values, mask, 1.0, 1.0)
    b, _ = gae(t([[1.0, 0, 2.0, 0]]), values, mask, 1.0, 1.0)
    assert torch.allclose(a, b)
    # A reward before the first sampled token (prompt) belongs to no action.
    c, _ = gae(t([[0, 0, 0, 0]]), values, t([[0, 1, 0, 1]]), 1.0, 1.0)
    d, _ = gae(t([[5.0, 0, 0, 0]]), values, t([[0, 1, 0, 1]]), 1.0, 1.0)
    assert torch.allclose(c, d)


@pytest.mark.parametrize("block", [1, 3, 7, 256])
def test_vectorised_matches_reference_loop(block):
    g = torch.Generator().manual_seed(2)
    mask = (torch.rand(4, 61, generator=g) < 0.5).float()
    mask[:, 50:] *= torch.tensor([[1.0], [0.0], [1.0], [0.0]])  # some rows padded
    rewards = torch.randn(4, 61, generator=g)
    values = torch.randn(4, 61, generator=g)
    adv, ret = gae(rewards, values, mask, 0.95, 0.9, block=block)
    ref_adv, ref_ret = gae_reference(rewards, values, mask, 0.95, 0.9)
    assert torch.allclose(adv.double(), ref_adv, atol=1e-5)
    assert torch.allclose(ret.double(), ref_ret, atol=1e-5)


def test_long_sequence_no_overflow():
    n = 5000
    x = torch.ones(1, n)
    y = discounted_reverse_cumsum(x, 0.9, block=256)
    expected = (1 - 0.9 ** torch.arange(n, 0, -1, dtype=torch.float64)) / (1 - 0.9)
    assert torch.isfinite(y).all()
    assert torch.allclose(y[0].double(), expected, atol=1e-4)


def test_whiten_masked():
    x = t([[1.0, 2.0, 100.0], [3.0, -50.0, 4.0]])
    mask = t([[1, 1, 0], [1, 0, 1]])
    w = whiten(x, mask)
    sel = w[mask.bool()]
    assert abs(float(sel.mean())) < 1e-6
    assert math.isclose(float(sel.std()), 1.0, rel_tol=1e-4)
    assert w[0, 2] == 0 and w[1, 1] == 0
    ws = whiten(x, mask, shift_mean=False)
    assert torch.all(torch.sign(ws[mask.bool()]) == torch.sign(x[mask.bool()]))


def test_explained_variance():
    ret = t([[1.0, 2.0, 3.0, 99.0]])
    mask = t([[1, 1, 1, 0]])
    assert math.isclose(float(explained_variance(ret.clone(), ret, mask)), 1.0, abs_tol=1e-6)
    const = torch.full_like(ret, 2.0)
    assert math.isclose(float(explained_variance(const, ret, mask)), 0.0, abs_tol=1e-6)
    assert float(explained_variance(-ret, ret, mask)) < 0
    assert math.isnan(float(explained_variance(ret, torch.ones_like(ret), mask)))
    assert math.isclose(float(masked_mean(ret, mask)), 2.0)


def test_degenerate_shapes():
    adv, ret = gae(torch.ones(2, 3), torch.ones(2, 3), torch.zeros(2, 3))
    assert torch.all(adv == 0) and torch.all(ret == 0)
    adv, _ = gae(torch.zeros(0, 4), torch.zeros(0, 4), torch.zeros(0, 4))
    assert adv.shape == (0, 4)
    with pytest.raises(ValueError, match="mask's shape"):
        gae(torch.zeros(2, 3), torch.zeros(2, 4), torch.zeros(2, 3))


def test_values_before_tokens_shift():
    from conch.rl.advantages import values_before_tokens

    after = t([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    assert torch.equal(values_before_tokens(after), t([[0.0, 1.0, 2.0], [0.0, 4.0, 5.0]]))
