"""The `docker` sandbox backend: one container per sandbox, driven through the Docker Engine API.

Why the engine API and not the docker CLI: a `docker` subprocess per command costs a process start plus the
CLI's own start-up on top of the engine's exec, and a persistent shell would hold a CLI process per session.
Here one-shot commands are an exec created and started over the API socket, and a persistent shell is one
exec of bash whose hijacked API connection carries stdin and the multiplexed stdout/stderr frames, read
without blocking a thread, so `--jobs N` sessions cost N sockets and no threads.

Containers run with networking disabled (network_mode "none"), the task's CPU/memory/pids limits, and labels
(`io.conch.kind=sandbox`, `io.conch.owner=<host>:<pid>:<start time>`) so that `conch sandbox gc` can remove
whatever a crashed run left (conch/sandbox/docker_gc.py). Every container this process starts is also removed at
interpreter exit (Ctrl-C included).

The container is a security boundary: the agent is root inside it, so root there must not reach the host
kernel's settings, its own limits, other boxes or host files. Hence Docker's default capability set pinned
(no CAP_SYS_ADMIN: no mounts), no-new-privileges, the engine's default seccomp profile, a private cgroup
namespace (the box sees only its own cgroup, read-only), /proc/sys and /sys read-only, and the one file Docker
bind-mounts from its host folder (/etc/hostname; with networking disabled it mounts no hosts/resolv.conf)
read-only, since writes there would land on the host's disk outside the box's storage limit.
CONCH_DOCKER_RUNTIME names another OCI runtime for the containers (e.g. `runsc`, gVisor).
"""

from __future__ import annotations

import asyncio
import atexit
import functools
import os
import re
import socket
import struct
import sys
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from conch.sandbox.base import (BOX_CAPS, DEFAULT_OUTPUT_CAP, Cleanup, ExecResult, Sandbox, SandboxError, SandboxSpec,
                                ShellSession, VerifierSetup)
from conch.sandbox import docker_images as images
from conch.sandbox.compose import environment_of
from conch.sandbox.disk_watch import DiskWatch, watch_container
from conch.sandbox.exec_marker import UntilMarker, new_nonce, wrapped_argv
from conch.sandbox.docker_files import extract_download as _extract_download
from conch.sandbox.docker_files import get_archive as _get_archive
from conch.sandbox.docker_files import tar_for_upload as _tar_for_upload
from conch.sandbox.readback import CapWriter
from conch.sandbox.shell import SHELL_ARGV, CappedBuffer, PersistentShell, pidfd_wait

HOST_GRACE_S = 10.0  # host-side guard beyond a command's own timeout (the in-container `timeout` kills first)
# HostConfig.ReadonlyPaths replaces the engine's default list, so that list (moby oci/defaults.go) comes first.
ENGINE_READONLY = ("/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger")
# Files the engine may bind-mount from its own folder on the host (inspect key, path in the box).
HOST_FILES = (("HostnamePath", "/etc/hostname"), ("HostsPath", "/etc/hosts"), ("ResolvConfPath", "/etc/resolv.conf"))

# Engine calls block; they run on a pool of their own so that image builds (their own small pool) or a busy
# default executor never delay the short calls of other sandboxes (`--jobs N`).
_API_POOL = ThreadPoolExecutor(max_workers=32, thread_name_prefix="conch-docker-api")
_BUILD_POOL = ThreadPoolExecutor(max_workers=4, thread_name_prefix="conch-docker-build")


async def engine_call(fn: Any, *args: Any, **kwargs: Any) -> Any:
    return await asyncio.get_running_loop().run_in_executor(_API_POOL, functools.partial(fn, *args, **kwargs))


_storage_opt_ok = True  # until the engine refuses a disk quota once
live_containers: dict[str, Any] = {}  # container name -> docker client, for the exit-time safety net
live_lock = threading.Lock()


def _remove_live_containers() -> None:
    with live_lock:
        items = list(live_containers.items())
        live_containers.clear()
    for name, c in items:
        try:
            c.api.remove_container(name, force=True)
        except Exception:
            pass  # already gone, or the engine is gone; `conch sandbox gc` is the fallback


atexit.register(_remove_live_containers)


async def _read_frames(reader: asyncio.StreamReader, sinks: dict[int, Any], feed: str = "feed",
                       done: Any = None) -> None:
    """Demultiplex the engine's stdout(1)/stderr(2) frames from `reader` into `getattr(sinks[n], feed)`, until
    the stream ends or `done()` is true."""
    calls = {n: getattr(sink, feed) for n, sink in sinks.items()}
    while done is None or not done():
        try:
            header = await reader.readexactly(8)
        except (asyncio.IncompleteReadError, ConnectionError):
            return
        size = struct.unpack(">I", header[4:])[0]
        try:
            payload = await reader.readexactly(size)
        except asyncio.IncompleteReadError as exc:
            payload = exc.partial
        except ConnectionError:
            return
        call = calls.get(header[0])
        if call is not None and payload:
            call(payload)
        if len(payload) < size:
            return


async def _hijack(api: Any, exec_id: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Start exec `exec_id` and return the upgraded API connection as asyncio streams."""
    sock = await engine_call(api.exec_start, exec_id, socket=True)
    raw = getattr(sock, "_sock", sock)
    if not isinstance(raw, socket.socket):
        raise SandboxError(f"the Docker engine connection ({type(raw).__name__}) cannot be streamed; "
                           "use a unix:// or plain tcp:// DOCKER_HOST")
    raw.setblocking(False)
    return await asyncio.open_connection(sock=raw, limit=1 << 20)


async def _exit_code(api: Any, exec_id: str, tries: int = 100) -> tuple[int | None, int]:
    """(exit code, host pid) of a finished exec; the engine may report it a moment after the stream ends."""
    info: dict[str, Any] = {}
    for i in range(tries):
        info = await engine_call(api.exec_inspect, exec_id)
        if not info.get("Running"):
            return info.get("ExitCode"), int(info.get("Pid") or 0)
        await asyncio.sleep(0.002 if i < 5 else 0.02)
    return None, int(info.get("Pid") or 0)


async def _exec_pid(api: Any, exec_id: str, tries: int = 20) -> int:
    """Host pid of a started exec (the engine fills it in a moment after the start); 0 if not known."""
    for _ in range(tries):
        info = await engine_call(api.exec_inspect, exec_id)
        if info.get("Pid") or not info.get("Running", True) and info.get("ExitCode") is not None:
            return int(info.get("Pid") or 0)
        await asyncio.sleep(0.005)
    return 0


@dataclass
class _Finished:
    stdout: CappedBuffer
    stderr: CappedBuffer
    exit_code: int | None
    guard_hit: bool  # the host-side guard fired: the stream did not end in time


async def _run_once(api: Any, container: str, command: str, timeout: float, cwd: str | None = None,
                    env: dict[str, str] | None = None, output_cap: int = DEFAULT_OUTPUT_CAP) -> _Finished:
    """Run `bash -c command` under `timeout -s KILL timeout` in one exec, read until the command's end markers
    (exec_marker.py: background children may hold the stream open for seconds) or the host guard fires."""
    nonce = new_nonce()
    try:
        created = await engine_call(api.exec_create, container, wrapped_argv(command, timeout), stdin=True,
                              environment=env or None, workdir=cwd or None)
    except Exception as exc:  # noqa: BLE001 - the engine's reason is in the message
        raise SandboxError(f"cannot run a command in container {container}: {exc}") from exc
    out, err = CappedBuffer(output_cap), CappedBuffer(output_cap)
    marks = {1: UntilMarker(out, nonce), 2: UntilMarker(err, nonce)}
    reader, writer = await _hijack(api, created["Id"])
    guard_hit = False
    try:
        writer.write(nonce.encode() + b"\n")
        writer.write_eof()  # the command's stdin is empty
        await asyncio.wait_for(_read_frames(reader, marks, done=lambda: marks[1].seen and marks[2].seen),
                               timeout + HOST_GRACE_S)
    except asyncio.TimeoutError:
        guard_hit = True
    finally:
        writer.close()
    for mark in marks.values():
        mark.flush()
    if marks[1].seen and marks[2].seen:
        return _Finished(out, err, marks[1].status, False)
    # No markers (the wrapper was killed, or the box stopped): the engine reports the exit code once the
    # stream has ended, which background children holding it can delay by about 2 s.
    code, pid = await _exit_code(api, created["Id"], tries=3 if guard_hit else 100)
    if guard_hit and code is None:
        _kill_host_pid(pid)
    return _Finished(out, err, code, guard_hit)


class DockerShellTransport:
    """A `ShellTransport` (conch/sandbox/shell.py) over one interactive exec of bash: `stdin` is the hijacked
    API connection (closing it closes bash's stdin), `stdout`/`stderr` are fed by a pump that splits the
    engine's frames, and `control` runs a short script beside the session as a one-shot exec.

    bash runs under `setsid -w`: plain `setsid` forks when started as a group leader (an exec is), the exec's
    own process then exits, and the engine closes the streams two seconds later with bash still running. And
    `setsid -w` reports a bash killed by a signal as "setsid: child N did not exit normally: No such file or
    directory" with exit status 9. An exec's process already leads its own process group (the engine makes it
    a session leader), which is all the interrupt ladder needs, so bash runs as the exec's process itself."""

    def __init__(self, api: Any, container: str, exec_id: str, reader: asyncio.StreamReader,
                 writer: asyncio.StreamWriter) -> None:
        self._api, self._container, self._exec_id = api, container, exec_id
        self.stdin = writer
        self.stdout = asyncio.StreamReader(limit=1 << 24)
        self.stderr = asyncio.StreamReader(limit=1 << 24)
        self.box_pid: int | None = None  # bash's pid inside the container, set once the session answered
        self._pump = asyncio.ensure_future(self._run_pump(reader))

    @classmethod
    async def open(cls, api: Any, container: str, workdir: str | None = None,
                   env: dict[str, str] | None = None) -> "DockerShellTransport":
        argv = list(SHELL_ARGV[1:])  # without `setsid`: see the class docstring
        created = await engine_call(api.exec_create, container, argv, stdin=True, workdir=workdir or None,
                                          environment=env or None)
        reader, writer = await _hijack(api, created["Id"])
        return cls(api, container, created["Id"], reader, writer)

    async def _run_pump(self, reader: asyncio.StreamReader) -> None:
        try:
            await _read_frames(reader, {1: self.stdout, 2: self.stderr}, feed="feed_data")
        finally:
            self.stdout.feed_eof()
            self.stderr.feed_eof()

    async def control(self, script: str) -> None:
        await _run_once(self._api, self._container, script, timeout=10.0)

    async def wait_exit(self) -> None:
        """Returns when bash exits (seen through its host pid with a local engine; else when the stream ends)."""
        pid = await _exec_pid(self._api, self._exec_id) if engine_is_local(self._api) else 0
        if not (pid and await pidfd_wait(pid)):
            await asyncio.shield(self._pump)

    async def terminate(self) -> int | None:
        if not self._pump.done():
            if self.box_pid:
                try:  # bash leads its own process group; its foreground and background jobs are in it
                    await self.control(f"kill -KILL -- -{self.box_pid} {self.box_pid} 2>/dev/null")
                except Exception:  # noqa: BLE001 - the container may be gone already
                    pass
            self.stdin.close()
            try:
                await asyncio.wait_for(asyncio.shield(self._pump), 5.0)
            except asyncio.TimeoutError:
                self._pump.cancel()
        code, _pid = await _exit_code(self._api, self._exec_id, tries=10)
        return code


def engine_is_local(api: Any) -> bool:
    """True when the engine is reached over a unix socket: its process ids are this host's."""
    return str(getattr(api, "base_url", "")).startswith("http+docker://")


def _kill_host_pid(pid: int) -> None:
    """Best effort: kill an exec's process when the engine runs on this host (same pid namespace)."""
    if pid > 0:
        try:
            os.kill(pid, 9)
        except (ProcessLookupError, PermissionError):
            pass


def slug(name: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_.-]+", "-", name).strip("-.")[:40] or "task"


class DockerSandbox:
    """A Sandbox (see conch/sandbox/base.py) backed by one Docker container."""

    _entrypoint: tuple[str, ...] = ("sleep", "infinity")  # the idle init's child (a verifier box's: the image's)

    def __init__(self, spec: SandboxSpec) -> None:
        self.spec = spec
        self.name = spec.name
        self.image: str | None = None
        self.container: str | None = None  # name, known before the container exists (for cleanup)
        self._client: Any = None
        self._env: dict[str, str] = {}
        self._workdir: str | None = None
        self._shells: list[Any] = []
        self._quota_enforced = False  # the engine applied storage_opt size
        self._disk_watch: DiskWatch | None = None
        self._disk_error: str | None = None

    # ------------------------------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        if self.container is not None:
            raise SandboxError(f"sandbox {self.name} already started")
        spec = self.spec
        env = environment_of(spec.context_dir, spec.dockerfile, spec.compose_file)
        self._client = await engine_call(images.client)
        loop = asyncio.get_running_loop()
        self.image = await loop.run_in_executor(_BUILD_POOL, images.ensure_env_image, env, spec.name)
        config = (await engine_call(self._client.api.inspect_image, self.image)).get("Config") or {}
        image_env = dict(item.split("=", 1) for item in config.get("Env") or [] if "=" in item)
        from_base = (config.get("Labels") or {}).get(images.LABEL_FROM_BASE) == "1"
        self._env = {**(images.runtime_env(image_env) if from_base else {}), **env.env, **spec.env}
        self._workdir = spec.workdir or env.workdir
        self.container = f"conch-{slug(spec.name)}-{uuid.uuid4().hex[:10]}"
        with live_lock:
            live_containers[self.container] = self._client
        creating = asyncio.ensure_future(engine_call(self._create_and_start))
        try:
            await asyncio.shield(creating)
            if not self._quota_enforced:
                await self._watch_disk()
        except BaseException:
            try:  # on cancellation (Ctrl-C) let the engine call finish, so that the removal below sees it
                await creating
            except BaseException:  # noqa: BLE001 - its error is the one being raised already
                pass
            await self.stop()
            raise

    async def _watch_disk(self) -> None:
        """No engine quota here: enforce `storage_mb` with a watchdog on the writable layer (disk_watch.py)."""
        api, container = self._require()
        info = await engine_call(api.inspect_container, container)
        limit = self.spec.limits.storage_mb

        async def exceeded(used: int) -> None:
            self._disk_error = (f"disk limit: sandbox {self.name} wrote {used >> 20} MiB, over its {limit} MiB "
                                "storage limit; stopped")
            try:
                await engine_call(api.kill, container)
            except Exception:  # noqa: BLE001 - already gone
                pass

        self._disk_watch = watch_container(info, limit << 20, exceeded)

    def _create_and_start(self) -> None:
        import docker.errors

        api = self._client.api
        try:
            readonly = [*ENGINE_READONLY, "/etc/hostname"]
            self._create(readonly)
            api.start(self.container)
            info = api.inspect_container(self.container)  # the engine sets its files' paths at start
            bound = [path for key, path in HOST_FILES if info.get(key) and path not in readonly]
            if bound:  # this engine bind-mounts more host files despite network_disabled: those read-only too
                api.remove_container(self.container, force=True)
                self._create(readonly + bound)
                api.start(self.container)
        except docker.errors.APIError as exc:
            raise SandboxError(f"sandbox {self.name}: cannot start a container from {self.image}: {exc}") from exc

    def _create(self, readonly: list[str]) -> None:
        """Create the (unprivileged: see the module docstring) container; `readonly`: its ReadonlyPaths."""
        import docker.errors

        global _storage_opt_ok
        api, lim = self._client.api, self.spec.limits
        config = dict(network_mode="none", nano_cpus=int(lim.cpus * 1e9), mem_limit=f"{lim.memory_mb}m",
                      memswap_limit=f"{lim.memory_mb}m", pids_limit=lim.pids, init=True, privileged=False,
                      cap_drop=["ALL"], cap_add=list(BOX_CAPS), security_opt=["no-new-privileges"],
                      cgroupns="private", runtime=os.environ.get("CONCH_DOCKER_RUNTIME") or None)
        labels = {images.LABEL_KIND: "sandbox", images.LABEL_TASK: self.name,
                  images.LABEL_OWNER: images.owner_label()}
        while True:
            # A disk quota needs overlay2 on xfs with pquota; elsewhere the engine refuses it: say so once.
            storage = {"storage_opt": {"size": f"{lim.storage_mb}m"}} if _storage_opt_ok else {}
            host_config = api.create_host_config(**config, **storage)
            host_config["ReadonlyPaths"] = readonly  # MaskedPaths is left unset: the engine's defaults apply
            host_config.update(self._extra_host_config())
            try:
                self._quota_enforced = bool(storage)
                api.create_container(
                    self.image, name=self.container, entrypoint=list(self._entrypoint), detach=True,
                    environment=self._env, working_dir=self._workdir, labels=labels, network_disabled=True,
                    host_config=host_config)
                return
            except docker.errors.APIError as exc:
                if not storage or "storage-opt" not in str(exc).lower():
                    raise
                with live_lock:
                    said, _storage_opt_ok = not _storage_opt_ok, False
                if not said:
                    print(f"conch: note: the Docker engine cannot limit container disk size here "
                          f"({exc.explanation}); conch enforces storage limits with a watchdog on each "
                          "container's writable layer instead", file=sys.stderr, flush=True)

    def _extra_host_config(self) -> dict[str, Any]:
        """More HostConfig keys for `_create` (a verifier box's mounts: conch/sandbox/docker_verify.py)."""
        return {}

    def verification(self, setup: VerifierSetup) -> AbstractAsyncContextManager[Sandbox]:
        """A verifier container over a snapshot of this one (conch/sandbox/docker_verify.py)."""
        from conch.sandbox.docker_verify import verifier_box

        return verifier_box(self, setup)

    async def stop(self) -> None:
        if self._disk_watch is not None:
            await self._disk_watch.stop()
            self._disk_watch = None
        shells, self._shells = self._shells, []
        for sh in shells:
            try:
                await sh.close()
            except Exception:  # noqa: BLE001 - the container removal below ends it anyway
                pass
        name, client = self.container, self._client
        if client is None:
            return
        if name is not None:
            await engine_call(self._remove, client, name)
        self.container = self._client = None
        client.close()

    def _remove(self, client: Any, name: str) -> None:
        import docker.errors

        try:
            client.api.remove_container(name, force=True)
        except docker.errors.NotFound:
            pass
        except docker.errors.APIError as exc:
            if "already in progress" not in str(exc):
                raise SandboxError(f"sandbox {self.name}: cannot remove container {name}: {exc}") from exc
        with live_lock:
            live_containers.pop(name, None)

    def _require(self) -> tuple[Any, str]:
        if self._disk_error:
            raise SandboxError(self._disk_error)
        if self.container is None or self._client is None:
            raise SandboxError(f"sandbox {self.name} is not started")
        return self._client.api, self.container

    async def netns_pid(self) -> int:
        api, container = self._require()
        return int((await engine_call(api.inspect_container, container))["State"]["Pid"])

    def cleanup(self) -> Cleanup:
        if self.container is None or self._client is None:
            return Cleanup()
        cid = self._client.api.inspect_container(self.container)["Id"]
        return Cleanup(containers=(self.container,), cgroups=tuple(
            Path(p) for p in (f"/sys/fs/cgroup/memory/docker/{cid}", f"/sys/fs/cgroup/system.slice/docker-{cid}.scope",
                              f"/sys/fs/cgroup/docker/{cid}")))

    # ------------------------------------------------------------------------------------------ commands

    async def exec(
        self,
        command: str,
        timeout: float = 60.0,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        output_cap: int = DEFAULT_OUTPUT_CAP,
    ) -> ExecResult:
        api, container = self._require()
        t0 = time.monotonic()
        # `timeout` kills the command's whole process group inside the box; the host guard is a backstop.
        done = await _run_once(api, container, command, timeout, cwd=cwd, env=env, output_cap=output_cap)
        seconds = time.monotonic() - t0
        timed_out = done.guard_hit or (done.exit_code == 137 and seconds >= timeout)
        stderr = done.stderr.render().decode("utf-8", "replace")
        if self._disk_error:  # the watchdog stopped the box during this command
            stderr += ("\n" if stderr and not stderr.endswith("\n") else "") + f"conch: {self._disk_error}\n"
        return ExecResult(
            stdout=done.stdout.render().decode("utf-8", "replace"),
            stderr=stderr,
            exit_code=None if timed_out else done.exit_code,
            timed_out=timed_out,
            truncated=done.stdout.truncated or done.stderr.truncated,
            seconds=seconds,
        )

    async def shell(self, cwd: str | None = None, env: dict[str, str] | None = None) -> ShellSession:
        api, container = self._require()
        transport = await DockerShellTransport.open(api, container, workdir=cwd, env=env)
        session = await PersistentShell.open(transport)
        transport.box_pid = session.pid
        self._shells.append(session)
        return session

    # ------------------------------------------------------------------------------------------ files

    async def upload(self, src: Path, dest: str) -> None:
        api, container = self._require()
        src = Path(src)
        if not src.exists():
            raise FileNotFoundError(f"upload source {src} does not exist")
        target = PurePosixPath(dest if dest.startswith("/") else f"{self._workdir or '/'}/{dest}")
        spool = await engine_call(_tar_for_upload, src, str(target).lstrip("/"))
        try:
            ok = await engine_call(api.put_archive, container, "/", spool)
        finally:
            spool.close()
        if not ok:
            raise SandboxError(f"sandbox {self.name}: copying {src} to {target} failed")

    async def download(self, src: str, dest: Path, max_bytes: int | None = None) -> None:
        import docker.errors

        api, container = self._require()
        target = src if src.startswith("/") else f"{self._workdir or '/'}/{src}"
        with tempfile.TemporaryFile() as spool:
            try:
                sink = CapWriter(spool, max_bytes, f"download of {target}") if max_bytes is not None else spool
                await engine_call(_get_archive, api, container, target, sink)
                spool.seek(0)
            except docker.errors.NotFound as exc:
                raise FileNotFoundError(f"sandbox {self.name}: {target} does not exist") from exc
            await engine_call(_extract_download, spool, PurePosixPath(target).name or ".", Path(dest))
