"""`conch check`'s scripted agents and its result: a `CheckResult` is a view of one episode's `Trajectory`.

Why two scripted agents: `oracle` runs a task's reference solution, so a task whose oracle does not score
n/n is broken (bad tests, bad environment, bad solution) and must not reach training; `nop` does nothing, so
a task that nop already passes is vacuous. Together they are the sanity check every task, hand-written or
synthesized, goes through. They run through the one episode runner (`conch.agent.episode.run_episode`) and
the one job executor (`conch.agent.executor.run_jobs`), as the policy's episodes do.

`run_task` is total: whatever goes wrong (a TaskLoadError, a sandbox that will not build, an exception in
the agent) comes back as a `CheckResult` with `error` set and `n_total` from the static test count, and the
sandbox is always stopped.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from conch.agent.episode import SOLUTION_DIR, Agent, AgentError, CommandAgent, NopAgent, run_episode, sandbox_factory
from conch.agent.executor import run_jobs
from conch.agent.trajectory import Trajectory
from conch.tasks.fields import check_tree
from conch.tasks.model import Task, TaskLoadError
from conch.verify import VerifyResult
from conch.verify_parsers import static_test_count

AGENTS = ("oracle", "nop")
__all__ = ["AGENTS", "SOLUTION_DIR", "AgentError", "CheckResult", "Step", "check_agent", "run_task", "run_tasks"]


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

    @classmethod
    def of(cls, task: Task, traj: Trajectory, result: VerifyResult | None) -> "CheckResult":
        """The check of a command agent's episode: `result` is its verifier's (None when the episode failed
        before a verdict). A reference solution that never finished is a broken task, whatever the tests say."""
        seconds = traj.timings.get("total_seconds", 0.0)
        steps = [Step(t.command or "", m["content"], t.exit_code, t.timed_out)
                 for t, m in zip(traj.turns, traj.messages[1::2])]
        if result is None:
            return cls(task.name, 0, _static_total(task), None, traj.error, seconds, steps)
        error, reward = result.error, result.reward
        if traj.mode == "oracle" and steps and steps[-1].timed_out:
            error = f"oracle solution timed out after {task.agent_timeout_sec:g}s" + (f"; {error}" if error else "")
            reward = None
        return cls(task=task.name, n_passed=result.n_passed, n_total=result.n_total, reward=reward, error=error,
                   seconds=seconds, steps=steps, verify=result)


def _static_total(task: Task | TaskLoadError) -> int:
    tests_dir = task.tests_dir if isinstance(task, Task) else Path(task.path) / "tests"
    try:
        if not isinstance(task, Task):
            check_tree(Path(task.path))  # a folder refused for links out of it or pipes is not read at all
        return static_test_count(tests_dir)
    except Exception:
        return 0


def check_agent(agent: str | Sequence[str]) -> Agent:
    """A scripted agent's name (oracle, nop) or a list of commands, as the agent that acts."""
    if isinstance(agent, str):
        return CommandAgent.oracle() if agent == "oracle" else NopAgent()
    return CommandAgent(agent)


async def run_task(task: Task | TaskLoadError, agent: str | Sequence[str] = "oracle",
                   backend: str = "local", network: str = "never") -> CheckResult:
    """Build the task's sandbox, let `agent` act, verify, stop the sandbox. Never raises (except cancellation).

    `agent` is a scripted agent's name or a list of commands to run as the agent's turns (e.g. a
    demonstration that is not the reference solution).
    """
    start = time.monotonic()
    if isinstance(task, TaskLoadError):
        return CheckResult(task.name, 0, _static_total(task), None, f"task did not load: {task}",
                           time.monotonic() - start)
    if isinstance(agent, str) and agent not in AGENTS:
        return CheckResult(task.name, 0, _static_total(task), None,
                           f"unknown agent {agent!r}; choose one of {', '.join(AGENTS)}", time.monotonic() - start)
    verdicts: list[VerifyResult] = []
    traj = await run_episode(task, check_agent(agent), sandbox_factory(backend, network), on_verify=verdicts.append)
    return CheckResult.of(task, traj, verdicts[0] if verdicts else None)


async def run_tasks(
    tasks: Sequence[Task | TaskLoadError],
    agent: str = "oracle",
    backend: str = "local",
    jobs: int = 1,
    on_result: Callable[[CheckResult], None] | None = None,
    network: str = "never",
) -> list[CheckResult]:
    """`run_task` over `tasks`, at most `jobs` at a time; results in input order, `on_result` as each ends."""
    return await run_jobs(tasks, lambda task: run_task(task, agent, backend, network), jobs, on_result)
