"""The agent's context limit in tokens: `agent.max_context`, or the model's own when it is 0.

Why one function: the default `agent.max_context = 0` means "as long as the model allows", and every consumer
(the agent loop, through the engine's `max_positions`; the SFT examples, through the policy's config) must turn
that 0 into the same number. A configured limit is kept, but never above what the model can attend to.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def model_positions(model: Any) -> int | None:
    """The model's max_position_embeddings, or None when unknown. `model`: a number of tokens (an engine's
    `max_positions`), a checkpoint folder (its config.json), or a model / HF config object."""
    if model is None or isinstance(model, bool):
        return None
    if isinstance(model, (int, float)):
        return int(model) if model > 0 else None
    if isinstance(model, (str, Path)):
        try:
            value = json.loads((Path(model) / "config.json").read_text()).get("max_position_embeddings")
        except (OSError, ValueError):
            return None
    else:
        value = getattr(getattr(model, "config", model), "max_position_embeddings", None)
    return int(value) if isinstance(value, (int, float)) and value > 0 else None


def context_length(configured: int, model: Any = None) -> int:
    """`agent.max_context` resolved: `configured` when > 0 (capped by the model's limit when known), else the
    model's max_position_embeddings. ValueError when it is 0 and the model's limit is unknown."""
    limit = model_positions(model)
    if configured > 0:
        return min(configured, limit) if limit else configured
    if limit is None:
        raise ValueError("agent.max_context = 0 means the model's max_position_embeddings, but the model gives "
                         "none; set agent.max_context")
    return limit
