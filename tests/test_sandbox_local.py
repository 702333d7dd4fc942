"""The `local` backend (bubblewrap + overlay) end to end: isolation between boxes and from the host, exec,
files in and out, clean stop and crash leftovers, Dockerfile images with a build cache, and the offline
verifier toolchain (`pytest --ctrf` and `uvx ... pytest`)."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conch.sandbox import SandboxSpec, make_sandbox, paths
from conch.sandbox.base import SandboxError

REPO = Path(__file__).resolve().parents[1]


def run(coro):
    return asyncio.run(coro)


async def started(spec: SandboxSpec):
    box = make_sandbox("local", spec)
    await box.start()
    return box


def test_overlay_isolation_between_boxes_and_host(base_root):
    marker = f"conch-iso-{secrets.token_hex(4)}"

    async def main():
        a = await started(SandboxSpec(name="iso-a"))
        b = await started(SandboxSpec(name="iso-b"))
        try:
            r = await a.exec(f"echo A > /etc/{marker} && echo A > /usr/local/bin/{marker} && mkdir -p /app && "
                             f"echo A > /app/{marker} && echo A > /tmp/{marker} && rm /etc/debian_version && "
                             f"echo changed > /etc/hostname && cat /etc/{marker} /app/{marker}")
            assert r.exit_code == 0 and r.stdout == "A\nA\n", r
            seen_b = await b.exec(f"ls /etc/{marker} /usr/local/bin/{marker} /app/{marker} /tmp/{marker} 2>&1; "
                                  "cat /etc/debian_version /etc/hostname")
            assert seen_b.stdout.count("No such file") == 4, seen_b
            assert seen_b.stdout.endswith("iso-b\n")  # b's own /etc/hostname
            assert (await a.exec("test -e /etc/debian_version")).exit_code == 1
        finally:
            await a.stop()
            await b.stop()

    run(main())
    for p in (f"/etc/{marker}", f"/usr/local/bin/{marker}", f"/app/{marker}", f"/tmp/{marker}"):
        assert not Path(p).exists(), p
        assert not (base_root / p.lstrip("/")).exists(), p
    assert (base_root / "etc/debian_version").exists()
    assert (base_root / "etc/hostname").read_text() == "sandbox\n"


def test_hostname_resolves_inside(base_root):
    async def main():
        box = await started(SandboxSpec(name="my_box.1"))
        try:
            return await box.exec("hostname; cat /etc/hostname; getent hosts $(hostname) localhost")
        finally:
            await box.stop()

    r = run(main())
    assert r.stdout.splitlines()[:2] == ["my_box.1", "my_box.1"]
    assert "127.0.1.1       my_box.1" in r.stdout and "localhost" in r.stdout.splitlines()[3]


def test_exec_semantics(base_root):
    async def main():
        box = await started(SandboxSpec(name="exec", workdir="/work/dir", env={"FROM_SPEC": "s"}))
        try:
            r = await box.exec("pwd; echo $FROM_SPEC $EXTRA; echo oops >&2; exit 3", env={"EXTRA": "e"})
            assert (r.stdout, r.stderr, r.exit_code, r.timed_out) == ("/work/dir\ns e\n", "oops\n", 3, False)
            assert (await box.exec("pwd", cwd="/usr")).stdout == "/usr\n"
            assert (await box.exec("true", cwd="/does/not/exist")).exit_code == 125
            t0 = time.monotonic()
            r = await box.exec("echo started; (sleep 300; echo never) & sleep 300", timeout=1)
            assert r.timed_out and r.exit_code is None and r.stdout == "started\n"
            assert time.monotonic() - t0 < 5
            left = await box.exec("ps -eo args | grep -c '^sleep 300' || true")
            assert left.stdout.strip() == "0", "the timeout kills the command's whole process group"
            r = await box.exec("head -c 100000 /dev/zero | tr '\\0' y", output_cap=1000)
            assert r.truncated and r.stdout.startswith("y" * 400) and len(r.stdout) < 1100
            r = await box.exec("kill -9 $$")
            assert r.exit_code == 137
        finally:
            await box.stop()

    run(main())


def test_upload_and_download(base_root, tmp_path):
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "a.txt").write_text("alpha\n")
    (src / "sub" / "b.sh").write_text("#!/bin/sh\necho beta\n")
    (src / "sub" / "b.sh").chmod(0o755)
    (src / "link").symlink_to("a.txt")
    single = tmp_path / "single.txt"
    single.write_text("one\n")

    async def main():
        box = await started(SandboxSpec(name="files"))
        try:
            await box.upload(src, "/deep/new/tests")
            await box.upload(single, "/etc/single.txt")
            r = await box.exec("cat /deep/new/tests/a.txt /etc/single.txt; /deep/new/tests/sub/b.sh; "
                               "readlink /deep/new/tests/link; stat -c %U /deep/new/tests/a.txt")
            assert r.stdout == "alpha\none\nbeta\na.txt\nroot\n", r
            await box.exec("mkdir -p /out/logs && echo log > /out/logs/x.log && echo top > /out/top.txt")
            await box.download("/out", tmp_path / "got")
            await box.download("/out/top.txt", tmp_path / "top.txt")
            await box.download("/deep/new/tests", tmp_path / "roundtrip")
            with pytest.raises(SandboxError):
                await box.download("/no/such/file", tmp_path / "missing")
        finally:
            await box.stop()

    run(main())
    assert (tmp_path / "got" / "logs" / "x.log").read_text() == "log\n"
    assert (tmp_path / "top.txt").read_text() == "top\n"
    assert (tmp_path / "roundtrip" / "sub" / "b.sh").stat().st_mode & 0o111
    assert os.readlink(tmp_path / "roundtrip" / "link") == "a.txt"
    assert not (tmp_path / "missing").exists()


def _pids_in_pid_ns(ns_inode: str) -> list[int]:
    found = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if os.readlink(d / "ns" / "pid") == ns_inode:
                    found.append(int(d.name))
            except OSError:
                pass
    return found


def test_stop_leaves_no_process_mount_or_state(base_root):
    async def main():
        box = await started(SandboxSpec(name="stop"))
        sh = await box.shell()
        await sh.run("nohup sleep 1000 >/dev/null 2>&1 & (setsid sleep 1000 &) ; sleep 1000 &")
        ns = os.readlink(f"/proc/{box.init_pid}/ns/pid")
        state, cgroups = box.state_dir, list(box.cleanup().cgroups)
        assert len(_pids_in_pid_ns(ns)) >= 4
        await box.stop()
        await box.stop()  # idempotent
        return ns, state, cgroups

    ns, state, cgroups = run(main())
    deadline = time.monotonic() + 5
    while _pids_in_pid_ns(ns) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _pids_in_pid_ns(ns) == []
    assert not state.exists()
    assert all(not p.exists() for p in cgroups)
    assert str(state) not in Path("/proc/self/mountinfo").read_text()
    for backing in Path("/sys/block").glob("loop*/loop/backing_file"):
        assert str(state) not in backing.read_text()


CRASHER = """
import asyncio, json, sys, time
from conch.sandbox import SandboxSpec, make_sandbox
async def main():
    box = make_sandbox("local", SandboxSpec(name="crash"))
    await box.start()
    await box.exec("sleep 1000 >/dev/null 2>&1 &")
    print(json.dumps({"state": str(box.state_dir), "init": box.init_pid,
                      "cgroups": [str(p) for p in box.cleanup().cgroups]}), flush=True)
    time.sleep(1000)
asyncio.run(main())
"""


def test_crashed_owner_leftovers_are_collected(base_root):
    proc = subprocess.Popen([sys.executable, "-c", CRASHER], stdout=subprocess.PIPE, text=True, cwd=REPO)
    try:
        info = json.loads(proc.stdout.readline())
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    deadline = time.monotonic() + 5
    while Path(f"/proc/{info['init']}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not Path(f"/proc/{info['init']}").exists(), "the box dies with its owner"
    # Only the state folder is left behind. Any sandbox start (ours or a concurrent test's) also collects it,
    # so `gc` may find it already gone.
    out = subprocess.run([sys.executable, "-m", "conch", "sandbox", "gc"], capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 0, out
    assert not Path(info["state"]).exists()
    assert all(not Path(p).exists() for p in info["cgroups"])


def _drop_layers(lowers) -> None:
    """Delete the cached layers a test built (keeps the shared cache from growing with test runs)."""
    for diff in lowers:
        if diff.parent.parent == paths.layers_dir():
            shutil.rmtree(diff.parent, ignore_errors=True)
            Path(f"{diff.parent}.lock").unlink(missing_ok=True)


def test_dockerfile_image_cache_and_defaults(base_root, tmp_path):
    nonce = secrets.token_hex(6)
    ctx = tmp_path / "ctx"
    (ctx / "data").mkdir(parents=True)
    (ctx / "data" / "in.txt").write_text("input\n")
    (ctx / "skip.log").write_text("ignored\n")
    (ctx / ".dockerignore").write_text("*.log\n*.tar\n")
    (ctx / "src").mkdir()
    (ctx / "src" / "pkg.txt").write_text(f"packed {nonce}\n")
    subprocess.run(["tar", "-C", str(ctx), "-cf", str(ctx / "vendor.tar"), "src"], check=True)
    (ctx / "Dockerfile").write_text(
        "FROM python:3.12-slim\n"
        f"ENV NONCE={nonce} PATH=/app/bin:$PATH\n"
        "WORKDIR /app\n"
        "COPY . /app/\n"
        "RUN mkdir -p bin && printf '#!/bin/sh\\necho tool $NONCE\\n' > bin/tool && chmod +x bin/tool "
        "&& rm /etc/debian_version\n"
        "COPY --chown=nobody:nogroup --chmod=600 data/in.txt /secret.txt\n"
        "ADD vendor.tar /vendor/\n")
    spec = SandboxSpec(name="img", context_dir=ctx, dockerfile=ctx / "Dockerfile")

    lowers: list[Path] = []

    async def one() -> tuple[int, str, float]:
        box = await started(spec)
        lowers[:] = box.image.lowers[:4]  # the COPY/RUN/ADD layers (WORKDIR /app is shared with others)
        try:
            r = await box.exec("pwd; tool; cat data/in.txt; ls; test -e /etc/debian_version || echo gone; "
                               "stat -c '%U:%G %a' /secret.txt; cat /vendor/src/pkg.txt")
            return box.image.built_steps, r.stdout, box.start_seconds
        finally:
            await box.stop()

    try:
        built1, out1, _ = run(one())
        built2, out2, secs2 = run(one())
    finally:
        _drop_layers(lowers)
    assert built1 >= 4 and built2 == 0, "the second start must come entirely from the cache"
    expected = f"/app\ntool {nonce}\ninput\nDockerfile\nbin\ndata\nsrc\ngone\nnobody:nogroup 600\npacked {nonce}\n"
    assert out1 == expected and out2 == expected
    assert secs2 < 5


def test_failing_run_step_names_the_line(base_root, tmp_path):
    (tmp_path / "Dockerfile").write_text("FROM debian\nRUN true\nRUN echo boom-output && exit 7\n")
    box = make_sandbox("local", SandboxSpec(name="bad", context_dir=tmp_path, dockerfile=tmp_path / "Dockerfile"))
    with pytest.raises(SandboxError) as err:
        run(box.start())
    msg = str(err.value)
    assert f"{tmp_path / 'Dockerfile'}:3" in msg and "exit code 7" in msg and "boom-output" in msg


TESTS_PY = """
def test_pass():
    assert 1 + 1 == 2

def test_fail():
    assert False, "expected failure"
"""

TEST_SH = """#!/bin/bash
apt-get update >/dev/null 2>&1
curl -LsSf https://astral.sh/uv/0.9.5/install.sh 2>/dev/null | sh >/dev/null 2>&1
source $HOME/.local/bin/env
uvx -p 3.11 -w pytest==8.4.1 -w pytest-json-ctrf==0.3.5 pytest --ctrf /logs/verifier/ctrf-uvx.json /tests/test_outputs.py -rA
echo "uvx-rc=$?"
pytest --ctrf /logs/verifier/ctrf.json /tests/test_outputs.py -rA
echo "pytest-rc=$?"
pip install pytest==8.4.1 >/dev/null && echo pip-offline-ok
"""


def test_offline_verifier_toolchain(base_root, tmp_path):
    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "test_outputs.py").write_text(TESTS_PY)
    (tests / "test.sh").write_text(TEST_SH)

    async def main():
        box = await started(SandboxSpec(name="verifier", workdir="/app"))
        try:
            await box.upload(tests, "/tests")
            r = await box.exec("bash /tests/test.sh", timeout=120, cwd="/app")
            await box.download("/logs/verifier", tmp_path / "verifier")
            return r
        finally:
            await box.stop()

    r = run(main())
    assert "uvx-rc=1" in r.stdout and "pytest-rc=1" in r.stdout, r  # one test fails on purpose
    assert "pip-offline-ok" in r.stdout
    for name in ("ctrf.json", "ctrf-uvx.json"):
        summary = json.loads((tmp_path / "verifier" / name).read_text())["results"]["summary"]
        assert (summary["passed"], summary["failed"]) == (1, 1), name


def test_safe_extract_refuses_escapes(tmp_path):
    import io
    import tarfile

    from conch.sandbox.layerfs import safe_extract

    def archive(*members: tuple[str, bytes | None, str | None]) -> tarfile.TarFile:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tf:
            for name, data, link in members:
                info = tarfile.TarInfo(name)
                if link is not None:
                    info.type, info.linkname = tarfile.SYMTYPE, link
                    tf.addfile(info)
                else:
                    info.size = len(data or b"")
                    tf.addfile(info, io.BytesIO(data or b""))
        buf.seek(0)
        return tarfile.open(fileobj=buf)

    out = tmp_path / "out"
    out.mkdir()
    safe_extract(archive(("/abs/ok.txt", b"fine", None), ("d/link", None, "/etc")), out)
    assert (out / "abs" / "ok.txt").read_text() == "fine"
    for bad in (("../escape.txt", b"x", None), ("d/link/passwd", b"x", None)):
        with pytest.raises(SandboxError):
            safe_extract(archive(bad), out)
    assert not (tmp_path / "escape.txt").exists()
    assert Path("/etc/passwd").read_text() != "x"


def test_compose_service_env_workdir_and_multi_service_error(base_root, tmp_path):
    (tmp_path / "Dockerfile").write_text("FROM python:3.11\nWORKDIR /app\n")
    compose = tmp_path / "docker-compose.yaml"
    compose.write_text("services:\n  main:\n    build: .\n    working_dir: /srv/x\n    environment:\n      - FOO=bar\n")
    spec = SandboxSpec(name="compose", context_dir=tmp_path, dockerfile=tmp_path / "Dockerfile", compose_file=compose)

    async def main():
        box = await started(spec)
        try:
            return await box.exec("pwd; echo $FOO")
        finally:
            await box.stop()

    assert run(main()).stdout == "/srv/x\nbar\n"
    compose.write_text("services:\n  a:\n    build: .\n  b:\n    image: redis\n")
    with pytest.raises(SandboxError, match="2 services"):
        run(make_sandbox("local", spec).start())


def test_deep_layer_stack(base_root, tmp_path):
    nonce = secrets.token_hex(6)
    lines = ["FROM debian", f"ENV N={nonce}"]
    for i in range(90):
        (tmp_path / f"f{i}").write_text(f"{nonce} {i}\n")
        lines.append(f"COPY f{i} /layers/")
    (tmp_path / "Dockerfile").write_text("\n".join(lines) + "\n")

    lowers: list[Path] = []

    async def main():
        box = make_sandbox("local", SandboxSpec(name="deep", context_dir=tmp_path, dockerfile=tmp_path / "Dockerfile"))
        try:
            await box.start()
            lowers[:] = box.image.lowers
            return len(box.image.lowers), await box.exec("cat /layers/f0 /layers/f89; ls /layers | wc -l")
        finally:
            await box.stop()

    try:
        n_lowers, r = run(main())
    finally:
        _drop_layers(lowers)
    assert n_lowers == 91
    assert r.stdout == f"{nonce} 0\n{nonce} 89\n90\n", r
