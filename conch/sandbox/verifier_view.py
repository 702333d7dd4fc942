"""What the verifier sees of the agent's filesystem: all of it, except the verifier's own toolchain.

Why: the reward is what the task's tests report, and the tests run over what the agent left. Whatever the
verifier executes on its way to a count (the shell, uv/uvx, the Python that runs pytest, pytest and its CTRF
plugin, the wheels they install from, the dynamic loader) must be conch's, or a policy learns to replace it:
a `uvx` earlier on PATH, a `sitecustomize.py` or `.pth` file, a poisoned wheelhouse each turned 0/5 into 5/5.

The line, for a verifier box whose root shows the agent's final filesystem:
- **pristine** (the image as built, before the first agent turn, read-only): conch's toolchain (the uv/uvx
  shims, the real uv, /opt/conch with the offline wheelhouse, uv's env script in HOME), the shell and the
  core tools test scripts run (`VERIFIER_TOOLS`, in every PATH directory), glibc and the loader's
  configuration, the Python interpreters with their standard libraries and configuration, the test runner's
  packages (`RUNNER_PACKAGES`) and every `.pth` / `sitecustomize` / `usercustomize` the image's site
  directories hold;
- **masked** (the verifier sees an empty file or folder): what the agent *added* under those names, any
  executable it added to a PATH directory that shadows a command of the image (a later PATH entry), and pytest
  plugin registrations (`pytest11` entry points) it added to a site directory;
- **the agent's**: everything else — its files anywhere, the programs and packages it installed, a site
  directory's packages (the task's tests may import them).

`plan` computes that as a list of `Change`s from two read-only views (`TreeReader`): the pristine image and
the agent's final filesystem. Each backend applies the list its own way (bind mounts on `local`, image mounts
or restored files on `docker`). Reading the agent's view never follows a link (`HostTree`).
"""

from __future__ import annotations

import fnmatch
import functools
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

# PATH of the verifier, first to last; `root/.local/bin` is where TB2 test scripts' `source $HOME/.local/bin/env`
# puts uv, ahead of everything else.
PATH_DIRS = ("root/.local/bin", "usr/local/sbin", "usr/local/bin", "usr/sbin", "usr/bin", "sbin", "bin")
# What a test script runs on its way to a count. In every PATH dir: the image's version, or nothing.
VERIFIER_TOOLS = ("bash", "sh", "dash", "env", "uv", "uvx", "pytest", "py.test", "python", "python3", "python3.*",
                  "pip", "pip3", "pip3.*", "tar", "timeout", "mkdir", "rm", "cat", "tee", "cp", "mv", "chmod",
                  "ls", "head", "tail", "grep", "sed", "awk", "mawk", "sort", "wc", "cut", "tr", "curl",
                  "apt-get", "apt", "dpkg", "source", "test", "[", "true", "false", "echo", "printf")
# Directories that are conch's toolchain or a Python's configuration, pristine as a whole.
TOOLCHAIN_DIRS = ("usr/local/lib/conch", "opt/conch", "etc/ld.so.conf.d", "etc/apt/apt.conf.d")
# ... and files: uv's env script, the loader's configuration, apt's and curl/wget's configuration (a test script
# runs `apt-get update` and `curl ... | sh`: a hook or a `--write-out` there would run the agent's code).
TOOLCHAIN_FILES = ("root/.local/bin/env", "etc/ld.so.cache", "etc/ld.so.conf", "etc/ld.so.preload",
                   "etc/apt/apt.conf", "root/.curlrc", "root/.config/curlrc", "etc/curlrc", "root/.wgetrc",
                   "etc/wgetrc", "usr/pyvenv.cfg", "usr/bin/pyvenv.cfg", "usr/local/pyvenv.cfg",
                   "usr/local/bin/pyvenv.cfg")
# glibc and the loader (everything a dynamically linked verifier tool loads first).
GLIBC = ("ld-linux-x86-64.so.2", "libc.so.6", "libm.so.6", "libdl.so.2", "libpthread.so.0", "librt.so.1",
         "libutil.so.1", "libresolv.so.2", "libtinfo.so.6", "ld-linux-aarch64.so.1",
         # what the Python that runs pytest loads (its extension modules' libraries)
         "libexpat.so.1", "libz.so.1", "libffi.so.8", "libbz2.so.1.0", "liblzma.so.5", "libssl.so.3",
         "libcrypto.so.3", "libsqlite3.so.0", "libmpdec.so.4", "libuuid.so.1", "libreadline.so.8",
         "libncursesw.so.6", "libzstd.so.1", "libgcc_s.so.1", "libpython3.13.so.1.0", "libb2.so.1")
LIB_DIRS = ("usr/lib/x86_64-linux-gnu", "usr/lib/aarch64-linux-gnu", "usr/lib64", "lib64", "lib")
SITE_NAMES = ("dist-packages", "site-packages")
# The test runner: pytest, the CTRF plugin and their dependencies (top-level names in a site directory).
RUNNER_PACKAGES = ("pytest", "_pytest", "py.py", "pluggy", "iniconfig", "packaging", "ctrf", "pytest_json_ctrf",
                   "pytest-*.dist-info", "pytest_json_ctrf-*.dist-info", "pluggy-*.dist-info",
                   "iniconfig-*.dist-info", "packaging-*.dist-info", "pytest_ctrf*", "colorama", "exceptiongroup",
                   "tomli", "pygments", "pygments-*.dist-info", "__pycache__")
HOOK_NAMES = ("*.pth", "sitecustomize", "sitecustomize.*", "usercustomize", "usercustomize.*")
ENTRY_CAP = 64 * 1024
MAX_LIST = 20_000


@dataclass(frozen=True)
class Change:
    """One change to the agent's view. `kind`: "pristine" (bind the image's `source` at `path`, read-only),
    "mask-file" / "mask-dir" (an empty read-only file / folder at `path`). Paths are relative to /."""

    path: str
    kind: str
    source: str = ""
    folder: bool = False  # what is mounted at `path` is a folder (else a file)


class TreeReader(Protocol):
    """A read-only view of one filesystem tree (relative paths, links never followed)."""

    def kind(self, rel: str) -> str | None:
        """"dir", "file", "link", "other", or None when absent (or behind a link)."""
        ...

    def listdir(self, rel: str) -> list[str]:
        """Names in the directory `rel` ([] when it is absent or not a plain directory)."""
        ...

    def readlink(self, rel: str) -> str | None: ...

    def read(self, rel: str, cap: int) -> bytes | None: ...


class HostTree:
    """A `TreeReader` over a host directory that the box wrote: every component is opened with O_NOFOLLOW, so
    a link planted by the agent never makes conch look at a host path."""

    def __init__(self, root: str | os.PathLike) -> None:
        self.root = str(root)

    def _open_parent(self, rel: str) -> tuple[int, str] | None:
        parts = [p for p in rel.split("/") if p and p != "."]
        if not parts or ".." in parts:
            return None
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_DIRECTORY | os.O_CLOEXEC
        try:
            fd = os.open(self.root, flags)
        except OSError:
            return None
        for part in parts[:-1]:
            try:
                nxt = os.open(part, flags, dir_fd=fd)
            except OSError:
                os.close(fd)
                return None
            os.close(fd)
            fd = nxt
        return fd, parts[-1]

    def _lstat(self, rel: str) -> os.stat_result | None:
        opened = self._open_parent(rel)
        if opened is None:
            return None
        fd, name = opened
        try:
            return os.stat(name, dir_fd=fd, follow_symlinks=False)
        except OSError:
            return None
        finally:
            os.close(fd)

    def kind(self, rel: str) -> str | None:
        st = self._lstat(rel)
        if st is None:
            return None
        if stat.S_ISCHR(st.st_mode) and st.st_rdev == 0:
            return None  # an overlay whiteout: the entry was deleted
        return _kind(st.st_mode)

    def listdir(self, rel: str) -> list[str]:
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_DIRECTORY | os.O_CLOEXEC
        if rel.strip("/"):
            opened = self._open_parent(rel)
            if opened is None:
                return []
            parent, name = opened
            try:
                fd = os.open(name, flags, dir_fd=parent)
            except OSError:
                return []
            finally:
                os.close(parent)
        else:
            try:
                fd = os.open(self.root, flags)
            except OSError:
                return []
        try:
            return sorted(os.listdir(fd)[:MAX_LIST])
        except OSError:
            return []
        finally:
            os.close(fd)

    def readlink(self, rel: str) -> str | None:
        opened = self._open_parent(rel)
        if opened is None:
            return None
        fd, name = opened
        try:
            return os.readlink(name, dir_fd=fd)
        except OSError:
            return None
        finally:
            os.close(fd)

    def read(self, rel: str, cap: int) -> bytes | None:
        opened = self._open_parent(rel)
        if opened is None:
            return None
        fd, name = opened
        try:
            leaf = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=fd)
        except OSError:
            return None
        finally:
            os.close(fd)
        try:
            if not stat.S_ISREG(os.fstat(leaf).st_mode):
                return None
            return os.read(leaf, cap)
        finally:
            os.close(leaf)


class LayersTree:
    """A `TreeReader` over an image stored as overlay layers on the host (`lowers`, top first): what an
    overlay of them would show (whiteouts and opaque folders honoured)."""

    def __init__(self, lowers: list[Path]) -> None:
        self.layers = [_frozen_layer(str(p)) for p in lowers]

    def _top(self, rel: str) -> tuple[HostTree, str] | None:
        parts = [p for p in rel.split("/") if p]
        for layer in self.layers:
            blocked = False
            for i in range(1, len(parts) + 1):
                sub = "/".join(parts[:i])
                st = layer._lstat(sub)
                if st is None:
                    break
                if stat.S_ISCHR(st.st_mode) and st.st_rdev == 0:
                    return None
                if i == len(parts):
                    return layer, _kind(st.st_mode)
                if not stat.S_ISDIR(st.st_mode):
                    return None
                blocked |= _opaque(os.path.join(layer.root, sub))
            if blocked:
                return None
        return None

    def kind(self, rel: str) -> str | None:
        top = self._top(rel)
        return top[1] if top else None

    def _state(self, layer: HostTree, rel: str) -> tuple[str, bool]:
        """(what `rel` is in `layer`: "absent" | "dir" | "other" (a file, link or whiteout, hiding the layers
        below), whether the layer hides the layers below it at `rel` (an opaque folder on the way))."""
        parts = [p for p in rel.split("/") if p]
        blocked = False
        for i in range(1, len(parts) + 1):
            sub = "/".join(parts[:i])
            st = layer._lstat(sub)
            if st is None:
                return "absent", blocked
            if not stat.S_ISDIR(st.st_mode):
                return "other", True
            blocked |= _opaque(os.path.join(layer.root, sub))
        return "dir", blocked

    def listdir(self, rel: str) -> list[str]:
        names: set[str] = set()
        gone: set[str] = set()
        for layer in self.layers:
            state, blocked = self._state(layer, rel)
            if state == "other":
                break
            if state == "dir":
                for name in layer.listdir(rel):
                    sub = f"{rel}/{name}" if rel else name
                    st = layer._lstat(sub)
                    if st is not None and stat.S_ISCHR(st.st_mode) and st.st_rdev == 0:
                        gone.add(name)
                    elif name not in gone:
                        names.add(name)
            if blocked:
                break
        return sorted(names)

    def readlink(self, rel: str) -> str | None:
        top = self._top(rel)
        return top[0].readlink(rel) if top and top[1] == "link" else None

    def read(self, rel: str, cap: int) -> bytes | None:
        top = self._top(rel)
        return top[0].read(rel, cap) if top and top[1] == "file" else None


class _FrozenHostTree(HostTree):
    """A `HostTree` over an image layer, which never changes once built: answers are remembered."""

    def __init__(self, root: str) -> None:
        super().__init__(root)
        self._stats: dict[str, os.stat_result | None] = {}
        self._lists: dict[str, list[str]] = {}

    def _lstat(self, rel: str) -> os.stat_result | None:
        if rel not in self._stats:
            self._stats[rel] = super()._lstat(rel)
        return self._stats[rel]

    def listdir(self, rel: str) -> list[str]:
        if rel not in self._lists:
            self._lists[rel] = super().listdir(rel)
        return self._lists[rel]


@functools.lru_cache(maxsize=512)
def _frozen_layer(root: str) -> _FrozenHostTree:
    return _FrozenHostTree(root)


class Memo:
    """A `TreeReader` that remembers every answer of another (for trees that never change: image layers)."""

    def __init__(self, tree: TreeReader) -> None:
        self.tree = tree
        self._cache: dict[tuple, object] = {}

    def _get(self, key: tuple, fn):  # noqa: ANN001, ANN202
        if key not in self._cache:
            self._cache[key] = fn()
        return self._cache[key]

    def kind(self, rel: str) -> str | None:
        return self._get(("k", rel), lambda: self.tree.kind(rel))  # type: ignore[return-value]

    def listdir(self, rel: str) -> list[str]:
        return self._get(("l", rel), lambda: self.tree.listdir(rel))  # type: ignore[return-value]

    def readlink(self, rel: str) -> str | None:
        return self._get(("r", rel), lambda: self.tree.readlink(rel))  # type: ignore[return-value]

    def read(self, rel: str, cap: int) -> bytes | None:
        return self._get(("d", rel, cap), lambda: self.tree.read(rel, cap))  # type: ignore[return-value]


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "dir"
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISLNK(mode):
        return "link"
    return "other"


def _opaque(path: str) -> bool:
    try:
        return os.getxattr(path, "trusted.overlay.opaque", follow_symlinks=False) == b"y"
    except OSError:
        return False


def hops(tree: TreeReader, rel: str) -> tuple[tuple[tuple[str, str], ...], str | None]:
    """((link, its target), ...) that resolving `rel` in `tree` goes through, and where it ends (as `resolve`)."""
    parts = [p for p in rel.split("/") if p]
    done: list[str] = []
    seen: list[tuple[str, str]] = []
    while parts and len(seen) < 40:
        part = parts.pop(0)
        if part == "..":
            if done:
                done.pop()
            continue
        cur = "/".join([*done, part])
        kind = tree.kind(cur)
        if kind is None:
            return tuple(seen), None
        if kind == "link":
            target = tree.readlink(cur) or ""
            seen.append((cur, target))
            parts = [*([] if target.startswith("/") else done), *[p for p in target.split("/") if p and p != "."],
                     *parts]
            done = []
            continue
        done.append(part)
    return tuple(seen), ("/".join(done) if not parts else None)


def resolve(tree: TreeReader, rel: str) -> str | None:
    """`rel` with every link of the image followed inside the image (never outside it), or None."""
    return hops(tree, rel)[1]


@functools.lru_cache(maxsize=16)
def _pattern(patterns: tuple[str, ...]) -> re.Pattern:
    return re.compile("|".join(f"(?:{fnmatch.translate(p)})" for p in patterns))


def _matches(name: str, patterns: tuple[str, ...]) -> bool:
    return _pattern(patterns).match(name) is not None


def _site_dirs(tree: TreeReader) -> list[str]:
    """Every site directory of the image's and the agent's Pythons (system, pip, python:* image layouts)."""
    out = ["usr/lib/python3/dist-packages"]
    for lib in ("usr/lib", "usr/local/lib"):
        for name in tree.listdir(lib):
            if fnmatch.fnmatchcase(name, "python3*"):
                out += [f"{lib}/{name}/{site}" for site in SITE_NAMES]
    return out


def _stdlib_dirs(tree: TreeReader) -> list[str]:
    return [f"{lib}/{n}" for lib in ("usr/lib", "usr/local/lib") for n in tree.listdir(lib)
            if fnmatch.fnmatchcase(n, "python3.*")]


def path_dirs(path: str | None) -> tuple[str, ...]:
    """The verifier's PATH folders (relative), first to last: uv's `~/.local/bin`, then the box's PATH."""
    dirs = [d.strip("/") for d in (path or "").split(":") if d.startswith("/") and ".." not in d.split("/")]
    return tuple(dict.fromkeys([PATH_DIRS[0], *dirs, *PATH_DIRS[1:]]))


def plan(pristine: TreeReader, agent: TreeReader, path: tuple[str, ...] = PATH_DIRS) -> list[Change]:
    """The changes that turn the agent's final filesystem into the verifier's view (see the module docstring).
    `path`: the verifier's PATH folders (`path_dirs`).

    Order matters: a folder bound pristine as a whole comes before what is re-exposed or masked inside it."""
    changes: list[Change] = []
    seen: set[str] = set()

    def keep(path: str) -> None:
        """The image's version of `path` (resolved inside the image) or, when the image has none, nothing."""
        if path in seen:
            return
        seen.add(path)
        source = resolve(pristine, path)
        kind = pristine.kind(source) if source is not None else None
        if kind in ("file", "dir"):
            changes.append(Change(path, "pristine", source, folder=kind == "dir"))
        elif agent.kind(path) is not None:
            folder = agent.kind(path) == "dir"
            changes.append(Change(path, "mask-dir" if folder else "mask-file", folder=folder))

    # Top-level links of the image (/lib64 -> usr/lib64, /bin -> usr/bin, ...): the loader every dynamically
    # linked tool names lives behind one; one the agent replaced gives way to the image's folder.
    for name in pristine.listdir(""):
        if pristine.kind(name) == "link" and (agent.kind(name) != "link" or
                                              agent.readlink(name) != pristine.readlink(name)):
            keep(name)
    for rel in (*TOOLCHAIN_DIRS, *TOOLCHAIN_FILES):
        keep(rel)
    for lib in LIB_DIRS:
        if pristine.kind(lib) == "dir":
            for name in GLIBC:
                if pristine.kind(f"{lib}/{name}") is not None:
                    keep(f"{lib}/{name}")
    # Pythons: the standard library whole, then the agent's site directories inside it re-exposed.
    for std in sorted(set(_stdlib_dirs(pristine))):
        keep(std)
        for site in SITE_NAMES:
            if agent.kind(f"{std}/{site}") == "dir":
                changes.append(Change(f"{std}/{site}", "agent", folder=True))
    for lib in ("usr/lib", "usr/local/lib"):  # the zipped standard library, first on sys.path
        for name in sorted(set(pristine.listdir(lib)) | set(agent.listdir(lib))):
            if fnmatch.fnmatchcase(name, "python3*.zip"):
                keep(f"{lib}/{name}")
    for etc in pristine.listdir("etc"):
        if fnmatch.fnmatchcase(etc, "python3*"):
            keep(f"etc/{etc}")
    for site in sorted(set(_site_dirs(pristine)) | set(_site_dirs(agent))):
        if agent.kind(site) != "dir" and pristine.kind(site) != "dir":
            continue
        image_names = set(pristine.listdir(site))
        for name in sorted(image_names | set(agent.listdir(site))):
            if _matches(name, RUNNER_PACKAGES) or _matches(name, HOOK_NAMES):
                keep(f"{site}/{name}")
            elif name.endswith((".dist-info", ".egg-info")) and name in image_names:
                if pristine.kind(f"{site}/{name}/entry_points.txt") or agent.kind(f"{site}/{name}/entry_points.txt"):
                    keep(f"{site}/{name}/entry_points.txt")  # an image package's plugins are the image's
            elif name.endswith((".dist-info", ".egg-info")) and name not in image_names:
                entry = agent.read(f"{site}/{name}/entry_points.txt", ENTRY_CAP)
                if entry is not None and b"pytest11" in entry:
                    changes.append(Change(f"{site}/{name}/entry_points.txt", "mask-file"))
    # PATH: the tools a test script runs are the image's; nothing the agent added shadows an image command.
    image_commands: set[str] = set()
    for d in path:
        image_commands.update(pristine.listdir(resolve(pristine, d) or d))
    for d in path:
        if pristine.kind(d) == "link" and agent.kind(d) == "link" and agent.readlink(d) == pristine.readlink(d):
            continue  # /bin -> usr/bin, as in the image: its entries are those of usr/bin
        if pristine.kind(d) == "link":
            keep(d)  # the agent replaced a merged-usr link: the image's folder takes its place
            continue
        image_names = set(pristine.listdir(d))
        for name in sorted(image_names | set(agent.listdir(d))):
            if _matches(name, VERIFIER_TOOLS):
                keep(f"{d}/{name}")
            elif name not in image_names and name in image_commands:
                keep(f"{d}/{name}")
    return changes
