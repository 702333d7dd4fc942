"""`COPY --from=<stage>` for the local builder: copy paths out of an earlier stage's layer stack.

Why a merged walk: an earlier stage is not one folder but a stack of overlay diffs (whiteouts, opaque
directories), so a directory in it may be spread over several layers. We list it the way overlayfs shows it
(upper entries hide lower ones, whiteouts delete, an opaque directory stops the descent) and copy what a process
in that stage would see, owners and modes kept (or set by --chown/--chmod), into the new step's diff.
"""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

from conch.sandbox.base import SandboxError
from conch.sandbox.layerfs import ensure_dir, is_whiteout, lookup, opaque, own, parse_owner, resolve


def merged_entries(lowers: list[Path], parts: list[str]) -> dict[str, Path]:
    """{name: host path of the visible entry} of directory `parts` in the layer stack `lowers` (top first)."""
    out: dict[str, Path] = {}
    hidden: set[str] = set()
    for layer in lowers:
        d = layer.joinpath(*parts)
        try:
            st = os.lstat(d)
        except (FileNotFoundError, NotADirectoryError):
            continue
        if not stat.S_ISDIR(st.st_mode):
            break  # a file or whiteout here hides everything below
        for entry in os.scandir(d):
            if entry.name in out or entry.name in hidden:
                continue
            if is_whiteout(entry.stat(follow_symlinks=False)):
                hidden.add(entry.name)
            else:
                out[entry.name] = Path(entry.path)
        if opaque(d):
            break
    return out


def _copy_tree(lowers: list[Path], parts: list[str], host: Path, out: Path, owner, mode: int | None) -> None:
    """Copy the visible entry `parts` (found at `host`) to `out`, recursing through the merged view."""
    st = os.lstat(host)
    if out.is_dir() and not out.is_symlink() and not stat.S_ISDIR(st.st_mode):
        shutil.rmtree(out)
    elif (out.exists() or out.is_symlink()) and not (stat.S_ISDIR(st.st_mode) and out.is_dir()):
        out.unlink()
    if stat.S_ISDIR(st.st_mode):
        out.mkdir(exist_ok=True)
        for name, child in sorted(merged_entries(lowers, parts).items()):
            _copy_tree(lowers, parts + [name], child, out / name, owner, mode)
        shutil.copystat(host, out, follow_symlinks=False)
    else:
        shutil.copy2(host, out, follow_symlinks=False)
    uid, gid = owner if owner is not None else (st.st_uid, st.st_gid)
    own(out, uid, gid, mode)


def copy_from_stage(df: Path, step, src_lowers: list[Path], lowers: list[Path], diff: Path) -> None:
    """Run `COPY --from=... SRC... DEST` (paths in the earlier stage) into `diff`, over image `lowers`."""
    owner = parse_owner(df, step, lowers) if step.chown else None
    mode = int(step.chmod, 8) if step.chmod else None
    found: list[tuple[list[str], Path]] = []
    for src in step.sources:
        parts = resolve(src_lowers, src if src.startswith("/") else "/" + src)
        host = lookup(src_lowers, parts) if parts else src_lowers[-1]
        if host is None:
            raise SandboxError(f"{df}:{step.line}: COPY --from={step.from_stage}: {src} does not exist in that stage")
        found.append((parts, host))
    dest_parts = resolve(lowers, step.dest.rstrip("/") or "/")
    existing = lookup(lowers, dest_parts) if dest_parts else None
    to_dir = step.dest.endswith("/") or (existing is not None and existing.is_dir()) or not dest_parts
    single_dir = len(found) == 1 and found[0][1].is_dir() and not found[0][1].is_symlink()
    if single_dir and not to_dir:  # a directory's contents go to DEST itself
        ensure_dir(lowers, diff, "/" + "/".join(dest_parts))
        to_dir, single_into = True, True
    else:
        single_into = False
        ensure_dir(lowers, diff, "/" + "/".join(dest_parts if to_dir else dest_parts[:-1]))
    target = diff.joinpath(*dest_parts)
    for parts, host in found:
        if host.is_dir() and not host.is_symlink():
            target.mkdir(parents=True, exist_ok=True)
            for name, child in sorted(merged_entries(src_lowers, parts).items()):
                _copy_tree(src_lowers, parts + [name], child, target / name, owner, mode)
        elif to_dir and not single_into:
            _copy_tree(src_lowers, parts, host, target / parts[-1], owner, mode)
        else:
            _copy_tree(src_lowers, parts, host, target, owner, mode)
