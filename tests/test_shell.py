"""The persistent shell (conch/sandbox/shell.py) inside a real local sandbox: state persists, a timeout stops
the command and never the session, output is capped with bounded memory, the protocol survives any text."""

from __future__ import annotations

import asyncio
import resource
import statistics
import time

import pytest

from conch.sandbox import SandboxSpec, make_sandbox
from conch.sandbox.base import SandboxError
from conch.sandbox.shell import CappedBuffer, _Stream


# --- pure protocol pieces --------------------------------------------------------------------------------------

def test_capped_buffer_keeps_head_and_tail():
    buf = CappedBuffer(10)
    for ch in b"abcdefghijklmnopqrstuvwxyz":
        buf.feed(bytes([ch]))
    out = buf.render()
    assert buf.truncated and buf.total == 26
    assert out.startswith(b"abcde") and out.endswith(b"vwxyz")
    assert b"[... 16 bytes truncated ...]" in out
    small = CappedBuffer(100)
    small.feed(b"hello")
    assert small.render() == b"hello" and not small.truncated


def test_marker_split_across_reads_is_found():
    async def main():
        stream = _Stream(asyncio.StreamReader(), asyncio.Event())
        token = "0123456789abcdef"
        data = b"out\0put\0CONC" + b"\0CONCH" + token.encode() + b":42\n" + b"after"
        for i in range(len(data)):  # one byte per read: the worst case
            stream.feed(data[i : i + 1])
        return stream.take([token])

    out, truncated, rc = asyncio.run(main())
    assert out == b"out\0put\0CONC" and rc == 42 and not truncated


# --- real sessions ---------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def loop():
    lp = asyncio.new_event_loop()
    yield lp
    lp.close()


@pytest.fixture(scope="module")
def box(base_root, loop):
    sb = make_sandbox("local", SandboxSpec(name="test-shell"))
    loop.run_until_complete(sb.start())
    yield sb
    loop.run_until_complete(sb.stop())


@pytest.fixture()
def sh(box, loop):
    session = loop.run_until_complete(box.shell())
    yield session
    loop.run_until_complete(session.close())


def test_state_persists_between_commands(sh, loop):
    run = lambda c, **kw: loop.run_until_complete(sh.run(c, **kw))  # noqa: E731
    assert run("cd /usr/share && export GREETING=hi && greet() { echo \"$GREETING $1\"; }").exit_code == 0
    r = run("pwd; greet there; declare -A m=([k]=v)")
    assert r.stdout == "/usr/share\nhi there\n"
    assert run("echo ${m[k]}").stdout == "v\n"  # declare at top level, not inside a wrapper function
    r = run("sleep 300 & echo $!")
    pid = r.stdout.strip()
    assert run("jobs -p").stdout.strip() == pid
    assert run(f"kill -0 {pid} && echo alive").stdout == "alive\n"
    assert run("false").exit_code == 1
    assert run("echo $?").stdout == "1\n"  # $? survives the protocol
    assert run("(exit 7)").exit_code == 7


def test_background_job_visible_to_exec(sh, box, loop):
    loop.run_until_complete(sh.run("python3 -m http.server 8765 --bind 127.0.0.1 >/tmp/http.log 2>&1 &"))
    probe = ("python3 -c \"import time,urllib.request as u\nfor _ in range(50):\n try:\n"
             "  print(u.urlopen('http://127.0.0.1:8765/').status); break\n except OSError: time.sleep(0.1)\"")
    r = loop.run_until_complete(box.exec(probe, timeout=20))
    assert r.stdout.strip() == "200", r


def test_timeout_interrupts_the_command_not_the_session(sh, loop):
    run = lambda c, **kw: loop.run_until_complete(sh.run(c, **kw))  # noqa: E731
    run("export KEEP=1; cd /tmp; sleep 500 &")
    cases = [
        "while true; do :; done",                      # a builtin loop in the shell itself
        "sleep 30",                                    # a foreground child
        "timeout 60 sleep 50",                         # a child in its own process group
        "python3 -c 'import signal,time; signal.signal(signal.SIGINT, lambda *a: None); time.sleep(60)'",
        "bash -c 'trap \"\" INT; sleep 40'",           # ignores SIGINT entirely: needs SIGKILL
    ]
    for cmd in cases:
        t0 = time.monotonic()
        r = run(cmd, timeout=0.5)
        assert r.timed_out and r.exit_code is None, (cmd, r)
        assert time.monotonic() - t0 < 6, cmd
        after = run("echo $KEEP $PWD")
        assert after.stdout == "1 /tmp\n" and not after.timed_out, (cmd, after)
    assert "sleep 500" in run("jobs").stdout  # background jobs survive interrupts


def test_exit_code_stdout_stderr_separate(sh, loop):
    r = loop.run_until_complete(sh.run("echo out; echo err >&2; exit_code() { return 3; }; exit_code"))
    assert (r.stdout, r.stderr, r.exit_code) == ("out\n", "err\n", 3)
    r = loop.run_until_complete(sh.run("printf 'no newline'"))
    assert r.stdout == "no newline"


def test_command_text_is_passed_verbatim(sh, loop):
    cmd = ("cat <<'EOF'\nit's \"quoted\" $HOME `x` \\ back\nEOF\n"
           "printf '%s|' 'a b' \"c'd\" $'e\\tf'\necho\n"
           "echo 'multi\nline'")
    r = loop.run_until_complete(sh.run(cmd))
    assert r.stdout == "it's \"quoted\" $HOME `x` \\ back\na b|c'd|e\tf|\nmulti\nline\n", r
    r = loop.run_until_complete(sh.run("echo 'unterminated"))
    assert r.exit_code != 0 and "unexpected EOF" in r.stderr
    assert loop.run_until_complete(sh.run("echo fine")).stdout == "fine\n"


def test_stdin_cannot_eat_the_protocol(sh, loop):
    r = loop.run_until_complete(sh.run("cat; read x; echo got=$x; python3 -c 'import sys; print(len(sys.stdin.read()))'"))
    assert r.stdout == "got=\n0\n" and r.exit_code == 0
    assert loop.run_until_complete(sh.run("echo next")).stdout == "next\n"


def test_huge_output_is_capped_with_bounded_memory(sh, loop):
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    r = loop.run_until_complete(sh.run("yes x | head -c 1G; echo END", timeout=120, output_cap=4096))
    rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    assert r.exit_code == 0 and r.truncated
    assert r.stdout.startswith("x\n" * 100) and r.stdout.endswith("x\nEND\n")
    assert "bytes truncated" in r.stdout and len(r.stdout) < 5000
    assert (rss1 - rss0) * 1024 < 100 * 2**20, "reading 1 GB of output must not grow memory"
    r = loop.run_until_complete(sh.run("cat /dev/zero", timeout=1, output_cap=1000))
    assert r.timed_out and r.truncated and len(r.stdout) < 1100
    assert loop.run_until_complete(sh.run("echo ok")).stdout == "ok\n"


def test_exit_ends_the_session_cleanly(box, loop):
    session = loop.run_until_complete(box.shell(cwd="/etc", env={"X": "y"}))
    r = loop.run_until_complete(session.run("echo $PWD $X; exit 4"))
    assert r.stdout == "/etc y\n" and r.exit_code == 4
    with pytest.raises(SandboxError):
        loop.run_until_complete(session.run("true"))
    loop.run_until_complete(session.close())


def test_round_trip_is_fast(sh, loop):
    for _ in range(20):
        loop.run_until_complete(sh.run("true"))
    times = []
    for _ in range(200):
        t0 = time.perf_counter()
        loop.run_until_complete(sh.run("true"))
        times.append(time.perf_counter() - t0)
    median_ms = statistics.median(times) * 1000
    assert median_ms < 2.0, f"median round trip {median_ms:.3f} ms"


def test_interrupts_work_when_conch_itself_ignores_sigint():
    """Started as a background job of a script (CI runners, `conch train ... &`), conch inherits SIGINT and SIGQUIT
    ignored, and so would everything it execs. The box must still start with default signals: a timeout then
    interrupts the foreground command and spares background jobs (it used to kill them)."""
    import signal

    old = signal.signal(signal.SIGINT, signal.SIG_IGN), signal.signal(signal.SIGQUIT, signal.SIG_IGN)
    loop = asyncio.new_event_loop()
    box = make_sandbox("local", SandboxSpec(name="sigign"))
    try:
        loop.run_until_complete(box.start())
        sh = loop.run_until_complete(box.shell())
    finally:
        signal.signal(signal.SIGINT, old[0])
        signal.signal(signal.SIGQUIT, old[1])
    try:
        run = lambda c, **kw: loop.run_until_complete(sh.run(c, **kw))  # noqa: E731
        fg = run("grep SigIgn /proc/self/status").stdout.split()[-1]
        assert int(fg, 16) & 6 == 0, fg  # a foreground command sees SIGINT and SIGQUIT at their defaults
        run("sleep 500 &")
        r = run("sleep 30", timeout=0.5)
        assert r.timed_out and "sleep 500" in run("jobs").stdout
    finally:
        loop.run_until_complete(box.stop())
        loop.close()
