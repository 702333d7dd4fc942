"""The learner: policy, critic, their optimizers and the reference model, behind score / update / save / load.

Why a role object: the driver (`rl/train.py`) should read as the algorithm, and the same learner must run in
this process or sharded over ranks (FSDP2, `rl/distributed.py`) without the driver changing. Scoring
(`score`) is the pure part of an iteration: trainer log-probs before the update, values, rewards, group
baseline, GAE and whitening (`rl/update.prepare`, `rl/advantages.py`, `rl/rewards.py`); `update` is one PPO
update, or a critic-only one during the warm-up (`update_policy=False`).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from conch.agent.trajectory import Trajectory
from conch.config import Config


@dataclass
class Scored:
    """A rollout batch ready for the update: the prepared trajectories and what was left out, and why."""

    prepared: list
    mismatch: dict[str, float]
    excluded: list = field(default_factory=list)


def loss_config(cfg: Config):
    from conch.rl.losses import LossConfig

    p = cfg.ppo
    return LossConfig(clip_low=p.clip_low, clip_high=p.clip_high, dual_clip=p.dual_clip or None,
                      value_clip=p.value_clip or None, entropy_coef=p.entropy_coef, kl_coef=p.kl_coef,
                      tis_cap=p.tis_cap or None, agg=p.loss_agg, mask_low=p.mask_low or None,
                      mask_high=p.mask_high or None)


class Learner:
    def __init__(self, cfg: Config, policy: Any, tokenizer: Any, pad_id: int, dp: tuple[int, int] = (0, 1)) -> None:
        from conch.rl.critic import ValueModel

        self.cfg, self.policy, self.tokenizer, self.pad_id, self.dp = cfg, policy, tokenizer, pad_id, dp
        self.replay = cfg.ppo.routing_replay
        self.critic = ValueModel.from_policy(policy)
        self.ref_model = copy.deepcopy(policy).eval().requires_grad_(False) if cfg.ppo.kl_coef else None
        if dp[1] > 1:
            from conch.rl.distributed import shard

            for m in (self.policy, self.critic, self.ref_model):
                if m is not None:
                    shard(m)
        self.opt_pi = torch.optim.AdamW(self.policy.parameters(), lr=cfg.ppo.lr, betas=(0.9, 0.95))
        self.opt_v = torch.optim.AdamW(self.critic.parameters(), lr=cfg.ppo.critic_lr)
        self.loss_cfg = loss_config(cfg)

    def score(self, trajs: list[Trajectory]) -> Scored:
        """Exclude errored trajectories, then old log-probs, values, rewards and advantages (no gradient)."""
        from conch.rl.rewards import partition
        from conch.rl.update import prepare

        p = self.cfg.ppo
        kept, excluded = partition(trajs)
        prepared, mismatch = prepare(self.policy, self.critic, kept, self.pad_id, self.replay, self.cfg.reward.mode,
                                     p.gamma, p.lam, p.micro_batch, group_baseline=p.group_baseline)
        return Scored(prepared, mismatch, excluded)

    def update(self, scored: Scored, update_policy: bool = True, seed: int = 0) -> dict[str, float]:
        """One update over the batch: PPO (actor and critic), or the critic alone during the warm-up."""
        from conch.rl.update import ppo_update

        p = self.cfg.ppo
        epochs = p.epochs if update_policy else self.cfg.critic.epochs
        return ppo_update(self.policy, self.critic, self.opt_pi if update_policy else None, self.opt_v,
                          scored.prepared, self.pad_id, self.replay, self.loss_cfg, epochs, p.micro_batch,
                          p.grad_accum, p.max_grad_norm, update_policy=update_policy, seed=seed,
                          ref_model=self.ref_model if update_policy else None, dp=self.dp)

    def weights(self) -> dict[str, torch.Tensor]:
        """The policy's full weights (gathered from every rank when sharded), for weight sync."""
        from conch.rl.distributed import full_state_dict

        return full_state_dict(self.policy)

    def save(self, run_dir: Path, iteration: int) -> Path:
        """A checkpoint of iteration `iteration`: HF model folders in one process; DCP shards over ranks (every
        rank calls it, `rl/sharded_checkpoint.py`)."""
        if self.dp[1] > 1:
            from conch.rl.sharded_checkpoint import save_sharded

            return save_sharded(run_dir, iteration, *self._parts(), keep=self.cfg.ppo.keep_checkpoints)
        from conch.rl.checkpoint import save_checkpoint

        return save_checkpoint(run_dir, iteration, self.policy, tokenizer=self.tokenizer,
                               optimizer={"policy": self.opt_pi, "critic": self.opt_v},
                               aux_models={"critic": self.critic}, keep=self.cfg.ppo.keep_checkpoints,
                               overwrite=True)

    def load(self, path: Path) -> int:
        """Restore a checkpoint (policy, critic, optimizers, RNG); returns its iteration. A sharded checkpoint
        loads into any number of ranks; a one-process checkpoint only into one process."""
        from conch.rl.checkpoint import load_checkpoint
        from conch.rl.sharded_checkpoint import check_loadable, is_sharded, load_sharded

        check_loadable(path, self.dp[1])
        if is_sharded(path):
            return load_sharded(path, *self._parts())
        info = load_checkpoint(path, model=self.policy, optimizer={"policy": self.opt_pi, "critic": self.opt_v},
                               aux_models={"critic": self.critic})
        return info.iteration

    def _parts(self) -> tuple[dict[str, Any], dict[str, Any]]:
        return {"policy": self.policy, "critic": self.critic}, {"policy": self.opt_pi, "critic": self.opt_v}

    def save_critic(self, path: Path) -> None:
        """The warmed-up critic, whole (the same file whatever the number of ranks; rank 0 writes it)."""
        from conch.rl.distributed import full_state_dict

        state = full_state_dict(self.critic)
        if self.dp[0] == 0:
            torch.save(state, path)

    def load_critic(self, path: Path) -> None:
        if self.dp[1] == 1:
            self.critic.load_state_dict(torch.load(path, weights_only=True))
            return
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        state = torch.load(path, weights_only=True) if self.dp[0] == 0 else {}
        set_model_state_dict(self.critic, state, options=StateDictOptions(full_state_dict=True,
                                                                          broadcast_from_rank0=True))

    def publish(self, out: Path) -> Path:
        """The policy as a plain HF folder at `out` (for `conch eval --model`), gathered whole when sharded."""
        from conch.rl.checkpoint import publish_model

        if self.dp[1] == 1:
            return publish_model(self.policy, self.tokenizer, out)
        from conch.rl.distributed import full_state_dict

        state = full_state_dict(self.policy)
        if self.dp[0] == 0:
            publish_model(self.policy, self.tokenizer, out, state_dict=state)
        return out

    def close(self) -> None:
        """Nothing to stop in one process (rank 0's `DriverLearner` stops its followers here)."""
