import pytest

from conch.agent.toolcall import ToolCall, ToolCallError, parse_turn


def test_single_bash_call_with_content():
    t = parse_turn('Let me look.\n<tool_call>\n{"name": "bash", "arguments": {"command": "ls -la"}}\n</tool_call>')
    assert t.content == "Let me look."
    assert t.calls == (ToolCall("bash", "ls -la"),)


def test_arguments_as_json_string_and_multiple_calls():
    text = (
        '<tool_call>{"name": "bash", "arguments": "{\\"command\\": \\"pwd\\"}"}</tool_call>'
        '<tool_call>{"name": "submit", "arguments": {}}</tool_call>'
    )
    t = parse_turn(text)
    assert [c.name for c in t.calls] == ["bash", "submit"]
    assert t.calls[0].command == "pwd"


def test_no_tool_call_is_a_final_answer():
    t = parse_turn("All done, the file is fixed.")
    assert t.calls == () and t.content.startswith("All done")


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("<tool_call>{not json}</tool_call>", "not valid JSON"),
        ('<tool_call>{"name": "python", "arguments": {}}</tool_call>', "unknown tool"),
        ('<tool_call>{"name": "bash", "arguments": {}}</tool_call>', "non-empty string"),
        ('<tool_call>{"name": "bash", "arguments": [1]}</tool_call>', "must be a JSON object"),
        ('<tool_call>{"name": "bash", "arguments": {"command": "ls"}}', "unterminated"),
        ("<tool_call>[1, 2]</tool_call>", "JSON object"),
    ],
)
def test_malformed_calls_raise_readable_errors(text, fragment):
    with pytest.raises(ToolCallError, match=fragment):
        parse_turn(text)


def test_command_with_quotes_and_newlines_round_trips():
    import json

    cmd = "cat <<'EOF' > a.txt\nhello \"world\"\nEOF"
    text = "<tool_call>" + json.dumps({"name": "bash", "arguments": {"command": cmd}}) + "</tool_call>"
    assert parse_turn(text).calls[0].command == cmd
