"""The sandbox registry: one entry per backend kind, everything a command needs to know about a backend.

Why a registry: choosing a backend used to be an if-chain in `make_sandbox`, the names `("local", "docker")` were
spelled out in each command's flag choices, and `conch sandbox gc`, `conch images build-base`, the benchmarks and
the network wiring each knew both backends by name. Here each backend is one `SandboxBackend` (how to create a
box, whether it can run here, how to collect what crashed runs left, how to build its base); the CLI's choices
are `names()`, and a new backend (e.g. a remote one) is one more entry in `BACKENDS`. What a started box
exposes to callers (its network namespace, what `stop` releases) is on the `Sandbox` protocol itself
(conch/sandbox/base.py), so no caller reads a backend's private fields.

This module imports no backend: each factory imports its own (docker's SDK only when a docker box is made), so
`conch --help` never pays for them.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from typing import Callable

from conch.sandbox.base import Sandbox, SandboxError, SandboxSpec

Out = Callable[[str], None]  # where a gc or build prints its lines (stdout)


@dataclass(frozen=True)
class SandboxBackend:
    """One sandbox backend. `optional`: the default set of a command that runs every backend (`conch bench
    sandbox`, `conch sandbox gc`) includes it only when `problem()` is None (docker: when an engine answers)."""

    name: str
    create: Callable[[SandboxSpec], Sandbox]
    problem: Callable[[float], str | None]  # timeout -> why it cannot run here (a sentence), or None
    gc: Callable[[argparse.Namespace, Out], None]  # remove what crashed runs left (`conch sandbox gc` flags)
    build_help: str  # `conch images build-base --<name>`
    build_base: Callable[[bool, bool, Out], None]  # (force, tarball, out); SandboxError when it cannot
    optional: bool = False


def _create_local(spec: SandboxSpec) -> Sandbox:
    from conch.sandbox.local import LocalSandbox

    return LocalSandbox(spec)


def _create_docker(spec: SandboxSpec) -> Sandbox:
    from conch.sandbox.docker import DockerSandbox

    return DockerSandbox(spec)


def _local_problem(timeout: float = 0.0) -> str | None:
    from conch.sandbox.bwrap import require_host

    try:
        require_host()
    except SandboxError as exc:
        return str(exc)
    return None


def _docker_problem(timeout: float = 5.0) -> str | None:
    from conch.sandbox.docker_images import engine_problem

    return engine_problem(timeout=timeout)


def _gc_local(args: argparse.Namespace, out: Out) -> None:
    """State folders of boxes whose owner is gone (survivors killed), replaced base roots, with `--layers` or
    `--unused-days` the Dockerfile layer cache."""
    from conch.sandbox import paths
    from conch.sandbox.baseroot import gc_old_roots
    from conch.sandbox.local import gc_sandboxes
    from conch.sandbox.localbuild import prune_layers

    removed = gc_sandboxes()
    for name in removed:
        out(f"removed sandbox state {name}")
    out(f"{len(removed)} stale sandbox(es) cleaned under {paths.sandboxes_dir()}")
    for name in gc_old_roots():
        out(f"removed old base root folder {name}")
    if args.layers or args.unused_days is not None:
        n = prune_layers(None if args.layers else args.unused_days)
        out(f"{n} cached layer(s) deleted from {paths.layers_dir()}")


def _gc_docker(args: argparse.Namespace, out: Out) -> None:
    """Containers of the docker backend whose conch process is gone (labels name the owner)."""
    from conch.sandbox.docker_gc import gc

    report = gc(remove_images=args.images)
    for name in report.containers:
        out(f"removed docker container {name}")
    out(f"{len(report.containers)} stale docker sandbox(es) removed ({report.kept_running} of live runs kept)")
    if report.verifier:
        out(f"{len(report.verifier)} leftover verifier snapshot(s)/volume(s) removed")
    if args.images:
        out(f"{len(report.images)} cached docker image(s) deleted")


def _build_local(force: bool, tarball: bool, out: Out) -> None:
    from conch.sandbox.baseroot import base_ready, build_base_root, recipe_id, root_path, rootfs_tarball

    if base_ready() and not force:
        print(f"base root {recipe_id()} already built at {root_path()}", file=sys.stderr)
    else:
        build_base_root(force=force)
    out(str(root_path()))
    if tarball:
        out(str(rootfs_tarball()))


def _build_docker(force: bool, tarball: bool, out: Out) -> None:
    from conch.sandbox import docker_images

    c = docker_images.client()
    try:
        out(docker_images.ensure_base_image(c, force=force))
    finally:
        c.close()


BACKENDS: dict[str, SandboxBackend] = {
    "local": SandboxBackend("local", _create_local, _local_problem, _gc_local,
                            "build the local backend's Debian base root (debootstrap, needs root)", _build_local),
    "docker": SandboxBackend("docker", _create_docker, _docker_problem, _gc_docker,
                             "docker import the same base root as the docker backend's base image (needs an engine)",
                             _build_docker, optional=True),
}


def names() -> tuple[str, ...]:
    """The backend names, in registry order: the CLI's `--sandbox` choices and `sandbox.backend`'s."""
    return tuple(BACKENDS)


def get(name: str) -> SandboxBackend:
    """The backend called `name`; ValueError naming the known ones otherwise."""
    backend = BACKENDS.get(name)
    if backend is None:
        raise ValueError(f"unknown sandbox backend {name!r}; choose one of {', '.join(BACKENDS)}")
    return backend


def default_set(timeout: float = 3.0, warn: Out | None = None) -> list[str]:
    """Every backend that can run here: the required ones, plus each optional one whose probe answers (`warn`
    gets `NAME skipped (why)` for the others)."""
    chosen = []
    for b in BACKENDS.values():
        problem = b.problem(timeout) if b.optional else None
        if problem is None:
            chosen.append(b.name)
        elif warn is not None:
            warn(f"{b.name} skipped ({problem})")
    return chosen
