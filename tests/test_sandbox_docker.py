"""The `docker` sandbox backend, on a real Docker engine.

Tests that need an engine skip, with the reason, when none answers; in CI (CI=true) they fail instead, since
.ci/run starts one. Dockerfile rewriting and compose parsing are tested without an engine.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from conch.sandbox import SandboxError, SandboxSpec, make_sandbox
from conch.sandbox import docker_images as di
from conch.sandbox.base import Limits

REPO = Path(__file__).resolve().parents[1]
CONCH = [sys.executable, "-m", "conch"]

_problem = di.engine_problem()


def _need_engine() -> None:
    if _problem is None:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true but {_problem}")
    pytest.skip(_problem)


@pytest.fixture(scope="module")
def engine() -> None:
    _need_engine()


def run(coro):
    return asyncio.run(coro)


def write_task_env(folder: Path, dockerfile: str, files: dict[str, str] | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "Dockerfile").write_text(textwrap.dedent(dockerfile))
    for name, text in (files or {}).items():
        (folder / name).write_text(text)
    return folder


@pytest.fixture(scope="module")
def app_env(tmp_path_factory, engine) -> Path:
    """A small task environment: stand-in FROM, WORKDIR, ENV and a copied file."""
    return write_task_env(tmp_path_factory.mktemp("env"), """\
        FROM python:3.11-slim-bookworm
        ENV GREETING=hello
        WORKDIR /app
        COPY data.txt /app/data.txt
        """, {"data.txt": "one two\n"})


def spec_for(env_dir: Path, name: str = "t", **kw) -> SandboxSpec:
    return SandboxSpec(name=name, context_dir=env_dir, dockerfile=env_dir / "Dockerfile", **kw)


# --------------------------------------------------------------------------------------- without an engine


def test_standin_patterns():
    for ref in ("python:3.11", "python:3.13-slim", "python:3.12-slim-bookworm", "python:3.11.9-bookworm",
                "docker.io/library/python:3.10-slim", "debian:bookworm-slim", "debian", "ubuntu:24.04",
                "ghcr.io/laude-institute/t-bench/python-3-13:20250620", "ghcr.io/laude-institute/t-bench/ubuntu-24-04"):
        assert di.is_standin_ref(ref), ref
    for ref in ("node:20", "python:2.7", "alpine:3.19", "ghcr.io/other/x:1", "python:3.11-alpine", "rust:1.80"):
        assert not di.is_standin_ref(ref), ref


def test_generate_dockerfile_rewrites_from_lines():
    text = textwrap.dedent("""\
        # syntax=docker/dockerfile:1
        ARG PY=3.12
        FROM --platform=linux/amd64 python:${PY}-slim AS build
        RUN echo a \\
            && echo b
        FROM build AS second
        from scratch
        COPY --from=build /x /x
        FROM ubuntu:22.04
        RUN true
        """)
    gen = di.generate_dockerfile(text, "conch/base:x", "Dockerfile", lambda ref: False)
    assert gen.standins == ("python:3.12-slim", "ubuntu:22.04")
    froms = [line for line in gen.text.splitlines() if line.upper().startswith("FROM")]
    assert froms == ["FROM --platform=linux/amd64 conch/base:x AS build", "FROM build AS second", "FROM scratch",
                     "FROM conch/base:x"]
    # every non-scratch stage gets the build CA for its RUN steps, as build ARGs (never ENV)
    assert gen.text.count(f"COPY {di.BUILD_DIR}/ca.crt {di.CA_IN_IMAGE}") == 3
    assert gen.text.count(f"ARG SSL_CERT_FILE={di.CA_IN_IMAGE}") == 3
    assert "ENV SSL_CERT_FILE" not in gen.text
    assert "RUN echo a \\\n    && echo b" in gen.text  # other instructions untouched


def test_generate_dockerfile_keeps_local_images_and_rejects_unknown():
    gen = di.generate_dockerfile("FROM myorg/tool:1\n", "conch/base:x", "D", lambda ref: ref == "myorg/tool:1")
    assert gen.standins == () and gen.text.startswith("FROM myorg/tool:1\n")
    with pytest.raises(SandboxError, match=r"D:1: FROM node:20 cannot be pulled"):
        di.generate_dockerfile("FROM node:20\n", "conch/base:x", "D", lambda ref: False)
    with pytest.raises(SandboxError, match="no FROM"):
        di.generate_dockerfile("RUN true\n", "conch/base:x", "D", lambda ref: False)


def test_compose_single_service_and_multi_service(tmp_path):
    (tmp_path / "Dockerfile.client").write_text("FROM debian:bookworm\n")
    compose = tmp_path / "docker-compose.yaml"
    compose.write_text(textwrap.dedent("""\
        services:
          client:
            build:
              dockerfile: Dockerfile.client
            image: ${T_BENCH_TASK_DOCKER_CLIENT_IMAGE_NAME}
            command: ["sh", "-c", "sleep infinity"]
            environment:
              - TEST_DIR=${T_BENCH_TEST_DIR}
              - MODE=${MODE:-fast}
            working_dir: /work
        """))
    env = di.environment_of(tmp_path, None, compose)
    assert env.dockerfile == tmp_path / "Dockerfile.client" and env.context_dir == tmp_path
    assert env.env == {"TEST_DIR": "/tests", "MODE": "fast"} and env.workdir == "/work"

    compose.write_text("services:\n  client:\n    build: .\n  db:\n    image: postgres:16\n")
    with pytest.raises(SandboxError, match=r"2 services \(client, db\); multi-service compose tasks are unsupported"):
        di.environment_of(tmp_path, None, compose)


def test_output_cap_keeps_head_and_tail():
    from conch.sandbox.docker import _Capped

    cap = _Capped(100)
    for i in range(1000):
        cap.feed(f"{i:04d}\n".encode())
    text = cap.text()
    assert text.startswith("0000\n0001\n") and text.endswith("0998\n0999\n")
    assert cap.dropped == 5000 - 100 and "truncated" in text


# --------------------------------------------------------------------------------------- with an engine
