"""Turn an oracle run into a chat transcript for warm-start SFT, in the exact shape rollouts use.

Why the system prompt and the observation format live here as the single source: the agent loop imports
`SYSTEM_PROMPT` and `format_observation`, so what the model sees during supervised warm-start is what it will
see during RL rollouts, byte for byte.
"""

from __future__ import annotations

from typing import Any

SYSTEM_PROMPT = """You operate a Linux machine through the `bash` tool: one command per call, in a persistent shell session.
Each call returns the output and exit code. When the task is done, reply briefly without a tool call."""

BASH_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Run a command in the persistent bash session.",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string", "description": "Shell command."}},
            "required": ["command"],
        },
    },
}

OBSERVATION_CAP = 16_000  # characters of command output shown to the model (head and tail kept)


def format_observation(output: str, exit_code: int | None, cap: int = OBSERVATION_CAP) -> str:
    """The text of a tool observation: the output (middle elided beyond `cap` chars) and an exit-code line.

    `exit_code` None means the command was stopped by its timeout.
    """
    if len(output) > cap:
        head, tail = output[: cap // 2], output[-cap // 2 :]
        output = f"{head}\n[... {len(output) - len(head) - len(tail)} characters omitted ...]\n{tail}"
    if output and not output.endswith("\n"):
        output += "\n"
    status = "[command timed out]" if exit_code is None else f"[exit code: {exit_code}]"
    return f"{output}{status}"


def assistant_call(command: str) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"type": "function", "function": {"name": "bash", "arguments": {"command": command}}}],
    }


def build_chat(
    task: str,
    family: str,
    instruction: str,
    steps: list[tuple[str, str, int | None]],
    final_message: str,
    split: str = "train",
) -> dict[str, Any]:
    """One JSONL record: the task's instruction, then per step a tool call and its observation, then the end.

    `steps` are (command, output, exit_code) from a real sandbox run.
    """
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": instruction},
    ]
    for command, output, exit_code in steps:
        messages.append(assistant_call(command))
        messages.append({"role": "tool", "content": format_observation(output, exit_code)})
    messages.append({"role": "assistant", "content": final_message})
    return {"task": task, "family": family, "split": split, "messages": messages}
