"""The critic: a value model initialised from the warm policy's backbone with a fresh scalar head.

Why from the warm policy: the critic must read the same token features the actor acts on; starting it from
the SFT'd backbone (rather than random) is half of the "aggressive warm start" — the other half is training it
on rollouts of the frozen warm policy before PPO begins, so advantages are meaningful from the first update.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import torch
from torch import nn

HEAD_FILE = "value_head.pt"


class ValueModel(nn.Module):
    def __init__(self, backbone: nn.Module, hidden_size: int) -> None:
        super().__init__()
        self.backbone = backbone
        self.head = nn.Linear(hidden_size, 1)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    @classmethod
    def from_policy(cls, policy: Any) -> "ValueModel":
        """Copy the policy's decoder stack (its `.model`) and attach a zero-initialised scalar head."""
        backbone = copy.deepcopy(policy.model)
        return cls(backbone, policy.config.hidden_size)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        hidden = self.backbone(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state
        return self.head(hidden.float()).squeeze(-1).clone()  # not a view: FSDP2 hooks its output for backward

    def save(self, out: Path) -> None:
        out.mkdir(parents=True, exist_ok=True)
        self.backbone.save_pretrained(str(out))
        torch.save(self.head.state_dict(), out / HEAD_FILE)

    @classmethod
    def load(cls, path: Path) -> "ValueModel":
        from transformers import AutoModel

        backbone = AutoModel.from_pretrained(str(path), local_files_only=True, dtype=torch.float32)
        vm = cls(backbone, backbone.config.hidden_size)
        vm.head.load_state_dict(torch.load(path / HEAD_FILE, weights_only=True))
        return vm


def value_forward(critic: ValueModel, batch: Any, replay: bool) -> torch.Tensor:
    """Values [B, T] (value at position t: expected return after token t is in context), replaying routing.
    Memory at long T: turn on `conch.rl.batch.set_gradient_checkpointing(critic, True)` (replay stays exact)."""
    from contextlib import nullcontext

    from conch.moe.routing import RoutingReplay
    from conch.rl.batch import replaying

    state = RoutingReplay(batch.experts, record_own=False) if (replay and batch.experts is not None) else None
    with replaying(critic.backbone, state) if state is not None else nullcontext():
        return critic(batch.ids, batch.attn)
