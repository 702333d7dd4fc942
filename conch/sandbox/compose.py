"""A task's environment: what to build and how to run it, after reading its compose file if it has one.

Why apart from either backend: both the `local` and the `docker` backend start a task from the same definition
(the Dockerfile, or a compose service's build, image, environment and working_dir), so neither reads the other's
code to learn it. Only single-service compose files are supported (one box per task).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from conch.sandbox.base import SandboxError

# Variables TB1 compose files use; the values its harness gives them inside the container.
_COMPOSE_DEFAULTS = {
    "T_BENCH_TEST_DIR": "/tests",
    "T_BENCH_CONTAINER_LOGS_PATH": "/var/log/tbench",
    "T_BENCH_CONTAINER_AGENT_LOGS_PATH": "/agent-logs",
}



@dataclass(frozen=True)
class Environment:
    """What to build and how to run it, after reading a compose file if there is one.

    `dockerfile` None with `image` None: the bare base image. `image`: a compose service without `build`.
    """

    context_dir: Path | None
    dockerfile: Path | None
    image: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    workdir: str | None = None


def _interpolate(value: str) -> str:
    def sub(m: re.Match[str]) -> str:
        name, default = m.group(1) or m.group(3), m.group(2) or ""
        return _COMPOSE_DEFAULTS.get(name, default)

    return re.sub(r"\$\{(\w+)(?::?-([^}]*))?\}|\$(\w+)", sub, value)


def environment_of(context_dir: Path | None, dockerfile: Path | None, compose_file: Path | None) -> Environment:
    """Resolve a task's environment; a compose file with several services is a SandboxError (unsupported)."""
    if compose_file is None:
        return Environment(context_dir=context_dir, dockerfile=dockerfile)
    import yaml

    try:
        doc = yaml.safe_load(compose_file.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise SandboxError(f"{compose_file}: cannot read compose file: {exc}") from exc
    services = doc.get("services") if isinstance(doc, dict) else None
    if not isinstance(services, dict) or not services:
        raise SandboxError(f"{compose_file}: no `services` table")
    if len(services) > 1:
        raise SandboxError(f"{compose_file}: defines {len(services)} services ({', '.join(sorted(services))}); "
                           "multi-service compose tasks are unsupported by conch sandboxes (one container only)")
    name, svc = next(iter(services.items()))
    svc = svc or {}
    if not isinstance(svc, dict):
        raise SandboxError(f"{compose_file}: service {name!r} must be a mapping")
    env_items = svc.get("environment") or {}
    if isinstance(env_items, list):
        env_items = dict(item.split("=", 1) if "=" in item else (item, "") for item in map(str, env_items))
    env = {str(k): _interpolate(str(v if v is not None else "")) for k, v in env_items.items()}
    workdir = svc.get("working_dir")
    build = svc.get("build")
    if build is None:
        image = svc.get("image")
        if dockerfile is None and image:
            return Environment(None, None, image=_interpolate(str(image)), env=env, workdir=workdir)
        return Environment(context_dir, dockerfile, env=env, workdir=workdir)
    if isinstance(build, str):
        build = {"context": build}
    ctx = (compose_file.parent / _interpolate(str(build.get("context", ".")))).resolve()
    df = ctx / _interpolate(str(build.get("dockerfile", "Dockerfile")))
    if not df.is_file():
        raise SandboxError(f"{compose_file}: service {name!r} builds {df}, which does not exist")
    return Environment(ctx, df, env=env, workdir=workdir)
