"""Files in and out of a Docker sandbox as tar streams (the engine's archive API), with the same extraction checks
as the local backend (conch/sandbox/layerfs.py `safe_extract`). Links come out as links: read results with
conch/sandbox/readback.py."""

from __future__ import annotations

import os
import tarfile
import tempfile
from pathlib import Path
from typing import Any

from conch.sandbox.base import SandboxError
from conch.sandbox.layerfs import place_download, safe_extract


def tar_for_upload(src: Path, arcname: str) -> Any:
    """A tar (a spooled file) of `src` named `arcname` (a path under /), without entries for its parents,
    which keep their modes and owners in the box."""
    spool = tempfile.TemporaryFile()

    def norm(info: tarfile.TarInfo) -> tarfile.TarInfo:
        for what, name in (("file name", info.name), ("link target", info.linkname)):
            try:  # the engine reads tar names as UTF-8; say which file instead of sending what it cannot read
                name.encode("utf-8")
            except UnicodeEncodeError:
                shown = os.fsencode(f"{src}: {info.name}").decode("utf-8", "backslashreplace")
                raise SandboxError(f"upload of {shown}: {what} is not valid UTF-8") from None
        info.uid = info.gid = 0
        info.uname = info.gname = "root"
        return info

    try:
        with tarfile.open(fileobj=spool, mode="w") as tar:
            tar.add(str(src), arcname=arcname, filter=norm)
    except BaseException:
        spool.close()
        raise
    spool.seek(0)
    return spool


def get_archive(api: Any, container: str, path: str, spool: Any) -> None:
    stream, _stat = api.get_archive(container, path)
    try:
        for chunk in stream:
            spool.write(chunk)
    finally:
        close = getattr(stream, "close", None)
        if close is not None:
            close()


def extract_download(spool: Any, top: str, dest: Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest.parent, prefix=".conch-dl-") as tmp:
        with tarfile.open(fileobj=spool) as tar:  # the same checks as the local backend's download
            safe_extract(tar, Path(tmp), owner=(os.getuid(), os.getgid()))
        place_download(Path(tmp) / top, dest)
