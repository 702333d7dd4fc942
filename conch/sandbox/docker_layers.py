"""A Docker image's overlay2 layers read on this host as one tree, the way the engine's overlay shows them.

Why apart from the verifier box (conch/sandbox/docker_verify.py): the verifier's plan compares the task image as
built (pristine) with the agent's snapshot, and both are read here, without a container and without following any
link (whiteouts and opaque folders honoured). Needs the engine on this host and its layers readable (root).
"""

from __future__ import annotations

import functools
import os
from typing import Any

from conch.sandbox.base import SandboxError
from conch.sandbox.docker import engine_is_local
from conch.sandbox.verifier_view import MAX_LIST, Memo



def image_layers(api: Any, image: str) -> list[str]:
    """The host folders of `image`'s overlay2 layers, top first; SandboxError when they are not readable here."""
    if not engine_is_local(api):
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
