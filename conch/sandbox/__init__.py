"""Sandboxes: the protocol (`base`) and its backends (`local` on bubblewrap, `docker`)."""

from __future__ import annotations

from conch.sandbox.base import DEFAULT_OUTPUT_CAP, ExecResult, Limits, Sandbox, SandboxError, SandboxSpec, ShellSession

BACKENDS = ("local", "docker")

__all__ = [
    "BACKENDS",
    "DEFAULT_OUTPUT_CAP",
    "ExecResult",
    "Limits",
    "Sandbox",
    "SandboxError",
    "SandboxSpec",
    "ShellSession",
    "make_sandbox",
]


def make_sandbox(backend: str, spec: SandboxSpec, registries: bool = False) -> Sandbox:
    """Create (not start) a sandbox of the named backend for `spec`; with `registries`, its commands may reach
    the package registries (and nothing else) through conch.sandbox.network's proxy."""
    if registries:
        from conch.sandbox.network import RegistryNetworkSandbox, with_registry_env

        return RegistryNetworkSandbox(make_sandbox(backend, with_registry_env(spec)))  # type: ignore[return-value]
    if backend == "local":
        from conch.sandbox.local import LocalSandbox

        return LocalSandbox(spec)
    if backend == "docker":
        from conch.sandbox.docker import DockerSandbox

        return DockerSandbox(spec)
    raise ValueError(f"unknown sandbox backend {backend!r}; choose one of {', '.join(BACKENDS)}")
