"""The one episode runner: a fresh sandbox for the task, an agent acts in it, the verifier judges, the sandbox
is stopped, and everything that happened is one `Trajectory`.

Why one: `conch check` (oracle and nop), SFT demonstrations (a solution cut into commands), evaluation and RL
rollouts (the policy) all need the same lifecycle, with the same failure handling (whatever goes wrong comes
back inside the trajectory, `error` set and `stop_reason` error; the sandbox is always stopped) and the same
verifier bookkeeping. What differs is only who acts, so that is the `Agent` protocol:

- `PolicyAgent`: a model through an engine, the multi-turn loop of `conch/agent/loop.py`;
- `CommandAgent`: a fixed list of commands as the agent's turns in one persistent shell (a demonstration, a
  scripted attack), or the task's reference solution (`CommandAgent.oracle()`);
- `NopAgent`: does nothing (what passes with no action).

`conch.harness.CheckResult` is a view of the trajectory a command agent leaves.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from conch.agent.loop import AgentLoop, run_loop
from conch.agent.trajectory import StopReason, Trajectory, Turn
from conch.config import AgentLoopConfig
from conch.sandbox import make_sandbox
from conch.sandbox.base import Sandbox
from conch.sandbox.network import granted
from conch.tasks.model import Task
from conch.verify import VerifyResult, verify

SOLUTION_DIR = "/solution"

SandboxFactory = Callable[[Task], Sandbox]


def sandbox_factory(backend: str = "local", network: str = "never") -> SandboxFactory:
    """A task's sandbox (created, not started) of `backend`; with `network` "task", a task that allows the
    internet may reach the package registries."""
    return lambda task: make_sandbox(backend, task.sandbox_spec(), registries=granted(network, task.allow_internet))


def system_prompt() -> str:
    from conch.tasks.synth.trajectories import SYSTEM_PROMPT

    return SYSTEM_PROMPT


class AgentError(RuntimeError):
    """The agent could not act at all (e.g. the oracle of a task without a solution)."""


class Agent(Protocol):
    """Who acts in an episode. `name` is the trajectory's `mode` (tito, retokenize, oracle, nop, commands)."""

    name: str

    async def act(self, sandbox: Sandbox, task: Task, traj: Trajectory, seed: int | None) -> None:
        """Act in the started `sandbox`, recording turns (and messages) in `traj`; may raise (an episode error)."""
        ...


class NopAgent:
    """Does nothing: the tests that pass anyway (a vacuous task passes them all)."""

    name = "nop"

    async def act(self, sandbox: Sandbox, task: Task, traj: Trajectory, seed: int | None) -> None:
        return None


def _output(stdout: str, stderr: str) -> str:
    return stdout + ("\n" if stdout and stderr and not stdout.endswith("\n") else "") + stderr


def _record(turns: list[Turn], messages: list[dict], command: str, output: str, exit_code: int | None,
            timed_out: bool) -> None:
    """One command turn: its outcome in `turns`, the call and its whole output in `messages`."""
    turns.append(Turn(start=0, end=0, finish_reason="command", command=command, exit_code=exit_code,
                      timed_out=timed_out))
    messages.append({"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "bash", "arguments": {"command": command}}}]})
    messages.append({"role": "tool", "content": output})


class CommandAgent:
    """Commands as the agent's turns, each in one persistent shell, until the task's agent timeout; with no
    commands (`CommandAgent.oracle()`), the task's reference solution. Turns are recorded once all ran (an
    agent that failed midway leaves none)."""

    def __init__(self, commands: Sequence[str] | None = None, name: str = "commands") -> None:
        self.commands, self.name = None if commands is None else list(commands), name

    @classmethod
    def oracle(cls) -> "CommandAgent":
        return cls(None, name="oracle")

    async def act(self, sandbox: Sandbox, task: Task, traj: Trajectory, seed: int | None) -> None:
        turns: list[Turn] = []
        messages: list[dict] = []
        if self.commands is not None:
            await self._run_commands(sandbox, self.commands, task.agent_timeout_sec, turns, messages)
        elif task.solution_commands:
            await self._run_commands(sandbox, task.solution_commands, task.agent_timeout_sec, turns, messages)
        else:
            await self._run_script(sandbox, task, turns, messages)
        traj.turns.extend(turns)
        traj.messages.extend(messages)

    @staticmethod
    async def _run_commands(sandbox: Sandbox, commands: Sequence[str], timeout: float, turns: list[Turn],
                            messages: list[dict]) -> None:
        deadline = time.monotonic() + timeout
        session = await sandbox.shell()
        try:
            for command in commands:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    _record(turns, messages, command, "agent timeout reached; not run", None, True)
                    break
                r = await session.run(command, timeout=remaining)
                _record(turns, messages, command, _output(r.stdout, r.stderr), r.exit_code, r.timed_out)
        finally:
            await session.close()

    @staticmethod
    async def _run_script(sandbox: Sandbox, task: Task, turns: list[Turn], messages: list[dict]) -> None:
        script = task.solution_script
        if script is None:
            raise AgentError(f"{task.path}: no solution (solution/solve.sh, solution/commands.json, solution.sh "
                             f"or solution.yaml)")
        if script.parent.name == "solution":  # Harbor: the whole solution/ folder, as Harbor mounts it
            await sandbox.upload(script.parent, SOLUTION_DIR)
        else:  # TB1: solution.sh alone (the task folder holds tests too)
            await sandbox.upload(script, f"{SOLUTION_DIR}/{script.name}")
        command = f"bash {SOLUTION_DIR}/{script.name}"
        r = await sandbox.exec(command, timeout=task.agent_timeout_sec)
        _record(turns, messages, command, _output(r.stdout, r.stderr), r.exit_code, r.timed_out)


class PolicyAgent:
    """A model through `engine`: the multi-turn loop (`conch/agent/loop.py`) in one persistent shell.

    `verify_every` > 0 (reward mode `progress`) counts passing tests every that many turns, in a verifier box
    over the agent's filesystem while the agent is frozen (it never sees the tests). `loop` builds the loop
    (a benchmark passes a subclass of `AgentLoop`)."""

    def __init__(self, engine: Any, codec: Any, cfg: AgentLoopConfig, verify_every: int = 0,
                 loop: Callable[..., AgentLoop] = AgentLoop) -> None:
        self.engine, self.codec, self.cfg, self.verify_every, self.loop = engine, codec, cfg, verify_every, loop
        self.name = cfg.mode

    async def act(self, sandbox: Sandbox, task: Task, traj: Trajectory, seed: int | None) -> None:
        shell = await sandbox.shell()

        async def measure_progress(turn_idx: int) -> None:
            if (turn_idx + 1) % self.verify_every == 0:
                res = await verify(sandbox, task, final=False)
                traj.progress.append((turn_idx, res.n_passed))

        await run_loop(self.engine, self.codec, shell, system_prompt(), task.instruction, self.cfg, traj, seed=seed,
                       agent_timeout=self.cfg.agent_timeout or task.agent_timeout_sec,
                       on_turn=measure_progress if self.verify_every else None, loop=self.loop)
        await shell.close()


def record_verdict(traj: Trajectory, result: VerifyResult) -> None:
    """The verifier's outcome in the trajectory; a verification the agent broke is a failure (never its partial
    count)."""
    traj.n_passed, traj.n_total, traj.reward, traj.verifier_error = (result.n_passed, result.n_total,
                                                                     result.reward, result.error)
    traj.verifier_fault, traj.tampered = result.fault, result.tampered
    if result.error and result.fault == "agent":
        traj.n_passed = 0
    traj.tests = [{"name": t.name, "status": t.status} for t in result.tests]


async def run_episode(task: Task, agent: Agent, sandboxes: SandboxFactory, sample: int = 0,
                      seed: int | None = None,
                      on_verify: Callable[[VerifyResult], None] | None = None) -> Trajectory:
    """One episode of `task` by `agent` in a fresh sandbox, then its verifier. Never raises (except
    cancellation): a failure is the trajectory's `error`. `on_verify` sees the verifier's whole result."""
    traj = Trajectory(task=task.name, sample=sample, mode=agent.name)
    t0 = time.monotonic()
    sandbox: Sandbox | None = None
    try:
        sandbox = sandboxes(task)
        await sandbox.start()
        traj.timings["sandbox_start_seconds"] = time.monotonic() - t0
        await agent.act(sandbox, task, traj, seed)
        t_v = time.monotonic()
        result = await verify(sandbox, task)
        traj.timings["verify_seconds"] = time.monotonic() - t_v
        record_verdict(traj, result)
        if on_verify is not None:
            on_verify(result)
    except asyncio.CancelledError:
        raise
    except AgentError as exc:
        traj.stop_reason, traj.error = StopReason.ERROR, f"agent {agent.name}: {exc}"
    except Exception as exc:
        traj.stop_reason, traj.error = StopReason.ERROR, f"{type(exc).__name__}: {exc}"
    finally:
        if sandbox is not None:
            try:
                await sandbox.stop()
            except Exception:
                pass
    traj.timings["total_seconds"] = time.monotonic() - t0
    return traj
