"""conch as a library, as README.md shows it: the public names, a task in a real sandbox, and the agent loop
driven by an engine written outside conch (a replay of the task's solution, so the run must pass)."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import conch
from conch.agent.scripted import tool_call_text
from own_tasks import write_task


def test_import_is_light_and_every_public_name_resolves():
    code = ("import sys, conch; light = 'torch' not in sys.modules; "
            "[getattr(conch, n) for n in conch.__all__]; print(light)")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "True"


def test_load_task_open_sandbox_run_commands_verify(tmp_path, base_root):
    task = conch.load_task(write_task(tmp_path, "word-apple", "apple"))
    assert isinstance(task, conch.Task)

    async def main():
        sandbox = conch.make_sandbox("local", task.sandbox_spec())
        await sandbox.start()
        try:
            shell = await sandbox.shell()
            await shell.run("mkdir -p /app/out && cd /app/out")
            r = await shell.run("echo apple > word-apple.txt && pwd")  # the shell kept its cwd
            await shell.close()
            return r, await conch.verify_task(sandbox, task)
        finally:
            await sandbox.stop()

    r, result = asyncio.run(main())
    assert r.exit_code == 0 and r.stdout.strip() == "/app/out"
    assert (result.n_passed, result.n_total, result.reward) == (2, 2, 1.0)


class ReplayEngine:
    """A user's own engine: implements conch.Engine by replaying fixed commands as tool calls."""

    num_experts = num_moe_layers = top_k = 0  # a dense "model": no routing to replay

    def __init__(self, codec, commands):
        self.codec, self.commands, self.turns = codec, commands, {}

    async def open_session(self, prompt_ids):
        sid = len(self.turns) + 1
        self.turns[sid] = 0
        return sid

    async def generate(self, session, new_token_ids, sampling):
        i = self.turns[session]
        self.turns[session] += 1
        text = tool_call_text(self.commands[i]) if i < len(self.commands) else "Done."
        ids = self.codec.encode(text) + [self.codec.end_id]
        return conch.GenerateResult(ids, [0.0] * len(ids), "stop", prompt_tokens=len(new_token_ids))

    async def close_session(self, session):
        self.turns.pop(session, None)

    def load_weights(self, state_dict):
        pass

    async def aclose(self):
        pass


def test_agent_loop_with_your_own_engine(tmp_path, base_root):
    from transformers import AutoTokenizer

    from conch.model.init import cached_model

    task = conch.load_task(write_task(tmp_path, "word-cedar", "cedar"))
    codec = conch.ChatCodec(AutoTokenizer.from_pretrained(cached_model()), tools=[conch.BASH_TOOL])
    engine = ReplayEngine(codec, conch.split_script(task.solution_script.read_text()))
    assert isinstance(engine, conch.Engine)
    cfg = conch.AgentLoopConfig(max_turns=10, max_context=32768, max_new_tokens=256, obs_token_budget=512,
                                command_timeout=60.0)
    traj = asyncio.run(conch.run_one(engine, codec, task, 0, cfg))
    assert traj.error is None, traj.error
    assert [t.command for t in traj.turns][:2] == ["mkdir -p /app/out", "cd /app/out"]
    assert (traj.n_passed, traj.n_total) == (2, 2)
    replies = [tool_call_text(c) for c in engine.commands] + ["Done."]
    assert traj.num_sampled == sum(len(codec.encode(t)) + 1 for t in replies)  # exactly what the engine returned
