"""When a curve has stopped improving: the one patience rule of the warm start.

SFT watches its validation loss with it (cutting the learning rate at each plateau before it stops); the
critic warm-up watches its explained variance (negated, no cuts). One rule, so "plateau" means the same thing
wherever a run reports it: `patience` observations in a row without a gain of more than `min_delta`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass
class Plateau:
    """Reduce-on-plateau bookkeeping over a stream of losses, lower is better (pure, so it is unit-tested).

    `observe(v)` answers "best" (keep these weights), "wait", "cut" (go back to the best weights and multiply the
    learning rate by `lr_cut`) or "stop" (the plateau persisted through `max_cuts` cuts)."""

    patience: int
    max_cuts: int
    lr_cut: float = 0.3
    min_delta: float = 1e-3
    best: float = math.inf
    scale: float = 1.0
    cuts: int = 0
    bad: int = 0

    def observe(self, v: float) -> str:
        if v < self.best - self.min_delta:
            self.best, self.bad = v, 0
            return "best"
        self.bad += 1
        if self.bad < self.patience:
            return "wait"
        if self.cuts >= self.max_cuts:
            return "stop"
        self.cuts, self.bad, self.scale = self.cuts + 1, 0, self.scale * self.lr_cut
        return "cut"
