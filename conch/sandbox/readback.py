"""Read files that came out of a sandbox without trusting them.

Why: everything under a folder downloaded from a box was written by the agent (or by a test script the agent
could tamper with). A symlink planted there may point at a host file (`/etc/shadow`, a key) or a device
(`/dev/zero`), a FIFO blocks a reader forever, and a regular file may be gigabytes. So conch reads such files
only through this module:

- every path component is opened relative to the trusted root with `O_NOFOLLOW`: a link anywhere on the way
  is refused, never followed (no host file is ever opened);
- only regular files are read (`fstat` after open, `O_NONBLOCK` so a FIFO cannot block the open);
- every read is capped, and the cap is named in the error; error lines quoting a file are clipped.

`walk_regular` lists the regular files of a downloaded folder the same way (links and special files are
skipped, the listing itself is bounded).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from conch.sandbox.base import SandboxError

REWARD_CAP = 64 * 1024  # a reward file holds one number or a tiny JSON object
REPORT_CAP = 8 * 1024 * 1024  # CTRF / JUnit reports (a 10^6-test forgery is refused before parsing)
LOG_CAP = 4 * 1024 * 1024  # per log file parsed for test results
DOWNLOAD_CAP = 256 * 1024 * 1024  # a whole results folder copied out of a box
MAX_FILES = 10_000  # entries listed below a downloaded folder
LINE_CHARS = 160


class ReadBackError(SandboxError):
    """A file from a sandbox was refused: a link, not a regular file, or over its size cap."""


def human(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size and n % size == 0:
            return f"{n // size} {unit}"
    return f"{n} bytes"


def clip(text: str, limit: int = LINE_CHARS) -> str:
    """One line of at most `limit` characters (newlines and control characters shown escaped)."""
    one = text.encode("unicode_escape", "backslashreplace").decode("ascii") if not text.isprintable() else text
    return one if len(one) <= limit else one[: limit - 1] + "…"


def _open_nofollow(root: Path, rel: str | os.PathLike) -> int:
    """An fd of `root/rel` opened component by component, refusing links. The caller closes it."""
    parts = [p for p in Path(rel).parts if p not in ("", ".")]
    if not parts or any(p == ".." or p.startswith("/") for p in parts):
        raise ReadBackError(f"{rel}: not a plain relative path")
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(root, flags | os.O_DIRECTORY)
    try:
        for part in parts[:-1]:
            try:
                nxt = os.open(part, flags | os.O_DIRECTORY, dir_fd=fd)
            except OSError as exc:
                raise ReadBackError(f"{rel}: {part} is not a plain folder ({exc.strerror})") from exc
            os.close(fd)
            fd = nxt
        try:
            leaf = os.open(parts[-1], flags | os.O_NONBLOCK, dir_fd=fd)
        except OSError as exc:
            if exc.errno in (getattr(os, "ELOOP", 40), 40):
                raise ReadBackError(f"{rel} is a symbolic link (not followed)") from exc
            raise
    finally:
        os.close(fd)
    return leaf


def read_bytes(root: Path, rel: str | os.PathLike, cap: int) -> bytes:
    """The content of regular file `root/rel`, at most `cap` bytes, else `ReadBackError` naming the cap.

    Raises FileNotFoundError when it does not exist (a normal case for optional result files)."""
    fd = _open_nofollow(root, rel)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ReadBackError(f"{rel} is not a regular file")
        if st.st_size > cap:
            raise ReadBackError(f"{rel} is {st.st_size} bytes, over the {human(cap)} read cap")
        chunks, total = [], 0
        while chunk := os.read(fd, min(1 << 20, cap + 1 - total)):
            chunks.append(chunk)
            total += len(chunk)
            if total > cap:
                raise ReadBackError(f"{rel} is over the {human(cap)} read cap")
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_text(root: Path, rel: str | os.PathLike, cap: int) -> str:
    return read_bytes(root, rel, cap).decode("utf-8", "replace")


def walk_regular(root: Path, max_files: int = MAX_FILES) -> list[str]:
    """Relative paths (sorted, `/`-separated) of the regular files below `root`, links not followed.

    Raises `ReadBackError` past `max_files` entries (a box can create millions of empty files)."""
    found: list[str] = []
    seen = 0
    stack = [""]
    while stack:
        rel = stack.pop()
        try:
            with os.scandir(root / rel if rel else root) as it:
                entries = list(it)
        except OSError:
            continue
        for entry in entries:
            seen += 1
            if seen > max_files:
                raise ReadBackError(f"{root.name} holds over {max_files} entries (listing cap)")
            path = f"{rel}/{entry.name}" if rel else entry.name
            if entry.is_dir(follow_symlinks=False):
                stack.append(path)
            elif entry.is_file(follow_symlinks=False):
                found.append(path)
    return sorted(found)


class CapWriter:
    """A file-like sink that refuses more than `cap` bytes (used while copying an archive out of a box)."""

    def __init__(self, fh, cap: int, what: str) -> None:  # noqa: ANN001 - any binary file object
        self.fh, self.cap, self.what, self.total = fh, cap, what, 0

    def write(self, data: bytes) -> int:
        self.total += len(data)
        if self.total > self.cap:
            raise ReadBackError(f"{self.what} is over the {human(self.cap)} download cap")
        return self.fh.write(data)


def copy_out(src: str | os.PathLike, dest: Path, cap: int = DOWNLOAD_CAP, max_files: int = MAX_FILES) -> None:
    """Copy the tree at host path `src` (written by a box) into the new folder `dest`: folders and regular
    files, links re-created as links (never followed), any other entry (a FIFO, a device) as an empty FIFO, so
    a reader still finds it and refuses it as "not a regular file"; `ReadBackError` past `cap`
    bytes or `max_files` entries. Every component is opened with O_NOFOLLOW below `src`."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
    total, seen = 0, 0
    dest.mkdir(parents=True, exist_ok=True)
    stack = [(os.open(src, flags | os.O_DIRECTORY), dest)]
    try:
        while stack:
            fd, out = stack.pop()
            try:
                for name in os.listdir(fd):
                    seen += 1
                    if seen > max_files:
                        raise ReadBackError(f"{Path(src).name} holds over {max_files} entries (listing cap)")
                    st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                    target = out / name
                    if stat.S_ISDIR(st.st_mode):
                        target.mkdir()
                        stack.append((os.open(name, flags | os.O_DIRECTORY, dir_fd=fd), target))
                    elif stat.S_ISLNK(st.st_mode):
                        os.symlink(os.readlink(name, dir_fd=fd), target)
                    elif not stat.S_ISREG(st.st_mode):
                        os.mkfifo(target, 0o600)
                    else:
                        total += st.st_size
                        if total > cap:
                            raise ReadBackError(f"{Path(src).name} is over the {human(cap)} download cap")
                        leaf = os.open(name, flags | os.O_NONBLOCK, dir_fd=fd)
                        try:
                            with open(target, "wb") as fh:
                                while chunk := os.read(leaf, 1 << 20):
                                    fh.write(chunk)
                        finally:
                            os.close(leaf)
            finally:
                os.close(fd)
    finally:
        for fd, _ in stack:
            os.close(fd)
