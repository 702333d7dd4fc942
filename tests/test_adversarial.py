"""Hostile episodes, on real sandboxes: what an agent optimised for reward may do must not hurt the host or the run.

Each case asserts the three things a user relies on: the host is unaffected (no host file content in any
output, conch's own memory bounded), the session or the batch goes on, and the error is clear. The suite runs on
the `local` backend and, when an engine answers (always in CI), on `docker`.

Runtime is kept modest: one batch of adversarial tasks through `conch check` per backend (its peak memory is
measured with wait4), plus direct sandbox tests for the shell edge cases.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conch.sandbox import make_sandbox
from conch.sandbox.readback import ReadBackError, clip, read_bytes, walk_regular

REPO = Path(__file__).resolve().parents[1]
SECRET = "conch-host-secret-7f3a9c"  # written to a host file; must never appear in any output


# ----------------------------------------------------------------------------------------- readback (pure)


def test_readback_refuses_links_devices_fifos_and_big_files(tmp_path):
    secret = tmp_path / "host-secret"
    secret.write_text(SECRET)
    box = tmp_path / "box"
    (box / "sub").mkdir(parents=True)
    (box / "ok.txt").write_text("1\n")
    (box / "to-host").symlink_to(secret)
    (box / "to-zero").symlink_to("/dev/zero")
    (box / "linked-dir").symlink_to(tmp_path)
    os.mkfifo(box / "fifo")
    (box / "big").write_bytes(b"9" * 5000)
    assert read_bytes(box, "ok.txt", 10) == b"1\n"
    for name, words in (("to-host", "symbolic link"), ("to-zero", "symbolic link"), ("fifo", "not a regular"),
                        ("linked-dir/host-secret", "not a plain folder")):
        with pytest.raises(ReadBackError, match=words):
            read_bytes(box, name, 1 << 20)
    with pytest.raises(ReadBackError, match="over the 4 KiB read cap"):
        read_bytes(box, "big", 4096)
    with pytest.raises(ReadBackError):
        read_bytes(box, "../host-secret", 1 << 20)
    assert walk_regular(box) == ["big", "ok.txt"]
    assert clip("x" * 500 + "\n", 20) == "x" * 19 + "…"
    assert "\n" not in clip("a\nb")


def test_malformed_or_refused_reports_are_named(tmp_path):
    from conch.verify_parsers import find_ctrf, find_junit, report_problems

    logs = tmp_path / "verifier"
    (logs / "sub").mkdir(parents=True)
    (logs / "ctrf.json").write_text('{"results": {"tests": [')
    (logs / "sub" / "junit.xml").write_text("<testsuite><testcase name='a'")
    (logs / "link.json").symlink_to("/etc/hostname")
    (logs / "ok.json").write_text("{}")
    assert find_ctrf(logs) is None and find_junit(logs) is None
    problems = report_problems(logs)
    assert any(p.startswith("ctrf.json: not valid JSON") for p in problems), problems
    assert any(p.startswith("sub/junit.xml: not valid XML") for p in problems), problems
    assert any(p.startswith("link.json: not a regular file") for p in problems), problems
    assert not any(p.startswith("ok.json") for p in problems)


# ----------------------------------------------------------------------------------------- helpers


def make_task(root: Path, name: str, test_sh: str, solve_sh: str | None = None, commands: list[str] | None = None,
              test_file: str | None = None, agent_timeout: float = 60, verifier_timeout: float = 60,
              limits: str = "") -> Path:
    d = root / name
    (d / "environment").mkdir(parents=True)
    (d / "tests").mkdir()
    (d / "solution").mkdir()
    (d / "task.toml").write_text(
        f'version = "1.0"\n[agent]\ntimeout_sec = {agent_timeout}\n[verifier]\ntimeout_sec = {verifier_timeout}\n'
        f"[environment]\n{limits}\n")
    (d / "instruction.md").write_text(f"adversarial case {name}\n")
    (d / "environment" / "Dockerfile").write_text("FROM debian:bookworm\nWORKDIR /app\n")
    (d / "tests" / "test.sh").write_text(textwrap.dedent(test_sh))
    (d / "tests" / "test_outputs.py").write_text(test_file or "def test_one():\n    assert True\n")
    if commands is not None:
        (d / "solution" / "commands.json").write_text(json.dumps(commands))
    else:
        (d / "solution" / "solve.sh").write_text(textwrap.dedent(solve_sh or "true\n"))
    return d


# A child's ru_maxrss starts at its parent's peak (Linux carries the forking process's high-water mark across
# exec), and late in a full suite pytest itself holds over a GiB. So `conch check` is forked from a small fresh
# interpreter, which reports its child's wait4 peak: conch's own, with the descendants it waited for.
_SPAWN = """import json, os, subprocess, sys
proc = subprocess.Popen(sys.argv[2:], stdout=open(sys.argv[1] + ".out", "wb"), stderr=open(sys.argv[1] + ".err", "wb"))
_, status, usage = os.wait4(proc.pid, 0)
json.dump({"rc": os.waitstatus_to_exitcode(status), "maxrss": usage.ru_maxrss}, open(sys.argv[1] + ".rc", "w"))
"""


def conch_check(tasks_dir: Path, backend: str, jobs: int = 2, timeout: float = 900) -> tuple[dict, str, int]:
    """({task: result}, stderr, peak RSS in KiB of the conch process) of `conch check --json` on `tasks_dir`."""
    base = tasks_dir.parent / f"check-{backend}"
    cmd = [sys.executable, "-m", "conch", "check", str(tasks_dir), "--agent", "oracle", "--sandbox", backend,
           "--jobs", str(jobs), "--json"]
    spawner = subprocess.Popen([sys.executable, "-c", _SPAWN, str(base), *cmd], cwd=REPO, start_new_session=True)
    try:
        assert spawner.wait(timeout) == 0
    except subprocess.TimeoutExpired:
        os.killpg(spawner.pid, 9)
        raise
    done = json.loads(Path(f"{base}.rc").read_text())
    stderr = Path(f"{base}.err").read_text(errors="replace")
    assert done["rc"] == 0, stderr[-3000:]
    results = {r["task"]: r for r in json.loads(Path(f"{base}.out").read_text())}
    return results, stderr, done["maxrss"]


def run(coro):
    return asyncio.run(coro)


# ----------------------------------------------------------------------------------------- verifier read-back

CTRF_SH = "pytest --ctrf /logs/verifier/ctrf.json /tests/test_outputs.py -rA; "


def _readback_tasks(root: Path, secret: Path) -> dict[str, str]:
    """Tasks whose verifier leaves hostile result files; returns {task: what its error must say ('' = none)}."""
    tasks = root / "tasks"
    # A link toward a host file: the host must never open it (its content must appear nowhere).
    make_task(tasks, "link-reward-to-host", f"ln -sf {secret} /logs/verifier/reward.txt\n")
    make_task(tasks, "link-dir-to-host", f"mkdir -p /logs/verifier/x; ln -s {secret.parent} /logs/verifier/d; "
                                          "ln -s d/host-secret /logs/verifier/reward.txt\n")
    # A link toward a device: reading it would never end (the 20 GiB); the test results still count.
    make_task(tasks, "link-ctrf-to-zero", CTRF_SH + "rm -f /logs/verifier/ctrf.json; "
                                          "ln -s /dev/zero /logs/verifier/ctrf.json; "
                                          "ln -s /dev/zero /logs/verifier/out.log; echo 1 > /logs/verifier/reward.txt\n")
    make_task(tasks, "fifo-reward", "mkfifo /logs/verifier/reward.txt\n")
    # 300 MB of digits: over the download cap; the error names the cap and stays one short line.
    make_task(tasks, "huge-reward", "head -c 300000000 /dev/zero | tr '\\0' 9 > /logs/verifier/reward.txt\n")
    make_task(tasks, "big-reward", "head -c 100000 /dev/zero | tr '\\0' 9 > /logs/verifier/reward.txt\n")
    # A huge CTRF file (over its cap) is ignored: the console summary still gives the results.
    make_task(tasks, "huge-ctrf", "pytest /tests/test_outputs.py -rA; python3 -c \"import json; "
              "json.dump({'results': {'tests': [{'name': 't%d' % i, 'status': 'failed', 'pad': 'x' * 400} "
              "for i in range(100000)]}}, open('/logs/verifier/ctrf.json', 'w'))\"\n")
    make_task(tasks, "malformed-junit", "pytest /tests/test_outputs.py -rA; "
                                        "printf '<testsuite><testcase name=\"a\"' > /logs/verifier/junit.xml\n")
    return {"link-reward-to-host": "symbolic link", "link-dir-to-host": "symbolic link",
            "link-ctrf-to-zero": "", "fifo-reward": "not a regular file", "huge-reward": "download cap",
            "big-reward": "64 KiB read cap", "huge-ctrf": "", "malformed-junit": ""}


def test_verifier_results_are_read_safely(tmp_path, backend):
    secret = tmp_path / "host" / "host-secret"
    secret.parent.mkdir()
    secret.write_text(SECRET + "\n")
    expected = _readback_tasks(tmp_path, secret)
    results, stderr, peak_kib = conch_check(tmp_path / "tasks", backend)
    assert set(results) == set(expected)
    assert SECRET not in json.dumps(results) and SECRET not in stderr
    for name, words in expected.items():
        r = results[name]
        if words:
            assert r["error"] and words in r["error"] and r["reward"] is None, r
            assert len(r["error"]) < 400, r["error"]
        else:
            assert r["error"] is None and (r["n_passed"], r["n_total"]) == (1, 1), r
    assert results["link-ctrf-to-zero"]["reward"] == 1.0
    assert peak_kib < 1 << 20, f"conch check peaked at {peak_kib >> 10} MiB"


# ----------------------------------------------------------------------------------------- processes


async def _in_box(backend: str, body):
    from conch.sandbox import SandboxSpec

    box = make_sandbox(backend, SandboxSpec(name="adversarial"))
    await box.start()
    try:
        return await body(box)
    finally:
        await box.stop()


def test_exec_returns_when_its_command_exits(backend):
    """Background children holding the output pipes must not turn a finished command into a timeout."""
    async def body(box):
        r = await box.exec("sleep 300 & echo hi", timeout=30)
        assert (r.stdout.strip(), r.exit_code, r.timed_out) == ("hi", 0, False), r
        r = await box.exec("(sleep 300; echo late) & echo a; exit 3", timeout=30)
        assert (r.stdout.strip(), r.exit_code, r.timed_out) == ("a", 3, False), r
        # All the output written before the exit is read, however loaded the machine.
        r = await box.exec("sleep 300 & head -c 5000000 /dev/zero | tr '\\0' x", timeout=30, output_cap=4096)
        dropped = int(re.search(r"\[\.\.\. (\d+) bytes truncated", r.stdout).group(1))
        assert (dropped + r.stdout.count("x"), r.exit_code, r.timed_out) == (5_000_000, 0, False)
        r = await box.exec("ps -eo args | grep -c '^sleep 300'", timeout=30)
        assert r.stdout.strip() == "3"  # the background jobs live on in the box, as a server would
    run(_in_box(backend, body))


def test_persistent_shell_notices_its_own_exit(backend):
    async def body(box):
        for command, status in (("exit 7", 7), ("kill -9 $$", 137)):
            sh = await box.shell()
            r = await sh.run("sleep 300 & echo started", timeout=30)
            assert r.stdout.strip() == "started"
            r = await sh.run(command, timeout=60)
            assert (r.exit_code, r.timed_out) == (status, False), r
            assert "setsid" not in r.stderr and not sh.alive
            with pytest.raises(Exception, match=f"shell exited with status {status}"):
                await sh.run("echo again")
            await sh.close()
        sh = await box.shell()  # a new session opens in the same box
        assert (await sh.run("echo fresh")).stdout.strip() == "fresh"
        await sh.close()
    run(_in_box(backend, body))


def test_persistent_shell_survives_exec_redirections(backend):
    async def body(box):
        sh = await box.shell()
        steps = [("exec >/dev/null", "", ""), ("echo gone; echo kept >&2", "", "kept"),
                 ("exec >/tmp/log 2>&1", "", ""), ("echo x; ls /nonexistent-path", "", ""),
                 ("exec >/dev/tty 2>/dev/tty || exec >&- 2>&-", None, None),
                 ("exec 2>&-", "", ""), ("echo alive", None, None), ("exit 0", None, None)]
        for command, out, err in steps:
            r = await sh.run(command, timeout=30)
            assert not r.timed_out, (command, r)
            if out is not None:
                assert (r.stdout.strip(), r.stderr.strip()) == (out, err), (command, r)
        assert r.exit_code == 0 and not sh.alive
        await sh.close()
        r = await box.exec("grep -c nonexistent-path /tmp/log")
        assert r.stdout.strip() == "1"
    run(_in_box(backend, body))


def test_verifier_with_a_background_server_is_not_a_timeout(tmp_path, backend):
    """A test.sh that starts a helper server in the background and leaves it running passes as soon as it is
    done (today: the verifier waited for the server's pipes until its timeout)."""
    tasks = tmp_path / "tasks"
    make_task(tasks, "bg-server", "python3 -m http.server 8123 --bind 127.0.0.1 &\n"
              "for i in $(seq 100); do python3 -c 'import urllib.request as u; "
              "u.urlopen(\"http://127.0.0.1:8123/\")' 2>/dev/null && break; sleep 0.1; done\n"
              "pytest /tests/test_outputs.py -rA && echo 1 > /logs/verifier/reward.txt\n",
              solve_sh="sleep 300 &\necho solved\n", agent_timeout=40, verifier_timeout=40)
    results, stderr, _ = conch_check(tasks, backend, jobs=1)
    r = results["bg-server"]
    assert (r["error"], r["reward"], r["n_passed"]) == (None, 1.0, 1), (r, stderr[-2000:])


# ----------------------------------------------------------------------------------------- hostile agents, one batch

PASS_SH = "pytest /tests/test_outputs.py -rA && echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt\n"
MARKER_TEST = "from pathlib import Path\n\ndef test_marker():\n    assert Path('/app/ok').exists()\n"


def _hostile_tasks(root: Path, secret: Path, host_out: Path, backend: str) -> dict:
    """Tasks whose oracle misbehaves; returns {task: a check of its result}."""
    tasks = root / "tasks"
    small = "cpus = 1\nmemory_mb = 256\nstorage_mb = 300\npids = 128\n"
    # The bomb outlives its script: the verifier then cannot start a process in the box (a clear error).
    make_task(tasks, "fork-bomb", PASS_SH, solve_sh="bomb() { bomb | bomb & }; bomb\n", agent_timeout=8,
              limits=small)
    make_task(tasks, "memory-hog", PASS_SH, solve_sh="python3 -c 'b = [bytearray(1 << 26) for _ in range(64)]'\n"
              "touch /app/ok\n", test_file=MARKER_TEST, limits=small)
    make_task(tasks, "endless-output", PASS_SH, solve_sh="head -c 400000000 /dev/zero | tr '\\0' x\n"
              "touch /app/ok\n", test_file=MARKER_TEST)
    make_task(tasks, "ignores-signals", PASS_SH, commands=["trap '' INT TERM HUP; while :; do sleep 1; done",
                                                          "touch /app/ok"], agent_timeout=8)
    make_task(tasks, "shell-games", PASS_SH, test_file=MARKER_TEST, commands=[
        "sleep 1000 &", "exec >/dev/null", "exec 2>&-", "(sleep 1000 &); cd /app", "touch ok", "exit 3"])
    make_task(tasks, "network", PASS_SH, test_file=MARKER_TEST, solve_sh=(
        "python3 - <<'EOF'\nimport socket\nfor host in ('1.1.1.1', '8.8.8.8', '10.0.0.1'):\n    try:\n"
        "        socket.create_connection((host, 53), timeout=2)\n        raise SystemExit('reached ' + host)\n"
        "    except OSError:\n        pass\nsrv = socket.create_server(('127.0.0.1', 8099))\n"
        "socket.create_connection(('127.0.0.1', 8099), timeout=2)\nopen('/app/ok', 'w').close()\nEOF\n"))
    make_task(tasks, "host-files", PASS_SH, test_file=MARKER_TEST, solve_sh=(
        f"cat {secret} /proc/1/root{secret} 2>&1; echo owned > {host_out} 2>&1; "
        f"mkdir -p {host_out.parent} && echo owned > {host_out}; touch /app/ok\n"))
    make_task(tasks, "solve-never-ends", PASS_SH, solve_sh="sleep 1000\n", agent_timeout=5)
    # A test file with a syntax error: no test ran, so it must be a verifier error, never a plain 0/1.
    make_task(tasks, "broken-test-file", PASS_SH, test_file="def test_x(:\n    pass\n", solve_sh="true\n")
    make_task(tasks, "writes-own-reward", "pytest /tests/test_outputs.py -rA; "
              "[ -e /logs/verifier/reward.txt ] || echo 0 > /logs/verifier/reward.txt\n", test_file=MARKER_TEST,
              solve_sh="mkdir -p /logs/verifier; echo 1 > /logs/verifier/reward.txt\n")
    passed = lambda r: r["error"] is None and (r["n_passed"], r["n_total"], r["reward"]) == (1, 1, 1.0)  # noqa: E731

    def error(*words: str):
        return lambda r: bool(r["error"]) and any(w in r["error"] for w in words) and r["reward"] is None \
            and "\n" not in r["error"]

    expected = {
        # Under the pids limit the bomb starves the verifier's own processes more or less (a one-line error,
        # results without a reward, or a pass when it dies out first); the batch goes on either way.
        "fork-bomb": lambda r: r["n_total"] == 1 and (r["error"] is None or "\n" not in r["error"]),
        "memory-hog": passed, "endless-output": passed, "shell-games": passed, "network": passed,
        "host-files": passed, "ignores-signals": error("oracle solution timed out after 8s"),
        "solve-never-ends": error("oracle solution timed out after 5s"),

        # The agent's own reward file is wiped before the verifier runs: the failing test gives a plain 0.
        "writes-own-reward": lambda r: r["error"] is None and (r["n_passed"], r["reward"]) == (0, 0.0)}
    # local: the box's own ext4 image fills up (ENOSPC inside, the script goes on); docker on overlay2 over ext4
    # (no engine quota): the disk watchdog stops the box and the run reports the limit.
    make_task(tasks, "disk-fill", PASS_SH, test_file=MARKER_TEST, limits=small,
              solve_sh="head -c 1000000000 /dev/zero > /app/fill; df -m /app; rm -f /app/fill; touch /app/ok\n")
    expected["disk-fill"] = lambda r: passed(r) or error("disk limit")(r)
    return expected


def test_hostile_agents_do_not_hurt_host_or_batch(tmp_path, backend):
    secret = tmp_path / "host" / "host-secret"
    secret.parent.mkdir()
    secret.write_text(SECRET + "\n")
    host_out = tmp_path / "host" / "written-by-box"
    expected = _hostile_tasks(tmp_path, secret, host_out, backend)
    results, stderr, peak_kib = conch_check(tmp_path / "tasks", backend, jobs=2)
    assert set(results) == set(expected) | {"broken-test-file"}
    wrong = {name: results[name] for name, check in expected.items() if not check(results[name])}
    assert not wrong, json.dumps(wrong)
    assert SECRET not in json.dumps(results) and SECRET not in stderr
    assert not host_out.exists() and secret.read_text() == SECRET + "\n"
    assert peak_kib < 1 << 20, f"conch check peaked at {peak_kib >> 10} MiB"
    broken = results["broken-test-file"]
    assert broken["error"] and broken["reward"] is None, broken  # no test ran: an error, never a plain 0/1


def test_disk_fill_is_stopped_at_the_storage_limit(backend):
    """local: ENOSPC inside the box at `storage_mb`; docker: the engine's quota where it has one, else conch's
    watchdog stops the box once its writable layer passes the limit, and says so."""
    from conch.sandbox import SandboxError, SandboxSpec
    from conch.sandbox.base import Limits

    async def go():
        box = make_sandbox(backend, SandboxSpec(name="disk-fill", limits=Limits(storage_mb=200)))
        await box.start()
        try:
            r = await box.exec("head -c 2000000000 /dev/zero > /fill; ls -s --block-size=1M /fill", timeout=120)
            if "No space left on device" in r.stderr:
                assert int(r.stdout.split()[0]) <= 200, r
                return "enospc"
            assert "disk limit" in r.stderr and "200 MiB storage limit" in r.stderr, r
            with pytest.raises(SandboxError, match="disk limit"):
                await box.exec("echo again")
            return "watchdog"
        finally:
            await box.stop()

    how = run(go())
    assert how == "enospc" or backend == "docker"


def test_task_without_dockerfile_warns(tmp_path, capsys):
    from conch.tasks.loader import load_task

    d = make_task(tmp_path, "bare", PASS_SH)
    (d / "environment" / "Dockerfile").unlink()
    task = load_task(d)
    assert task.dockerfile is None
    err = capsys.readouterr().err
    assert "bare: " in err and "environment/Dockerfile is missing" in err
    from conch.sandbox.baseroot import SUITE

    assert f"bare base (Debian 13 {SUITE}, Python 3.13)" in err and "bookworm" not in err  # the base root's distro


def test_bench_sandbox_sessions_leave_nothing(base_root):
    """`conch bench sandbox --sessions N` (small N here): every session answers, and nothing is left."""
    proc = subprocess.run([sys.executable, "-m", "conch", "bench", "sandbox", "--sessions", "6", "--sandbox",
                           "local", "--parallel", "3", "--json"], capture_output=True, text=True, cwd=REPO,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    r = json.loads(proc.stdout)["local"]
    assert (r["live"], r["failed"], r["leaked"]) == (6, 0, {}), r
    assert 0 < r["host_pss_mib_per_session"] < 20 and r["cgroup_mib_per_session"] > 0, r
