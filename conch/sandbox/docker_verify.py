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
from conch.sandbox.docker import DockerSandbox, _call, _engine_is_local, _live, _live_lock, _slug, owner_label
from conch.sandbox.docker_files import extract_download, get_archive
from conch.sandbox.readback import DOWNLOAD_CAP, MAX_FILES, CapWriter, ReadBackError
from conch.sandbox.verifier_view import MAX_LIST, Change, Memo, TreeReader, hops, path_dirs, plan, resolve

SNAPSHOT_REPO = "conch/snapshot"
KIND_SNAPSHOT = "snapshot"  # io.conch.kind of a snapshot image
KIND_VOLUME = "verify"  # io.conch.kind of a verifier box's volumes
RESULTS = (("logs", "/logs/verifier", "verifier"), ("warnings", "/var/log/conch", "conch"))  # field, box path, name
UV_CACHE = f"{VERIFIER_RUN}/uv-cache"
TMPFS_BYTES = DOWNLOAD_CAP
SLEEP = ("usr/bin/sleep", "bin/sleep")  # the image's, for the idle init
MOUNT_DATA_MAX = 4000  # an overlay volume's mount options must fit a page


@dataclass(frozen=True)
class Entry:
    """One thing the verifier container shows at `path` (relative to /). `kind`: "pristine" (the image's `source`,
    read-only), "mask-file" / "mask-dir" (empty, read-only), "link" (a link to `source`, written into the
    snapshot), "bind" (host folder `source`, read-only), "tmpfs", "volume" (a results folder). `need`: what must
    be at `path` in the snapshot for the mount ("dir", "file", "link")."""

    path: str
    kind: str
    source: str = ""
    need: str = "dir"


@dataclass
class Layout:
    mounts: list[Entry]
    fixes: list[tuple[str, str, str]]  # (path, "dir" | "file" | "link", link target), parents first


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


# --------------------------------------------------------------------------------------------------- layers


def image_layers(api: Any, image: str) -> list[str]:
    """The host folders of `image`'s overlay2 layers, top first; SandboxError when they are not readable here."""
    if not _engine_is_local(api):
        raise SandboxError("docker verification needs the Docker engine on this host (a unix socket): it binds the "
                           "image's own layers into the verifier container")
    graph = (api.inspect_image(image).get("GraphDriver") or {})
    data = graph.get("Data") or {}
    layers = [data["UpperDir"]] if data.get("UpperDir") else []
    layers += [p for p in (data.get("LowerDir") or "").split(":") if p]
    if graph.get("Name") != "overlay2" or not layers:
        raise SandboxError(f"docker verification needs the overlay2 storage driver (this engine: {graph.get('Name')})")
    if not all(os.path.isdir(p) and os.access(p, os.R_OK | os.X_OK) for p in layers):
        raise SandboxError(f"docker verification reads the image's layers under {os.path.dirname(layers[0])}, "
                           "which this user cannot (run conch as root, as the local backend needs)")
    return layers


@functools.lru_cache(maxsize=32)
def pristine_tree(layers: tuple[str, ...]) -> Memo:
    """An image's layers as one read-only view, memoized (layers never change once built)."""
    return Memo(LayerStack(list(layers)))


class LayerStack:
    """A `TreeReader` over overlay layers on this host (top first), as the overlay of them shows them: whiteouts
    and opaque folders honoured, no link followed (`stack`). (verifier_view.LayersTree stops listing a folder at
    the first layer that lacks it.)"""

    def __init__(self, layers: list[str]) -> None:
        self.layers = layers

    def kind(self, rel: str) -> str | None:
        found = stack(self.layers, rel) if rel.strip("/") else [(self.layers[0], "dir")]
        return found[0][1] if found else None

    def listdir(self, rel: str) -> list[str]:
        found = stack(self.layers, rel) if rel.strip("/") else _root_stack(self.layers)
        names: set[str] = set()
        gone: set[str] = set()
        for path, kind in found:
            if kind != "dir":
                return []
            try:
                entries = os.listdir(path)[:MAX_LIST]
            except OSError:
                continue
            for name in entries:
                if name in gone or name in names:
                    continue
                try:
                    st = os.lstat(os.path.join(path, name))
                except OSError:
                    continue
                (gone if _whiteout(st) else names).add(name)
        return sorted(names)

    def readlink(self, rel: str) -> str | None:
        found = stack(self.layers, rel)
        if not found or found[0][1] != "link":
            return None
        try:
            return os.readlink(found[0][0])
        except OSError:
            return None

    def read(self, rel: str, cap: int) -> bytes | None:
        found = stack(self.layers, rel)
        if not found or found[0][1] != "file":
            return None
        try:
            fd = os.open(found[0][0], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            return os.read(fd, cap)
        finally:
            os.close(fd)


def _root_stack(layers: list[str]) -> list[tuple[str, str]]:
    out = []
    for root in layers:
        out.append((root, "dir"))
        if _opaque(root):
            break
    return out


def _whiteout(st: os.stat_result) -> bool:
    import stat

    return stat.S_ISCHR(st.st_mode) and st.st_rdev == 0


def _opaque(path: str) -> bool:
    try:
        return os.getxattr(path, "trusted.overlay.opaque", follow_symlinks=False) == b"y"
    except OSError:
        return False


def stack(layers: list[str], rel: str) -> list[tuple[str, str]]:
    """(host path, kind) of `rel` in each layer an overlay of `layers` (top first) shows it from: one entry for a
    file or link, every contributing layer for a folder. No link is ever followed on the way."""
    import stat

    parts = [p for p in rel.split("/") if p]
    out: list[tuple[str, str]] = []
    for root in layers:
        path, hidden = root, False
        for i, part in enumerate(parts):
            path = os.path.join(path, part)
            try:
                st = os.lstat(path)
            except OSError:
                break  # not in this layer
            if _whiteout(st):
                return out
            if i < len(parts) - 1:
                if not stat.S_ISDIR(st.st_mode):
                    return out  # a file or link here hides the lower layers' folder
                hidden |= _opaque(path)
                continue
            kind = "dir" if stat.S_ISDIR(st.st_mode) else "file" if stat.S_ISREG(st.st_mode) else \
                "link" if stat.S_ISLNK(st.st_mode) else "other"
            if kind != "dir":
                return out if out else [(path, kind)]
            out.append((path, kind))
            hidden |= _opaque(path)
        if hidden:
            return out
    return out


# --------------------------------------------------------------------------------------------------- layout


def entries_of(changes: list[Change], pristine: TreeReader, agent: TreeReader) -> list[Entry]:
    """The plan as `Entry`s, in order: a pristine folder holding "agent" paths becomes its entries around them."""
    agent_paths = [c.path for c in changes if c.kind == "agent"]
    out: list[Entry] = []
    for c in changes:
        if c.kind == "agent":
            continue
        if c.kind == "pristine":
            kind = pristine.kind(c.source)
            inner = [p[len(c.path) + 1:] for p in agent_paths if p.startswith(c.path + "/")]
            if kind == "dir" and inner:
                _around(c.path, c.source, inner, pristine, agent, out)
            elif kind in ("dir", "file"):
                out.append(Entry(c.path, "pristine", c.source, kind))
        elif c.kind in ("mask-file", "mask-dir"):
            out.append(Entry(c.path, c.kind, need="file" if c.kind == "mask-file" else "dir"))
        else:
            raise SandboxError(f"verifier plan: unknown change {c.kind!r} at {c.path}")
    return out


def _around(path: str, source: str, keep: list[str], pristine: TreeReader, agent: TreeReader,
            out: list[Entry]) -> None:
    """The image's folder `source` at `path`, entry by entry, except the agent's own sub-paths `keep`."""
    heads: dict[str, list[str]] = {}
    for rel in keep:
        head, _, rest = rel.partition("/")
        heads.setdefault(head, []).append(rest)
    names = pristine.listdir(source)
    for name in names:
        src, dst = f"{source}/{name}", f"{path}/{name}"
        kind = pristine.kind(src)
        if "" in heads.get(name, []):
            continue  # the agent's own
        if name in heads and kind == "dir":
            _around(dst, src, heads[name], pristine, agent, out)
        elif kind in ("dir", "file"):
            out.append(Entry(dst, "pristine", src, kind))
        elif kind == "link":
            out.append(Entry(dst, "link", pristine.readlink(src) or "", "link"))
    for name in agent.listdir(path):
        if name in names or name in heads:
            continue
        dst = f"{path}/{name}"
        out.append(Entry(dst, "mask-dir", need="dir") if agent.kind(dst) == "dir"
                   else Entry(dst, "mask-file", need="file"))


def _utf8(path: str) -> bool:
    try:
        path.encode("utf-8")
        return True
    except UnicodeEncodeError:
        return False


def _through_links(entries: list[Entry], pristine: TreeReader, agent: TreeReader) -> list[Entry]:
    """An image file reached through links (`usr/bin/sh` -> dash) that the agent left as they are: bound at
    the file's own path instead, so that the links need not be replaced in the snapshot. Only where the links,
    the agent's and the image's, are the same and none lies below a folder the verifier gets mounted."""
    folders = [e.path for e in entries if e.need == "dir"]
    out: list[Entry] = []
    for e in entries:
        if e.kind == "pristine" and e.need == "file" and e.path != e.source and agent.kind(e.path) == "link":
            chain, end = hops(agent, e.path)
            clear = all(not (p == f or p.startswith(f + "/")) for p, _ in chain for f in folders)
            if end == e.source and clear and hops(pristine, e.path) == (chain, end):
                out.append(Entry(e.source, "pristine", e.source, "file"))
                continue
        out.append(e)
    return out


def layout(entries: list[Entry], pristine: TreeReader, agent: TreeReader) -> Layout:
    """Which entries to mount, and what to write into the snapshot first so that each mount lands on its own
    path: a folder where the agent left a link or a file on the way, the right kind of entry where the agent
    left another. Entries below a mounted folder are checked against what that folder shows instead."""
    by_path: dict[str, Entry] = {}
    for e in _through_links(entries, pristine, agent):  # a later entry for the same path wins
        by_path.pop(e.path, None)
        by_path[e.path] = e
    folders = {p: e for p, e in by_path.items() if e.need == "dir" and e.kind != "link"}
    mounts: list[Entry] = []
    fixes: dict[str, tuple[str, str]] = {}
    for path in sorted(by_path, key=lambda p: (p.count("/"), p)):
        e = by_path[path]
        parts = path.split("/")
        if not _utf8(path):  # the engine's API carries UTF-8 names only; its archive API any bytes
            if e.kind not in ("mask-file", "mask-dir"):
                raise SandboxError(f"docker verification: cannot mount at {path!r} (not UTF-8)")
            fixes[path] = ("file", "")  # an empty file in place of the agent's file or folder
            continue
        enclosing = next((a for a in ("/".join(parts[:i]) for i in range(len(parts) - 1, 0, -1)) if a in folders),
                         None)
        if enclosing is not None:
            outer = folders[enclosing]
            rest = path[len(enclosing):]
            if outer.kind in ("tmpfs", "volume"):
                mounts.append(e)  # an empty writable folder: the engine makes the mount point
            elif outer.kind == "bind":
                host = outer.source + rest
                if e.kind != "link" and not os.path.islink(host) and (
                        os.path.isdir(host) if e.need == "dir" else os.path.isfile(host)):
                    mounts.append(e)
            elif outer.kind == "pristine" and e.kind != "link" and pristine.kind(outer.source + rest) == e.need:
                mounts.append(e)
            continue  # else what the enclosing mount shows there stands
        fixed = False
        for i in range(1, len(parts)):
            anc = "/".join(parts[:i])
            if anc in fixes:
                fixed = True
                break
            kind = agent.kind(anc)
            if kind is None:
                fixed = True  # absent: the engine creates it (as a folder)
                break
            if kind != "dir":
                fixes[anc] = ("dir", "")
                fixed = True
                break
        have = None if fixed else agent.kind(path)
        if e.kind == "link":
            if have != "link" or agent.readlink(path) != e.source:
                fixes[path] = ("link", e.source)
            continue
        if have is not None and have != e.need:
            fixes[path] = (e.need, "")
        mounts.append(e)
    order = sorted(fixes, key=lambda p: (p.count("/"), p))
    return Layout(mounts, [(p, *fixes[p]) for p in order])


# --------------------------------------------------------------------------------------------------- engine side


def _labels(kind: str) -> dict[str, str]:
    return {images.LABEL_KIND: kind, images.LABEL_OWNER: owner_label()}


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
        self._client = await _call(images.client)
        self.container = f"conch-{_slug(self.name)[:30]}-v{uuid.uuid4().hex[:10]}"
        with _live_lock:
            _live[self.container] = self._client
        creating = asyncio.ensure_future(_call(self._create_and_start))
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
        await asyncio.gather(*(_call(read_back, api, container, box_path, top, Path(getattr(setup, name)))
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
            await _call(api.pause, container)
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
    state = (await _call(api.inspect_container, container)).get("State") or {}
    paused = False
    if state.get("Running") and not state.get("Paused"):
        await _pause(api, container)
        paused = True
    left = _Leftovers()
    timings: dict[str, float] = {"pause": time.monotonic() - start}
    box: VerifierContainer | None = None
    try:
        preparing = asyncio.ensure_future(_call(prepare, api, container, setup, left, timings))
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
            await _call(_kill, api, container)
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
                await _call(left.remove, api)
        finally:
            if setup.final and state.get("Running"):
                await _call(_kill, api, container)
            elif paused:
                with contextlib.suppress(docker.errors.APIError):
                    await _call(api.unpause, container)
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
