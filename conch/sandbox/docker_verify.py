"""The `docker` backend's verifier box: a second container over a snapshot of the agent's, toolchain pristine.

Why a second container (as on `local`, conch/sandbox/local_verify.py): a process the agent left running could
rewrite the results while the tests run, a mid-episode measurement must not show the agent the tests, and what
the verifier runs must be the image's (conch/sandbox/verifier_view.py). So:

1. the agent's container is paused (cgroup freezer): nothing of it runs from here on;
2. `docker commit` (already paused) snapshots its filesystem into an image labelled for `gc`;
3. the plan (`verifier_view.plan`) is computed from two read-only views on this host: the task image's overlay
   layers (pristine) and the snapshot's (exactly the verifier container's lower filesystem);
4. a container of the snapshot is created, never started before its mounts are in place, with the agent
   container's limits and security options (the same `DockerSandbox._create`) and these mounts: each pristine
   path bound read-only from the image layer that holds it (a folder spread over several layers: a read-only
   overlay volume of them, mounted by the engine), masks as empty read-only host files and folders, the staged
   tests and run folders read-only, and size-capped tmpfs for the uv cache and the two results folders (the
   results ones as tmpfs volumes: the engine's archive API reads volumes, never a container's own tmpfs);
5. where the agent's filesystem has a link or a file where a mount needs a folder (or the like), a throwaway
   container of the snapshot gets the right empty entries by the engine's archive API and is committed again:
   no tool of the snapshot ever runs before the verifier's command. The container's idle init is tini plus the
   image's own `sleep`, bound pristine;
6. once the verifier container runs, a final verification kills the agent's container (`docker kill`; `stop`
   removes it later); a mid-episode one leaves it paused until the verifier container is gone, then unpauses.

A pristine folder that holds an "agent" path (a Python's site directory inside its standard library folder) is
not bound whole: each of its other entries is bound (or masked, or its link re-created) around the agent's own
sub-folder, which stays the snapshot's (writable, on the verifier container's size-limited writable layer).

Results come back with the verifier container paused, through the engine's archive API (links as links, nothing
followed, `DOWNLOAD_CAP` and `MAX_FILES` per folder, else `ReadBackError`). Needs an engine on this host with
overlay2 layers readable here (conch as root, like the `local` backend); elsewhere verification is refused with a
`SandboxError` naming why.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import io
import json
import os
import secrets
import shutil
import tarfile
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, AsyncIterator

from conch.sandbox import docker_images as images
from conch.sandbox.base import VERIFIER_RUN, SandboxError, VerifierSetup
from conch.sandbox.docker import DockerSandbox, engine_call, live_containers, live_lock, slug
from conch.sandbox.docker_files import extract_download, get_archive
from conch.sandbox.docker_layers import LayerStack, image_layers, pristine_tree, stack
from conch.sandbox.docker_layout import Entry, Layout, entries_of, layout
from conch.sandbox.readback import DOWNLOAD_CAP, MAX_FILES, CapWriter, ReadBackError
from conch.sandbox.verifier_view import TreeReader, path_dirs, plan, resolve

SNAPSHOT_REPO = "conch/snapshot"
KIND_SNAPSHOT = "snapshot"  # io.conch.kind of a snapshot image
KIND_VOLUME = "verify"  # io.conch.kind of a verifier box's volumes
RESULTS = (("logs", "/logs/verifier", "verifier"), ("warnings", "/var/log/conch", "conch"))  # field, box path, name
UV_CACHE = f"{VERIFIER_RUN}/uv-cache"
TMPFS_BYTES = DOWNLOAD_CAP
SLEEP = ("usr/bin/sleep", "bin/sleep")  # the image's, for the idle init
MOUNT_DATA_MAX = 4000  # an overlay volume's mount options must fit a page


@dataclass
class _Leftovers:
    """What one verification created, removed in reverse order at the end (whatever happened)."""

    images: list[str] = field(default_factory=list)
    containers: list[str] = field(default_factory=list)
    volumes: list[str] = field(default_factory=list)
    dirs: list[str] = field(default_factory=list)

    def remove(self, api: Any) -> None:
        """Best effort: what the engine refuses to remove now, `conch sandbox gc` removes later (labels)."""
        import docker.errors

        calls = [functools.partial(api.remove_container, ct, force=True) for ct in reversed(self.containers)]
        calls += [functools.partial(api.remove_volume, vol, force=True) for vol in reversed(self.volumes)]
        calls += [functools.partial(api.remove_image, img, force=True) for img in reversed(self.images)]
        for call in calls:
            with contextlib.suppress(docker.errors.APIError):
                call()
        for d in self.dirs:
            shutil.rmtree(d, ignore_errors=True)


def _labels(kind: str) -> dict[str, str]:
    return {images.LABEL_KIND: kind, images.LABEL_OWNER: images.owner_label()}


def _commit(api: Any, container: str) -> str:
    changes = [f"LABEL {k}={json.dumps(v)}" for k, v in _labels(KIND_SNAPSHOT).items()]
    return api.commit(container, repository=SNAPSHOT_REPO, tag=uuid.uuid4().hex[:16], pause=False,
                      changes=changes)["Id"]


def _fix_tar(fixes: list[tuple[str, str, str]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path, kind, target in fixes:
            info = tarfile.TarInfo(path)
            info.mtime = int(time.time())
            if kind == "dir":
                info.type, info.mode = tarfile.DIRTYPE, 0o755
            elif kind == "link":
                info.type, info.linkname, info.mode = tarfile.SYMTYPE, target, 0o777
            else:
                info.type, info.mode = tarfile.REGTYPE, 0o444
            tar.addfile(info, io.BytesIO(b"") if kind == "file" else None)
    return buf.getvalue()


def _apply_fixes(api: Any, image: str, fixes: list[tuple[str, str, str]], left: _Leftovers) -> str:
    """`image` with `fixes` written by the engine (archive API into a never-started container), committed."""
    ct = api.create_container(image, entrypoint=["/nonexistent"], network_disabled=True,
                              labels={**_labels("sandbox"), images.LABEL_TASK: "verifier snapshot fix"},
                              host_config=api.create_host_config(network_mode="none"))["Id"]
    left.containers.append(ct)
    if not api.put_archive(ct, "/", _fix_tar(fixes)):
        raise SandboxError("could not prepare the verifier's snapshot (archive refused)")
    fixed = _commit(api, ct)
    left.images.append(fixed)
    return fixed


def _overlay_volume(api: Any, lowers: list[str], left: _Leftovers) -> str:
    for p in lowers:
        if any(ch in p for ch in ",:\\\n"):
            raise SandboxError(f"docker verification: cannot overlay an image folder named {p!r}")
    data = "ro,lowerdir=" + ":".join(lowers)
    if len(data) > MOUNT_DATA_MAX:
        raise SandboxError(f"docker verification: a pristine folder spans too many layers ({len(lowers)})")
    name = f"conch-verify-{secrets.token_hex(6)}"
    api.create_volume(name, driver="local", driver_opts={"type": "overlay", "device": "overlay", "o": data},
                      labels=_labels(KIND_VOLUME))
    left.volumes.append(name)
    return name


def _results_volume(api: Any, left: _Leftovers) -> str:
    name = f"conch-verify-{secrets.token_hex(6)}"
    api.create_volume(name, driver="local", labels=_labels(KIND_VOLUME),
                      driver_opts={"type": "tmpfs", "device": "tmpfs",
                                   "o": f"size={TMPFS_BYTES},mode=1777,nosuid,nodev"})
    left.volumes.append(name)
    return name


def docker_mounts(api: Any, lay: Layout, layers: list[str], scratch: str, left: _Leftovers) -> list[dict]:
    """HostConfig.Mounts for `lay`: pristine paths from `layers` (the image's, top first) read-only."""
    empty_file, empty_dir = os.path.join(scratch, "empty"), os.path.join(scratch, "emptydir")
    out: list[dict] = []

    def bind(source: str, target: str, layer: bool = False) -> None:
        # The engine wants a slave mount for a source below its own root folder (the image's layers).
        out.append({"Type": "bind", "Source": source, "Target": "/" + target, "ReadOnly": True,
                    "BindOptions": {"Propagation": "rslave" if layer else "rprivate"}})

    for e in lay.mounts:
        if e.kind == "pristine":
            found = stack(layers, e.source)
            if not found or found[0][1] != e.need:
                raise SandboxError(f"docker verification: {e.source} is not in the image's layers as a {e.need}")
            if len(found) == 1:
                bind(found[0][0], e.path, layer=True)
            else:
                vol = _overlay_volume(api, [p for p, _ in found], left)
                out.append({"Type": "volume", "Source": vol, "Target": "/" + e.path, "ReadOnly": True,
                            "VolumeOptions": {"NoCopy": True}})
        elif e.kind == "mask-file":
            bind(empty_file, e.path)
        elif e.kind == "mask-dir":
            bind(empty_dir, e.path)
        elif e.kind == "bind":
            bind(e.source, e.path)
        elif e.kind == "volume":
            out.append({"Type": "volume", "Source": _results_volume(api, left), "Target": "/" + e.path,
                        "ReadOnly": False, "VolumeOptions": {"NoCopy": True}})
        elif e.kind != "tmpfs":
            raise SandboxError(f"docker verification: unknown mount kind {e.kind!r}")
    return out


class VerifierContainer(DockerSandbox):
    """The verifier box: a `DockerSandbox` bound to a container of the agent's snapshot (see the module
    docstring). Opened by `verifier_box` only."""

    def __init__(self, agent: DockerSandbox, image: str, mounts: list[dict], tmpfs: dict[str, str],
                 entrypoint: tuple[str, ...]) -> None:
        super().__init__(agent.spec)
        self.name = f"{agent.name}-verifier"
        self.image = image
        self._env = dict(agent._env)
        self._workdir = agent._workdir
        self._mounts, self._tmpfs = mounts, tmpfs
        self._entrypoint = entrypoint
        self.timings: dict[str, float] = {}

    def _extra_host_config(self) -> dict[str, Any]:
        return {"Mounts": self._mounts, "Tmpfs": self._tmpfs}

    async def start(self) -> None:  # noqa: D102 - see `open`
        raise SandboxError("a verifier box is opened with conch.sandbox.docker_verify.verifier_box")

    def verification(self, setup: VerifierSetup):  # noqa: ANN201
        raise SandboxError("a verifier box has no verifier box of its own")

    async def open(self) -> None:
        self._client = await engine_call(images.client)
        self.container = f"conch-{slug(self.name)[:30]}-v{uuid.uuid4().hex[:10]}"
        with live_lock:
            live_containers[self.container] = self._client
        creating = asyncio.ensure_future(engine_call(self._create_and_start))
        try:
            await asyncio.shield(creating)
            if not self._quota_enforced:
                await self._watch_disk()
        except BaseException:
            with contextlib.suppress(BaseException):
                await creating
            await self.stop()
            raise

    async def collect(self, setup: VerifierSetup) -> None:
        """Pause the verifier container, then copy its results folders into `setup`'s (links as links)."""
        api, container = self._require()
        await _pause(api, container)
        await asyncio.gather(*(engine_call(read_back, api, container, box_path, top, Path(getattr(setup, name)))
                               for name, box_path, top in RESULTS))


def read_back(api: Any, container: str, box_path: str, top: str, dest: Path) -> None:
    """Folder `box_path` of `container` into the new host folder `dest`, through the engine's archive API."""
    import docker.errors

    with tempfile.TemporaryFile() as spool:
        try:
            get_archive(api, container, box_path, CapWriter(spool, DOWNLOAD_CAP, f"verifier results {box_path}"))
        except docker.errors.NotFound:
            dest.mkdir(parents=True, exist_ok=True)
            return
        spool.seek(0)
        with tarfile.open(fileobj=spool) as tar:
            for n, member in enumerate(tar):
                if n > MAX_FILES:
                    raise ReadBackError(f"verifier results {box_path} hold over {MAX_FILES} entries (listing cap)")
                if n == 0 and not (member.name.rstrip("/") == top and member.isdir()):
                    raise ReadBackError(f"verifier results {box_path} is not a folder (not followed)")
        spool.seek(0)
        extract_download(spool, top, dest)
    dest.mkdir(parents=True, exist_ok=True)


def _sleep_path(pristine: TreeReader) -> str:
    for rel in SLEEP:
        found = resolve(pristine, rel)
        if found is not None and pristine.kind(found) == "file":
            return found
    raise SandboxError("docker verification: the image has no sleep (usr/bin/sleep) for the verifier's idle init")


def prepare(api: Any, agent_container: str, setup: VerifierSetup, left: _Leftovers,
            timings: dict[str, float]) -> tuple[str, list[dict], dict[str, str], tuple[str, ...]]:
    """Snapshot the (paused) agent container and work out the verifier container: (image, mounts, tmpfs,
    entrypoint). Blocking; run in the API pool."""
    t = time.monotonic()
    image = api.inspect_container(agent_container)["Image"]
    layers = image_layers(api, image)
    snapshot = _commit(api, agent_container)
    left.images.append(snapshot)
    timings["commit"] = time.monotonic() - t
    t = time.monotonic()
    pristine = pristine_tree(tuple(layers))
    agent = LayerStack(image_layers(api, snapshot))
    sleep = _sleep_path(pristine)
    entries = [Entry(sleep, "pristine", sleep, "file")]
    env = dict(e.split("=", 1) for e in api.inspect_image(image)["Config"].get("Env") or [] if "=" in e)
    links = {n for n in pristine.listdir("") if pristine.kind(n) == "link"}
    changes = [c for c in plan(pristine, agent, path_dirs(env.get("PATH"))) if c.path not in links]
    entries += entries_of(changes, pristine, agent)
    # The image's top-level links (merged /usr: /lib64 -> usr/lib64, where every tool's loader is) as they were.
    entries += [Entry(n, "link", pristine.readlink(n) or "", "link") for n in pristine.listdir("")
                if pristine.kind(n) == "link"]
    Path(setup.run, "uv-cache").mkdir(exist_ok=True)
    entries += [Entry("tests", "bind", str(setup.tests)), Entry(VERIFIER_RUN.lstrip("/"), "bind", str(setup.run)),
                Entry(UV_CACHE.lstrip("/"), "tmpfs")]
    entries += [Entry(box.lstrip("/"), "volume") for _, box, _ in RESULTS]
    lay = layout(entries, pristine, agent)
    scratch = tempfile.mkdtemp(prefix="conch-verify-")
    left.dirs.append(scratch)
    Path(scratch, "empty").touch(mode=0o444)
    os.chmod(os.path.join(scratch, "empty"), 0o444)
    os.mkdir(os.path.join(scratch, "emptydir"), 0o555)
    os.chmod(scratch, 0o755)
    mounts = docker_mounts(api, lay, layers, scratch, left)
    timings["plan"] = time.monotonic() - t
    if lay.fixes:
        t = time.monotonic()
        snapshot = _apply_fixes(api, snapshot, lay.fixes, left)
        timings["fix"] = time.monotonic() - t
    tmpfs = {UV_CACHE: f"rw,exec,nosuid,nodev,size={TMPFS_BYTES},mode=1777"}
    return snapshot, mounts, tmpfs, ("/" + sleep, "infinity")


async def _pause(api: Any, container: str, tries: int = 5) -> None:
    """`docker pause`, retried: runc's freeze can fail transiently ("unable to freeze") while the container's
    processes are forking; the engine leaves it running then, and a second try succeeds."""
    for attempt in range(tries):
        try:
            await engine_call(api.pause, container)
            return
        except Exception as exc:  # noqa: BLE001 - docker.errors.APIError, retried then re-raised
            if "unable to freeze" not in str(exc) or attempt == tries - 1:
                raise
            await asyncio.sleep(0.2 * (attempt + 1))

@contextlib.asynccontextmanager
async def verifier_box(agent: DockerSandbox, setup: VerifierSetup) -> AsyncIterator[DockerSandbox]:
    """Pause `agent`, open a verifier container over its snapshot, kill (final) or later unpause the agent."""
    import docker.errors

    api, container = agent._require()
    start = time.monotonic()
    state = (await engine_call(api.inspect_container, container)).get("State") or {}
    paused = False
    if state.get("Running") and not state.get("Paused"):
        await _pause(api, container)
        paused = True
    left = _Leftovers()
    timings: dict[str, float] = {"pause": time.monotonic() - start}
    box: VerifierContainer | None = None
    try:
        preparing = asyncio.ensure_future(engine_call(prepare, api, container, setup, left, timings))
        try:  # on cancellation let the engine calls finish, so that the removal below sees what they made
            image, mounts, tmpfs, entrypoint = await asyncio.shield(preparing)
        except docker.errors.APIError as exc:
            raise SandboxError(f"sandbox {agent.name}: cannot snapshot it for its verifier: {exc}") from exc
        except BaseException:
            with contextlib.suppress(BaseException):
                await preparing
            raise
        t = time.monotonic()
        box = VerifierContainer(agent, image, mounts, tmpfs, entrypoint)
        box.timings = timings
        await box.open()
        timings["create_start"] = time.monotonic() - t
        if setup.final and state.get("Running"):
            await engine_call(_kill, api, container)
        timings["ready"] = time.monotonic() - start
        yield box
        t = time.monotonic()
        await box.collect(setup)
        timings["collect"] = time.monotonic() - t
    finally:
        t = time.monotonic()
        try:
            try:
                if box is not None:
                    await box.stop()
            finally:
                await engine_call(left.remove, api)
        finally:
            if setup.final and state.get("Running"):
                await engine_call(_kill, api, container)
            elif paused:
                with contextlib.suppress(docker.errors.APIError):
                    await engine_call(api.unpause, container)
            timings["teardown"] = time.monotonic() - t
            timings["total"] = time.monotonic() - start


def _kill(api: Any, container: str) -> None:
    import docker.errors

    try:
        api.kill(container)
    except docker.errors.APIError as exc:  # already dead, or gone
        if "is not running" not in str(exc) and not isinstance(exc, docker.errors.NotFound):
            raise


def gc_leftovers(c: Any, keep: Any) -> list[str]:
    """Remove snapshot images and verifier volumes whose owner label `keep(owner)` does not keep. Containers are
    removed before (they may use them); a snapshot's fixed child goes before it."""
    import docker.errors

    removed: list[str] = []
    for _round in range(2):
        for img in c.api.images(filters={"label": f"{images.LABEL_KIND}={KIND_SNAPSHOT}"}):
            if keep((img.get("Labels") or {}).get(images.LABEL_OWNER, "")):
                continue
            try:
                c.api.remove_image(img["Id"], force=True)
                removed.append((img.get("RepoTags") or [img["Id"]])[0])
            except docker.errors.APIError:
                pass  # a child first (next round), or in use
    for vol in c.api.volumes(filters={"label": f"{images.LABEL_KIND}={KIND_VOLUME}"}).get("Volumes") or []:
        if keep((vol.get("Labels") or {}).get(images.LABEL_OWNER, "")):
            continue
        try:
            c.api.remove_volume(vol["Name"], force=True)
            removed.append(f"volume {vol['Name']}")
        except docker.errors.APIError:
            pass
    return removed
