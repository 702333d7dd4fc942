"""One PPO update over a batch of scored trajectories: old log-probs and values, GAE, then clipped updates.

Kept apart from the driver so `train.py` reads like the algorithm. Per-trajectory tensors are stored unpadded
and re-collated per micro-batch, so a long trajectory never pads the whole batch to its length.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from conch.agent.trajectory import Trajectory
from conch.rl.advantages import explained_variance, gae, values_before_tokens
from conch.rl.batch import collate, policy_forward
from conch.rl.critic import value_forward
from conch.rl.losses import LossConfig, LossStats, ppo_loss, value_loss
from conch.rl.mismatch import mismatch_metrics
from conch.report.store import routing_disagreements
from conch.rl.rewards import last_sampled_index, token_rewards


@dataclass
class Prepared:
    """Per-trajectory tensors computed before the update (all 1-D, length = tokens)."""

    traj: Trajectory
    old_lp: torch.Tensor
    values: torch.Tensor
    adv: torch.Tensor
    ret: torch.Tensor
    route_diff: torch.Tensor | None = None  # [N, 2] (token, layer) where trainer and sampler routed differently


def _chunks(xs: Sequence, n: int) -> list[Sequence]:
    return [xs[i : i + n] for i in range(0, len(xs), n)]


def _pad(rows: list[torch.Tensor], T: int) -> torch.Tensor:
    out = torch.zeros((len(rows), T), dtype=torch.float32)
    for i, r in enumerate(rows):
        out[i, : r.shape[0]] = r
    return out


@torch.no_grad()
def prepare(
    policy: Any, critic: Any, trajs: Sequence[Trajectory], pad_id: int, replay: bool, reward_mode: str,
    gamma: float, lam: float, micro_batch: int, whiten_adv: bool = True, group_baseline: bool = False,
) -> tuple[list[Prepared], dict[str, float]]:
    """Old log-probs (the trainer's, before any update), values, rewards, GAE; plus mismatch metrics.

    `group_baseline`: subtract from each trajectory's final reward the mean final reward of the K rollouts of
    the same task, before GAE (the critic then learns the centred returns). A baseline that depends only on
    the task leaves the expected gradient unchanged and removes the between-task variance that a young
    critic cannot explain yet."""
    offsets = _group_offsets(trajs, reward_mode) if group_baseline else {}
    prepared: list[Prepared] = []
    mm_sum: dict[str, float] = {}
    mm_tokens = 0
    for chunk in _chunks(list(trajs), micro_batch):
        batch = collate(chunk, pad_id, with_experts=replay or True)
        lp, _ent, own = policy_forward(policy, batch, replay=replay, sampled_only=True)
        values = values_before_tokens(value_forward(critic, batch, replay=replay)) if critic is not None else None
        n_tok = float(batch.mask.sum())
        mm = mismatch_metrics(lp, batch.sampler_logprobs, batch.mask, own_routing=own, sampler_routing=batch.experts)
        for k, v in mm.items():
            mm_sum[k] = mm_sum.get(k, 0.0) + float(v) * n_tok
        mm_tokens += n_tok
        T = batch.ids.shape[1]
        rewards = torch.stack([_pad_1d(_shifted(t, token_rewards(t, reward_mode), offsets.get(id(t), 0.0)), T)
                               for t in chunk])
        if values is None:
            values = torch.zeros_like(lp)
        adv, ret = gae(rewards, values, batch.mask, gamma=gamma, lam=lam)
        for b, t in enumerate(chunk):
            n = len(t.tokens)
            diff = (routing_disagreements(own[b, :n], batch.experts[b, :n], batch.mask[b, :n])
                    if own is not None and batch.experts is not None else None)
            prepared.append(Prepared(t, lp[b, :n].clone(), values[b, :n].clone(), adv[b, :n].clone(), ret[b, :n].clone(),
                                     diff))
    if whiten_adv and prepared:
        masks = torch.cat([torch.tensor(p.traj.mask, dtype=torch.bool) for p in prepared])
        allv = torch.cat([p.adv for p in prepared])[masks]
        mean, std = allv.mean(), allv.std().clamp(min=1e-6) if allv.numel() > 1 else torch.tensor(1.0)
        for p in prepared:
            m = torch.tensor(p.traj.mask, dtype=torch.bool)
            p.adv = torch.where(m, (p.adv - mean) / std, torch.zeros_like(p.adv))
    metrics = {k: v / max(mm_tokens, 1.0) for k, v in mm_sum.items()}
    return prepared, metrics


def _group_offsets(trajs: Sequence[Trajectory], reward_mode: str) -> dict[int, float]:
    """id(trajectory) -> mean total reward of its task's rollouts in this batch."""
    groups: dict[str, list[tuple[int, float]]] = {}
    for t in trajs:
        r = token_rewards(t, reward_mode)
        if r is not None:
            groups.setdefault(t.task, []).append((id(t), float(r.sum())))
    return {i: sum(v for _, v in g) / len(g) for g in groups.values() for i, _ in g}


def _shifted(t: Trajectory, rewards: torch.Tensor | None, offset: float) -> torch.Tensor | None:
    """Subtract `offset` at the last sampled token (where the final reward sits)."""
    if rewards is None or not offset:
        return rewards
    out = rewards.clone()
    out[last_sampled_index(t.mask)] -= offset
    return out


def _pad_1d(x: torch.Tensor | None, T: int) -> torch.Tensor:
    out = torch.zeros(T, dtype=torch.float32)
    if x is not None:
        out[: x.shape[0]] = x
    return out


def _clip_grads(model: Any, max_norm: float) -> float:
    """Clip the global gradient norm; with FSDP2 the norm is a DTensor over every rank's shard."""
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)


def _gather_stats(stats: list[LossStats], world: int) -> list[LossStats]:
    """Every rank's micro-batch stats, so the logged means cover the whole batch as in one process."""
    if world == 1:
        return stats
    import dataclasses

    import torch.distributed as dist

    mine = [LossStats(**{f.name: (v.detach().cpu() if isinstance(v := getattr(s, f.name), torch.Tensor) else v)
                         for f in dataclasses.fields(LossStats)}) for s in stats]
    parts: list = [None] * world
    dist.all_gather_object(parts, mine)
    return [s for part in parts for s in part]


def ppo_update(
    policy: Any, critic: Any, opt_pi: Any, opt_v: Any, prepared: list[Prepared], pad_id: int, replay: bool,
    loss_cfg: LossConfig, epochs: int, micro_batch: int, grad_accum: int, max_grad_norm: float,
    update_policy: bool = True, seed: int = 0, ref_model: Any = None, dp: tuple[int, int] = (0, 1),
) -> dict[str, float]:
    """Clipped policy and value updates; `update_policy=False` trains the critic only (critic warm-up).

    `dp = (rank, world)`: data parallel (FSDP2). Every rank holds the same `prepared` batch and the same shuffle;
    rank r runs micro-batches r, r + world, ... of each optimizer step. A loss is a sum over the step divided by
    the step's global token count, so each rank scales its part by `world` (FSDP averages gradients over ranks)
    and the summed gradient equals the one-process gradient. A rank short of a micro-batch runs a zero-weighted
    one, so every rank makes the same collective calls."""
    rank, world = dp
    rng = random.Random(seed)
    stats: list[LossStats] = []
    grad_norms_pi: list[float] = []
    grad_norms_v: list[float] = []
    policy.train(update_policy)
    if critic is not None:
        critic.train()
    for _epoch in range(epochs):
        order = list(prepared)
        rng.shuffle(order)
        steps = _chunks(order, micro_batch * grad_accum)
        for step in steps:
            if loss_cfg.agg == "seq-mean-token-mean":  # each trajectory weighs the same, however long
                denom = float(len(step))
            else:
                denom = float(sum(sum(p.traj.mask[1:]) for p in step)) or 1.0
            if update_policy:
                opt_pi.zero_grad(set_to_none=True)
            if opt_v is not None:
                opt_v.zero_grad(set_to_none=True)
            micro = _chunks(step, micro_batch)
            rounds = -(-len(micro) // world)
            for j in range(rounds):
                mine = rank + j * world
                mb, scale = (micro[mine], float(world)) if mine < len(micro) else (micro[0], 0.0)
                batch = collate([p.traj for p in mb], pad_id, with_experts=True)
                T = batch.ids.shape[1]
                old_lp = _pad([p.old_lp for p in mb], T)
                adv = _pad([p.adv for p in mb], T)
                ret = _pad([p.ret for p in mb], T)
                old_v = _pad([p.values for p in mb], T)
                values = values_before_tokens(value_forward(critic, batch, replay=replay)) if critic is not None else None
                if update_policy:
                    new_lp, ent, _own = policy_forward(policy, batch, replay=replay, sampled_only=True)
                    ref_lp = None
                    if ref_model is not None and loss_cfg.kl_coef:
                        with torch.no_grad():
                            ref_lp, _, _ = policy_forward(ref_model, batch, replay=replay, sampled_only=True)
                    loss, st = ppo_loss(
                        loss_cfg, new_lp, old_lp, adv, batch.mask, values=values, old_values=old_v, returns=ret,
                        entropy=ent, ref_logp=ref_lp, sampler_logp=batch.sampler_logprobs, denom=denom,
                    )
                else:
                    loss, _clip = value_loss(values, old_v, ret, batch.mask, clip=loss_cfg.value_clip, denom=denom)
                    st = None
                (loss * scale).backward()
                if st is not None and scale:
                    stats.append(st)
            if update_policy:
                grad_norms_pi.append(_clip_grads(policy, max_grad_norm))
                opt_pi.step()
            if opt_v is not None:
                grad_norms_v.append(_clip_grads(critic, max_grad_norm))
                opt_v.step()
    policy.eval()
    if critic is not None:
        critic.eval()
    stats = _gather_stats(stats, world)
    out: dict[str, float] = LossStats.mean(stats) if stats else {}
    if grad_norms_pi:
        out["train/grad_norm_policy"] = sum(grad_norms_pi) / len(grad_norms_pi)
    if grad_norms_v:
        out["train/grad_norm_critic"] = sum(grad_norms_v) / len(grad_norms_v)
    masks = torch.cat([torch.tensor(p.traj.mask, dtype=torch.float32) for p in prepared]) if prepared else None
    if masks is not None:
        vals = torch.cat([p.values for p in prepared])
        rets = torch.cat([p.ret for p in prepared])
        ev = float(explained_variance(vals, rets, masks))
        out["train/explained_variance"] = ev
    return out
