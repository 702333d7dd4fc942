"""The benchmarks' agent: the production loop, except that a turn without a runnable tool call runs a fixed
command instead of ending the episode.

Why: a randomly initialised model almost never emits a tool call, so its episodes would end at the first turn
and a benchmark would measure nothing of the shell side. With `FallbackLoop` every turn still samples real ids
(the trajectory holds exactly what was sampled) and runs a real command in the episode's shell. It lives here,
not in `conch/agent/loop.py`, because training and evaluation never want it.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from conch.agent.loop import AgentLoop
from conch.agent.toolcall import ToolCall
from conch.config import AgentLoopConfig

# The agent settings the benchmarks have always measured with, where a benchmark does not set them itself (a
# fixed context and observation budget, whatever the config's defaults become), so their figures compare.
BENCH_AGENT = {"max_turns": 300, "max_context": 32768, "max_new_tokens": 256, "obs_token_budget": 512,
               "command_timeout": 60.0}


def bench_agent(**fields: Any) -> AgentLoopConfig:
    """The config's `[agent]` section with the benchmarks' settings under `fields`."""
    return AgentLoopConfig(**{**BENCH_AGENT, **fields})


class FallbackLoop(AgentLoop):
    """`AgentLoop` whose turns without a runnable tool call (no call, or a malformed one) run `command`."""

    def __init__(self, *args: Any, command: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.command = command

    def idle_call(self) -> ToolCall | None:
        return ToolCall("bash", self.command)


def fallback_loop(command: str) -> Any:
    """The loop constructor for `conch.agent.rollout.run_rollouts(loop=...)` and `PolicyAgent(loop=...)`."""
    return partial(FallbackLoop, command=command)


def fallback_spec(command: str) -> tuple[str, dict[str, Any]]:
    """The same loop as plain data, for Ray workers (`conch.cluster.ray_rollout.LoopSpec`)."""
    return (f"{__name__}:FallbackLoop", {"command": command})
