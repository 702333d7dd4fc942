"""Where each path of the verifier container comes from: the verifier plan turned into mounts and snapshot fixes.

Why apart from the container work (conch/sandbox/docker_verify.py): this is pure planning over two read-only
trees (the image's and the agent's, `TreeReader`s) with no engine call, so it is tested on its own. A pristine
folder that holds an "agent" path is not bound whole: each of its other entries is bound (or masked, or its link
re-created) around the agent's own sub-folder; a mount that needs a folder where the agent left a link or a file
becomes a fix of the snapshot.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from conch.sandbox.base import SandboxError
from conch.sandbox.verifier_view import Change, TreeReader, hops


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
