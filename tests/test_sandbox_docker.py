"""The `docker` sandbox backend, on a real Docker engine.

Tests that need an engine skip, with the reason, when none answers; in CI (CI=true) they fail instead, since
.ci/run starts one. Dockerfile rewriting and compose parsing are tested without an engine.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from conch.sandbox import SandboxError, SandboxSpec, make_sandbox
from conch.sandbox import docker_from
from conch.sandbox import docker_images as di
from conch.sandbox.base import Limits
from conch.sandbox.compose import environment_of
from conch.sandbox.docker_gc import gc as docker_gc

REPO = Path(__file__).resolve().parents[1]
CONCH = [sys.executable, "-m", "conch"]

_problem = di.engine_problem()


def _need_engine() -> None:
    if _problem is None:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true but {_problem}")
    pytest.skip(_problem)


@pytest.fixture(scope="module")
def engine() -> None:
    _need_engine()


def run(coro):
    return asyncio.run(coro)


def write_task_env(folder: Path, dockerfile: str, files: dict[str, str] | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "Dockerfile").write_text(textwrap.dedent(dockerfile))
    for name, text in (files or {}).items():
        (folder / name).write_text(text)
    return folder


@pytest.fixture(scope="module")
def app_env(tmp_path_factory, engine) -> Path:
    """A small task environment: stand-in FROM, WORKDIR, ENV and a copied file."""
    return write_task_env(tmp_path_factory.mktemp("env"), """\
        FROM python:3.11-slim-bookworm
        ENV GREETING=hello
        WORKDIR /app
        COPY data.txt /app/data.txt
        RUN test "$PIP_CERT" = "$SSL_CERT_FILE" && sha256sum "$SSL_CERT_FILE" | cut -d' ' -f1 > /ca.sum
        """, {"data.txt": "one two\n"})


def spec_for(env_dir: Path, name: str = "t", **kw) -> SandboxSpec:
    return SandboxSpec(name=name, context_dir=env_dir, dockerfile=env_dir / "Dockerfile", **kw)


# --------------------------------------------------------------------------------------- without an engine


def test_standin_patterns():
    for ref in ("python:3.11", "python:3.13-slim", "python:3.12-slim-bookworm", "python:3.11.9-bookworm",
                "docker.io/library/python:3.10-slim", "debian:bookworm-slim", "debian", "ubuntu:24.04",
                "ghcr.io/laude-institute/t-bench/python-3-13:20250620", "ghcr.io/laude-institute/t-bench/ubuntu-24-04"):
        assert docker_from.is_standin_ref(ref), ref
    for ref in ("node:20", "python:2.7", "alpine:3.19", "ghcr.io/other/x:1", "python:3.11-alpine", "rust:1.80"):
        assert not docker_from.is_standin_ref(ref), ref


def test_generate_dockerfile_rewrites_from_lines():
    text = textwrap.dedent("""\
        # syntax=docker/dockerfile:1
        ARG PY=3.12
        FROM --platform=linux/amd64 python:${PY}-slim AS build
        RUN echo a \\
            && echo b
        FROM build AS second
        from scratch
        COPY --from=build /x /x
        FROM ubuntu:22.04
        RUN true
        """)
    gen = docker_from.generate_dockerfile(text, "conch/base:x", "Dockerfile", lambda ref: False)
    assert gen.standins == ("python:3.12-slim", "ubuntu:22.04")
    froms = [line for line in gen.text.splitlines() if line.upper().startswith("FROM")]
    assert froms == ["FROM conch/base:x AS build", "FROM build AS second", "FROM scratch", "FROM conch/base:x"]
    # every non-scratch stage gets the build CA for its RUN steps, as build ARGs (never ENV)
    assert gen.text.count(f"COPY {docker_from.BUILD_DIR}/ca.crt {docker_from.CA_IN_IMAGE}") == 3
    assert gen.text.count(f"ARG SSL_CERT_FILE={docker_from.CA_IN_IMAGE}") == 3
    assert "ENV SSL_CERT_FILE" not in gen.text
    assert "RUN echo a \\\n    && echo b" in gen.text  # other instructions untouched


def test_generate_dockerfile_keeps_local_images_and_rejects_unknown():
    gen = docker_from.generate_dockerfile("FROM myorg/tool:1\n", "conch/base:x", "D", lambda ref: ref == "myorg/tool:1")
    assert gen.standins == () and gen.text.startswith("FROM myorg/tool:1\n")
    with pytest.raises(SandboxError, match=r"D:1: FROM node:20 cannot be pulled"):
        docker_from.generate_dockerfile("FROM node:20\n", "conch/base:x", "D", lambda ref: False)
    with pytest.raises(SandboxError, match="no FROM"):
        docker_from.generate_dockerfile("RUN true\n", "conch/base:x", "D", lambda ref: False)


def test_compose_single_service_and_multi_service(tmp_path):
    (tmp_path / "Dockerfile.client").write_text("FROM debian:bookworm\n")
    compose = tmp_path / "docker-compose.yaml"
    compose.write_text(textwrap.dedent("""\
        services:
          client:
            build:
              dockerfile: Dockerfile.client
            image: ${T_BENCH_TASK_DOCKER_CLIENT_IMAGE_NAME}
            command: ["sh", "-c", "sleep infinity"]
            environment:
              - TEST_DIR=${T_BENCH_TEST_DIR}
              - MODE=${MODE:-fast}
            working_dir: /work
        """))
    env = environment_of(tmp_path, None, compose)
    assert env.dockerfile == tmp_path / "Dockerfile.client" and env.context_dir == tmp_path
    assert env.env == {"TEST_DIR": "/tests", "MODE": "fast"} and env.workdir == "/work"

    compose.write_text("services:\n  client:\n    build: .\n  db:\n    image: postgres:16\n")
    with pytest.raises(SandboxError, match=r"2 services \(client, db\); multi-service compose tasks are unsupported"):
        environment_of(tmp_path, None, compose)


# --------------------------------------------------------------------------------------- with an engine


@pytest.fixture(scope="module")
def box(app_env):
    """One started sandbox shared by the read-mostly tests below (a start costs ~0.2 s, a build more)."""
    loop = asyncio.new_event_loop()
    sb = make_sandbox("docker", spec_for(app_env, "shared", limits=Limits(cpus=0.5, memory_mb=300, pids=128)))
    loop.run_until_complete(sb.start())
    yield sb, loop
    loop.run_until_complete(sb.stop())
    loop.close()


def run_text(box, command: str) -> str:
    sb, loop = box
    return loop.run_until_complete(sb.exec(command)).stdout


def test_exec_results_env_and_cwd(box):
    sb, loop = box
    r = loop.run_until_complete(sb.exec("pwd; cat data.txt; echo $GREETING; echo oops >&2; exit 7"))
    assert (r.stdout, r.stderr, r.exit_code, r.timed_out) == ("/app\none two\nhello\n", "oops\n", 7, False)
    r = loop.run_until_complete(sb.exec("pwd; echo $X", cwd="/tmp", env={"X": "42"}))
    assert r.stdout == "/tmp\n42\n" and r.exit_code == 0


def test_exec_timeout_kills_the_command_group(box):
    sb, loop = box
    r = loop.run_until_complete(sb.exec("sleep 30 & sleep 30; echo never", timeout=1))
    # At or after 1 s, never early; the in-box `timeout` (not the host guard at 11 s) killed it: none left.
    assert r.timed_out and r.exit_code is None and (r.stdout, r.stderr) == ("", "") and 1 <= r.seconds < 11
    left = loop.run_until_complete(sb.exec("ps -eo args | grep -c '^sleep 30' || true"))
    assert left.stdout.strip() == "0"


def test_exec_output_cap(box):
    sb, loop = box
    r = loop.run_until_complete(sb.exec("seq 1 100000", output_cap=1000))
    assert r.truncated and r.stdout.startswith("1\n2\n") and r.stdout.endswith("99999\n100000\n")
    assert len(r.stdout) < 1200


def test_end_marker_is_found_across_frames_and_only_with_its_nonce():
    from conch.sandbox.exec_marker import UntilMarker, new_nonce
    from conch.sandbox.shell import CappedBuffer

    nonce = new_nonce()
    assert nonce != new_nonce() and len(nonce) >= 32
    out = CappedBuffer(1 << 20)
    m = UntilMarker(out, nonce)
    stream = (b"a\nconch-end-00000000000000000000000000000000:0\n" + nonce[:-1].encode() + b":0\nb"
              + nonce.encode() + b":42\nlater output of a background child\n")
    for i in range(len(stream)):  # one byte per frame: the marker always spans frames
        m.feed(stream[i:i + 1])
    assert (m.seen, m.status) == (True, 42)
    assert out.render() == b"a\nconch-end-00000000000000000000000000000000:0\n" + nonce[:-1].encode() + b":0\nb"
    cut = UntilMarker(out := CappedBuffer(100), nonce)  # the wrapper was killed: no marker, nothing lost
    cut.feed(b"xyz" + nonce.encode()[:5])
    cut.flush()
    assert (cut.seen, out.render()) == (False, b"xyz" + nonce.encode()[:5])


def test_exec_ends_at_the_commands_exit_not_its_background_childrens(box):
    """The engine keeps an exec's stream open (and its exit code unknown) for ~2 s while background children hold
    its stdout/stderr. Here a child starts writing only once the exec's top process in the box has exited, and
    keeps writing: the result must be the command's own output and status, not a timeout, with the child and a
    background sleep still running. No wall-clock bound is needed: with the old read-to-the-end the child's lines
    were in the output."""
    sb, loop = box
    command = ("top=$$; while p=$(cut -d' ' -f4 /proc/$top/stat) && [ \"$p\" != 0 ]; do top=$p; done; "
               "(while grep -qs '^State:[[:space:]]*[^Z]' /proc/$top/status; do sleep 0.01; done; touch /tmp/w.on; "
               " while :; do echo late; echo late >&2; sleep 0.01; done) & echo $! > /tmp/w.pid; "
               "sleep 1000 & echo $! > /tmp/s.pid; printf hi; echo err >&2; exit 3")
    r = loop.run_until_complete(sb.exec(command, timeout=120))
    assert (r.stdout, r.stderr, r.exit_code, r.timed_out) == ("hi", "err\n", 3, False), r
    r = loop.run_until_complete(sb.exec(
        "until [ -e /tmp/w.on ]; do sleep 0.01; done; kill -0 $(cat /tmp/w.pid) $(cat /tmp/s.pid) && echo running; "
        "kill $(cat /tmp/w.pid) $(cat /tmp/s.pid)", timeout=120))
    assert (r.stdout, r.exit_code) == ("running\n", 0), r
    r = loop.run_until_complete(sb.exec("sleep 1000 & echo hi", timeout=120))
    assert (r.stdout, r.exit_code, r.timed_out) == ("hi\n", 0, False), r
    left = loop.run_until_complete(sb.exec("pkill -x -f 'sleep 1000' && echo killed"))
    assert left.stdout == "killed\n"  # it was still running


def test_exec_marker_nonce_is_secret_and_a_killed_wrapper_still_reports(box, monkeypatch):
    import conch.sandbox.docker as docker_backend

    sb, loop = box
    monkeypatch.setattr(docker_backend, "new_nonce", lambda: "conch-end-" + "ab" * 16)
    # The command cannot read the nonce from any process's argv or environment, nor from its stdin.
    r = loop.run_until_complete(sb.exec(
        "printf 'conch-end-%s' $(printf 'ab%.0s' $(seq 16)) > /tmp/pat; "
        "grep -lsf /tmp/pat /proc/[0-9]*/cmdline /proc/[0-9]*/environ; cat; echo done"))
    assert (r.stdout, r.exit_code) == ("done\n", 0), r
    # The command kills the wrapper (the exec's top process): no markers; the engine's exit status is used.
    r = loop.run_until_complete(sb.exec(
        "top=$$; while p=$(cut -d' ' -f4 /proc/$top/stat) && [ \"$p\" != 0 ]; do top=$p; done; kill -9 $top",
        timeout=120))
    assert (r.exit_code, r.timed_out) == (137, False) and "conch-end" not in r.stdout + r.stderr, r


def test_no_network_and_limits(box):
    sb, loop = box
    r = loop.run_until_complete(sb.exec("ls /sys/class/net"))
    assert r.stdout.split() == ["lo"]
    r = loop.run_until_complete(sb.exec(
        "python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", 9), timeout=2)' 2>&1 | tail -1; "
        "python3 -c 'import socket; socket.create_connection((\"1.1.1.1\", 53), timeout=2)' 2>&1 | tail -1"))
    assert "Connection refused" in r.stdout and "Network is unreachable" in r.stdout
    c = di.client()
    info = c.api.inspect_container(sb.container)
    c.close()
    hc = info["HostConfig"]
    assert hc["NetworkMode"] == "none" and not info["NetworkSettings"].get("IPAddress")
    assert (hc["NanoCpus"], hc["Memory"], hc["PidsLimit"]) == (500_000_000, 300 * 2**20, 128)
    assert info["Config"]["Labels"][di.LABEL_KIND] == "sandbox"
    oom = loop.run_until_complete(sb.exec("python3 -c 'b = bytearray(600 * 2**20)'"))
    assert oom.exit_code == 137 and not oom.timed_out  # killed by the memory limit, not a timeout
    # RUN steps saw this machine's CA bundle (build ARGs); the running box's environment does not name it
    assert run_text(box, "cat /ca.sum").strip() == hashlib.sha256(di.build_ca_bundle()).hexdigest()
    assert run_text(box, "env | grep -c CERT || true").strip() == "0"


def test_persistent_shell(box):
    sb, loop = box

    async def go():
        sh = await sb.shell(cwd="/tmp", env={"A": "1"})
        try:
            got = [await sh.run("pwd; echo $A")]
            got.append(await sh.run("cd /app; V=5; f() { echo f$1; }; sleep 300 & true"))
            got.append(await sh.run("sleep 20", timeout=1))
            got.append(await sh.run("pwd; echo $V; f 2; jobs | wc -l"))
            # ignores SIGINT: the session escalates to SIGKILL through a control exec beside it
            got.append(await sh.run("bash -c \"trap '' INT; sleep 30\"", timeout=1))
            got.append(await sh.run("seq 1 50000; echo $V", output_cap=2000))
            return got
        finally:
            await sh.close()

    first, _, slow, after, stubborn, big = loop.run_until_complete(go())
    assert first.stdout == "/tmp\n1\n"
    assert slow.timed_out and slow.exit_code is None and slow.seconds < 6
    assert after.stdout == "/app\n5\nf2\n1\n" and after.exit_code == 0
    assert stubborn.timed_out and stubborn.exit_code is None and stubborn.seconds < 8
    assert big.truncated and big.stdout.startswith("1\n2\n") and big.stdout.endswith("50000\n5\n")


def test_upload_download_roundtrip(box, tmp_path):
    sb, loop = box
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "a.txt").write_text("A")
    (src / "sub" / "b.sh").write_text("#!/bin/sh\necho b\n")
    (src / "sub" / "b.sh").chmod(0o755)
    loop.run_until_complete(sb.upload(src, "/deep/new/dir"))
    loop.run_until_complete(sb.upload(src / "a.txt", "/deep/one.txt"))
    r = run_text(box, "cat /deep/new/dir/a.txt /deep/one.txt; /deep/new/dir/sub/b.sh; stat -c %a /tmp")
    assert r == "AAb\n1777\n"  # parents were created, existing folders' modes untouched
    loop.run_until_complete(sb.exec("mkdir -p /out/x && echo made > /out/x/f && ln -s f /out/x/l"))
    loop.run_until_complete(sb.download("/out", tmp_path / "dl"))
    assert (tmp_path / "dl" / "x" / "f").read_text() == "made\n" and os.readlink(tmp_path / "dl" / "x" / "l") == "f"
    loop.run_until_complete(sb.download("/deep/one.txt", tmp_path / "one.txt"))
    assert (tmp_path / "one.txt").read_text() == "A"
    with pytest.raises(FileNotFoundError):
        loop.run_until_complete(sb.download("/nope", tmp_path / "nope"))


def test_offline_verifier_toolchain(box):
    sb, loop = box
    test = "def test_a():\n    assert 1\n\ndef test_b():\n    assert 0\n"
    loop.run_until_complete(sb.exec(f"mkdir -p /t && printf '{test}' > /t/test_x.py"))
    summary = "import json; print(json.load(open('/t/a.json'))['results']['summary']['passed'])"
    r = loop.run_until_complete(sb.exec(f"cd /t && pytest --ctrf /t/a.json test_x.py -q; python3 -c \"{summary}\"",
                                        timeout=120))
    assert "1 failed, 1 passed" in r.stdout and r.stdout.strip().endswith("1"), r.stdout + r.stderr
    r = loop.run_until_complete(sb.exec("cd /t && uvx -p 3.11 -w pytest==8.4.1 -w pytest-json-ctrf==0.3.5 "
                                        "pytest --ctrf /t/b.json test_x.py -q", timeout=120))
    assert "1 failed, 1 passed" in r.stdout and r.exit_code == 1, r.stdout + r.stderr


def test_image_cached_by_content_and_standin_said_once(tmp_path, engine, capfd):
    env_dir = write_task_env(tmp_path / "e", "FROM ubuntu:24.04\nCOPY f /f\nRUN echo built-$(cat /f) > /g\n",
                             {"f": "1"})
    env = environment_of(env_dir, env_dir / "Dockerfile", None)
    first = di.ensure_env_image(env, "cache-test")
    err = capfd.readouterr().err
    assert err.count("FROM ubuntu:24.04 cannot be pulled here") == 1
    t0 = time.monotonic()
    assert di.ensure_env_image(env, "cache-test") == first  # reused: no build
    assert time.monotonic() - t0 < 2
    assert "cannot be pulled" not in capfd.readouterr().err  # said once per image
    (env_dir / "f").write_text("2")
    second = di.ensure_env_image(env, "cache-test")
    assert second != first

    async def read_g():
        sb = make_sandbox("docker", spec_for(env_dir, "cache-test"))
        await sb.start()
        try:
            return (await sb.exec("cat /g")).stdout
        finally:
            await sb.stop()

    assert run(read_g()) == "built-2\n"


def test_build_failure_and_unpullable_base_are_clear_errors(tmp_path, engine):
    bad = write_task_env(tmp_path / "bad", "FROM debian:bookworm\nRUN echo about-to-fail && exit 3\n")
    with pytest.raises(SandboxError, match=r"building bad-build failed(.|\n)*about-to-fail"):
        run(make_sandbox("docker", spec_for(bad, "bad-build")).start())
    alpine = write_task_env(tmp_path / "alp", "FROM alpine:3.19\n")
    with pytest.raises(SandboxError, match=r"FROM alpine:3.19 cannot be pulled"):
        run(make_sandbox("docker", spec_for(alpine, "alp")).start())


def test_multi_service_compose_is_unsupported(tmp_path, engine):
    d = write_task_env(tmp_path / "m", "FROM debian:bookworm\n")
    (d / "docker-compose.yaml").write_text("services:\n  client:\n    build: .\n  redis:\n    image: redis:7\n")
    sb = make_sandbox("docker", SandboxSpec(name="m", context_dir=d, dockerfile=d / "Dockerfile",
                                            compose_file=d / "docker-compose.yaml"))
    with pytest.raises(SandboxError, match="multi-service compose tasks are unsupported"):
        run(sb.start())
    run(sb.stop())  # stop after a failed start is harmless


_CHILD = """
import asyncio, signal, sys, time
signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal, even if our parent ignores SIGINT
from pathlib import Path
from conch.sandbox import SandboxSpec, make_sandbox
async def main():
    d = Path(sys.argv[1])
    sb = make_sandbox("docker", SandboxSpec(name="child", context_dir=d, dockerfile=d / "Dockerfile"))
    await sb.start()
    try:
        print(sb.container, flush=True)
        await asyncio.sleep(60)
    finally:
        await sb.stop()
asyncio.run(main())
"""


def _start_child(env_dir: Path) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, "-c", _CHILD, str(env_dir)], stdout=subprocess.PIPE, text=True,
                            cwd=REPO)
    name = proc.stdout.readline().strip()
    assert name.startswith("conch-child-"), name
    return proc, name


def _exists(name: str) -> bool:
    c = di.client()
    try:
        return bool(c.api.containers(all=True, filters={"name": name}))
    finally:
        c.close()


def test_ctrl_c_removes_the_container(app_env):
    proc, name = _start_child(app_env)
    assert _exists(name)
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=30)
    assert not _exists(name)


def test_gc_removes_what_a_killed_run_left(app_env):
    """`conch sandbox gc` (real CLI) removes the container of a SIGKILLed run and keeps a live run's."""
    proc, name = _start_child(app_env)
    proc.kill()  # SIGKILL: no clean-up ran
    proc.wait(timeout=30)
    assert _exists(name)

    async def live_one():
        sb = make_sandbox("docker", spec_for(app_env, "alive"))
        await sb.start()
        try:
            gc = await asyncio.to_thread(subprocess.run, [*CONCH, "sandbox", "gc"], capture_output=True, text=True,
                                         cwd=REPO, timeout=120)
            return gc, sb.container, _exists(sb.container)
        finally:
            await sb.stop()

    gc, alive, alive_kept = run(live_one())
    assert gc.returncode == 0, gc.stderr
    assert f"removed docker container {name}" in gc.stdout and alive not in gc.stdout and alive_kept
    assert not _exists(name)
    assert docker_gc().containers == []  # nothing left to remove


def _check(backend: str, agent: str) -> list[dict]:
    proc = subprocess.run([*CONCH, "check", str(REPO / "examples" / "tasks"), "--sandbox", backend, "--agent", agent,
                           "--jobs", "2", "--json"], capture_output=True, text=True, cwd=REPO, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [{k: r[k] for k in ("task", "n_passed", "n_total", "reward", "error")} for r in json.loads(proc.stdout)]


@pytest.mark.parametrize("agent", ["oracle", "nop"])
def test_same_results_as_the_local_backend(engine, agent):
    """`conch check --sandbox docker` and `--sandbox local` agree on every example task (real CLI)."""
    docker_results = _check("docker", agent)
    local_results = _check("local", agent)
    assert len(docker_results) >= 5
    assert docker_results == local_results
    if agent == "oracle":
        assert all(r["error"] is None and r["n_passed"] == r["n_total"] > 0 for r in docker_results)
    else:
        assert sum(r["n_passed"] for r in docker_results) < sum(r["n_total"] for r in docker_results)
