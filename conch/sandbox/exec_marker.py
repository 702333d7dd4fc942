"""End-of-command markers for one-shot commands whose output arrives over a stream that outlives them.

Why: a Docker exec's output stream stays open while background children of the command hold its stdout or
stderr, and the engine reports the exit code only when it closes the stream (up to ~2 s after the command
exited). So the command runs under a small in-box wrapper that, once the command has exited, prints
`<nonce>:<exit status>\\n` on stdout and then on stderr. Each stream is one pipe, so all that the command wrote to
it comes before its marker; the host stops reading once both markers are in, and that is the command's end.

The nonce is random per call and reaches the wrapper on stdin, which it reads before the command starts: it is in
no argv or environment block the command could read from /proc, the command itself reads an empty stdin, and
what the command prints cannot end it early or fake its exit status.
"""

from __future__ import annotations

import secrets
from typing import Any

# $1: the in-box timeout, $2: the command. `timeout -s KILL` moves itself and the command into a process group
# of their own and kills that group at the limit (status 137); the wrapper stays outside it and reports. The
# wrapper's own stderr goes to /dev/null (bash would report a killed `timeout` there); the command gets the
# real one, saved on fd 3, and so does the marker.
_WRAPPER = ('IFS= read -r n || exit 126; exec 3>&2 2>/dev/null; timeout -s KILL "$1" bash -c "$2" 2>&3 3>&-; '
            'c=$?; printf "%s:%d\\n" "$n" "$c"; printf "%s:%d\\n" "$n" "$c" >&3; exit "$c"')


def new_nonce() -> str:
    return "conch-end-" + secrets.token_hex(16)


def wrapped_argv(command: str, timeout: float) -> list[str]:
    """argv that runs `command` under `timeout -s KILL` and then prints the markers (the nonce comes on stdin)."""
    return ["bash", "-c", _WRAPPER, "conch-exec", f"{max(timeout, 0.001):.3f}", command]


class UntilMarker:
    """A sink that passes one stream through to `sink.feed` up to the marker `<nonce>:<status>\\n`.

    It holds back at most len(tag) - 1 bytes, so that a marker split across frames is still found; what comes
    after the marker (later output of background children) is dropped."""

    def __init__(self, sink: Any, nonce: str) -> None:
        self.sink = sink
        self.tag = nonce.encode() + b":"
        self.pending = bytearray()
        self.status: int | None = None
        self.seen = False

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        if self.seen:
            return
        self.pending += data
        i = self.pending.find(self.tag)
        if i < 0:
            cut = max(0, len(self.pending) - (len(self.tag) - 1))
            if cut:
                self.sink.feed(bytes(self.pending[:cut]))
                del self.pending[:cut]
            return
        if i:
            self.sink.feed(bytes(self.pending[:i]))
            del self.pending[:i]
        end = self.pending.find(b"\n", len(self.tag))
        if end < 0:
            return  # the rest of the marker is in the next frame
        digits = bytes(self.pending[len(self.tag):end])
        self.status = int(digits) if digits.isdigit() else None
        self.seen = True
        self.pending.clear()

    def flush(self) -> None:
        """The stream ended without a marker (the wrapper was killed): pass on what was held back."""
        if not self.seen and self.pending:
            self.sink.feed(bytes(self.pending))
            self.pending.clear()
