"""Demonstrations for the SFT warm start from the user's own material: a task's `solution/solve.sh`, or chats
the user brings (`corpus.sft_data`: JSONL of OpenAI-style messages, or ATIF trajectories as Harbor writes them).

Why a solution script becomes many tool calls, not one: the policy acts one command per turn and sees each
command's output before the next; a demonstration of `bash /solution/solve.sh` as a single call would teach it
to call a script that does not exist at rollout time. So the script is cut into its top-level commands (a
multi-line `if`, loop, heredoc or `\\`-continued line stays one command; `bash -n` decides where a command is
complete), each is run as one turn in a persistent shell of the task's real sandbox, and the recorded outputs
are the observations. Script-only flags (`set -e`, `set -o pipefail`) are dropped: in a persistent session
`set -e` would end the shell at the first failing command. A demonstration is kept only when the verifier
passes every test after those turns, so SFT never imitates a run that does not solve its task.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from conch.agent.executor import run_jobs
from conch.tasks.model import Task

_SCRIPT_FLAGS = re.compile(r"^\s*set\s+[-+][a-z]*(\s+[-+]?[a-z]+)*\s*(#.*)?$")


def _complete(chunk: str) -> bool:
    """Whether `chunk` is one or more complete shell commands (an open heredoc only warns under `bash -n`)."""
    p = subprocess.run(["bash", "-n"], input=chunk + "\n", capture_output=True, text=True)
    return p.returncode == 0 and "here-document" not in p.stderr


def split_script(text: str) -> list[str]:
    """The top-level commands of a shell script, in order, without comments, blank lines and script flags."""
    commands: list[str] = []
    buf: list[str] = []
    for line in text.splitlines():
        if not buf and (not line.strip() or line.lstrip().startswith("#") or _SCRIPT_FLAGS.match(line)):
            continue
        buf.append(line)
        if line.rstrip().endswith("\\"):
            continue
        chunk = "\n".join(buf)
        if _complete(chunk):
            commands.append(chunk.strip())
            buf = []
    if buf:  # a syntax error at the end: keep the rest as one command (the verifier will judge the run)
        commands.append("\n".join(buf).strip())
    return commands


@dataclass
class DemoResult:
    """One task's demonstration attempt: `chat` when it passed, else `error` says why not."""

    task: str
    chat: dict[str, Any] | None
    error: str | None
    commands: int = 0


async def demonstrate(task: Task, backend: str = "local") -> DemoResult:
    """Run the task's solution script as agent turns in a fresh sandbox; the chat if the verifier passes all."""
    from conch.harness import run_task
    from conch.tasks.synth.trajectories import build_chat

    if task.solution_commands:
        commands = list(task.solution_commands)
    elif task.solution_script is not None:
        commands = split_script(task.solution_script.read_text(errors="replace"))
    else:
        return DemoResult(task.name, None, "no solution/solve.sh")
    if not commands:
        return DemoResult(task.name, None, f"{task.solution_script}: no commands")
    run = await run_task(task, commands, backend)
    if run.error:
        return DemoResult(task.name, None, run.error, len(commands))
    if not run.n_total or run.n_passed != run.n_total:
        return DemoResult(task.name, None, f"solution passed {run.n_passed}/{run.n_total} tests when run one "
                                           f"command per turn", len(commands))
    steps = [(s.command, s.output, s.exit_code) for s in run.steps]
    chat = build_chat(task.name, task.name, task.instruction, steps, "The task is complete.")
    return DemoResult(task.name, chat, None, len(commands))


async def demonstrate_all(tasks: Sequence[Task], backend: str = "local", jobs: int = 2,
                          on_result: Callable[[DemoResult], None] | None = None) -> list[DemoResult]:
    """`demonstrate` over `tasks`, `jobs` sandboxes at a time (the one job executor); results in input order."""
    return await run_jobs(tasks, lambda task: demonstrate(task, backend), jobs, on_result)


class DemoFormatError(ValueError):
    """A line of a demonstrations file that is not an OpenAI-style chat; the message names file and line."""


def normalize_chat(record: Any, where: str) -> dict[str, Any]:
    """One JSONL record as the chat SFT lays out: `{"messages": [system, user, assistant/tool ...]}`.

    Accepts OpenAI-style messages: `tool_calls[].function.arguments` as a JSON string or an object; a missing
    system message gets conch's own (the one rollouts use), so the warm start sees the prompt RL will show.
    """
    from conch.tasks.synth.trajectories import SYSTEM_PROMPT

    if not isinstance(record, dict) or not isinstance(record.get("messages"), list):
        raise DemoFormatError(f"{where}: expected an object with a \"messages\" list")
    messages: list[dict[str, Any]] = []
    for i, m in enumerate(record["messages"]):
        if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant", "tool"):
            raise DemoFormatError(f"{where}: message {i} needs a role of system, user, assistant or tool")
        m = dict(m)
        m["content"] = m.get("content") or ""
        if m.get("tool_calls"):
            m["tool_calls"] = [_tool_call(c, f"{where}: message {i}") for c in m["tool_calls"]]
        messages.append(m)
    if not messages or messages[0]["role"] != "system":
        messages.insert(0, {"role": "system", "content": SYSTEM_PROMPT})
    if len(messages) < 3 or messages[1]["role"] != "user":
        raise DemoFormatError(f"{where}: expected a user message after the system message, then assistant turns")
    if not any(m["role"] == "assistant" for m in messages):
        raise DemoFormatError(f"{where}: no assistant message to learn from")
    bad = [i for i, m in enumerate(messages[2:], 2) if m["role"] == "user" or m["role"] == "system"]
    if bad:
        raise DemoFormatError(f"{where}: message {bad[0]}: only assistant and tool messages may follow the user's")
    return {"task": str(record.get("task", "")), "family": str(record.get("family", record.get("task", ""))),
            "split": "train", "messages": messages}


def _tool_call(call: Any, where: str) -> dict[str, Any]:
    fn = call.get("function") if isinstance(call, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise DemoFormatError(f"{where}: a tool call needs function.name")
    args = fn.get("arguments", {})
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError:
            raise DemoFormatError(f"{where}: tool call arguments are not JSON: {args[:60]!r}") from None
    if not isinstance(args, dict):
        raise DemoFormatError(f"{where}: tool call arguments must be an object")
    return {"type": "function", "function": {"name": fn["name"], "arguments": args}}


def atif_to_chat(record: dict[str, Any], where: str) -> dict[str, Any]:
    """An ATIF trajectory (Harbor's Agent Trajectory Interchange Format, read and validated by
    `conch.report.atif.atif_to_messages`) as an OpenAI-style chat for conch's one bash tool: each tool call must
    be a shell command, `arguments.command` or `arguments.keystrokes` (Terminus) without its trailing newline.
    ATIF results carry no exit code, so those observations lack the `[exit code: N]` line rollouts show."""
    from conch.report.atif import atif_to_messages

    try:
        messages = atif_to_messages(record)
    except RuntimeError as exc:  # harbor's models are not installed
        raise DemoFormatError(f"{where}: {exc}") from None
    except ValueError as exc:  # pydantic's ValidationError
        first = str(exc).strip().splitlines()
        raise DemoFormatError(f"{where}: not a valid ATIF trajectory: {' '.join(first[:3])[:200]}") from None
    step = 0
    for m in messages:
        step += m["role"] != "tool"
        calls = []
        for c in m.get("tool_calls") or []:
            fn = c["function"]
            args = fn.get("arguments") or {}
            command = args.get("command", args.get("keystrokes")) if isinstance(args, dict) else None
            if not isinstance(command, str):
                raise DemoFormatError(f"{where}: step {step - 1}: tool call {fn.get('name')!r} is not a shell "
                                      f"command (conch's agent has one bash tool)")
            calls.append({"type": "function", "function": {"name": "bash", "arguments": {"command": command.rstrip("\n")}}})
        if calls:
            m["tool_calls"] = calls
    name = str(record.get("task_name") or record.get("session_id") or "")
    return {"task": name, "messages": messages}


def _records(path: Path) -> list[tuple[Any, str]]:
    """(record, where) of a .jsonl file (one per line), a .json file (one object), or a folder of them."""
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in (".json", ".jsonl"))
        return [rec for f in files for rec in _records(f)]
    text = path.read_text()
    if path.suffix == ".json":
        try:
            return [(json.loads(text), str(path))]
        except json.JSONDecodeError as exc:
            raise DemoFormatError(f"{path}: not JSON ({exc.msg})") from None
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            out.append((json.loads(line), f"{path}:{n}"))
        except json.JSONDecodeError as exc:
            raise DemoFormatError(f"{path}:{n}: not JSON ({exc.msg})") from None
    return out


def read_sft_data(path: Path) -> list[dict[str, Any]]:
    """Every chat of a demonstrations file or folder, normalized: JSONL of OpenAI-style chats or ATIF
    trajectories, a JSON file of either, or a folder of such files (e.g. Harbor's trajectory.json per trial).
    DemoFormatError names the first bad file and line."""
    chats = []
    for record, where in _records(Path(path)):
        if isinstance(record, dict) and "steps" in record and "messages" not in record:
            record = atif_to_chat(record, where)
        chats.append(normalize_chat(record, where))
    if not chats:
        raise DemoFormatError(f"{path}: no demonstrations")
    return chats
