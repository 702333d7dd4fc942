"""Docker images for the `docker` sandbox: the offline base and task environment builds.

Why this exists: nothing can be pulled from a container registry here, yet task Dockerfiles start with
`FROM python:3.13-slim-bookworm` or `FROM ghcr.io/laude-institute/t-bench/python-3-13`. So the base image is
made from Debian packages (the same debootstrap'd root as the `local` backend, `docker import`ed), and FROM
references that cannot be pulled are rewritten to it in a generated Dockerfile (conch/sandbox/docker_from.py,
plus what the original image sets, e.g. the t-bench images' WORKDIR /app: conch/sandbox/standins.py), saying so
once per image. What a task's environment is (its compose service) is conch/sandbox/compose.py's.

Task images are tagged by a content hash of everything that can change the result (generated Dockerfile,
the build context's files, the ids of the images it starts from), so a second run, or another task with the
same environment, reuses the image without asking the engine to build anything.

Builds never run with the host network: a RUN step of a task's Dockerfile could then reach the host's
127.0.0.1 (a vLLM server, Ray's job API). Each build's RUN steps join the network namespace of a holder
container (loopback only) in which conch's registry proxy listens (conch/sandbox/network.py: PyPI, Debian,
npm, nothing else), found through the proxy variables, which are Docker's predefined build ARGs (never stored
in the image). This machine's CA bundle is added to the context and exposed to RUN steps through build ARGs,
which the engine turns into environment variables for RUN but never stores in the image's configuration. The
CA file itself is the only thing added to task images.
"""

from __future__ import annotations

import fcntl
import hashlib
import io
import os
import socket
import sys
import tarfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from conch.sandbox.base import SandboxError
from conch.sandbox.compose import Environment
from conch.sandbox.docker_from import BUILD_DIR, GeneratedDockerfile, announce_standins, generate_dockerfile

BASE_REPO = "conch/base"
TASK_REPO = "conch/env"
LABEL_KIND = "io.conch.kind"  # "base" | "env" | "sandbox"
LABEL_TASK = "io.conch.task"
LABEL_FROM_BASE = "io.conch.from-base"  # "1" on the base, inherited by images built on it: gets its runtime env
LABEL_OWNER = "io.conch.owner"  # "<hostname>:<pid>" of the process that started a container
# Bumped when the way images are generated changes, so old cache entries are not reused.
GENERATION = "1"

Progress = Callable[[str], None]


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------------------------- engine


def engine_problem(timeout: float = 5.0) -> str | None:
    """Why no Docker engine answers (a sentence), or None when one does."""
    try:
        import docker

        client = docker.from_env(timeout=timeout)
        try:
            client.ping()
        finally:
            client.close()
    except Exception as exc:  # any failure means "no usable engine"; say which
        host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
        return f"no Docker engine answers at {host}: {type(exc).__name__}: {exc}"
    return None


def proc_start(pid: int) -> str | None:
    """Start time of process `pid` (clock ticks since boot), or None when it does not exist."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def owner_label() -> str:
    """`<host>:<pid>:<start time>` of this process, for `gc` to tell a crashed run from a live one."""
    return f"{socket.gethostname()}:{os.getpid()}:{proc_start(os.getpid()) or ''}"


def client(timeout: float = 3600.0) -> Any:
    """A docker SDK client, or SandboxError naming the engine address when none answers. `timeout` bounds one
    read from the engine (a build step that prints nothing for that long fails)."""
    import docker

    try:
        c = docker.from_env(timeout=timeout)
        c.ping()
    except Exception as exc:
        host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
        raise SandboxError(f"no Docker engine answers at {host} ({type(exc).__name__}: {exc}); "
                           "start one (e.g. `dockerd --bridge=none --iptables=false`)") from exc
    return c


# ----------------------------------------------------------------------------------------------- context


def context_paths(context_dir: Path, dockerfile_rel: str) -> list[str]:
    """Paths (relative, sorted) of the build context after .dockerignore, like the docker CLI sends."""
    from docker.utils.build import exclude_paths

    patterns: list[str] = []
    ignore = context_dir / ".dockerignore"
    if ignore.is_file():
        for line in ignore.read_text().splitlines():
            line = line.strip()
            if line and not line.startswith("#"):
                patterns.append(line)
    return sorted(exclude_paths(str(context_dir), patterns, dockerfile=dockerfile_rel))


def _hash_context(h: Any, root: Path, paths: list[str]) -> None:
    for rel in paths:
        p = root / rel
        st = p.lstat()
        h.update(b"\0" + os.fsencode(rel) + f"\0{st.st_mode & 0o170755:o}\0".encode())  # any file name
        if p.is_symlink():
            h.update(os.fsencode(os.readlink(p)))
        elif p.is_file():
            with open(p, "rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    h.update(chunk)


def _context_tar(root: Path | None, paths: list[str], dockerfile_text: str, ca: bytes) -> io.BytesIO:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for rel in paths:
            p = root / rel  # type: ignore[operator]
            info = tar.gettarinfo(str(p), arcname=rel)
            for what, name in (("file name", rel), ("link target", info.linkname)):
                try:  # the engine reads tar names as UTF-8; say which file instead of sending what it cannot read
                    name.encode("utf-8")
                except UnicodeEncodeError:
                    shown = os.fsencode(rel).decode("utf-8", "backslashreplace")
                    raise SandboxError(f"build context: {shown}: {what} is not valid UTF-8") from None
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            if info.isreg():
                with open(p, "rb") as f:
                    tar.addfile(info, f)
            else:
                tar.addfile(info)
        for name, data, mode in ((f"{BUILD_DIR}/Dockerfile", dockerfile_text.encode(), 0o644),
                                 (f"{BUILD_DIR}/ca.crt", ca, 0o644)):
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), mode
            tar.addfile(info, io.BytesIO(data))
    buf.seek(0)
    return buf


def build_ca_bundle() -> bytes:
    """This machine's CA bundle (SSL_CERT_FILE, else the Debian default), given to builds for TLS."""
    for cand in (os.environ.get("SSL_CERT_FILE"), os.environ.get("PIP_CERT"), "/etc/ssl/certs/ca-certificates.crt"):
        if cand and Path(cand).is_file():
            return Path(cand).read_bytes()
    return b""


# ----------------------------------------------------------------------------------------------- locks


_thread_locks: dict[str, threading.Lock] = {}
_thread_locks_guard = threading.Lock()


class _BuildLock:
    """One build per image at a time: a thread lock (same process) plus a file lock (other processes)."""

    def __init__(self, key: str) -> None:
        with _thread_locks_guard:
            self._tlock = _thread_locks.setdefault(key, threading.Lock())
        lock_dir = Path(os.environ.get("TMPDIR", "/tmp")) / "conch-docker-locks"
        lock_dir.mkdir(parents=True, exist_ok=True)
        self._path = lock_dir / f"{key.replace('/', '_').replace(':', '_')}.lock"
        self._fd: int | None = None

    def __enter__(self) -> "_BuildLock":
        self._tlock.acquire()
        self._fd = os.open(self._path, os.O_CREAT | os.O_RDWR, 0o666)
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
        self._tlock.release()


def _image_id(c: Any, ref: str) -> str | None:
    import docker.errors

    try:
        return c.images.get(ref).id
    except docker.errors.ImageNotFound:
        return None
    except docker.errors.APIError as exc:  # malformed references and the like
        if getattr(exc, "status_code", None) in (400, 404):
            return None
        raise


# ----------------------------------------------------------------------------------------------- builds


# Docker's predefined build ARGs among the proxy variables: RUN steps see them, the image does not keep them.
PROXY_BUILD_ARGS = ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy")


@contextmanager
def _build_network(c: Any, image: str, what: str) -> Iterator[str]:
    """The `network_mode` for one build's RUN steps: `container:<id>` of a holder container (network "none":
    loopback only) with the registry proxy open inside its namespace. The holder is labelled as a sandbox of
    this process (so `conch sandbox gc` removes it after a crash) and removed at the end."""
    import docker.errors

    from conch.sandbox.network import ProxyThread

    labels = {LABEL_KIND: "sandbox", LABEL_TASK: f"build network of {what}", LABEL_OWNER: owner_label()}
    holder = None
    try:
        try:
            holder = c.api.create_container(image, entrypoint=["sleep", "infinity"], detach=True, labels=labels,
                                            host_config=c.api.create_host_config(network_mode="none"))["Id"]
            c.api.start(holder)
            pid = int(c.api.inspect_container(holder)["State"]["Pid"] or 0)
        except docker.errors.APIError as exc:
            raise SandboxError(f"building {what}: cannot start the build network's container from {image}: "
                               f"{exc}") from exc
        if not pid or not os.path.exists(f"/proc/{pid}/ns/net"):
            raise SandboxError(f"building {what}: the build network needs the Docker engine on this machine "
                               f"(its container's pid {pid} is not a process here)")
        with ProxyThread(pid):
            yield f"container:{holder}"
    finally:
        if holder is not None:
            try:
                c.api.remove_container(holder, force=True)
            except docker.errors.APIError:
                pass  # already gone; `conch sandbox gc` is the fallback


def _run_build(c: Any, tag: str, fileobj: io.BytesIO, labels: dict[str, str], what: str,
               progress: Progress, holder_image: str) -> None:
    """Build in a registries-only network (`_build_network`, started from `holder_image`), streaming step
    lines to `progress`; SandboxError with the log tail."""
    import docker.errors

    from conch.sandbox.network import PROXY_ENV

    tail: list[str] = []
    buildargs = {k: PROXY_ENV[k] for k in PROXY_BUILD_ARGS}
    try:
        with _build_network(c, holder_image, what) as network_mode:
            for chunk in c.api.build(fileobj=fileobj, custom_context=True, dockerfile=f"{BUILD_DIR}/Dockerfile",
                                     tag=tag, network_mode=network_mode, buildargs=buildargs, rm=True,
                                     forcerm=True, pull=False, labels=labels, decode=True):
                if "error" in chunk:
                    tail.append(str(chunk["error"]).rstrip())
                    raise SandboxError(f"building {what} failed: {chunk['error'].strip()}\n"
                                       + "\n".join(tail[-40:]))
                text = chunk.get("stream")
                if text:
                    for line in text.rstrip("\n").split("\n"):
                        tail.append(line)
                        if line.startswith("Step ") and " : RUN " in line:  # the steps that take time
                            progress(f"  {what}: {line}")
                    del tail[:-200]
    except docker.errors.APIError as exc:
        raise SandboxError(f"building {what} failed: {exc}\n" + "\n".join(tail[-40:])) from exc


@dataclass(frozen=True)
class _Plan:
    tag: str
    dockerfile: GeneratedDockerfile
    context: Path | None
    paths: list[str]


def _plan(c: Any, env: Environment, what: str, base_ref: str) -> _Plan | str:
    """The content-hash tag and build inputs of `env`, or just the base reference when nothing is built."""
    if env.dockerfile is None:
        if env.image is None:
            return base_ref
        text, source, ctx = f"FROM {env.image}\n", f"{what} (compose image)", None
    else:
        try:
            text = env.dockerfile.read_text()
        except OSError as exc:
            raise SandboxError(f"{env.dockerfile}: cannot read Dockerfile: {exc}") from exc
        source, ctx = str(env.dockerfile), env.context_dir or env.dockerfile.parent
    gen = generate_dockerfile(text, base_ref, source, lambda ref: _image_id(c, ref) is not None,
                              build_args_for_standin())
    announce_standins(gen.standins, base_ref, source)
    paths: list[str] = []
    if ctx is not None:
        try:
            rel = str(env.dockerfile.resolve().relative_to(ctx.resolve()))  # type: ignore[union-attr]
        except ValueError:
            rel = "Dockerfile"
        paths = context_paths(ctx, rel)
    h = hashlib.sha256(f"conch-env {GENERATION}\0".encode())
    h.update(gen.text.encode())
    for parent in gen.parents:
        h.update(f"\0parent {parent} {_image_id(c, parent)}".encode())
    if ctx is not None:
        _hash_context(h, ctx, paths)
    return _Plan(f"{TASK_REPO}:{h.hexdigest()[:24]}", gen, ctx, paths)


def ensure_env_image(env: Environment, what: str, progress: Progress = _stderr) -> str:
    """The image reference for `env`, built (once, cached by content hash) if missing. `what` names it."""
    c = client()
    try:
        base_ref = ensure_base_image(c, progress)
        plan = _plan(c, env, what, base_ref)
        if isinstance(plan, str):
            return plan
        if _image_id(c, plan.tag):
            return plan.tag
        with _BuildLock(plan.tag):
            if _image_id(c, plan.tag):
                return plan.tag
            progress(f"conch: building image {plan.tag} for {what}")
            tar = _context_tar(plan.context, plan.paths, plan.dockerfile.text, build_ca_bundle())
            # LABEL_FROM_BASE is inherited from the base image by everything built on it
            _run_build(c, plan.tag, tar, {LABEL_KIND: "env", LABEL_TASK: what}, what, progress, base_ref)
        return plan.tag
    finally:
        c.close()


def remove_env_image(env: Environment, what: str) -> str | None:
    """Delete the cached image of `env` (e.g. one a benchmark built for itself); its tag, or None if absent."""
    import docker.errors

    c = client()
    try:
        base_ref = base_tag()
        if not _image_id(c, base_ref):
            return None
        plan = _plan(c, env, what, base_ref)
        if isinstance(plan, str) or not _image_id(c, plan.tag):
            return None
        try:
            c.api.remove_image(plan.tag)
        except docker.errors.APIError as exc:
            raise SandboxError(f"cannot remove image {plan.tag}: {exc}") from exc
        return plan.tag
    finally:
        c.close()


# ----------------------------------------------------------------------------------------------- base


def base_tag() -> str:
    """`conch/base:<recipe id>`: the local backend's base root recipe, so both backends share one toolchain."""
    from conch.sandbox import baseroot

    return f"{BASE_REPO}:{baseroot.recipe_id()}"


def base_image_env() -> dict[str, str]:
    """ENV of the base image: what python:* images set too. The offline package-tool settings of the local
    backend (baseroot.RUNTIME_ENV) are given to containers at start instead, so that RUN steps of task
    builds, which have network, are not forced offline."""
    from conch.sandbox.bwrap import DEFAULT_PATH

    return {"PATH": DEFAULT_PATH, "LANG": "C.UTF-8"}


def ensure_base_image(c: Any, progress: Progress = _stderr, force: bool = False) -> str:
    """The offline base image reference: the shared Debian base root (built first when missing, with
    debootstrap) `docker import`ed once per recipe."""
    from conch.sandbox import baseroot

    tag = base_tag()
    if not force and _image_id(c, tag):
        return tag
    with _BuildLock(tag):
        if not force and _image_id(c, tag):
            return tag
        tarball = baseroot.rootfs_tarball()
        progress(f"conch: importing the base image {tag} from {tarball}")
        changes = [f"ENV {k}={v}" for k, v in base_image_env().items()]
        changes += ['CMD ["bash"]', f"LABEL {LABEL_KIND}=base", f"LABEL {LABEL_FROM_BASE}=1"]
        try:
            c.api.import_image_from_file(str(tarball), repository=BASE_REPO, tag=tag.split(":", 1)[1],
                                         changes=changes)
        except Exception as exc:  # noqa: BLE001 - the engine's message says what is wrong
            raise SandboxError(f"docker import of {tarball} failed: {exc}") from exc
        if not _image_id(c, tag):
            raise SandboxError(f"docker import of {tarball} did not produce {tag}")
        c.api.tag(tag, BASE_REPO, "latest")
    return tag


def build_args_for_standin() -> dict[str, str]:
    """Build-time environment of RUN steps in stages that start from the base (the local builder's BUILD_ENV)."""
    from conch.sandbox import baseroot

    return {k: v for k, v in baseroot.BUILD_ENV.items() if k not in base_image_env() and k != "HOME"}


def runtime_env(image_env: dict[str, str]) -> dict[str, str]:
    """Defaults of a sandbox's environment (baseroot.RUNTIME_ENV) that the image does not set itself."""
    from conch.sandbox import baseroot

    return {k: v for k, v in baseroot.RUNTIME_ENV.items() if k not in image_env}
