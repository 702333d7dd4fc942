"""conch: train long-horizon terminal agents with RL on Mixture-of-Experts models."""

__version__ = "0.1.0"
