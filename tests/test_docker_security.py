"""The docker sandbox as a security boundary: root in a box cannot change the host kernel's settings, its own
limits, see other boxes, write past its disk limit through files the engine bind-mounts from the host, or reach
the host's loopback services from an image build step.

Needs a Docker engine (skips without one; fails in CI, CI=true, like tests/test_sandbox_docker.py). Every
network check stays on loopback: the host's 127.0.0.1 and the build network's own proxy port.
"""

from __future__ import annotations

import asyncio
import secrets
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest
from test_sandbox_docker import engine, write_task_env  # noqa: F401 - `engine` is a fixture

from conch.sandbox import SandboxError, SandboxSpec, make_sandbox
from conch.sandbox import docker_images as di
from conch.sandbox.base import Limits
from conch.sandbox.compose import Environment
from conch.sandbox.docker import BOX_CAPS, ENGINE_READONLY

CAP_SYS_ADMIN = 21
# Bits of Docker's default capability set (BOX_CAPS), as /proc/<pid>/status prints them.
CAP_BITS = {"CHOWN": 0, "DAC_OVERRIDE": 1, "FOWNER": 3, "FSETID": 4, "KILL": 5, "SETGID": 6, "SETUID": 7,
            "SETPCAP": 8, "NET_BIND_SERVICE": 10, "NET_RAW": 13, "SYS_CHROOT": 18, "MKNOD": 27, "AUDIT_WRITE": 29,
            "SETFCAP": 31}
READ_ONLY_ERRORS = ("Read-only file system", "Permission denied", "Operation not permitted")


def run(coro):
    return asyncio.run(coro)


async def with_box(fn, limits: Limits | None = None, name: str = "secure"):
    box = make_sandbox("docker", SandboxSpec(name=name, limits=limits or Limits(memory_mb=512)))
    await box.start()
    try:
        return await fn(box)
    finally:
        await box.stop()


def inspect(container: str) -> dict:
    c = di.client()
    try:
        return c.api.inspect_container(container)
    finally:
        c.close()


def test_box_root_is_unprivileged(engine):
    async def check(box):
        r = await box.exec("grep -E '^(CapEff|CapBnd|NoNewPrivs|Seccomp):' /proc/self/status")
        return dict(line.split(":\t") for line in r.stdout.splitlines()), inspect(box.container)["HostConfig"]

    status, hc = run(with_box(check))
    default_caps = sum(1 << CAP_BITS[name] for name in BOX_CAPS)
    for key in ("CapEff", "CapBnd"):
        assert int(status[key], 16) == default_caps, status
        assert not int(status[key], 16) & (1 << CAP_SYS_ADMIN), status
    assert status["NoNewPrivs"] == "1" and status["Seccomp"] == "2", status
    assert not hc["Privileged"] and hc["CapDrop"] == ["ALL"] and set(hc["CapAdd"]) <= set(BOX_CAPS), hc
    assert "no-new-privileges" in hc["SecurityOpt"] and hc["CgroupnsMode"] == "private", hc
    assert hc["ReadonlyPaths"][:len(ENGINE_READONLY)] == list(ENGINE_READONLY), hc["ReadonlyPaths"]
    assert {"/proc/kcore", "/proc/keys", "/sys/firmware"} <= set(hc["MaskedPaths"]), hc["MaskedPaths"]


def test_kernel_settings_and_sys_are_read_only(engine):
    host_files = ("/proc/sys/kernel/core_pattern", "/proc/sys/fs/lease-break-time", "/sys/power/state")
    before = {p: Path(p).read_text() for p in host_files}
    # Values that would be harmless if a write ever got through (an invalid one for /sys/power/state).
    writes = {"/proc/sys/kernel/core_pattern": "core.conch-test", "/proc/sys/fs/lease-break-time": "44",
              "/sys/power/state": "conch-invalid"}

    async def check(box):
        out = {}
        for path, value in writes.items():
            out[path] = await box.exec(f"echo {value} > {path}")
        for cmd in ("mount -o remount,rw /sys", "mount -o remount,rw /proc/sys", "umount /proc/sys",
                    "mount -t sysfs sysfs /mnt", "umount /etc/hostname"):
            out[cmd] = await box.exec(cmd)
        return out

    try:
        results = run(with_box(check))
    finally:
        for path, text in before.items():
            if Path(path).read_text() != text and path != "/sys/power/state":
                Path(path).write_text(text)  # restore, then fail below
    for what, r in results.items():
        assert r.exit_code not in (0, None), (what, r)
    for path in writes:
        assert any(e in results[path].stderr for e in READ_ONLY_ERRORS), (path, results[path])
    assert {p: Path(p).read_text() for p in host_files} == before


def test_own_cgroup_is_private_and_its_limits_read_only(engine):
    async def check(box):
        return await box.exec(
            "cat /proc/self/cgroup; for f in /sys/fs/cgroup/memory.max /sys/fs/cgroup/memory/memory.limit_in_bytes "
            "/sys/fs/cgroup/pids.max /sys/fs/cgroup/pids/pids.max; do [ -e $f ] || continue; "
            "before=$(cat $f); if echo max > $f; then echo \"wrote $f\"; fi; "
            "[ \"$(cat $f)\" = \"$before\" ] && echo \"kept $f=$before\"; done")

    r = run(with_box(check, Limits(memory_mb=256, pids=64)))
    cgroups = [line for line in r.stdout.splitlines() if line[:1].isdigit()]
    assert cgroups and all(line.endswith(":/") for line in cgroups), r.stdout  # the box is its cgroup's root
    assert "wrote" not in r.stdout and "Read-only file system" in r.stderr, r
    kept = [line for line in r.stdout.splitlines() if line.startswith("kept ")]
    assert any("memory" in line for line in kept) and any("pids" in line for line in kept), r.stdout
    assert f"={256 << 20}\n" in r.stdout and "=64\n" in r.stdout, r.stdout


def test_another_box_is_not_visible(engine):
    async def check():
        a = make_sandbox("docker", SandboxSpec(name="seer", limits=Limits(memory_mb=256)))
        b = make_sandbox("docker", SandboxSpec(name="hidden-neighbour", limits=Limits(memory_mb=256)))
        await a.start()
        try:
            await b.start()
            try:
                other_id = inspect(b.container)["Id"]
                own = await a.exec("cat /proc/self/cgroup")
                r = await a.exec(
                    f"for w in {b.container} {other_id[:12]} hidden-neighbour; do "
                    "timeout 60 grep -rlsF \"$w\" /sys/fs/cgroup /proc/mounts /proc/[0-9]*/cgroup "
                    "/proc/[0-9]*/mountinfo /etc/hosts /etc/hostname; "
                    "find /sys/fs/cgroup -name \"*$w*\"; done; echo scanned", timeout=120)
                return own, r
            finally:
                await b.stop()
        finally:
            await a.stop()

    own, r = run(check())
    assert own.exit_code == 0 and own.stdout.strip(), own
    assert r.stdout == "scanned\n" and r.exit_code == 0, r


def test_memory_limit_kills_an_oversized_allocation(engine):
    async def check(box):
        hog = await box.exec("python3 -c 'b = b\"x\" * (2 << 30); print(len(b))'", timeout=120)
        after = await box.exec("cat /sys/fs/cgroup/memory.events /sys/fs/cgroup/memory/memory.oom_control "
                               "2>/dev/null | grep -w oom_kill")
        return hog, after

    hog, after = run(with_box(check, Limits(memory_mb=1024)))
    assert hog.exit_code == 137 and not hog.timed_out and hog.stdout == "", hog
    assert after.exit_code == 0 and int(after.stdout.split()[-1]) >= 1, after  # the box goes on, OOM counted


@pytest.mark.parametrize("path", ["/etc/hostname", "/etc/hosts", "/etc/resolv.conf"])
def test_host_bind_mounted_files_do_not_bypass_the_disk_limit(engine, path):
    """300 MiB into a 100 MiB box through each network file: a bind mount from the engine's folder on the host
    must be read-only; a file in the box's own layer counts against the limit (ENOSPC or the watchdog)."""

    async def check(box):
        info = inspect(box.container)
        folder = Path(info["HostnamePath"]).parent
        bound = {p for key, p in (("HostnamePath", "/etc/hostname"), ("HostsPath", "/etc/hosts"),
                                  ("ResolvConfPath", "/etc/resolv.conf")) if info.get(key)}
        r = await box.exec(f"dd if=/dev/zero of={path} bs=1M count=300 2>&1; echo dd=$?", timeout=120)
        stopped = "disk limit" in r.stderr
        for _ in range(20):  # the watchdog polls every half second
            if stopped:
                break
            try:
                await box.exec("true")
            except SandboxError as exc:
                stopped = "disk limit" in str(exc)
                break
            await asyncio.sleep(0.25)
        used = int(subprocess.run(["du", "-sk", str(folder)], capture_output=True, text=True).stdout.split()[0])
        return path in bound, r, stopped, used

    bound, r, stopped, used_kib = run(with_box(check, Limits(storage_mb=100, memory_mb=256), name="bind-fill"))
    assert used_kib < 10 << 10, f"{used_kib} KiB in the engine's host folder of the box"
    if bound:
        assert "dd=1" in r.stdout and "Read-only file system" in r.stdout, r
    else:
        assert "No space left on device" in r.stdout or stopped, r


def test_network_files_an_engine_bind_mounts_are_made_read_only(engine, monkeypatch):
    """An engine that bind-mounts /etc/hosts and /etc/resolv.conf from its host folder (here: networking not
    disabled) gets them read-only too, so nothing written to them lands on the host."""
    import docker.api.client

    create = docker.api.client.APIClient.create_container

    def with_network(self, *args, **kwargs):
        return create(self, *args, **{**kwargs, "network_disabled": False})

    monkeypatch.setattr(docker.api.client.APIClient, "create_container", with_network)

    async def check(box):
        info = inspect(box.container)
        r = await box.exec("grep -E ' /etc/(hosts|resolv.conf) ' /proc/self/mountinfo | cut -d' ' -f5,6; "
                           "for f in /etc/hosts /etc/resolv.conf; do dd if=/dev/zero of=$f bs=1M count=300 2>&1; "
                           "done")
        used = subprocess.run(["du", "-sk", str(Path(info["HostnamePath"]).parent)], capture_output=True, text=True)
        return info, r, int(used.stdout.split()[0])

    info, r, used_kib = run(with_box(check, Limits(storage_mb=100, memory_mb=256), name="bound-files"))
    assert info["HostsPath"] and info["ResolvConfPath"], "the engine did not bind-mount them: nothing tested"
    options = dict(line.split(" ", 1) for line in r.stdout.splitlines() if line.startswith("/etc/"))
    assert {path: opts.split(",")[0] for path, opts in options.items()} == {"/etc/hosts": "ro",
                                                                            "/etc/resolv.conf": "ro"}, r
    assert r.stdout.count("Read-only file system") == 2 and used_kib < 10 << 10, (r, used_kib)


def test_build_steps_cannot_reach_the_hosts_loopback(tmp_path, engine):
    """A Dockerfile RUN step connects to a listener on the host's 127.0.0.1: nothing arrives; the step does
    reach the build network's registry proxy on its own 127.0.0.1:3128."""
    from conch.sandbox.network import PROXY_PORT

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.settimeout(0.2)
    port = listener.getsockname()[1]
    arrived: list[object] = []
    done = threading.Event()

    def accept() -> None:
        while not done.is_set():
            try:
                conn, peer = listener.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            arrived.append(peer)
            conn.close()

    acceptor = threading.Thread(target=accept, daemon=True)
    acceptor.start()
    probe = ("import socket, sys\n"
             "for port in map(int, sys.argv[1:]):\n"
             "    try:\n"
             "        socket.create_connection(('127.0.0.1', port), 2).close(); print(port, 'connected')\n"
             "    except OSError as e:\n"
             "        print(port, type(e).__name__)\n")
    env_dir = write_task_env(tmp_path / "env", f"""\
        FROM python:3.13-slim-bookworm
        COPY probe.py /probe.py
        RUN python3 /probe.py {port} {PROXY_PORT} > /result
        """, {"probe.py": probe})
    env = Environment(env_dir, env_dir / "Dockerfile")
    tag = None
    try:
        tag = di.ensure_env_image(env, f"loopback-probe-{secrets.token_hex(3)}", progress=lambda _: None)
        c = di.client()
        try:
            result = c.containers.run(tag, ["cat", "/result"], network_mode="none", remove=True).decode()
        finally:
            c.close()
    finally:
        done.set()
        acceptor.join(5)
        listener.close()
        if tag is not None:
            di.remove_env_image(env, "loopback-probe")
    assert arrived == [], f"a build step connected to the host's 127.0.0.1:{port}"
    assert result.splitlines() == [f"{port} ConnectionRefusedError", f"{PROXY_PORT} connected"], result
    assert not _build_holders(), "the build network's container was left behind"


def test_failed_build_removes_its_network_container(tmp_path, engine):
    env_dir = write_task_env(tmp_path / "env", f"""\
        FROM python:3.13-slim-bookworm
        RUN echo {secrets.token_hex(4)} && exit 3
        """)
    with pytest.raises(SandboxError, match="returned a non-zero code: 3"):
        di.ensure_env_image(Environment(env_dir, env_dir / "Dockerfile"), "failing-build", progress=lambda _: None)
    assert not _build_holders()


def _build_holders() -> list[str]:
    """Build network containers of this process still present."""
    from conch.sandbox.docker_images import owner_label

    c = di.client()
    try:
        found = c.api.containers(all=True, filters={"label": [f"{di.LABEL_KIND}=sandbox",
                                                              f"{di.LABEL_OWNER}={owner_label()}"]})
    finally:
        c.close()
    return [ct["Id"] for ct in found if (ct.get("Labels") or {}).get(di.LABEL_TASK, "").startswith("build network")]
