"""MoE routing capture and replay (R3: rollout routing replay) for HF transformers v5 MoE models.

Why: in an MoE policy the sampler and the trainer can pick different experts for the same token (different
kernels, batch shapes, dtypes), and a flipped top-k choice changes the log-prob far more than any numeric noise.
R3 records the experts the sampler chose and makes the trainer's forward use them, while the gate weights are
still computed from the trainer's own router logits, so the router keeps learning.

In transformers v5 every supported MoE block calls a router module
`forward(hidden[N, H]) -> (router_logits[N, E], router_scores[N, k], router_indices[N, k])` and feeds scores and
indices to its experts module, so a forward hook on the router can both observe and replace the routing.
All state lives in explicit objects (`RoutingCapture`, `RoutingReplay`); nothing is stored on the model.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch import nn

# Router class -> whether it renormalises the top-k probabilities (None: read `norm_topk_prob` on the module).
SUPPORTED_ROUTERS: dict[str, bool | None] = {
    "Qwen3MoeTopKRouter": None,
    "Qwen2MoeTopKRouter": None,
    "OlmoeTopKRouter": None,
    "MixtralTopKRouter": True,
}
_MOE_LOOKING = re.compile(r"(Router|TopK|SparseMoe\w*Block|Moe\w*Block|MoE\w*(Block|Layer)|Experts)$")


class UnsupportedMoeError(RuntimeError):
    """The model has MoE layers whose router class conch cannot capture or replay."""


@dataclass(frozen=True)
class MoeShape:
    num_layers: int  # MoE layers (0 for dense models)
    num_experts: int
    top_k: int

    @property
    def index_dtype(self) -> torch.dtype:
        return torch.uint8 if self.num_experts <= 256 else torch.int16


def find_routers(model: nn.Module) -> list[nn.Module]:
    """Router modules in forward order (layer 0 first). [] for dense models; raises for unsupported MoE."""
    routers, unsupported = [], set()
    for _, module in model.named_modules():
        name = type(module).__name__
        if name in SUPPORTED_ROUTERS:
            routers.append(module)
        elif _MOE_LOOKING.search(name):
            unsupported.add(name)
    if unsupported and not routers:
        raise UnsupportedMoeError(
            f"{type(model).__name__} has MoE modules ({', '.join(sorted(unsupported))}) but no supported router; "
            f"supported router classes: {', '.join(SUPPORTED_ROUTERS)}"
        )
    return routers


def moe_layer_count(model: nn.Module) -> int:
    return len(find_routers(model))


def moe_shape(model: nn.Module) -> MoeShape:
    routers = find_routers(model)
    if not routers:
        return MoeShape(0, 0, 0)
    return MoeShape(len(routers), int(routers[0].num_experts), int(routers[0].top_k))


def _normalises(router: nn.Module) -> bool:
    fixed = SUPPORTED_ROUTERS[type(router).__name__]
    return bool(router.norm_topk_prob) if fixed is None else fixed


class RoutingCapture:
    """Forward hooks that record each router's top-k expert ids, converted to the compact dtype on the fly.

    After a forward pass `take()` returns [tokens, layers, k] for the tokens of that pass, in the flattened
    order the model saw them (batch-major). A hook only keeps a reference to the router's index tensor; the
    stack, the compact-dtype conversion and the device copy happen once per forward in `take()` (one op each
    instead of one per layer, which is most of what capture costs on a small model's decode step).
    Disabled captures cost one Python call per layer."""

    def __init__(self, model: nn.Module) -> None:
        self.routers = find_routers(model)
        self.shape = moe_shape(model)
        self.enabled = True
        self._last: list[torch.Tensor | None] = [None] * len(self.routers)
        self._handles = [r.register_forward_hook(self._hook(i)) for i, r in enumerate(self.routers)]

    def _hook(self, layer: int):
        last = self._last

        def hook(module: nn.Module, args: tuple, output: tuple) -> None:
            if self.enabled:
                last[layer] = output[2]
        return hook

    def take(self) -> torch.Tensor | None:
        """Indices of the last forward as a CPU tensor [tokens, layers, k]; None if nothing was recorded."""
        last = self._last
        if not last or any(t is None for t in last):
            return None
        with torch.no_grad():
            out = torch.stack(last, dim=1).to(device="cpu", dtype=self.shape.index_dtype)  # type: ignore[arg-type]
        for i in range(len(last)):
            last[i] = None
        return out

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []


@contextmanager
def capture_routing(model: nn.Module) -> Iterator[RoutingCapture]:
    cap = RoutingCapture(model)
    try:
        yield cap
    finally:
        cap.remove()


@dataclass
class RoutingReplay:
    """Recorded experts to replay: `experts` [batch, seq, layers, k] int (-1: unknown, use own routing).

    While replaying, `own[l]` receives what layer l's router would have chosen itself ([batch*seq, k]), so the
    caller can measure `routing_disagreement` without a second forward pass."""

    experts: torch.Tensor
    record_own: bool = True
    own: dict[int, torch.Tensor] = field(default_factory=dict)
    replayed_rows: int = 0  # token-layer rows that used recorded experts (summed over layers and forwards)
    fallback_rows: int = 0  # rows with an unknown (-1) entry that kept the model's own routing

    def own_experts(self) -> torch.Tensor:
        """Own routing of the last forward as [batch, seq, layers, k] (needs record_own)."""
        b, s, layers, k = self.experts.shape
        return torch.stack([self.own[i] for i in range(layers)], dim=1).view(b, s, layers, k)


@contextmanager
def replay_routing(model: nn.Module, replay: RoutingReplay | torch.Tensor) -> Iterator[RoutingReplay]:
    """Make every router use the recorded expert ids, with gate weights recomputed from its own logits.

    Gate weights: softmax over all experts of the router's logits (float32), gathered at the replayed ids and
    renormalised when the model normalises top-k; cast back to the router's score dtype. Gradient flows into
    the router weights through the logits."""
    state = replay if isinstance(replay, RoutingReplay) else RoutingReplay(replay)
    routers = find_routers(model)
    if state.experts.dim() != 4 or state.experts.shape[2] != len(routers):
        raise ValueError(f"replay experts must be [batch, seq, {len(routers)} layers, k]; "
                         f"got shape {tuple(state.experts.shape)}")
    if routers and state.experts.shape[3] != routers[0].top_k:
        raise ValueError(f"replay experts have k={state.experts.shape[3]} but the model routes top-{routers[0].top_k}")
    flat = state.experts.reshape(-1, state.experts.shape[2], state.experts.shape[3])
    if routers and flat.numel() and int(flat.max()) >= int(routers[0].num_experts):
        raise ValueError(f"replayed expert id {int(flat.max())} out of range for {routers[0].num_experts} experts")

    def make_hook(layer: int, normalise: bool):
        def hook(module: nn.Module, args: tuple, output: tuple):
            logits, scores, own_idx = output
            if logits.shape[0] != flat.shape[0]:
                raise ValueError(f"replay has {flat.shape[0]} tokens (batch*seq) but layer {layer}'s router saw "
                                 f"{logits.shape[0]}; pass experts shaped like the input ids")
            rec = flat[:, layer].to(device=own_idx.device, dtype=torch.long)
            known = (rec >= 0).all(dim=-1, keepdim=True)
            idx = torch.where(known, rec, own_idx)
            probs = torch.softmax(logits.float(), dim=-1)
            weights = probs.gather(1, idx)
            if normalise:
                weights = weights / weights.sum(dim=-1, keepdim=True)
            if state.record_own:
                state.own[layer] = own_idx.detach()
            n_known = int(known.sum())
            state.replayed_rows += n_known
            state.fallback_rows += known.shape[0] - n_known
            return logits, weights.to(scores.dtype), idx
        return hook

    handles = [r.register_forward_hook(make_hook(i, _normalises(r))) for i, r in enumerate(routers)]
    try:
        yield state
    finally:
        for h in handles:
            h.remove()


def routing_disagreement(own: torch.Tensor, recorded: torch.Tensor) -> float:
    """Fraction of token-layer rows whose top-k expert *sets* differ. Rows with any -1 in `recorded` are skipped."""
    if own.shape != recorded.shape:
        raise ValueError(f"shape mismatch: own {tuple(own.shape)} vs recorded {tuple(recorded.shape)}")
    k = own.shape[-1]
    a = torch.sort(own.reshape(-1, k).long(), dim=-1).values
    b = torch.sort(recorded.reshape(-1, k).long(), dim=-1).values
    valid = (b >= 0).all(dim=-1)
    if int(valid.sum()) == 0:
        return 0.0
    differ = (a != b).any(dim=-1) & valid
    return float(differ.sum()) / float(valid.sum())
