"""The layer stack read as one image filesystem, and host-side extraction that cannot escape its folder.

Why apart from the builder (conch/sandbox/localbuild.py): overlay semantics over a list of layer folders
(whiteouts, opaque folders, the image's own symlinks such as /bin -> usr/bin) are needed wherever conch reads or
writes an image without mounting it: a COPY/ADD step, `COPY --from=<stage>` (conch/sandbox/stagecopy.py), and
the sandboxes' downloads (`safe_extract`, `place_download`: the local backend and conch/sandbox/docker_files.py).
Nothing here builds or starts anything.
"""

from __future__ import annotations

import copy
import os
import shutil
import stat
import tarfile
from pathlib import Path

from conch.sandbox.base import SandboxError
from conch.sandbox.buildplan import BuildStep


def is_whiteout(st: os.stat_result) -> bool:
    return stat.S_ISCHR(st.st_mode) and st.st_rdev == 0


def opaque(path: Path) -> bool:
    try:
        return os.getxattr(path, "trusted.overlay.opaque") == b"y"
    except OSError:
        return False


def lookup(lowers: list[Path], parts: list[str]) -> Path | None:
    """Host path of the topmost entry for image path `parts` (components not resolved), or None."""
    for layer in lowers:
        cur, blocked = layer, False
        for i, comp in enumerate(parts):
            cur = cur / comp
            try:
                st = os.lstat(cur)
            except (FileNotFoundError, NotADirectoryError):
                break
            if is_whiteout(st):
                return None
            if i == len(parts) - 1:
                return cur
            if not stat.S_ISDIR(st.st_mode):
                return None
            blocked |= opaque(cur)
        else:
            return layer
        if blocked:
            return None
    return None


def resolve(lowers: list[Path], path: str, follow_last: bool = True) -> list[str]:
    """Canonical components of `path` in the image, following the image's symlinks (e.g. /bin -> usr/bin)."""
    parts = [p for p in path.split("/") if p and p != "."]
    out: list[str] = []
    hops, i = 0, 0
    while i < len(parts):
        comp = parts[i]
        if comp == "..":
            if out:
                out.pop()
            i += 1
            continue
        host = lookup(lowers, out + [comp])
        if host is not None and host.is_symlink() and (i < len(parts) - 1 or follow_last):
            hops += 1
            if hops > 40:
                raise SandboxError(f"too many symlinks resolving {path} in the image")
            target = os.readlink(host)
            if target.startswith("/"):
                out = []
            parts = [p for p in target.split("/") if p and p != "."] + parts[i + 1 :]
            i = 0
            continue
        out.append(comp)
        i += 1
    return out


def ensure_dir(lowers: list[Path], diff: Path, path: str, materialize: bool = True) -> list[str]:
    """Make directory `path` exist in the image; returns its resolved components.

    With `materialize`, the directories are also created in `diff` (copying the metadata of the ones that
    exist below, as overlay copy-up would) so files can be written into them. Without it, a directory that
    already exists in a lower layer leaves `diff` untouched.
    """
    parts = resolve(lowers, path)
    if diff.joinpath(*parts).is_dir():
        return parts
    below = lookup(lowers, parts) if parts else lowers[-1]
    if not materialize and below is not None and below.is_dir():
        return parts
    for j in range(len(parts)):
        d = diff.joinpath(*parts[: j + 1])
        if d.is_dir() and not d.is_symlink():
            continue
        if d.exists() or d.is_symlink():
            d.unlink()
        d.mkdir()
        src = lookup(lowers, parts[: j + 1])
        if src is not None and src.is_dir() and not src.is_symlink():
            st = os.lstat(src)
            os.chmod(d, stat.S_IMODE(st.st_mode))
            os.lchown(d, st.st_uid, st.st_gid)
        else:
            os.chmod(d, 0o755)
    return parts


def parse_owner(df: Path, step: BuildStep, lowers: list[Path]) -> tuple[int, int]:
    if not step.chown:
        return 0, 0
    user, _, group = step.chown.partition(":")

    def ident(name: str, db: str) -> int:
        if name.isdigit():
            return int(name)
        host = lookup(lowers, ["etc", db])
        for line in (host.read_text().splitlines() if host else []):
            fields = line.split(":")
            if fields and fields[0] == name and len(fields) > 2:
                return int(fields[2])
        raise SandboxError(f"{df}:{step.line}: --chown: no {'user' if db == 'passwd' else 'group'} {name!r} "
                           "in the image")

    uid = ident(user, "passwd")
    gid = ident(group, "group") if group else uid
    return uid, gid


def safe_extract(tf: tarfile.TarFile, dest: Path, owner: tuple[int, int] | None = None) -> None:
    """Extract `tf` into `dest`, refusing any member that would land outside it (absolute names, `..`, paths
    through symlinks extracted earlier, hard links out) and skipping device nodes. Owners are kept (numeric)
    unless `owner` is given. Does not rely on tarfile's extraction filters (absent in Debian's 3.11.2)."""
    root = os.path.realpath(dest)

    def inside(path: str) -> bool:
        real = os.path.realpath(path)
        return real == root or real.startswith(root + os.sep)

    kwargs = {"filter": "fully_trusted"} if hasattr(tarfile, "fully_trusted_filter") else {}
    for member in tf:
        name = member.name.lstrip("/")
        if member.ischr() or member.isblk() or not name:
            continue
        if not inside(os.path.join(root, name)):
            raise SandboxError(f"archive member {member.name!r} would be written outside {dest}")
        if member.islnk() and not inside(os.path.join(root, member.linkname.lstrip("/"))):
            raise SandboxError(f"archive hard link {member.name!r} points outside {dest}")
        member = copy.copy(member)
        member.name = name
        if member.islnk():
            member.linkname = member.linkname.lstrip("/")
        if owner is not None:
            member.uid, member.gid = owner
            member.uname = member.gname = ""
            member.mode &= 0o1777  # no setuid/setgid on the host
        tf.extract(member, root, set_attrs=True, numeric_owner=True, **kwargs)


def own(path: Path, uid: int, gid: int, mode: int | None) -> None:
    os.lchown(path, uid, gid)
    if mode is not None and not path.is_symlink():
        os.chmod(path, mode)


def place_download(got: Path, dest: Path) -> None:
    """Put an extracted download `got` at `dest`: a folder merges into an existing folder; anything else
    replaces what `dest` was (a link at `dest` is replaced, never followed)."""
    if dest.is_dir() and not dest.is_symlink() and got.is_dir():
        shutil.copytree(got, dest, symlinks=True, dirs_exist_ok=True)
        return
    if dest.is_dir() and not dest.is_symlink():
        shutil.rmtree(dest)
    elif dest.exists() or dest.is_symlink():
        dest.unlink()
    os.replace(got, dest)
