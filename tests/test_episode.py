"""The one episode runner and the one job executor.

The three kinds of agent (`NopAgent`, `CommandAgent` for the oracle and for command lists, `PolicyAgent` over a
scripted engine) go through the same `run_episode` on a real local sandbox and the real verifier; `conch check`'s
`CheckResult` is a view of the trajectory the command agents leave. The executor keeps results in job order,
seeds every job from its index, and never runs more than its bound at once.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from conch.agent.episode import CommandAgent, NopAgent, PolicyAgent, run_episode, sandbox_factory
from conch.agent.executor import RolloutStats, episode_seed, plan_jobs, run_jobs
from conch.agent.scripted import ScriptedEngine, tool_call_text
from conch.agent.trajectory import StopReason
from conch.config import AgentLoopConfig
from conch.harness import CheckResult, run_task
from conch.tasks.loader import load_task

REPO = Path(__file__).resolve().parents[1]
TASK = REPO / "examples/tasks/word-count"


def test_run_jobs_bounds_concurrency_and_keeps_job_order():
    in_flight, peak, finished = 0, 0, []

    async def work(job):
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(0.01 * (5 - job.index % 5))  # later jobs finish first
        in_flight -= 1
        return (job.task, job.sample, job.seed(7))

    jobs = plan_jobs(["a", "b", "c"], 3)
    out = asyncio.run(run_jobs(jobs, work, concurrency=2, on_done=finished.append))
    assert peak == 2
    assert out == [(t, k, episode_seed(7, i)) for i, (t, k) in enumerate((t, k) for t in "abc" for k in range(3))]
    assert sorted(finished) == sorted(out) and finished != out  # on_done as each ends, results in job order


def test_rollout_stats_of_counts_sampled_tokens_and_commands():
    from conch.agent.trajectory import Trajectory, Turn

    t = Trajectory(task="t", sample=0, mask=[0, 1, 1, 0], turns=[Turn(1, 3, "stop", command="ls"), Turn(3, 3, "stop")])
    s = RolloutStats.of([t, t], 2.0)
    assert (s.trajectories, s.sampled_tokens, s.env_steps, s.tokens_per_s) == (2, 4, 2, 2.0)


def test_three_agents_through_the_one_runner(base_root):
    from conch.tasks.demos import split_script
    from conch.tasks.synth.trajectories import BASH_TOOL

    task = load_task(TASK)
    sandboxes = sandbox_factory("local")
    nop = asyncio.run(run_episode(task, NopAgent(), sandboxes))
    oracle = asyncio.run(run_episode(task, CommandAgent.oracle(), sandboxes))
    commands = split_script(task.solution_script.read_text())
    demo = asyncio.run(run_episode(task, CommandAgent(commands), sandboxes))
    assert (nop.mode, nop.error, nop.turns) == ("nop", None, [])
    assert nop.n_total > 0 and nop.n_passed < nop.n_total
    assert oracle.error is None and oracle.n_passed == oracle.n_total > 0 and len(oracle.turns) == 1
    assert demo.error is None and demo.n_passed == demo.n_total and [t.command for t in demo.turns] == commands
    assert all(t.exit_code == 0 for t in demo.turns)
    for traj in (nop, oracle, demo):
        assert traj.timings["verify_seconds"] > 0 and traj.timings["total_seconds"] >= traj.timings["verify_seconds"]

    from transformers import AutoTokenizer

    from conch.agent.tito import ChatCodec
    from conch.model.init import cached_model

    codec = ChatCodec(AutoTokenizer.from_pretrained(cached_model()), tools=[BASH_TOOL])
    replies = [tool_call_text(c) for c in commands] + ["Done."]
    engine = ScriptedEngine(lambda turn, history: codec.encode(replies[min(turn, len(replies) - 1)]) + [codec.end_id])
    cfg = AgentLoopConfig(max_turns=20, max_context=32768, max_new_tokens=512)
    policy = asyncio.run(run_episode(task, PolicyAgent(engine, codec, cfg), sandboxes, sample=3, seed=1))
    assert (policy.mode, policy.sample, policy.stop_reason, policy.error) == ("tito", 3, StopReason.FINISHED, None)
    assert [t.command for t in policy.turns][:-1] == commands and policy.n_passed == policy.n_total == demo.n_total


def test_check_result_is_a_view_of_the_episode(base_root, tmp_path):
    task = load_task(TASK)
    r = asyncio.run(run_task(task, ["echo hi", "false"]))
    assert [(s.command, s.output, s.exit_code, s.timed_out) for s in r.steps] == [("echo hi", "hi\n", 0, False),
                                                                                   ("false", "", 1, False)]
    assert list(r.to_json()) == ["task", "n_passed", "n_total", "reward", "error", "fault", "tampered", "seconds"]
    assert r.error is None and r.verify is not None and r.n_total == r.verify.n_total

    # a failure before a verdict: the static test count, no verify result, the error said
    broken = tmp_path / "broken"
    import shutil

    shutil.copytree(TASK, broken)
    (broken / "solution" / "solve.sh").unlink()
    bad = asyncio.run(run_task(load_task(broken), "oracle"))
    assert bad.error and bad.error.startswith("agent oracle: ") and bad.verify is None
    assert bad.n_total == r.n_total and bad.reward is None
    assert isinstance(bad, CheckResult) and bad.to_json()["fault"] == "infra"


def test_a_sandbox_that_will_not_build_is_an_episode_error():
    task = load_task(TASK)

    def factory(task):
        raise RuntimeError("no such backend")

    traj = asyncio.run(run_episode(task, NopAgent(), factory))
    assert traj.stop_reason == StopReason.ERROR and traj.error == "RuntimeError: no such backend"


@pytest.mark.parametrize("knob", ["top_k=5", "max_parse_errors=2", "agent_timeout=30"])
def test_the_agent_section_holds_every_loop_knob(knob):
    from conch.config import load_config

    key, value = knob.split("=")
    cfg = load_config(None, [f"agent.{knob}"])
    assert getattr(cfg.agent, key) == type(getattr(AgentLoopConfig(), key))(value)
