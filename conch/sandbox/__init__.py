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


def make_sandbox(backend: str, spec: SandboxSpec) -> Sandbox:
    """Create (not start) a sandbox of the named backend for `spec`."""
    if backend == "local":
        from conch.sandbox.local import LocalSandbox

        return LocalSandbox(spec)
    if backend == "docker":
        from conch.sandbox.docker import DockerSandbox

        return DockerSandbox(spec)
    raise ValueError(f"unknown sandbox backend {backend!r}; choose one of {', '.join(BACKENDS)}")
