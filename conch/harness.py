"""Harness agents and the task runner behind `conch check`.

Why two scripted agents: `oracle` runs a task's reference solution, so a task whose oracle does not score
n/n is broken (bad tests, bad environment, bad solution) and must not reach training; `nop` does nothing, so
a task that nop already passes is vacuous. Together they are the sanity check every task, hand-written or
synthesized, goes through.

`run_task` is total: whatever goes wrong (a TaskLoadError, a sandbox that will not build, an exception in
the agent) comes back as a `CheckResult` with `error` set and `n_total` from the static test count, and the
sandbox is always stopped.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from conch.sandbox import make_sandbox
from conch.sandbox.base import Sandbox
from conch.sandbox.network import granted
from conch.tasks.fields import check_tree
from conch.tasks.model import Task, TaskLoadError
from conch.verify import VerifyResult, verify
from conch.verify_parsers import static_test_count

AGENTS = ("oracle", "nop")
SOLUTION_DIR = "/solution"


@dataclass
class Step:
    """One command the agent ran, and what came back (`exit_code` None when it timed out)."""

    command: str
    output: str
    exit_code: int | None
    timed_out: bool


@dataclass
class CheckResult:
    """One task's check. `to_json()` is the stable, public part; `steps`/`verify` are for inspection."""

    task: str
    n_passed: int
    n_total: int
    reward: float | None
    error: str | None
    seconds: float
    steps: list[Step] = field(default_factory=list)
    verify: VerifyResult | None = None

    def to_json(self) -> dict:
        return {
            "task": self.task,
            "n_passed": self.n_passed,
            "n_total": self.n_total,
            "reward": self.reward,
            "error": self.error,
            # whose fault the error was ("agent" | "infra"), and why the results could not be the tests' (or null)
            "fault": (self.verify.fault if self.verify is not None and self.verify.error else "infra")
            if self.error else None,
            "tampered": self.verify.tampered if self.verify is not None else None,
            "seconds": round(self.seconds, 3),
        }


class AgentError(RuntimeError):
    """The agent could not act at all (e.g. the oracle of a task without a solution)."""


def _output(stdout: str, stderr: str) -> str:
    return stdout + ("\n" if stdout and stderr and not stdout.endswith("\n") else "") + stderr


async def _run_commands(sandbox: Sandbox, commands: Sequence[str], timeout: float) -> list[Step]:
    """Each command in one persistent shell, as an agent's turns, until `timeout` seconds have passed."""
    deadline = time.monotonic() + timeout
    steps: list[Step] = []
    session = await sandbox.shell()
    try:
        for command in commands:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                steps.append(Step(command, "agent timeout reached; not run", None, True))
                break
            r = await session.run(command, timeout=remaining)
            steps.append(Step(command, _output(r.stdout, r.stderr), r.exit_code, r.timed_out))
    finally:
        await session.close()
    return steps


async def run_oracle(sandbox: Sandbox, task: Task) -> list[Step]:
    """Run the reference solution: a command list in one persistent shell, else the solution script."""
    if task.solution_commands:
        return await _run_commands(sandbox, task.solution_commands, task.agent_timeout_sec)
    steps: list[Step] = []
    script = task.solution_script
    if script is None:
        raise AgentError(f"{task.path}: no solution (solution/solve.sh, solution/commands.json, solution.sh or solution.yaml)")
    if script.parent.name == "solution":  # Harbor: the whole solution/ folder, as Harbor mounts it
        await sandbox.upload(script.parent, SOLUTION_DIR)
    else:  # TB1: solution.sh alone (the task folder holds tests too)
        await sandbox.upload(script, f"{SOLUTION_DIR}/{script.name}")
    command = f"bash {SOLUTION_DIR}/{script.name}"
    r = await sandbox.exec(command, timeout=task.agent_timeout_sec)
    steps.append(Step(command, _output(r.stdout, r.stderr), r.exit_code, r.timed_out))
    return steps


async def run_nop(sandbox: Sandbox, task: Task) -> list[Step]:
    return []


_AGENT_FNS = {"oracle": run_oracle, "nop": run_nop}


def _static_total(task: Task | TaskLoadError) -> int:
    tests_dir = task.tests_dir if isinstance(task, Task) else Path(task.path) / "tests"
    try:
        if not isinstance(task, Task):
            check_tree(Path(task.path))  # a folder refused for links out of it or pipes is not read at all
        return static_test_count(tests_dir)
    except Exception:
        return 0


async def run_task(task: Task | TaskLoadError, agent: str | Sequence[str] = "oracle",
                   backend: str = "local", network: str = "never") -> CheckResult:
    """Build the task's sandbox, let `agent` act, verify, stop the sandbox. Never raises (except cancellation).

    `agent` is a scripted agent's name or a list of commands to run as the agent's turns (e.g. a
    demonstration that is not the reference solution).
    """
    start = time.monotonic()
    steps: list[Step] = []

    def failed(message: str) -> CheckResult:
        return CheckResult(task.name, 0, _static_total(task), None, message, time.monotonic() - start, steps)

    if isinstance(task, TaskLoadError):
        return failed(f"task did not load: {task}")
    if isinstance(agent, str) and agent not in _AGENT_FNS:
        return failed(f"unknown agent {agent!r}; choose one of {', '.join(AGENTS)}")
    sandbox: Sandbox | None = None
    try:
        sandbox = make_sandbox(backend, task.sandbox_spec(), registries=granted(network, task.allow_internet))
        await sandbox.start()
        try:
            if isinstance(agent, str):
                steps.extend(await _AGENT_FNS[agent](sandbox, task))
            else:
                steps.extend(await _run_commands(sandbox, agent, task.agent_timeout_sec))
        except AgentError as exc:
            return failed(f"agent {agent}: {exc}")
        result = await verify(sandbox, task)
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        return failed(f"{type(exc).__name__}: {exc}")
    finally:
        if sandbox is not None:
            try:
                await sandbox.stop()
            except Exception:
                pass
    error, reward = result.error, result.reward
    if agent == "oracle" and steps and steps[-1].timed_out:  # a solution that never finished is a broken task
        error = f"oracle solution timed out after {task.agent_timeout_sec:g}s" + (f"; {error}" if error else "")
        reward = None
    return CheckResult(
        task=task.name,
        n_passed=result.n_passed,
        n_total=result.n_total,
        reward=reward,
        error=error,
        seconds=time.monotonic() - start,
        steps=steps,
        verify=result,
    )


async def run_tasks(
    tasks: Sequence[Task | TaskLoadError],
    agent: str = "oracle",
    backend: str = "local",
    jobs: int = 1,
    on_result: Callable[[CheckResult], None] | None = None,
    network: str = "never",
) -> list[CheckResult]:
    """`run_task` over `tasks`, at most `jobs` at a time; results in input order, `on_result` as each ends."""
    gate = asyncio.Semaphore(max(1, jobs))

    async def one(task: Task | TaskLoadError) -> CheckResult:
        async with gate:
            result = await run_task(task, agent, backend, network)
        if on_result is not None:
            on_result(result)
        return result

    return list(await asyncio.gather(*(one(t) for t in tasks)))
