"""`sandbox.network = "task"`: a task that sets `allow_internet = true` may reach package registries, nothing else.

Why a proxy and not a network interface: a sandbox must never reach arbitrary addresses (the host's services,
the local network, the rest of the internet). So its network namespace stays as it is (loopback only) and a
listening socket is created *inside* that namespace, on 127.0.0.1:PROXY_PORT, by a host thread that enters the
namespace just long enough to bind it (setns on /proc/<sandbox pid>/ns/net). Connections to it are served by
this process on the host: an HTTP proxy that accepts `CONNECT host:443` and plain `GET http://host/...` only for
the registry hosts in ALLOWED (PyPI, Debian, npm), and answers 403 to everything else. The sandbox's tools find
it through the usual HTTP(S)_PROXY variables; the offline pip/uv settings are turned off for such sandboxes.
Nothing runs inside the sandbox for this, and it works the same for both backends.

Image builds use the same proxy (`build_network`, `ProxyThread`): a task's Dockerfile `RUN` steps run in a
network namespace of their own with only loopback and the proxy, so a build step reaches the registries and
never the host's 127.0.0.1 (a vLLM server, Ray's job API, the Docker API) or any other address.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import fcntl
import socket
import struct
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace

from conch.sandbox.base import SandboxError, SandboxSpec

PROXY_PORT = 3128
NETWORK_POLICIES = ("never", "task")
# Package registries (host, port). CONCH_NETWORK_ALLOW (comma-separated host:port) replaces the list, e.g. to
# point at a mirror.
ALLOWED = tuple((h, p) for h in ("pypi.org", "files.pythonhosted.org", "deb.debian.org", "security.debian.org",
                                 "registry.npmjs.org") for p in (443, 80))
PROXY_ENV = {
    "HTTP_PROXY": f"http://127.0.0.1:{PROXY_PORT}",
    "HTTPS_PROXY": f"http://127.0.0.1:{PROXY_PORT}",
    "http_proxy": f"http://127.0.0.1:{PROXY_PORT}",
    "https_proxy": f"http://127.0.0.1:{PROXY_PORT}",
    "PIP_NO_INDEX": "0",
    "UV_OFFLINE": "0",
    "UV_NO_INDEX": "0",
}
_CLONE_NEWNET = 0x40000000
_SIOCGIFFLAGS, _SIOCSIFFLAGS, _IFF_UP = 0x8913, 0x8914, 0x1
_setns_lock = threading.Lock()


def allowed_hosts() -> tuple[tuple[str, int], ...]:
    raw = os.environ.get("CONCH_NETWORK_ALLOW")
    if not raw:
        return ALLOWED
    out = []
    for item in raw.split(","):
        host, _, port = item.strip().rpartition(":")
        if host and port.isdigit():
            out.append((host.lower(), int(port)))
    return tuple(out)


def is_allowed(host: str, port: int) -> bool:
    return (host.lower().rstrip("."), port) in allowed_hosts()


def granted(policy: str, allow_internet: bool) -> bool:
    """Whether a task's sandbox gets the registry proxy under `policy` ("never" | "task")."""
    if policy not in NETWORK_POLICIES:
        raise ValueError(f"unknown sandbox network policy {policy!r}; choose one of {', '.join(NETWORK_POLICIES)}")
    return policy == "task" and allow_internet


def with_registry_env(spec: SandboxSpec) -> SandboxSpec:
    return replace(spec, env={**spec.env, **PROXY_ENV})


def _listen_in_netns(pid: int) -> socket.socket:
    """A TCP socket listening on 127.0.0.1:PROXY_PORT inside the network namespace of process `pid`."""
    libc = ctypes.CDLL(None, use_errno=True)
    out: dict = {}

    def run() -> None:  # setns changes only this thread's namespace; it is undone before the thread ends
        try:
            with open("/proc/self/ns/net") as own, open(f"/proc/{pid}/ns/net") as target:
                if libc.setns(target.fileno(), _CLONE_NEWNET) != 0:
                    raise OSError(ctypes.get_errno(), f"setns into the network namespace of pid {pid}")
                try:
                    _loopback_up()
                    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                    sock.bind(("127.0.0.1", PROXY_PORT))
                    sock.listen(64)
                    sock.setblocking(False)
                    out["sock"] = sock
                finally:  # a thread that cannot return to its namespace ends right here anyway
                    libc.setns(own.fileno(), _CLONE_NEWNET)
        except OSError as exc:
            out["error"] = exc

    with _setns_lock:
        t = threading.Thread(target=run, name="conch-netns")
        t.start()
        t.join()
    if "error" in out or "sock" not in out:
        raise SandboxError(f"cannot open the registry proxy inside the sandbox: {out.get('error')}")
    return out["sock"]


def _loopback_up() -> None:
    """Bring `lo` up in the calling thread's network namespace (a fresh namespace starts with it down)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        req = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(s.fileno(), _SIOCGIFFLAGS, req))[1]
        if not flags & _IFF_UP:
            fcntl.ioctl(s.fileno(), _SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | _IFF_UP))


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(Exception):
            writer.close()


def _target(line: str) -> tuple[str, str, int, bool] | None:
    """(method, host, port, is_connect) of a proxy request line, or None when it is not one we serve."""
    parts = line.split()
    if len(parts) != 3:
        return None
    method, target = parts[0].upper(), parts[1]
    if method == "CONNECT":
        host, _, port = target.rpartition(":")
        return (method, host.strip("[]"), int(port), True) if port.isdigit() else None
    if target.lower().startswith("http://"):
        hostport = target[7:].split("/", 1)[0]
        host, sep, port = hostport.rpartition(":")
        if not sep or not port.isdigit():
            host, port = hostport, "80"
        return method, host, int(port), False
    return None


async def _serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
    except (asyncio.TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
        writer.close()
        return
    first = head.split(b"\r\n", 1)[0].decode("latin-1")
    target = _target(first)
    if target is None or not is_allowed(target[1], target[2]):
        what = f"{target[1]}:{target[2]}" if target else first[:80]
        body = f"conch: {what} is not a package registry; sandboxes may reach only those\n".encode()
        writer.write(b"HTTP/1.1 403 Forbidden\r\nContent-Type: text/plain\r\nConnection: close\r\n"
                     b"Content-Length: %d\r\n\r\n" % len(body) + body)
        with contextlib.suppress(Exception):
            await writer.drain()
        writer.close()
        return
    _, host, port, is_connect = target
    try:
        up_reader, up_writer = await asyncio.wait_for(asyncio.open_connection(host, port), 30)
    except (OSError, asyncio.TimeoutError) as exc:
        writer.write(f"HTTP/1.1 502 Bad Gateway\r\nConnection: close\r\n\r\nconch: {exc}\n".encode())
        writer.close()
        return
    if is_connect:
        writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
    else:
        up_writer.write(head)
    await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))


class RegistryProxy:
    """The proxy of one sandbox: started once the sandbox runs (its pid is known), closed with it."""

    def __init__(self) -> None:
        self._server: asyncio.AbstractServer | None = None

    async def start(self, pid: int) -> None:
        sock = await asyncio.to_thread(_listen_in_netns, pid)
        self._server = await asyncio.start_server(_serve, sock=sock)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 5)
            self._server = None


class ProxyThread:
    """A RegistryProxy inside the network namespace of `pid`, served by its own event loop on a daemon
    thread: for synchronous callers (image builds run in worker threads, outside any event loop)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._proxy = RegistryProxy()

    def __enter__(self) -> ProxyThread:
        loop = asyncio.new_event_loop()
        self._loop = loop
        self._thread = threading.Thread(target=loop.run_forever, name="conch-build-proxy", daemon=True)
        self._thread.start()
        try:
            asyncio.run_coroutine_threadsafe(self._proxy.start(self.pid), loop).result(30)
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(self._proxy.close(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
        self._loop = self._thread = None


@dataclass(frozen=True)
class BuildNet:
    """A held network namespace (loopback + the registry proxy) that build steps join by `netns` path."""

    netns: str
    env: dict[str, str]


@contextlib.contextmanager
def build_network() -> Iterator[BuildNet]:
    """A network namespace for local image builds: loopback only, the registry proxy on 127.0.0.1:PROXY_PORT.

    Held by a `sleep` in a namespace of its own (host side, created by `unshare --net`), so every RUN step of
    one build can join it and the proxy's socket lives as long as the build."""
    holder = subprocess.Popen(["unshare", "--net", "--", "sleep", "infinity"], stdin=subprocess.DEVNULL,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        mine = os.readlink("/proc/self/ns/net")
        deadline = time.monotonic() + 10
        while _netns_of(holder.pid) in (mine, None):
            if holder.poll() is not None or time.monotonic() > deadline:
                err = holder.stderr.read().decode(errors="replace").strip() if holder.stderr else ""
                raise SandboxError(f"cannot create the network namespace for image builds: {err or 'timed out'}")
            time.sleep(0.001)
        with ProxyThread(holder.pid):
            yield BuildNet(netns=f"/proc/{holder.pid}/ns/net", env=dict(PROXY_ENV))
    finally:
        holder.kill()
        holder.wait()


def _netns_of(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/net")
    except OSError:
        return None


class RegistryNetworkSandbox:
    """A sandbox (any backend) whose commands may reach the package registries through RegistryProxy."""

    registries = True  # read by conch.verify: the task's allow_internet was granted (registries only)

    def __init__(self, inner) -> None:
        self._inner = inner
        self._proxy = RegistryProxy()

    def __getattr__(self, name: str):
        return getattr(self._inner, name)

    async def start(self) -> None:
        await self._inner.start()
        try:
            await self._proxy.start(await self._inner.netns_pid())
        except BaseException:
            await self._inner.stop()
            raise

    async def stop(self) -> None:
        try:
            await self._proxy.close()
        finally:
            await self._inner.stop()
