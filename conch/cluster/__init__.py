"""Running conch over a Ray cluster: rollout workers with their own engine replica and sandbox pool.

Ray is imported only here and only when `cluster.backend = "ray"`, so the local path never needs it.
"""
