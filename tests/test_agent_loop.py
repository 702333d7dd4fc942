"""The agent loop on real local sandboxes, the real tokenizer and chat template.

The model is scripted (`ScriptedEngine`) where the test needs chosen turns (a randomly initialised model never
calls a tool); one test runs the real tiny HFEngine. Everything else is real: sandbox, persistent shell,
TokenBuilder, trajectory serialization, `run_rollouts`, and the `conch rollout` CLI.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conch.agent.loop import run_loop
from conch.agent.scripted import ScriptedEngine, tool_call_text
from conch.agent.tito import ChatCodec
from conch.agent.trajectory import StopReason, Trajectory
from conch.bench.agents import fallback_loop
from conch.config import AgentLoopConfig
from conch.tasks.synth.trajectories import BASH_TOOL, SYSTEM_PROMPT

REPO = Path(__file__).resolve().parents[1]
# The [agent] settings these tests were written with, under each test's own (a fixed context and budgets,
# whatever the config's defaults are).
LOOP = {"max_turns": 300, "max_context": 32768, "max_new_tokens": 256, "obs_token_budget": 512,
        "command_timeout": 60.0}


def agent(**fields) -> AgentLoopConfig:
    return AgentLoopConfig(**{**LOOP, **fields})


@pytest.fixture(scope="module")
def codec() -> ChatCodec:
    from transformers import AutoTokenizer

    from conch.model.init import cached_model

    return ChatCodec(AutoTokenizer.from_pretrained(cached_model()), tools=[BASH_TOOL])


def episode(engine, codec, cfg: AgentLoopConfig, instruction: str = "Do the task.", agent_timeout: float = 900.0,
            seed: int | None = 0) -> Trajectory:
    """One episode in a fresh local sandbox (bare base root)."""
    from conch.sandbox import SandboxSpec, make_sandbox

    async def main() -> Trajectory:
        sb = make_sandbox("local", SandboxSpec(name="agent-loop-test"))
        await sb.start()
        try:
            shell = await sb.shell()
            traj = Trajectory(task="t", sample=0, mode=cfg.mode)
            await run_loop(engine, codec, shell, SYSTEM_PROMPT, instruction, cfg, traj, seed=seed,
                           agent_timeout=agent_timeout)
            await shell.close()
            return traj
        finally:
            await sb.stop()

    return asyncio.run(main())


def call_ids(codec: ChatCodec, command: str | None, name: str = "bash") -> list[int]:
    return codec.encode(tool_call_text(command, name)) + [codec.end_id]


def check_alignment(traj: Trajectory, engine: ScriptedEngine) -> None:
    """The TITO invariants: every id the engine returned, in order, at exactly the mask-1 positions, with its
    log-prob; the engine's session held exactly the trajectory's prefix; routing rows aligned to it."""
    n = len(traj.tokens)
    assert len(traj.mask) == len(traj.logprobs) == n
    sampled = [t for c in engine.calls for t in c.sampled]
    lps = [x for c in engine.calls for x in c.logprobs]
    ones = [i for i, m in enumerate(traj.mask) if m == 1]
    assert [traj.tokens[i] for i in ones] == sampled
    assert [traj.logprobs[i] for i in ones] == lps
    assert all(traj.logprobs[i] == 0.0 for i in range(n) if traj.mask[i] == 0)
    spans = [i for t in traj.turns for i in range(t.start, t.end)]
    assert spans == ones
    (history,) = engine.closed.values()
    assert history == traj.tokens[: len(history)]
    assert traj.routed_experts is not None and traj.routed_experts.shape == (n, engine.num_moe_layers, engine.top_k)
    for i in range(0, len(history), max(1, len(history) // 200)):
        assert (traj.routed_experts[i] == engine.routing_row(history[i], i)).all()
    assert (traj.routed_experts[len(history):] == -1).all()


def test_300_turn_trajectory_in_a_real_sandbox(base_root, codec):
    seen = []

    def policy(turn, history):
        # The model sees the previous observation: the shell's real output of the previous command.
        seen.append(codec.decode(history[-40:]))
        return call_ids(codec, f"echo step {turn}; cd /tmp")

    engine = ScriptedEngine(policy)
    traj = episode(engine, codec, agent(max_turns=300))
    assert traj.error is None
    assert traj.stop_reason == StopReason.MAX_TURNS
    assert len(traj.turns) == 300 and len(engine.calls) == 300
    assert all(t.exit_code == 0 and t.command == f"echo step {i}; cd /tmp" for i, t in enumerate(traj.turns))
    assert "step 298\n[exit code: 0]" in seen[299]
    assert traj.messages[-1] == {"role": "tool", "content": "step 299\n[exit code: 0]"}
    check_alignment(traj, engine)
    assert not traj.drift
    # No drift: the sequence is exactly what the template produces for the final conversation.
    assert traj.tokens == codec.encode(codec.render(traj.messages, add_generation_prompt=True))
    back = Trajectory.from_json(json.loads(traj.dumps()))
    assert back.tokens == traj.tokens and back.mask == traj.mask and back.stop_reason == traj.stop_reason
    assert np.array_equal(back.routed_experts, traj.routed_experts) and len(back.turns) == 300


def test_1000_turns(base_root, codec):
    engine = ScriptedEngine(lambda turn, history: call_ids(codec, ":"), num_experts=0)
    traj = episode(engine, codec, agent(max_turns=1000, max_context=200_000))
    assert traj.stop_reason == StopReason.MAX_TURNS and traj.error is None
    assert len(traj.turns) == 1000 and all(t.exit_code == 0 for t in traj.turns)
    assert sum(traj.mask) == sum(len(c.sampled) for c in engine.calls)
    assert not traj.drift


def scripted(*turns: list[int]) -> ScriptedEngine:
    it = iter(turns)
    return ScriptedEngine(lambda turn, history: next(it))


def test_answer_without_tool_call_finishes(base_root, codec):
    engine = scripted(call_ids(codec, "echo hi"), codec.encode("The task is done.") + [codec.end_id])
    traj = episode(engine, codec, agent())
    assert traj.stop_reason == StopReason.FINISHED and len(traj.turns) == 2
    assert traj.messages[-1] == {"role": "assistant", "content": "The task is done."}
    check_alignment(traj, engine)
    assert traj.tokens == codec.encode(codec.render(traj.messages))


def test_submit_tool_ends_the_episode(base_root, codec):
    engine = scripted(call_ids(codec, "echo hi"), call_ids(codec, None, "submit"), call_ids(codec, "echo never"))
    traj = episode(engine, codec, agent())
    assert traj.stop_reason == StopReason.SUBMITTED and len(traj.turns) == 2
    assert traj.turns[1].command is None


def test_context_limit(base_root, codec):
    engine = ScriptedEngine(lambda turn, history: call_ids(codec, "seq 1 50"))
    cfg = agent(max_context=1500, max_new_tokens=64)
    traj = episode(engine, codec, cfg)
    assert traj.stop_reason == StopReason.CONTEXT
    assert 1 <= len(traj.turns) < 30
    assert len(traj.tokens) + cfg.max_new_tokens > cfg.max_context
    assert all(len(h) <= cfg.max_context for h in engine.closed.values())
    # The engine's own context is a limit too.
    engine = ScriptedEngine(lambda turn, history: call_ids(codec, "true"), max_positions=1200)
    traj = episode(engine, codec, agent(max_new_tokens=64))
    assert traj.stop_reason == StopReason.CONTEXT and all(len(h) <= 1200 for h in engine.closed.values())


def test_agent_timeout_interrupts_a_long_command(base_root, codec):
    engine = ScriptedEngine(lambda turn, history: call_ids(codec, "sleep 30"))
    traj = episode(engine, codec, agent(), agent_timeout=2.0)
    assert traj.stop_reason == StopReason.TIMEOUT
    assert traj.turns[0].timed_out and traj.turns[0].exit_code is None
    assert traj.timings["episode_seconds"] < 15
    assert "timed out" in traj.messages[-1]["content"]


def test_invalid_tool_calls_get_error_observations_then_stop(base_root, codec):
    bad_json = codec.encode("<tool_call>\n{not json}\n</tool_call>") + [codec.end_id]
    unknown = codec.encode('<tool_call>\n{"name": "python", "arguments": {}}\n</tool_call>') + [codec.end_id]
    engine = scripted(bad_json, call_ids(codec, "echo recovered"), bad_json, unknown, bad_json, call_ids(codec, "x"))
    traj = episode(engine, codec, agent(max_parse_errors=3))
    assert traj.stop_reason == StopReason.PARSE_ERRORS and traj.error is None
    assert len(traj.turns) == 5
    assert "not valid JSON" in traj.turns[0].parse_error and traj.turns[1].parse_error is None
    assert traj.messages[3]["role"] == "tool" and traj.messages[3]["content"].startswith("Error: tool call is not")
    assert traj.messages[5] == {"role": "tool", "content": "recovered\n[exit code: 0]"}
    assert "unknown tool 'python'" in traj.messages[9]["content"]
    check_alignment(traj, engine)


def test_engine_failure_is_a_stop_reason_not_a_crash(base_root, codec):
    def policy(turn, history):
        if turn == 2:
            raise RuntimeError("engine exploded")
        return call_ids(codec, "echo ok")

    traj = episode(ScriptedEngine(policy), codec, agent())
    assert traj.stop_reason == StopReason.ERROR and "engine exploded" in traj.error
    assert len(traj.turns) == 2 and len(traj.tokens) == len(traj.mask) == len(traj.logprobs)


def test_observation_truncated_to_token_budget_and_control_tokens_neutralized(base_root, codec):
    cmd = "seq 1 5000; printf '<|im_%s|>\\n' end"
    engine = scripted(call_ids(codec, cmd), codec.encode("done") + [codec.end_id])
    traj = episode(engine, codec, agent(obs_token_budget=64))
    obs = traj.messages[3]["content"]
    assert obs.startswith("1\n2\n") and "tokens truncated" in obs and obs.endswith("[exit code: 0]")
    assert "<|im_end|>" not in obs and "im_end" in obs
    assert len(codec.encode(obs)) < 120
    assert traj.tokens.count(codec.end_id) == 5  # system, user, assistant, tool, assistant: none from output
    assert traj.tokens == codec.encode(codec.render(traj.messages))


class Recorder:
    """Wraps a real engine and records what each generate returned."""

    def __init__(self, inner):
        self.inner, self.results, self.fed = inner, [], []
        self.num_experts, self.num_moe_layers, self.top_k = inner.num_experts, inner.num_moe_layers, inner.top_k
        self.max_positions = inner.max_positions

    async def open_session(self, prompt_ids):
        self.fed.append(list(prompt_ids))
        return await self.inner.open_session(prompt_ids)

    async def generate(self, session, new_ids, sampling):
        res = await self.inner.generate(session, new_ids, sampling)
        self.fed.append(list(new_ids) + list(res.token_ids))
        self.results.append(res)
        return res

    async def close_session(self, session):
        await self.inner.close_session(session)


def test_tito_with_the_real_tiny_engine(base_root, codec):
    from conch.engine.hf import HFEngine
    from conch.model.init import cached_model

    async def main():
        engine = HFEngine(cached_model(), max_batch=4)
        rec = Recorder(engine)
        from conch.sandbox import SandboxSpec, make_sandbox

        sb = make_sandbox("local", SandboxSpec(name="agent-loop-hf"))
        await sb.start()
        try:
            shell = await sb.shell()
            traj = Trajectory(task="t", sample=0)
            cfg = agent(max_turns=4, max_new_tokens=24)
            await run_loop(rec, codec, shell, SYSTEM_PROMPT, "Say hi.", cfg, traj, seed=3,
                           loop=fallback_loop("echo fallback"))
        finally:
            await sb.stop()
            await engine.aclose()
        return traj, rec

    traj, rec = asyncio.run(main())
    assert traj.error is None and traj.stop_reason == StopReason.MAX_TURNS and len(traj.turns) == 4
    ones = [i for i, m in enumerate(traj.mask) if m]
    assert [traj.tokens[i] for i in ones] == [t for r in rec.results for t in r.token_ids]
    assert [traj.logprobs[i] for i in ones] == [x for r in rec.results for x in r.logprobs]
    fed = [t for f in rec.fed for t in f]
    assert fed == traj.tokens[: len(fed)]
    rows = np.concatenate([r.routed_experts for r in rec.results])
    assert rows.shape[0] == len(fed)
    assert (traj.routed_experts[: len(fed)] == rows).all() and (traj.routed_experts[len(fed):] == -1).all()
    assert all(t.command == "echo fallback" and t.exit_code == 0 for t in traj.turns)


def test_run_rollouts_solves_a_task_with_a_scripted_policy(base_root, codec, tmp_path):
    from conch.agent.rollout import run_rollouts
    from conch.tasks.loader import load_tasks

    (task,) = load_tasks([REPO / "examples/tasks/word-count"])
    solve = (REPO / "examples/tasks/word-count/solution/solve.sh").read_text()
    good = ScriptedEngine(lambda turn, history: call_ids(codec, solve) if turn == 0 else
                          codec.encode("Done.") + [codec.end_id])
    out = tmp_path / "trajs.jsonl"
    done = []
    trajs, stats = asyncio.run(run_rollouts(good, codec, [task], 2, agent(), concurrency=2, seed=1, out=out,
                                            on_done=done.append))
    assert [t.sample for t in trajs] == [0, 1] and len(done) == 2
    for t in trajs:
        assert t.stop_reason == StopReason.FINISHED and t.error is None, t.error
        assert t.n_total > 0 and t.n_passed == t.n_total and t.reward == 1.0
        assert t.timings["sandbox_start_seconds"] >= 0 and t.timings["verify_seconds"] > 0
    assert stats.env_steps == 2 and stats.sampled_tokens == sum(t.num_sampled for t in trajs)
    lines = out.read_text().splitlines()
    assert len(lines) == 2 and Trajectory.from_json(json.loads(lines[0])).n_passed == trajs[0].n_total


def test_conch_rollout_cli_end_to_end(base_root, tmp_path):
    out = tmp_path / "r.jsonl"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run(
        [sys.executable, "-m", "conch", "rollout", "--tasks", str(REPO / "examples/tasks"), "--n-per-task", "2",
         "--concurrency", "4", "--max-turns", "3", "--max-new-tokens", "16", "--out", str(out), "--json"],
        capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    from conch.tasks.loader import load_tasks

    n_tasks = len(load_tasks([REPO / "examples/tasks"]))
    assert n_tasks >= 3
    assert summary["trajectories"] == 2 * n_tasks
    trajs = [Trajectory.from_json(json.loads(line)) for line in out.read_text().splitlines()]
    assert len(trajs) == 2 * n_tasks
    for t in trajs:
        assert t.error is None, t.error
        assert t.num_sampled > 0 and len(t.tokens) == len(t.mask) == len(t.logprobs) == t.routed_experts.shape[0]
        assert 1 <= len(t.turns) <= 3 and t.n_total > 0 and t.verifier_error is None
        assert t.messages[0]["content"] == SYSTEM_PROMPT
    assert summary["sampled_tokens"] == sum(t.num_sampled for t in trajs)
