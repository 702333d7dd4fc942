"""The `local` sandbox backend: bubblewrap over an overlay of the task image, no Docker needed.

Why one long-lived init per sandbox plus `nsenter`: every exec(), every shell session and the verifier must see
one filesystem and one pid namespace (a server the agent starts in the background must still answer when the
tests run). `start()` launches a tiny reaping bash as pid 1 of the box (see `bwrap.py` for the namespace
recipe); each command then joins its namespaces with `conch-enter` (enter.c: nsenter that drops capabilities)
and its cgroups before it runs. Killing that
pid 1 tears down the whole pid namespace, and with it every mount (they only ever existed in the box's private
mount namespace), so `stop()` leaves nothing behind; a crash leaves only a state folder under
CONCH_HOME/sandboxes/, which the next start or `conch sandbox gc` removes.

Storage is an overlay upper dir on a loop-mounted ext4 image of `limits.storage_mb` (a disk-full box gets
ENOSPC, the host disk is untouched beyond that size); memory, cpu and pids are cgroup limits.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import tarfile
import tempfile
import time
from contextlib import AbstractAsyncContextManager
from pathlib import Path

from conch.sandbox import paths
from conch.sandbox.base import DEFAULT_OUTPUT_CAP, Cleanup, ExecResult, SandboxError, SandboxSpec, VerifierSetup
from conch.sandbox.baseroot import RUNTIME_ENV
from conch.sandbox.compose import environment_of
from conch.sandbox.bwrap import (DEFAULT_PATH, BoxConfig, Cgroups, launcher_argv, proc_start_time, require_host,
                                 warn_once, write_id_maps)
from conch.sandbox.enter import enter_binary
from conch.sandbox.layerfs import lookup, place_download, safe_extract
from conch.sandbox.localbuild import LocalImage, build_image
from conch.sandbox.readback import CapWriter, ReadBackError
from conch.sandbox.shell import SHELL_ARGV, CappedBuffer, PersistentShell, pidfd_wait, settle, unread_bytes

_INIT = ("echo ready; exec >/dev/null 2>&1 </dev/null; trap : TERM INT HUP QUIT USR1 USR2; "
         "while :; do sleep 86400 & wait $!; done")
# Host-side wrapper that moves itself into the sandbox's cgroups, then execs conch-enter: cheaper than a
# preexec_fn, which forces a full fork() of the (possibly huge) Python process instead of vfork().
_JOIN = 'p=$$; while [ "$1" != -- ]; do echo "$p" > "$1" 2>/dev/null; shift; done; shift; exec "$@"'


@functools.cache
def _default_signals() -> tuple[str, ...]:
    """`env --default-signal=INT,QUIT` when the host's env has it (coreutils >= 8.31), else nothing.

    A process started in the background by a shell without job control (`conch train ... &` in a script, CI
    runners) inherits SIGINT and SIGQUIT *ignored*, and an ignored signal stays ignored across exec and cannot be
    reset by a shell. The persistent shell's interrupt ladder tells foreground work from background jobs by
    exactly those ignored signals, so everything in the box must start with them at their defaults."""
    try:
        ok = subprocess.run(["env", "--default-signal=INT,QUIT", "true"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, timeout=10).returncode == 0
    except (OSError, subprocess.SubprocessError):
        ok = False
    return ("env", "--default-signal=INT,QUIT") if ok else ()


def _children(pid: int) -> list[int]:
    try:
        return [int(x) for x in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _exit_code(rc: int | None) -> int | None:
    return 128 - rc if rc is not None and rc < 0 else rc


async def _drain(reader: asyncio.StreamReader, buf: CappedBuffer) -> None:
    while data := await reader.read(1 << 16):
        buf.feed(data)


async def process_exit(proc: asyncio.subprocess.Process) -> int:
    """Wait until `proc` itself exits. (`proc.wait()` also waits until every pipe is closed, which background
    children of the command can postpone forever.)"""
    if proc.returncode is None:
        await pidfd_wait(proc.pid)
    while proc.returncode is None:  # asyncio's child watcher reaps it a moment after the pidfd fires
        await asyncio.sleep(0.005)
    return proc.returncode


def release_pipes(proc: asyncio.subprocess.Process) -> None:
    """Close our ends of an exited process's pipes that background children of it still hold open."""
    transport = getattr(proc, "_transport", None)
    if transport is not None:
        transport.close()


class LocalSandbox:
    """`Sandbox` implementation on bubblewrap. See the module docstring for the design."""

    def __init__(self, spec: SandboxSpec) -> None:
        self.spec = spec
        self.name = spec.name
        self.image: LocalImage | None = None
        self.state_dir: Path | None = None
        self.init_pid: int | None = None
        self._launcher: asyncio.subprocess.Process | None = None
        self._cgroups: Cgroups | None = None
        self._env: dict[str, str] = {}
        self._cwd = "/"
        self._shells: list[PersistentShell] = []
        self.start_seconds = 0.0

    # --- lifecycle ---------------------------------------------------------------------------------------------

    async def start(self) -> None:
        if self.init_pid is not None:
            return
        t0 = time.monotonic()
        require_host()
        # A compose file (single service) may move the build and add env/working_dir; same rules as docker.
        envdef = environment_of(self.spec.context_dir, self.spec.dockerfile, self.spec.compose_file)
        if envdef.image and envdef.dockerfile is None:
            from conch.sandbox.standins import BASE_DESCRIPTION

            warn_once(f"image:{envdef.image}", f"compose image {envdef.image} runs on the local base root "
                                               f"({BASE_DESCRIPTION}; use --sandbox docker for the exact image)",
                      kind="note")
        self.image = await asyncio.to_thread(build_image, envdef.context_dir, envdef.dockerfile)
        gc_sandboxes()
        safe = re.sub(r"[^A-Za-z0-9_.-]", "-", self.name)[:40] or "box"
        sid = f"{safe}-{secrets.token_hex(4)}"
        state = paths.sandboxes_dir() / sid
        (state / "rw").mkdir(parents=True)
        (state / "merged").mkdir()
        self.state_dir = state
        limits = self.spec.limits
        try:
            disk, tmpfs_mb = await asyncio.to_thread(self._make_disk, state, limits.storage_mb)
            self._cgroups = Cgroups(sid)
            self._cgroups.create(limits)
            self._write_owner({})
            files = self._identity_files(state, safe[:63])
            cfg = BoxConfig(state_dir=state, lowers=self.image.lowers, disk_image=disk, tmpfs_mb=tmpfs_mb,
                            hostname=safe[:63], box_files=files, cgroup_views=self._cgroups.views())
            await self._launch(cfg)
        except BaseException:
            await self.stop()
            raise
        env = {**RUNTIME_ENV, "HOSTNAME": safe[:63], **dict(self.image.env), **envdef.env, **self.spec.env}
        self._env = env
        self._cwd = self.spec.workdir or envdef.workdir or self.image.workdir or "/"
        if self._cwd != self.image.workdir:
            await self.exec(f"mkdir -p -- {_q(self._cwd)}", cwd="/")
        self.start_seconds = time.monotonic() - t0

    async def _launch(self, cfg: BoxConfig) -> None:
        """Start the box's pid 1 from `cfg` inside this box's cgroups; sets `init_pid` (state_dir is cfg's)."""
        assert self._cgroups is not None and self.state_dir is not None
        state = self.state_dir
        with open(state / "launch.log", "wb") as log:
            self._launcher = await asyncio.create_subprocess_exec(
                "/bin/sh", "-c", _JOIN, "sh", *self._cgroups.procs_files(), "--", *_default_signals(),
                *launcher_argv(cfg, ["/bin/bash", "-c", _INIT], as_pid_1=True), stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=log, env={"PATH": DEFAULT_PATH})
        assert self._launcher.stdin is not None and self._launcher.stdout is not None
        write_id_maps(self._launcher.pid)
        self._launcher.stdin.write(b"go\n")
        await self._launcher.stdin.drain()
        try:
            line = await asyncio.wait_for(self._launcher.stdout.readline(), 60)
        except asyncio.TimeoutError:
            line = b""
        kids = _children(self._launcher.pid)
        if line.strip() != b"ready" or not kids:
            log_text = (state / "launch.log").read_text(errors="replace")[-2000:]
            raise SandboxError(f"local sandbox {self.name!r} failed to start: {log_text or line!r}")
        self.init_pid = kids[0]
        await self._seal()
        self._write_owner({"launcher_pid": self._launcher.pid,
                           "launcher_start": proc_start_time(self._launcher.pid),
                           "init_pid": self.init_pid, "init_start": proc_start_time(self.init_pid)})

    @property
    def launcher_pid(self) -> int | None:
        """Host pid of the box's launcher, whose mount namespace holds the box's mounted root (state/merged)."""
        return self._launcher.pid if self._launcher is not None and self._launcher.returncode is None else None

    @property
    def env(self) -> dict[str, str]:
        """The environment every command of the box starts with (image, task and conch defaults)."""
        return dict(self._env)

    @property
    def cwd(self) -> str:
        return self._cwd

    async def freeze(self) -> None:
        """Stop every process of the box where it stands (`thaw` resumes them)."""
        if self._cgroups is not None:
            await asyncio.to_thread(self._cgroups.freeze)

    async def thaw(self) -> None:
        if self._cgroups is not None:
            await asyncio.to_thread(self._cgroups.thaw)

    async def kill_processes(self) -> None:
        """Kill every process of the box, daemons and `setsid` children included (its pid namespace dies with
        its pid 1), but keep its files: they stay mounted wherever another namespace still holds them."""
        if self.init_pid is not None:
            try:
                os.kill(self.init_pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self._cgroups is not None:
            await asyncio.to_thread(self._cgroups.kill_all)

    def verification(self, setup: VerifierSetup) -> AbstractAsyncContextManager[LocalSandbox]:
        from conch.sandbox.local_verify import verifier_box

        return verifier_box(self, setup)

    async def _seal(self) -> None:
        """Make /proc/sys and its kin read-only in the box before any command runs in it (enter.c, --seal)."""
        proc = await asyncio.create_subprocess_exec(enter_binary(), "--seal", str(self.init_pid),
                                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        out, _ = await proc.communicate()
        if proc.returncode != 0:
            raise SandboxError(f"local sandbox {self.name!r}: could not make /proc/sys read-only: "
                               f"{out.decode(errors='replace').strip()[-500:]}")

    def _identity_files(self, state: Path, hostname: str) -> tuple[tuple[str, str], ...]:
        """/etc/hosts and /etc/hostname of this box (as Docker does): the image's hosts file plus a line that
        makes the box's own hostname resolve, copied into the box's writable layer (so writes to them count
        against its disk limit)."""
        assert self.image is not None
        found = lookup(list(self.image.lowers), ["etc", "hosts"])
        hosts = found.read_text(errors="replace") if found is not None and found.is_file() else ""
        if hosts and not hosts.endswith("\n"):
            hosts += "\n"
        (state / "hosts").write_text(hosts + f"127.0.1.1\t{hostname}\n")
        (state / "hostname").write_text(hostname + "\n")
        return ((str(state / "hosts"), "/etc/hosts"), (str(state / "hostname"), "/etc/hostname"))

    def _make_disk(self, state: Path, storage_mb: int) -> tuple[Path | None, int | None]:
        if os.path.exists("/dev/loop-control") and shutil.which("mkfs.ext4"):
            img = state / "disk.img"
            with open(img, "wb") as fh:
                fh.truncate(storage_mb << 20)
            proc = subprocess.run(["mkfs.ext4", "-q", "-F", "-m", "0", "-O", "^has_journal",
                                   "-E", "lazy_itable_init=1,lazy_journal_init=1,nodiscard", str(img)],
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            if proc.returncode == 0:
                return img, None
            warn_once("mkfs", f"mkfs.ext4 failed ({proc.stdout.strip()[:200]}); using a tmpfs for storage")
        else:
            warn_once("loop", "no loop devices (or mkfs.ext4); sandbox storage is a size-limited tmpfs (RAM)")
        return None, storage_mb

    def _write_owner(self, extra: dict) -> None:
        assert self.state_dir is not None
        info = {"name": self.name, "owner_pid": os.getpid(), "owner_start": proc_start_time(os.getpid()),
                "cgroups": [str(p) for p in (self._cgroups.paths if self._cgroups else [])], **extra}
        tmp = self.state_dir / "owner.json.tmp"
        tmp.write_text(json.dumps(info))
        os.replace(tmp, self.state_dir / "owner.json")

    async def stop(self) -> None:
        """Kill every process of the box (pid 1 first: the kernel then kills the namespace) and clean up."""
        for sh in self._shells:
            try:
                await asyncio.wait_for(sh.close(), 2)
            except Exception:  # noqa: BLE001 - the kill below covers it
                pass
        self._shells.clear()
        if self.init_pid is not None:
            try:
                os.kill(self.init_pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self._cgroups is not None:  # a frozen box dies of its SIGKILL only once thawed
            await asyncio.to_thread(self._cgroups.thaw)
        if self._launcher is not None:
            if self._launcher.returncode is None:
                try:
                    await asyncio.wait_for(self._launcher.wait(), 5)
                except asyncio.TimeoutError:
                    self._launcher.kill()
                    await self._launcher.wait()
            self._launcher = None
        if self._cgroups is not None:
            await asyncio.to_thread(self._cgroups.kill_all)
            await asyncio.to_thread(self._cgroups.remove)
            self._cgroups = None
        self.init_pid = None
        if self.state_dir is not None:
            await asyncio.to_thread(shutil.rmtree, self.state_dir, True)
            self.state_dir = None

    async def netns_pid(self) -> int:
        return self._require_started()  # pid 1 of the box

    def cleanup(self) -> Cleanup:
        cgroups = sorted(self._cgroups.paths if self._cgroups else [], key=lambda p: "memory" not in str(p))
        return Cleanup(dirs=(self.state_dir,) if self.state_dir else (), cgroups=tuple(cgroups))

    # --- processes ---------------------------------------------------------------------------------------------

    def _require_started(self) -> int:
        if self.init_pid is None:
            raise SandboxError(f"sandbox {self.name!r} is not started")
        return self.init_pid

    def nsenter_argv(self, script: str, cwd: str | None = None, limited: bool = True) -> list[str]:
        """Host argv running `bash -c script` in the box, in `cwd`, inside the box's cgroups.

        `limited=False` skips the pids cgroup (control commands must work during a fork bomb).
        """
        pid = self._require_started()
        files = self._cgroups.procs_files(limited) if self._cgroups else []
        # `cd` on the command's own first line keeps bash's error line numbers unchanged.
        text = f"cd -- {_q(cwd or self._cwd)} || exit 125; {script}"
        return ["/bin/sh", "-c", _JOIN, "sh", *files, "--", *_default_signals(),
                enter_binary(), str(pid), "--", "bash", "-c", text]

    async def spawn(self, script: str, *, cwd: str | None = None, env: dict[str, str] | None = None,
                    limited: bool = True, stdin: int = subprocess.DEVNULL) -> asyncio.subprocess.Process:
        """Start `bash -c script` in the box, in its own process group (host side), stdout/stderr piped."""
        return await asyncio.create_subprocess_exec(
            *self.nsenter_argv(script, cwd, limited), stdin=stdin, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, env={**self._env, **(env or {})}, start_new_session=True)

    async def exec(self, command: str, timeout: float = 60.0, cwd: str | None = None,
                   env: dict[str, str] | None = None, output_cap: int = DEFAULT_OUTPUT_CAP) -> ExecResult:
        """Returns when the command exits, whatever its background children still hold (pipes included):
        those keep running in the box, as on Docker, and what they print later is not this command's."""
        t0 = time.monotonic()
        proc = await self.spawn(command, cwd=cwd, env=env)
        out, err = CappedBuffer(output_cap), CappedBuffer(output_cap)
        assert proc.stdout is not None and proc.stderr is not None
        readers = asyncio.gather(_drain(proc.stdout, out), _drain(proc.stderr, err))
        timed_out = False
        try:
            await asyncio.wait_for(process_exit(proc), timeout)
        except asyncio.TimeoutError:
            timed_out = True
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            await process_exit(proc)
        await settle(readers, (out, err), pending=lambda: unread_bytes(proc))
        release_pipes(proc)
        return ExecResult(stdout=out.render().decode("utf-8", "replace"),
                          stderr=err.render().decode("utf-8", "replace"),
                          exit_code=None if timed_out else _exit_code(proc.returncode), timed_out=timed_out,
                          truncated=out.truncated or err.truncated, seconds=time.monotonic() - t0)

    async def shell(self, cwd: str | None = None, env: dict[str, str] | None = None) -> PersistentShell:
        transport = _NsenterShellTransport(self)
        await transport.start(cwd, env)
        session = await PersistentShell.open(transport)
        self._shells.append(session)
        return session

    # --- files -------------------------------------------------------------------------------------------------

    async def upload(self, src: Path, dest: str) -> None:
        src = Path(src)
        if not src.exists():
            raise SandboxError(f"upload: {src} does not exist")
        if not dest.startswith("/"):
            dest = f"{self._cwd.rstrip('/')}/{dest}"
        arcname = os.path.normpath(dest).lstrip("/")
        if not arcname or arcname == ".":
            raise SandboxError("upload: destination must not be /")

        def owned_by_root(info: tarfile.TarInfo) -> tarfile.TarInfo:
            info.uid = info.gid = 0
            info.uname = info.gname = "root"
            return info

        with tempfile.TemporaryFile() as tmp:
            def pack() -> None:
                with tarfile.open(fileobj=tmp, mode="w", format=tarfile.PAX_FORMAT) as tf:
                    tf.add(str(src), arcname=arcname, filter=owned_by_root)
                tmp.seek(0)

            await asyncio.to_thread(pack)
            parent = os.path.dirname("/" + arcname)
            proc = await self.spawn(f"mkdir -p -- {_q(parent)} && exec tar -C / -xpf -", cwd="/",
                                    stdin=subprocess.PIPE)
            assert proc.stdin is not None
            while chunk := tmp.read(1 << 20):
                proc.stdin.write(chunk)
                await proc.stdin.drain()
            proc.stdin.close()
            _, err = await proc.communicate()
        if proc.returncode != 0:
            raise SandboxError(f"upload {src} -> {dest} failed: {err.decode(errors='replace')[-1000:]}")

    async def download(self, src: str, dest: Path, max_bytes: int | None = None) -> None:
        dest = Path(dest)
        if not src.startswith("/"):
            src = f"{self._cwd.rstrip('/')}/{src}"
        norm = os.path.normpath(src)
        parent, name = os.path.split(norm)
        name = name or "."
        dest.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile() as tmp:
            proc = await self.spawn(f"exec tar -C {_q(parent or '/')} -cf - -- {_q(name)}", cwd="/")
            assert proc.stdout is not None and proc.stderr is not None
            err_task = asyncio.ensure_future(proc.stderr.read(64 * 1024))
            sink = CapWriter(tmp, max_bytes, f"download of {src}") if max_bytes is not None else tmp
            try:
                while chunk := await proc.stdout.read(1 << 20):
                    sink.write(chunk)
            except ReadBackError:
                os.killpg(proc.pid, signal.SIGKILL)
                await proc.wait()
                err_task.cancel()
                raise
            err = await err_task
            if await proc.wait() != 0:
                raise SandboxError(f"download {src} failed: {err.decode(errors='replace')[-1000:]}")
            tmp.seek(0)
            staging = Path(tempfile.mkdtemp(prefix=".conch-dl-", dir=dest.parent))
            try:
                def unpack() -> None:
                    with tarfile.open(fileobj=tmp) as tf:
                        safe_extract(tf, staging, owner=(os.getuid(), os.getgid()))

                await asyncio.to_thread(unpack)
                place_download(staging / name if name != "." else staging, dest)
            finally:
                shutil.rmtree(staging, ignore_errors=True)


def _q(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


class _NsenterShellTransport:
    """`ShellTransport` for a `PersistentShell` running inside a local sandbox."""

    def __init__(self, box: LocalSandbox) -> None:
        self.box = box
        self.proc: asyncio.subprocess.Process | None = None

    async def start(self, cwd: str | None, env: dict[str, str] | None) -> None:
        argv = " ".join(SHELL_ARGV)
        self.proc = await self.box.spawn(f"exec {argv}", cwd=cwd, env=env, stdin=subprocess.PIPE)
        assert self.proc.stdin and self.proc.stdout and self.proc.stderr
        self.stdin, self.stdout, self.stderr = self.proc.stdin, self.proc.stdout, self.proc.stderr

    async def control(self, script: str) -> None:
        proc = await self.box.spawn(script, cwd="/", limited=False)
        try:
            await asyncio.wait_for(proc.communicate(), 10)
        except asyncio.TimeoutError:
            os.killpg(proc.pid, signal.SIGKILL)

    async def wait_exit(self) -> None:
        if self.proc is not None:
            await process_exit(self.proc)

    async def terminate(self) -> int | None:
        proc = self.proc
        if proc is None:
            return None
        if proc.returncode is None:
            try:
                await asyncio.wait_for(process_exit(proc), 0.2)
            except asyncio.TimeoutError:
                for pid in [*_children(proc.pid), proc.pid]:  # the in-box bash first, then conch-enter
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                await process_exit(proc)
        release_pipes(proc)  # background jobs of the session may hold them open
        return _exit_code(proc.returncode)


def gc_sandboxes(force: bool = False) -> list[str]:
    """Remove state left by sandboxes whose owner process is gone (or all, with `force`). Returns their names."""
    removed: list[str] = []
    root = paths.sandboxes_dir()
    if not root.is_dir():
        return removed
    for d in sorted(root.iterdir()):
        try:
            info = json.loads((d / "owner.json").read_text())
        except (OSError, ValueError):
            try:
                young = time.time() - d.stat().st_mtime < 120
            except FileNotFoundError:
                continue  # its owner (or another gc) removed it meanwhile
            if young and not force:
                continue  # being created right now
            info = {}
        owner = info.get("owner_pid")
        if not force and owner and proc_start_time(owner) == info.get("owner_start"):
            continue
        for key in ("init", "launcher"):
            pid = info.get(f"{key}_pid")
            if pid and proc_start_time(pid) == info.get(f"{key}_start"):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        cg = Cgroups.from_paths(info.get("cgroups", []))
        cg.kill_all()
        cg.remove()
        shutil.rmtree(d, ignore_errors=True)
        removed.append(d.name)
    return removed
