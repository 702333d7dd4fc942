"""conch: train long-horizon terminal agents with RL on Mixture-of-Experts models.

The public names below are imported on first use (PEP 562), so `import conch` and `conch --help` stay light:
nothing loads torch, transformers or a sandbox backend until you touch a name that needs it. No public name
may equal a submodule's (importing `conch.verify` rebinds `conch.verify` to the module), hence `verify_task`.

    import asyncio, conch
    task = conch.load_task("tasks/my-task")                      # Harbor or Terminal-Bench 1 folder
    result = asyncio.run(conch.run_task(task, ["ls /app"]))      # commands as agent turns, then the verifier
    print(result.n_passed, result.n_total)

See README.md ("Use conch as a library") for a sandbox session and the agent loop with your own engine.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    # tasks
    "Task": "conch.tasks.model", "TaskLoadError": "conch.tasks.model",
    "load_task": "conch.tasks.loader", "load_tasks": "conch.tasks.loader",
    # sandboxes and the verifier
    "make_sandbox": "conch.sandbox", "Sandbox": "conch.sandbox", "SandboxSpec": "conch.sandbox",
    "ExecResult": "conch.sandbox", "verify_task": "conch.verify:verify", "VerifyResult": "conch.verify",
    "run_task": "conch.harness", "CheckResult": "conch.harness",
    # the agent loop and engines
    "AgentLoopConfig": "conch.config", "run_one": "conch.agent.rollout", "run_rollouts": "conch.agent.rollout",
    "run_episode": "conch.agent.episode", "PolicyAgent": "conch.agent.episode", "CommandAgent": "conch.agent.episode",
    "NopAgent": "conch.agent.episode",
    "Trajectory": "conch.agent.trajectory", "ChatCodec": "conch.agent.tito",
    "Engine": "conch.engine.base", "SamplingParams": "conch.engine.base", "GenerateResult": "conch.engine.base",
    "HFEngine": "conch.engine.hf",
    "BASH_TOOL": "conch.tasks.synth.trajectories", "SYSTEM_PROMPT": "conch.tasks.synth.trajectories",
    # demonstrations, config, training and evaluation
    "split_script": "conch.tasks.demos", "demonstrate": "conch.tasks.demos", "read_sft_data": "conch.tasks.demos",
    "Config": "conch.config", "ConfigError": "conch.config", "load_config": "conch.config",
    "train": "conch.rl.train", "evaluate": "conch.rl.stages",
}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str) -> Any:
    where = _EXPORTS.get(name)
    if where is None:
        raise AttributeError(f"module 'conch' has no attribute {name!r}")
    module, _, attr = where.partition(":")
    value = getattr(importlib.import_module(module), attr or name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
