"""What a local sandbox must not be able to do: reach a network, touch the host's files or processes, or take
the machine down with a fork bomb, a memory hog, a disk fill or a busy loop. Every network check stays on
loopback (inside the box's own network namespace)."""

from __future__ import annotations

import asyncio
import os
import secrets
import time
from pathlib import Path

from conch.sandbox import SandboxSpec, make_sandbox
from conch.sandbox.base import Limits

REPO = Path(__file__).resolve().parents[1]


def run(coro):
    return asyncio.run(coro)


async def with_box(fn, limits: Limits | None = None, name: str = "contain"):
    box = make_sandbox("local", SandboxSpec(name=name, limits=limits or Limits()))
    await box.start()
    try:
        return await fn(box)
    finally:
        await box.stop()


def test_no_network_but_loopback(base_root):
    async def check(box):
        return await box.exec(
            "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '; echo routes=$(tail -n +2 /proc/net/route | wc -l);"
            "python3 - <<'EOF'\n"
            "import socket\n"
            "try:\n    socket.create_connection(('127.0.0.1', 9), timeout=2); print('connected')\n"
            "except OSError as e:\n    print('connect failed:', type(e).__name__)\n"
            "try:\n    socket.getaddrinfo('deb.debian.org', 80); print('resolved')\n"
            "except OSError as e:\n    print('resolve failed')\n"
            "EOF")

    r = run(with_box(check))
    lines = r.stdout.splitlines()
    assert lines[0] == "lo" and lines[1] == "routes=0", r.stdout
    assert "connect failed: ConnectionRefusedError" in r.stdout
    assert "resolve failed" in r.stdout and "resolved\n" not in r.stdout


def test_host_files_and_processes_are_out_of_reach(base_root):
    marker = f"conch-contain-{secrets.token_hex(4)}"
    host_pid = os.getpid()

    async def check(box):
        return await box.exec(
            f"echo x > /etc/{marker}; echo x >> /etc/passwd; mkdir -p {REPO} && echo x > {REPO}/{marker}; "
            f"echo x > /root/{marker}; ls {REPO}/pyproject.toml 2>&1; "
            f"kill -0 {host_pid} 2>&1 || echo no-host-pid; ps -e --no-headers | wc -l; "
            "mount -t tmpfs none /mnt && echo mounted-inside; "
            "echo 1 > /proc/sys/kernel/sysrq 2>&1 || echo proc-sys-readonly; touch /sys/x 2>&1 || echo sys-ro")

    passwd_before = Path("/etc/passwd").read_text()
    r = run(with_box(check))
    assert "No such file" in r.stdout, "the project folder is not visible in the box"
    assert "no-host-pid" in r.stdout
    assert int(r.stdout.split("no-host-pid\n")[1].split("\n")[0]) < 10, "only the box's own processes"
    assert "proc-sys-readonly" in r.stdout and "sys-ro" in r.stdout
    assert not Path(f"/etc/{marker}").exists() and not (REPO / marker).exists()
    assert not Path(f"/root/{marker}").exists()
    assert Path("/etc/passwd").read_text() == passwd_before
    assert marker not in Path("/proc/self/mountinfo").read_text()


def test_fork_bomb_is_contained(base_root):
    async def bomb(box):
        t0 = time.monotonic()
        # The command outlives its timeout, which kills its whole process group, bomb included. (A command
        # that exits returns at once and leaves its background jobs running, as a server must.)
        r = await box.exec("bomb() { bomb | bomb & }; bomb; sleep 30", timeout=6)
        peak = max(int((p / "pids.peak").read_text()) for p in box.cleanup().cgroups if (p / "pids.peak").exists())
        after = await box.exec("echo alive", timeout=30)
        return r, peak, after, time.monotonic() - t0

    r, peak, after, secs = run(with_box(bomb, Limits(pids=64), name="bomb"))
    assert peak <= 64 and r.timed_out
    assert after.stdout == "alive\n", "the box still works after the bomb"
    assert secs < 40


def test_memory_limit_kills_the_hog_not_the_box(base_root):
    async def hog(box):
        r = await box.exec("python3 -c 'x = bytearray(400 * 2**20); x[::4096] = b\"1\" * len(x[::4096]); "
                           "print(\"allocated\")'", timeout=60)
        alive = await box.exec("echo alive")
        return r, alive

    r, alive = run(with_box(hog, Limits(memory_mb=128), name="mem"))
    assert "allocated" not in r.stdout and r.exit_code != 0, r
    assert alive.stdout == "alive\n"


def test_disk_fill_is_contained(base_root):
    async def fill(box):
        r = await box.exec("dd if=/dev/zero of=/fill bs=1M count=300 2>&1; df -m / | tail -1; "
                           "dd if=/dev/zero of=/tmp/fill2 bs=1M count=50 2>&1 | tail -1", timeout=60)
        disk = box.state_dir / "disk.img"
        used = os.stat(disk).st_blocks * 512 if disk.exists() else 0
        alive = await box.exec("rm /fill && echo freed")
        return r, used, alive

    r, used, alive = run(with_box(fill, Limits(storage_mb=64), name="disk"))
    assert "No space left on device" in r.stdout, r.stdout
    size_mb = int(r.stdout.split("overlay")[1].split()[0])
    assert size_mb <= 64
    assert used <= 80 * 2**20, f"the host disk holds at most the storage limit, got {used} bytes"
    assert alive.stdout == "freed\n"


def _cpu_quota(cg) -> list[str]:
    """[quota, period] in microseconds, from cgroup v2's cpu.max or v1's cfs files."""
    if (cg / "cpu.max").exists():
        return (cg / "cpu.max").read_text().split()
    return [(cg / f"cpu.cfs_{k}_us").read_text().strip() for k in ("quota", "period")]


def test_cpu_quota(base_root):
    async def burn(box):
        r = await box.exec(
            "python3 -c 'import time,os\nt=time.time()\nwhile time.time()-t<1.5: pass\n"
            "c=os.times(); print((c.user+c.system)/(time.time()-t))'", timeout=30)
        paths = [p for p in box.cleanup().cgroups if (p / "cpu.stat").exists()]
        return r, [_cpu_quota(p) for p in paths], [(p / "cpu.stat").read_text() for p in paths]

    r, quotas, stats = run(with_box(burn, Limits(cpus=0.2), name="cpu"))
    assert quotas and quotas[0] == ["20000", "100000"], quotas
    share = float(r.stdout)
    assert share < 0.35, f"cpu share {share} with cpus=0.2"
    # On a loaded host the loop may never reach its quota (so is never throttled); when it ran near the quota,
    # the kernel must have throttled it.
    if share > 0.15:
        throttled = {k: int(v) for line in stats[0].splitlines() for k, v in [line.split()]}
        assert throttled["nr_throttled"] > 0, stats
