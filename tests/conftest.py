"""Shared fixtures.

`base_root`: the local sandbox backend's Debian base root (built once, about a minute, when missing). Tests
that start local sandboxes take it; they skip with the reason when the host cannot run them (no bubblewrap,
not root), except in CI (CI=true), where that is a failure.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest


def local_sandbox_problem() -> str | None:
    """Why local sandboxes cannot run here, or None."""
    missing = [t for t in ("bwrap", "unshare", "nsenter", "debootstrap") if shutil.which(t) is None]
    if missing:
        return f"missing host tools for the local sandbox: {', '.join(missing)}"
    if os.geteuid() != 0:
        return "the local sandbox backend needs root"
    return None


@pytest.fixture(scope="session")
def base_root() -> Path:
    problem = local_sandbox_problem()
    if problem is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true but {problem}")
        pytest.skip(problem)
    from conch.sandbox.baseroot import ensure_base_root

    return ensure_base_root()
