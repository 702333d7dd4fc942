"""The local sandbox as a security boundary: root in a box is an unprivileged host uid with Docker's capability
set, cannot change the host kernel's settings or its own limits, cannot see other boxes, cannot write past its
disk limit through files placed in it, and its image build steps cannot reach the host's loopback services.

Every command runs as an agent turn would: in the box's persistent shell. Writes that would matter if they got
through use harmless values (the value already there, or an invalid one the kernel refuses), and the host
values are compared before and after. Network checks stay on loopback (the host's 127.0.0.1 and the build
network's own proxy port).
"""

from __future__ import annotations

import asyncio
import secrets
import socket
import subprocess
import threading
from pathlib import Path

import pytest

from conch.sandbox import SandboxSpec, make_sandbox
from conch.sandbox.base import Limits
from conch.sandbox.bwrap import ID_BASE
from conch.sandbox.localbuild import build_image

CAP_SYS_ADMIN = 21
# Docker's default capability set, as bits of /proc/<pid>/status.
DOCKER_CAPS = sum(1 << b for b in (0, 1, 3, 4, 5, 6, 7, 8, 10, 13, 18, 27, 29, 31))
REFUSED = ("Read-only file system", "Permission denied", "Operation not permitted", "No such file")


def run(coro):
    return asyncio.run(coro)


async def with_box(fn, limits: Limits | None = None, name: str = "secure", spec: SandboxSpec | None = None):
    box = make_sandbox("local", spec or SandboxSpec(name=name, limits=limits or Limits(memory_mb=512)))
    await box.start()
    shell = await box.shell()
    try:
        return await fn(box, shell)
    finally:
        await box.stop()


def host_uid(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Uid:"):
            return int(line.split()[1])
    raise AssertionError("no Uid line")


def test_box_root_is_an_unprivileged_host_uid_with_docker_capabilities(base_root):
    async def main(box, shell):
        r = await shell.run("id -u; grep -E '^(CapEff|CapBnd|NoNewPrivs):' /proc/self/status")
        init = await box.exec("grep -E '^(CapEff|CapPrm|NoNewPrivs):' /proc/1/status")
        return r.stdout, init.stdout, host_uid(box.init_pid)

    out, init_out, init_uid = run(with_box(main))
    fields = dict(line.split(":\t") for line in out.splitlines()[1:])
    assert out.splitlines()[0] == "0", out  # root inside
    assert init_uid == ID_BASE, init_uid  # ... and an unprivileged uid on the host
    for key in ("CapEff", "CapBnd"):
        assert int(fields[key], 16) == DOCKER_CAPS, fields
        assert not int(fields[key], 16) & (1 << CAP_SYS_ADMIN)
    assert fields["NoNewPrivs"] == "1", fields
    init = dict(line.split(":\t") for line in init_out.splitlines())
    # The box's pid 1 too (bwrap leaves its bounding set full, but no_new_privs caps what any exec can gain at
    # its permitted set).
    assert int(init["CapEff"], 16) == int(init["CapPrm"], 16) == DOCKER_CAPS and init["NoNewPrivs"] == "1", init


def test_kernel_settings_sys_and_proc_sys_cannot_be_changed(base_root):
    host = ("/proc/sys/kernel/core_pattern", "/proc/sys/fs/lease-break-time")
    before = {p: Path(p).read_text() for p in host}
    # The value already there (a write that got through changes nothing) and an invalid power state.
    writes = {**{p: before[p].strip() for p in host}, "/sys/power/state": "conch-invalid",
              "/proc/sysrq-trigger": "conch-invalid", "/proc/sys/kernel/shmmax": "4096",
              "/proc/sys/net/ipv4/ip_forward": "0"}

    async def main(box, shell):
        out = {}
        for cmd in ("mount -o remount,rw,bind /sys", "mount -o remount,rw /sys", "mount -o remount,rw /proc/sys",
                    "umount /proc/sys", "mount -t sysfs sysfs /mnt", "mount -t proc proc /mnt",
                    "unshare -Urm sh -c 'mount -o remount,rw /sys'",
                    "unshare -Urm sh -c 'mount -o remount,rw /proc/sys'"):
            out[cmd] = await shell.run(cmd + " 2>&1")
        for path, value in writes.items():
            out[path] = await shell.run(f"echo {value} > {path}")
        return out

    results = run(with_box(main))
    for what, r in results.items():
        assert r.exit_code not in (0, None), (what, r)
    for path in writes:
        assert any(e in results[path].stderr for e in REFUSED), (path, results[path])
    assert {p: Path(p).read_text() for p in host} == before


def test_own_cgroup_limits_are_read_only(base_root):
    async def main(box, shell):
        listing = await shell.run("find /sys/fs/cgroup -maxdepth 2 -name '*.max' -o -maxdepth 2 -name '*limit_in_bytes'"
                                  " -o -maxdepth 2 -name 'cpu.cfs_quota_us'")
        files = listing.stdout.split()
        # As an attacker would: remount first; then write back the value already there (harmless if it lands).
        await shell.run("for m in /sys /sys/fs/cgroup /sys/fs/cgroup/*; do mount -o remount,rw,bind $m; done"
                        " 2>/dev/null; true")
        tries = {f: await shell.run(f"v=$(cat {f}) && echo \"$v\" > {f}") for f in files}
        host = {p: (p / "memory.limit_in_bytes").read_text() for p in box.cleanup().cgroups if
                (p / "memory.limit_in_bytes").exists()}
        return files, tries, host

    files, tries, host = run(with_box(main, limits=Limits(memory_mb=256)))
    assert files, "the box shows its own cgroup limits"
    for f, r in tries.items():
        assert r.exit_code != 0 and any(e in r.stderr for e in REFUSED), (f, r)
    for value in host.values():
        assert int(value) == 256 << 20


def test_other_boxes_are_not_visible(base_root):
    other = f"neighbour-{secrets.token_hex(3)}"

    async def main():
        b = make_sandbox("local", SandboxSpec(name=other))
        await b.start()
        try:
            async def look(box, shell):
                return await shell.run(f"grep -rls {other} /sys /proc/[0-9]*/cgroup /proc/[0-9]*/mountinfo "
                                       f"/proc/mounts /etc 2>/dev/null; ls /sys/fs/cgroup/*/ 2>/dev/null | "
                                       f"grep -c conch-; true")
            return await with_box(look)
        finally:
            await b.stop()

    r = run(main())
    assert other not in r.stdout, r.stdout
    assert r.stdout.split()[-1] == "0", r.stdout  # no cgroup of any box (its own are shown as the root)


def test_memory_over_the_limit_is_killed_and_reported(base_root):
    async def main(box, shell):
        return await shell.run("python3 -c 'x = bytearray(2 << 30); print(len(x))'", timeout=120)

    r = run(with_box(main, limits=Limits(memory_mb=1024)))
    assert r.exit_code == 137 and not r.timed_out, r
    assert str(2 << 30) not in r.stdout


def test_files_placed_in_the_box_count_against_its_disk(base_root):
    """Every single-file mount point of the box: a 300 MiB write into a 100 MiB box fails or stays in the box."""
    async def main(box, shell):
        mounts = await shell.run("awk '{print $5}' /proc/self/mountinfo | while read m; do "
                                 "[ -f \"$m\" ] && echo \"$m\"; done; true")
        targets = sorted(set(mounts.stdout.split()) | {"/etc/hosts", "/etc/hostname"})
        results = {}
        for t in targets:
            results[t] = await shell.run(f"dd if=/dev/zero of={t} bs=1M count=300 2>&1; rm -f /big; "
                                         f": > {t} 2>/dev/null; true", timeout=120)
        used = subprocess.run(["du", "-sk", str(box.state_dir)], capture_output=True, text=True).stdout
        return targets, results, int(used.split()[0])

    targets, results, used_kib = run(with_box(main, limits=Limits(memory_mb=512, storage_mb=100)))
    for t, r in results.items():
        assert "300 MiB" not in r.stdout and "314572800 bytes" not in r.stdout, (t, r.stdout)
    assert used_kib < 130 * 1024, used_kib  # the 100 MiB disk image and the state folder, nothing more


def _listener() -> tuple[socket.socket, list]:
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    srv.settimeout(0.2)
    arrived: list = []

    def accept() -> None:
        while srv.fileno() != -1:
            try:
                conn, peer = srv.accept()
                arrived.append(peer)
                conn.close()
            except (TimeoutError, socket.timeout):
                continue
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    return srv, arrived


def test_build_steps_reach_the_proxy_but_not_the_host_loopback(base_root, tmp_path):
    srv, arrived = _listener()
    port = srv.getsockname()[1]
    probe = ("import socket\n"
             "def tcp(port):\n"
             "    try:\n"
             "        socket.create_connection(('127.0.0.1', port), 2).close()\n"
             "        return 'open'\n"
             "    except OSError as e:\n"
             "        return type(e).__name__\n"
             f"open('/probe.txt', 'w').write(tcp({port}) + ' ' + tcp(3128))\n")
    (tmp_path / "probe.py").write_text(probe)
    (tmp_path / "Dockerfile").write_text(
        f"FROM debian:trixie\n# {secrets.token_hex(4)}\nCOPY probe.py /probe.py\nRUN python3 /probe.py\n"
        "RUN grep -E '^(CapEff|NoNewPrivs)' /proc/self/status > /caps.txt; id -u >> /caps.txt\n")
    try:
        image = build_image(tmp_path, tmp_path / "Dockerfile", quiet=True)
    finally:
        srv.close()
    assert not arrived, arrived

    async def main(box, shell):
        return (await shell.run("cat /probe.txt")).stdout, (await shell.run("cat /caps.txt")).stdout

    probe_out, caps = run(with_box(main, spec=SandboxSpec(name="built", context_dir=tmp_path,
                                                           dockerfile=tmp_path / "Dockerfile")))
    host_result, proxy_result = probe_out.split()
    assert host_result != "open" and proxy_result == "open", probe_out
    fields = dict(line.split(":\t") for line in caps.splitlines()[:2])
    assert int(fields["CapEff"], 16) == DOCKER_CAPS and fields["NoNewPrivs"] == "1", caps
    assert image.lowers


@pytest.mark.parametrize("path", ["/etc/hosts", "/etc/hostname"])
def test_identity_files_are_writable_in_the_box(base_root, path):
    async def main(box, shell):
        return await shell.run(f"echo '127.0.0.2 extra' >> {path} && tail -1 {path}")

    r = run(with_box(main))
    assert r.exit_code == 0 and "extra" in r.stdout, r
