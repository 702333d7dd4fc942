"""Where the local sandbox backend keeps its state on the host.

Why one root: the base root, the Dockerfile layer cache, the wheelhouse and the per-sandbox state dirs must be
found again by later runs (cache hits, `conch sandbox gc` after a crash), and moved as one (CONCH_HOME).
"""

from __future__ import annotations

import os
from pathlib import Path


def conch_home() -> Path:
    """`$CONCH_HOME`, else `~/.cache/conch`. Not created here."""
    env = os.environ.get("CONCH_HOME")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "conch"


def base_dir() -> Path:
    """Holds `root/` (the Debian base root), its build lock and the rootfs tarball."""
    return conch_home() / "base"


def layers_dir() -> Path:
    """Dockerfile build cache: one folder per step, named by a short content hash."""
    return conch_home() / "layers"


def sandboxes_dir() -> Path:
    """One state folder per running sandbox (owner pid, disk image, mount points)."""
    return conch_home() / "sandboxes"


def wheelhouse_dir() -> Path:
    """Wheels downloaded on the host for the offline verifier toolchain."""
    return conch_home() / "wheelhouse"


def debs_cache_dir() -> Path:
    """debootstrap's package cache, so a rebuild of the base root downloads nothing twice."""
    return conch_home() / "debs"
