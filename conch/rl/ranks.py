"""Which learner rank this process is, from torchrun's environment, without importing torch.

Why a module of its own: `conch train` must know whether it is a follower rank before anything heavy is imported
(`rl/learner_group.py` imports torch.distributed), and the driver asks the same questions later.
"""

from __future__ import annotations

import os


def torchrun_env() -> tuple[int, int] | None:
    """(rank, world size) when launched by torchrun (or anything that sets RANK and WORLD_SIZE), else None."""
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    return None


def is_follower() -> bool:
    env = torchrun_env()
    return env is not None and env[0] > 0
