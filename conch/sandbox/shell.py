"""The persistent shell: one real bash per session, driven over its stdin/stdout/stderr.

Why this design:
- The agent works in a terminal for hundreds of turns, so cwd, variables, functions and background jobs must
  persist. One long-lived bash keeps them for free, and each command is `eval`ed at its top level (not inside
  a function) so `declare`, `local`-free assignments and `return`-less scripts behave as typed in a terminal.
- Each command needs its own timeout that stops that command, never the session. We run bash *interactive*
  (`-i`) without a terminal, as its own process-group leader (`setsid`). Interactive bash treats SIGINT like
  Ctrl-C at a prompt: it aborts the running loop or builtin and goes back to reading input with its state
  intact. Without job control, foreground children share bash's process group and receive the SIGINT too,
  while background jobs (`cmd &`) have SIGINT ignored (POSIX) and survive. Commands that ignore or survive
  SIGINT are escalated to SIGKILL by a small control script that walks /proc inside the box.
- The command text is sent as one single-quoted bash word (any quoting, heredocs, multi-line text survive),
  and its stdin is /dev/null so it cannot eat the protocol. The end of a command is a marker line
  `\\0CONCH<token>:<rc>` printed to both stdout and stderr on the *next* input line, so it still runs when
  SIGINT aborted the command line before it.
- Output is streamed through a head+tail buffer: a command printing gigabytes costs bounded memory.

Transport-agnostic: `PersistentShell` only needs a `ShellTransport` (the process's three pipes, a way to run a
short control script beside it, and a way to kill it). The local backend provides one over `nsenter`; a
docker backend can provide one over `docker exec -i`.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import re
import secrets
import struct
import termios
import time
from typing import Callable, Protocol

from conch.sandbox.base import DEFAULT_OUTPUT_CAP, ExecResult, SandboxError

# Run this in the box to start a session: bash as its own process-group leader, interactive, no rc files.
SHELL_ARGV = ("setsid", "bash", "--noediting", "--norc", "--noprofile", "-i")

_MARK = b"\0CONCH"
_MARKER_RE = re.compile(rb"\0CONCH([0-9a-f]{16}):(\d{1,3})\n")
_MARKER_MAXLEN = len(_MARK) + 16 + 1 + 3 + 1
_READ_SIZE = 1 << 16
# Seconds to wait for the session after each escalation level. Level 2 gets longer: level 3 kills background
# jobs too, so a loaded machine (slow /proc walk, slow kill) must not be mistaken for a stuck command.
_GRACE_S = (1.0, 2.5, 1.0)
# Interactive bash without a terminal prints this after a foreground job dies of a signal: noise, dropped.
_TCSETATTR_RE = re.compile(rb"bash: \[\d+: \d+ \(\d+\)\] tcsetattr: Inappropriate ioctl for device\n")


class CappedBuffer:
    """Keeps the first and the last bytes of a stream, counting what falls in between.

    Invariant: memory stays below ~2x `cap` whatever is fed; `render()` is exact when total <= cap.
    """

    def __init__(self, cap: int = DEFAULT_OUTPUT_CAP) -> None:
        self.cap = max(0, cap)
        self.head_cap = self.cap - self.cap // 2
        self.tail_cap = self.cap // 2
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        if not data:
            return
        self.total += len(data)
        room = self.head_cap - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if not data or self.tail_cap == 0:
            return
        if len(data) >= self.tail_cap:
            self.tail = bytearray(data[-self.tail_cap :])
        else:
            self.tail += data
            if len(self.tail) > 2 * self.tail_cap:
                del self.tail[: len(self.tail) - self.tail_cap]

    @property
    def truncated(self) -> bool:
        return self.total > self.cap

    def render(self) -> bytes:
        if not self.truncated:
            return bytes(self.head + self.tail)
        tail = self.tail[len(self.tail) - self.tail_cap :] if self.tail_cap else b""
        dropped = self.total - len(self.head) - len(tail)
        return bytes(self.head) + f"\n[... {dropped} bytes truncated ...]\n".encode() + bytes(tail)


async def pidfd_wait(pid: int) -> bool:
    """Wait until host process `pid` exits (a pidfd turns readable); True then, and at once when it is gone
    already. False at once when no pidfd can be opened (an old kernel): rely on the pipes ending instead."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    except (AttributeError, OSError):
        return False
    loop = asyncio.get_running_loop()
    exited = loop.create_future()
    loop.add_reader(fd, lambda: exited.done() or exited.set_result(None))
    try:
        await exited
    finally:
        loop.remove_reader(fd)
        os.close(fd)
    return True


async def settle(reading: asyncio.Future, bufs: tuple[CappedBuffer, ...], idle: float = 0.25,
                 pending: Callable[[], bool] = lambda: False, most: float = 5.0) -> None:
    """After a command exited: let what it left in its pipes arrive, and stop reading once they are closed, or
    nothing new came for `idle` seconds and `pending()` (bytes still unread in a pipe) is false, or after
    `most` seconds (background children of the command may write forever)."""
    end = time.monotonic() + most
    while not reading.done():
        before = sum(b.total for b in bufs)
        try:
            await asyncio.wait_for(asyncio.shield(reading), idle)
        except asyncio.TimeoutError:
            if (sum(b.total for b in bufs) == before and not pending()) or time.monotonic() > end:
                reading.cancel()
                await asyncio.gather(reading, return_exceptions=True)
                return


def unread_bytes(proc: asyncio.subprocess.Process) -> bool:
    """True when a stdout/stderr pipe of `proc` still holds bytes not read yet (FIONREAD)."""
    transport = getattr(proc, "_transport", None)
    for fd in (1, 2):
        pipe = transport.get_pipe_transport(fd) if transport is not None else None
        f = pipe.get_extra_info("pipe") if pipe is not None else None
        try:
            if f is not None and struct.unpack("i", fcntl.ioctl(f.fileno(), termios.FIONREAD, b"\0" * 4))[0]:
                return True
        except (OSError, ValueError):
            continue
    return False


def cap_bytes(data: bytes, cap: int) -> tuple[bytes, bool]:
    """Head+tail cap of a finished byte string: (rendered, truncated)."""
    buf = CappedBuffer(cap)
    buf.feed(data)
    return buf.render(), buf.truncated


def _partial_marker(tail: bytes) -> bool:
    """True when `tail` (starting with NUL) could be the start of a marker still being received."""
    n = min(len(tail), len(_MARK))
    if tail[:n] != _MARK[:n]:
        return False
    rest = tail[len(_MARK) :]
    token, _, rc = rest.partition(b":")
    return len(token) <= 16 and all(c in b"0123456789abcdef" for c in token) and rc.isdigit() | (rc == b"")


class _Stream:
    """One of the shell's output streams: strips markers and files the bytes between them per token."""

    def __init__(self, reader: asyncio.StreamReader, progress: asyncio.Event) -> None:
        self.reader = reader
        self.progress = progress
        self.buf = CappedBuffer()
        self.carry = b""
        self.finished: dict[str, tuple[bytes, bool, int]] = {}
        self.eof = False
        self.ended = False  # the shell process exited (background jobs may still hold the pipe open)

    def start_command(self, cap: int) -> None:
        """Output received since the last marker (background jobs) is kept at the head of the next command's."""
        idle = self.buf.render() if self.buf.total else b""
        self.finished.clear()
        self.buf = CappedBuffer(cap)
        self.buf.feed(idle)

    def feed(self, data: bytes) -> None:
        buf = self.carry + data
        pos = 0
        while True:
            i = buf.find(_MARK, pos)
            if i < 0:
                keep = max(pos, len(buf) - (len(_MARK) - 1))
                j = buf.find(b"\0", keep)
                keep = j if j >= 0 and _partial_marker(buf[j:]) else len(buf)
                self.buf.feed(memoryview(buf)[pos:keep])
                self.carry = buf[keep:]
                return
            m = _MARKER_RE.match(buf, i)
            if m:
                self.buf.feed(memoryview(buf)[pos:i])
                token = m.group(1).decode()
                self.finished[token] = (self.buf.render(), self.buf.truncated, int(m.group(2)))
                self.buf = CappedBuffer(self.buf.cap)
                self.progress.set()
                pos = m.end()
                continue
            if len(buf) - i < _MARKER_MAXLEN and _partial_marker(buf[i:]):
                self.buf.feed(memoryview(buf)[pos:i])
                self.carry = buf[i:]
                return
            self.buf.feed(memoryview(buf)[pos : i + 1])
            pos = i + 1

    async def pump(self) -> None:
        try:
            while True:
                data = await self.reader.read(_READ_SIZE)
                if not data:
                    break
                self.feed(data)
        finally:
            if self.carry:
                self.buf.feed(self.carry)
                self.carry = b""
            self.eof = True
            self.progress.set()

    def take(self, tokens: list[str]) -> tuple[bytes, bool, int | None]:
        """Output of the given tokens (in order), plus what is pending when the stream ended early."""
        parts: list[bytes] = []
        truncated = False
        rc: int | None = None
        for tok in tokens:
            if tok in self.finished:
                data, trunc, rc = self.finished.pop(tok)
                parts.append(data)
                truncated |= trunc
        if (self.eof or self.ended) and self.buf.total:
            parts.append(self.buf.render())
            truncated |= self.buf.truncated
            self.buf = CappedBuffer(self.buf.cap)
        return b"".join(parts), truncated, rc


class ShellTransport(Protocol):
    """A running `SHELL_ARGV` process inside some box, as the backend started it."""

    stdin: asyncio.StreamWriter
    stdout: asyncio.StreamReader
    stderr: asyncio.StreamReader

    async def control(self, script: str) -> None:
        """Run `bash -c script` inside the same box, beside the session (used to signal its processes).

        Should run outside the box's pids limit where the backend can, so it works during a fork bomb.
        """
        ...

    async def terminate(self) -> int | None:
        """Kill the session process; return its exit status if known."""
        ...

    # Optional: `async def wait_exit(self) -> None`, returning as soon as the shell process itself has exited
    # (its pipes may stay open: background jobs inherit them). Without it, the end of both streams tells.


def quote(text: str) -> str:
    """One bash word holding `text` verbatim (NUL bytes cannot exist in bash strings and are dropped)."""
    return "'" + text.replace("\0", "").replace("'", "'\\''") + "'"


def _end_line(token: str) -> str:
    fmt = "'\\0CONCH%s:%s\\n'"
    return (
        f'__conch_rc=$?; builtin printf {fmt} {token} "$__conch_rc" >&"$__conch_o"; '
        f'builtin printf {fmt} {token} "$__conch_rc" >&"$__conch_e"\n'
    )


# The session's own stdout/stderr are saved at start-up on descriptors of their own (>= 10): the end markers go
# there, so `exec >/dev/null`, `exec >log 2>&1` or `exec 2>&-` in a command cannot silence them. Commands run
# with those two descriptors closed (bash restores them after the command), so they never see them.
_BOOTSTRAP = (
    "set +H +o history; PS1=''; PS2=''; PS0=''; PS4='+ '; PROMPT_COMMAND=''; unset HISTFILE MAILCHECK; "
    "exec {__conch_o}>&1 {__conch_e}>&2; readonly __conch_o __conch_e; "
    "__conch_setrc() { return \"$1\"; }; __conch_rc=0; builtin printf '%s\\n' \"$$\"\n"
)
_CLOSE_SAVED = '{__conch_o}>&- {__conch_e}>&-'


# Signal the session's running command. S: the shell's pid (= its process group), L: the level.
# Background jobs of a shell without job control ignore SIGINT and SIGQUIT (POSIX); that tells them apart.
# 1: SIGINT to the shell's process group and to descendants in other groups that do not ignore SIGINT.
# 2: SIGKILL to descendants that are not background jobs (foreground work that survived SIGINT).
# 3: SIGKILL to every descendant.
CONTROL_SCRIPT = r"""
declare -A PP PG
for f in /proc/[0-9]*/stat; do
  IFS= read -r l < "$f" 2>/dev/null || continue
  p=${f#/proc/}; p=${p%/stat}; r=${l##*) }; set -- $r; PP[$p]=$2; PG[$p]=$3
done
[ "$L" = 1 ] && kill -INT -- "-$S" 2>/dev/null
for p in "${!PP[@]}"; do
  q=${PP[$p]}; d=0; n=0
  while [ -n "$q" ] && [ "$q" -gt 1 ] && [ $n -lt 64 ]; do [ "$q" = "$S" ] && { d=1; break; }; q=${PP[$q]}; n=$((n+1)); done
  [ $d = 1 ] || continue
  ign=0
  while read -r k v; do [ "$k" = SigIgn: ] && { ign=$(( 16#$v & 6 )); break; }; done < "/proc/$p/status" 2>/dev/null
  case $L in
    1) [ $(( ign & 2 )) = 0 ] && [ "${PG[$p]}" != "$S" ] && kill -INT "$p" 2>/dev/null ;;
    2) [ "$ign" != 6 ] && kill -KILL "$p" 2>/dev/null ;;
    *) kill -KILL "$p" 2>/dev/null ;;
  esac
done
exit 0
"""


class PersistentShell:
    """A `ShellSession` over any `ShellTransport`. Use `await PersistentShell.open(transport)`."""

    def __init__(self, transport: ShellTransport) -> None:
        self.transport = transport
        self._progress = asyncio.Event()
        self._out = _Stream(transport.stdout, self._progress)
        self._err = _Stream(transport.stderr, self._progress)
        self._pumps = [asyncio.ensure_future(self._out.pump()), asyncio.ensure_future(self._err.pump())]
        self._lock = asyncio.Lock()
        self._dead: str | None = None
        self._exited = False
        self.pid: int | None = None  # the shell's pid inside the box
        wait_exit = getattr(transport, "wait_exit", None)
        if wait_exit is not None:
            self._pumps.append(asyncio.ensure_future(self._watch_exit(wait_exit)))

    async def _watch_exit(self, wait_exit) -> None:  # noqa: ANN001 - the transport's coroutine function
        """Notice the shell's own exit at once; first let what it wrote before exiting arrive."""
        await wait_exit()
        while not (self._out.eof and self._err.eof):
            self._progress.clear()
            try:
                await asyncio.wait_for(self._progress.wait(), 0.25)
            except asyncio.TimeoutError:
                break
        self._exited = self._out.ended = self._err.ended = True
        self._progress.set()

    def _ended(self) -> bool:
        return self._exited or (self._out.eof and self._err.eof)

    @classmethod
    async def open(cls, transport: ShellTransport, timeout: float = 30.0) -> PersistentShell:
        shell = cls(transport)
        token = secrets.token_hex(8)
        await shell._send(_BOOTSTRAP + _end_line(token))
        done = await shell._wait([token], time.monotonic() + timeout)
        out, _, _ = shell._out.take([token])
        shell._err.take([token])
        if not done or not out.strip().isdigit():
            await shell.close()
            raise SandboxError(f"the shell session did not start (got {out[-200:]!r})")
        shell.pid = int(out.strip().splitlines()[-1])
        return shell

    @property
    def alive(self) -> bool:
        return self._dead is None

    async def _send(self, text: str) -> None:
        try:
            self.transport.stdin.write(text.encode())
            await self.transport.stdin.drain()
        except (BrokenPipeError, ConnectionResetError) as exc:
            self._dead = "the shell's input is closed"
            raise SandboxError("shell session is gone (its input pipe is closed)") from exc

    async def _wait(self, tokens: list[str], deadline: float) -> bool:
        """Wait until the last of `tokens` has been seen on both streams, or both streams ended."""
        final = tokens[-1]
        while True:
            if final in self._out.finished and final in self._err.finished:
                return True
            if self._ended():
                return False
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            self._progress.clear()
            try:
                await asyncio.wait_for(self._progress.wait(), remaining)
            except asyncio.TimeoutError:
                return False

    async def run(self, command: str, timeout: float = 60.0, output_cap: int = DEFAULT_OUTPUT_CAP) -> ExecResult:
        """Run `command` at the top level of the session; a timeout interrupts the command only."""
        async with self._lock:
            if self._dead:
                raise SandboxError(f"shell session is no longer usable: {self._dead}")
            start = time.monotonic()
            token = secrets.token_hex(8)
            tokens = [token]
            self._out.start_command(output_cap)
            self._err.start_command(output_cap)
            await self._send(f'__conch_setrc "$__conch_rc"; eval -- {quote(command)} </dev/null {_CLOSE_SAVED}\n'
                             + _end_line(token))
            done = await self._wait(tokens, start + timeout)
            timed_out = False
            if not done and not self._ended():
                timed_out = True
                done = await self._interrupt(tokens)
            out, out_trunc, rc = self._out.take(tokens)
            err, err_trunc, _ = self._err.take(tokens)
            err = _TCSETATTR_RE.sub(b"", err)
            if self._ended() and not done:
                status = await self.transport.terminate()
                if timed_out:
                    self._dead = "the shell did not recover from a timeout"
                else:
                    self._dead = "the shell exited" + (f" with status {status}" if status is not None else "")
                rc = status if not timed_out else None
            out, t1 = cap_bytes(out, output_cap)
            err, t2 = cap_bytes(err, output_cap)
            return ExecResult(
                stdout=out.decode("utf-8", "replace"),
                stderr=err.decode("utf-8", "replace"),
                exit_code=None if timed_out else rc,
                timed_out=timed_out,
                truncated=out_trunc or err_trunc or t1 or t2,
                seconds=time.monotonic() - start,
            )

    async def _interrupt(self, tokens: list[str]) -> bool:
        """Escalate until the session answers a fresh marker; on failure the session is killed."""
        for level in (1, 2, 3):
            try:
                await self.transport.control(f"S={self.pid}; L={level}\n" + CONTROL_SCRIPT)
            except Exception:  # noqa: BLE001 - a failed control run just means the next level is tried
                pass
            sync = secrets.token_hex(8)
            tokens.append(sync)
            try:
                await self._send(_end_line(sync))
            except SandboxError:
                return False
            if await self._wait(tokens, time.monotonic() + _GRACE_S[level - 1]):
                return True
            if self._ended():
                return False
        self._dead = "a timed-out command could not be interrupted"
        await self.transport.terminate()
        return False

    async def close(self) -> None:
        if self._dead is None:
            self._dead = "closed"
            try:
                self.transport.stdin.write(b"exit 0\n")
                await asyncio.wait_for(self.transport.stdin.drain(), 1.0)
            except (OSError, asyncio.TimeoutError):
                pass
        await self.transport.terminate()
        for pump in self._pumps:
            pump.cancel()
        await asyncio.gather(*self._pumps, return_exceptions=True)
