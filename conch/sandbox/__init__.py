"""Sandboxes: the protocol (`base`) and its backends (`local` on bubblewrap, `docker`), chosen by name from the
registry (`registry`)."""

from __future__ import annotations

from conch.sandbox import registry
from conch.sandbox.base import (DEFAULT_OUTPUT_CAP, Cleanup, ExecResult, Limits, Sandbox, SandboxError, SandboxSpec,
                                ShellSession)

BACKENDS = registry.names()  # the backend names, for flag choices

__all__ = [
    "BACKENDS",
    "Cleanup",
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
    return registry.get(backend).create(spec)
