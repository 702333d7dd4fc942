"""GAE over the tokens the model sampled, skipping the tokens conch inserted.

Why a custom GAE: an agent trajectory interleaves the model's tokens with long observations the environment
wrote. Those inserted tokens are not actions, so they must neither get loss nor count as time steps;
otherwise a 2,000-token `ls` output would discount the future by gamma^2000 and the value of the next action
would be bootstrapped from the middle of an observation.

The MDP (per sequence b; `mask[b, t] = 1` marks sampled tokens):

- Steps are the sampled positions t_1 < t_2 < ... < t_n. Step j's action is token t_j; its state is everything
  before t_j. `values[b, t_j]` is the critic's estimate of that state (the driver aligns it: typically the value
  head read at the hidden state of position t_j - 1).
- The reward of step j is the sum of `rewards[b, t]` for t_j <= t < t_{j+1}: a reward written on an inserted
  token is credited to the action that preceded it. Rewards before t_1 (prompt) belong to no action and are
  ignored. Conch places rewards on sampled tokens (see rewards.py), so this only matters for other callers.
- delta_j = r_j + gamma * V(t_{j+1}) - V(t_j), with V(t_{n+1}) = 0 (the episode ends after the last sampled
  token; truncated episodes are treated as terminal, as usual for LLM PPO).
- A_j = delta_j + gamma * lam * A_{j+1};  return_j = A_j + V(t_j).

gamma and lam apply once per sampled step, never per inserted token: the result equals GAE on the same
sequence with every mask-0 token removed. Outputs are zero where mask is 0 (padding included).

Implementation: sampled steps are compacted to the front of each row, deltas are formed there, and the
discounted reverse scan runs in blocks of `block` steps: inside a block it is one small matrix product with
powers of gamma*lam bounded by the block size (no overflow for long sequences), across blocks a carry loop of
ceil(n / block) iterations. Everything stays on the input's device.
"""

from __future__ import annotations

import torch


def _as_bool(mask: torch.Tensor) -> torch.Tensor:
    return mask if mask.dtype == torch.bool else mask != 0


def _check_2d(name: str, x: torch.Tensor, shape: torch.Size) -> None:
    if x.shape != shape:
        raise ValueError(f"{name} must have the mask's shape {tuple(shape)}; got {tuple(x.shape)}")


def compact_sampled(mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(order [B, T], valid [B, T]): `order[b, :n_b]` are row b's sampled positions in increasing order (n_b =
    its sampled count), followed by the inserted positions; `valid[b, j]` is True for j < n_b."""
    m = _as_bool(mask)
    t = m.shape[-1]
    pos = torch.arange(t, device=m.device).expand_as(m)
    key = pos + (~m).long() * t  # sampled first, each group in position order
    order = torch.argsort(key, dim=-1)
    valid = torch.gather(m, 1, order)
    return order, valid


def discounted_reverse_cumsum(x: torch.Tensor, discount: float, block: int = 256) -> torch.Tensor:
    """y[:, j] = sum_{k >= j} discount^(k - j) * x[:, k] along the last dim of a [B, N] tensor."""
    b, n = x.shape
    if n == 0:
        return x.clone()
    block = max(1, min(block, n))
    n_blocks = -(-n // block)
    pad = n_blocks * block - n
    xp = torch.nn.functional.pad(x, (0, pad)).view(b, n_blocks, block)
    idx = torch.arange(block, device=x.device, dtype=x.dtype)
    expo = idx[None, :] - idx[:, None]  # [j, k] = k - j
    upper = expo >= 0
    mat = torch.where(upper, torch.tensor(discount, dtype=x.dtype, device=x.device) ** expo.clamp(min=0),
                      torch.zeros((), dtype=x.dtype, device=x.device))
    local = torch.einsum("bcj,kj->bck", xp, mat)  # local[b, c, k] = sum_j mat[k, j] * xp[b, c, j]
    # Carry from the following block: A_j += discount^(block - j) * A_{next block start}.
    tail = torch.tensor(discount, dtype=x.dtype, device=x.device) ** (block - idx)
    out = torch.empty_like(local)
    carry = torch.zeros(b, dtype=x.dtype, device=x.device)
    for c in range(n_blocks - 1, -1, -1):
        out[:, c] = local[:, c] + tail[None, :] * carry[:, None]
        carry = out[:, c, 0]
    return out.reshape(b, n_blocks * block)[:, :n]


def values_before_tokens(values_after: torch.Tensor) -> torch.Tensor:
    """Re-align a critic that reads position t as "the value once token t is in context" (a value head on the
    hidden state of token t) to this module's convention, the value of the state in which token t is chosen:
    out[:, t] = values_after[:, t - 1], out[:, 0] = 0. Use the shifted values for GAE and the value loss alike."""
    return torch.nn.functional.pad(values_after[..., :-1], (1, 0))


def gae(rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0, lam: float = 1.0,
        block: int = 256) -> tuple[torch.Tensor, torch.Tensor]:
    """(advantages [B, T], returns [B, T]) by GAE over sampled tokens (see the module docstring); both zero
    where mask is 0. Computed in float32 (float64 if the inputs are), without gradient."""
    m = _as_bool(mask)
    if m.dim() != 2:
        raise ValueError(f"mask must be [batch, time]; got shape {tuple(m.shape)}")
    _check_2d("rewards", rewards, m.shape)
    _check_2d("values", values, m.shape)
    dtype = torch.float64 if values.dtype == torch.float64 else torch.float32
    with torch.no_grad():
        r = rewards.to(dtype)
        v = values.to(dtype)
        b, t = m.shape
        order, valid = compact_sampled(m)
        n_max = int(valid.sum(1).max()) if b else 0  # one sync; the scan then skips the all-padding tail
        order, valid = order[:, :n_max], valid[:, :n_max]
        # Step index of every token: -1 before the first sampled token, else the index of the latest step.
        step = torch.cumsum(m.long(), dim=1) - 1
        rc = torch.zeros(b, t + 1, dtype=dtype, device=m.device)
        rc.scatter_add_(1, (step + 1).clamp(min=0), r)  # slot 0 collects the ignored pre-action rewards
        rc = rc[:, 1:n_max + 1]
        vc = torch.gather(v, 1, order) * valid
        v_next = torch.nn.functional.pad(vc[:, 1:], (0, 1))  # already 0 past the last valid step
        delta = (rc + gamma * v_next - vc) * valid
        adv_c = discounted_reverse_cumsum(delta, gamma * lam, block) * valid
        ret_c = (adv_c + vc) * valid
        adv = torch.zeros(b, t, dtype=dtype, device=m.device).scatter(1, order, adv_c)
        ret = torch.zeros(b, t, dtype=dtype, device=m.device).scatter(1, order, ret_c)
    return adv, ret


def gae_reference(rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0,
                  lam: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """The same as `gae`, as a plain per-token reverse loop (slow; the oracle for tests)."""
    m = _as_bool(mask)
    b, t = m.shape
    adv = torch.zeros(b, t, dtype=torch.float64)
    ret = torch.zeros(b, t, dtype=torch.float64)
    for i in range(b):
        next_value, next_adv, pending_reward = 0.0, 0.0, 0.0
        for j in range(t - 1, -1, -1):
            pending_reward += float(rewards[i, j])
            if not m[i, j]:
                continue
            v = float(values[i, j])
            delta = pending_reward + gamma * next_value - v
            next_adv = delta + gamma * lam * next_adv
            adv[i, j], ret[i, j] = next_adv, next_adv + v
            next_value, pending_reward = v, 0.0
    return adv, ret


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    m = _as_bool(mask).to(x.dtype)
    return (x * m).sum() / m.sum().clamp(min=1.0)


def masked_var(x: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    m = _as_bool(mask).to(x.dtype)
    n = m.sum()
    mean = (x * m).sum() / n.clamp(min=1.0)
    sq = (((x - mean) * m) ** 2).sum()
    return sq / ((n - 1.0).clamp(min=1.0) if unbiased else n.clamp(min=1.0))


def whiten(x: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, eps: float = 1e-8) -> torch.Tensor:
    """(x - mean) / std over the mask-1 entries of the whole batch; zero where mask is 0. With
    `shift_mean=False` only the scale changes (keeps the sign of every advantage)."""
    m = _as_bool(mask)
    mean = masked_mean(x, m)
    var = masked_var(x, m)
    out = (x - mean) if shift_mean else x
    out = out * torch.rsqrt(var + eps)
    return torch.where(m, out, torch.zeros((), dtype=out.dtype, device=out.device))


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """1 - Var[returns - values] / Var[returns] over mask-1 entries (0-dim tensor). 1 is a perfect critic,
    0 no better than a constant, negative worse; NaN when the returns have zero variance."""
    var_ret = masked_var(returns, mask)
    var_err = masked_var(returns - values, mask)
    return torch.where(var_ret > 0, 1.0 - var_err / var_ret.clamp(min=1e-30),
                       torch.full_like(var_ret, float("nan")))
