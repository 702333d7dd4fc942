"""Parse the model's tool calls (Qwen3/Hermes style) out of an assistant turn.

Format: `<tool_call>{"name": "bash", "arguments": {"command": "ls"}}</tool_call>`; `arguments` may also be a
JSON-encoded string (some checkpoints emit that). Tools: `bash` (run a command) and `submit` (declare done).
Anything malformed raises ToolCallError with a message the agent sees as its observation, so a bad call costs a
turn, never the episode.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

TOOL_CALL_RE = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
OPEN_TAG = "<tool_call>"
TOOLS = ("bash", "submit")

class ToolCallError(ValueError):
    """A tool call that cannot be executed; the message is shown to the model."""


@dataclass(frozen=True)
class ToolCall:
    name: str
    command: str | None = None

    def to_message(self) -> dict:
        args = {"command": self.command} if self.name == "bash" else {}
        return {"type": "function", "function": {"name": self.name, "arguments": args}}


@dataclass(frozen=True)
class ParsedTurn:
    """The assistant text split into its free content and its tool calls (empty when it answered in prose)."""

    content: str
    calls: tuple[ToolCall, ...]


def _parse_one(body: str) -> ToolCall:
    try:
        obj = json.loads(body)
    except json.JSONDecodeError as exc:
        raise ToolCallError(f"tool call is not valid JSON ({exc.msg} at char {exc.pos})") from None
    if not isinstance(obj, dict):
        raise ToolCallError("tool call must be a JSON object with 'name' and 'arguments'")
    name = obj.get("name")
    if name not in TOOLS:
        raise ToolCallError(f"unknown tool {name!r}; available tools: {', '.join(TOOLS)}")
    args = obj.get("arguments", {})
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError:
            raise ToolCallError("'arguments' is a string that is not valid JSON") from None
    if not isinstance(args, dict):
        raise ToolCallError("'arguments' must be a JSON object")
    if name == "submit":
        return ToolCall("submit")
    command = args.get("command")
    if not isinstance(command, str) or not command.strip():
        raise ToolCallError("bash needs a non-empty string argument 'command'")
    return ToolCall("bash", command)


def parse_turn(text: str) -> ParsedTurn:
    """Split `text` into content and tool calls. Raises ToolCallError on any malformed call."""
    calls = tuple(_parse_one(m.group(1)) for m in TOOL_CALL_RE.finditer(text))
    content = TOOL_CALL_RE.sub("", text).strip()
    if not calls and OPEN_TAG in text:
        raise ToolCallError("unterminated <tool_call>: close it with </tool_call>")
    return ParsedTurn(content=content, calls=calls)
