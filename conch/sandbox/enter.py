"""The host binary through which every command enters a running local sandbox (`enter.c`).

Why a compiled helper and not `nsenter`: setns into a user namespace hands the caller every capability in it,
and nsenter has no way to drop them again before it execs the box's program. `conch-enter` joins the box's
namespaces, drops every capability Docker's default set does not have (CAP_SYS_ADMIN above all: no remount of
/sys or /proc/sys), sets no_new_privs and only then execs. It is built once per source version with the host's C
compiler into CONCH_HOME/bin (gcc is one of `make install`'s system packages) and never placed in a box.
"""

from __future__ import annotations

import functools
import hashlib
import os
import secrets
import shutil
import subprocess
from pathlib import Path

from conch.sandbox import paths
from conch.sandbox.base import SandboxError

_SOURCE = Path(__file__).with_name("enter.c")


@functools.cache
def enter_binary() -> str:
    """Path of the built helper (compiled on first use; concurrent builders never see a half-written file)."""
    source = _SOURCE.read_bytes()
    target = paths.conch_home() / "bin" / f"conch-enter-{hashlib.sha256(source).hexdigest()[:12]}"
    if target.is_file() and os.access(target, os.X_OK):
        return str(target)
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not compiler:
        raise SandboxError("the local sandbox needs a C compiler to build its entry helper once "
                           "(apt-get install gcc libc6-dev)")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{secrets.token_hex(4)}")
    try:
        done = subprocess.run([compiler, "-O2", "-Wall", "-o", str(tmp), str(_SOURCE)], capture_output=True,
                              text=True, timeout=120)
        if done.returncode != 0:
            raise SandboxError(f"building the sandbox entry helper failed: {(done.stderr or done.stdout)[-500:]}")
        os.chmod(tmp, 0o755)
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    return str(target)
