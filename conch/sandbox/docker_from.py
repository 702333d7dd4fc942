"""FROM lines an engine without registry access can build: references rewritten to the offline base image.

Why: nothing can be pulled from a container registry here, yet task Dockerfiles start with
`FROM python:3.13-slim-bookworm` or a t-bench image. References that have a stand-in (conch/sandbox/standins.py)
become the base image in a generated Dockerfile, plus what the original image sets (e.g. WORKDIR /app), said
once per image; images that exist locally are kept; anything else is refused with the line.
"""

from __future__ import annotations

import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from conch.sandbox.base import SandboxError
from conch.sandbox.baseroot import BUILD_CA, CA_VARS
from conch.sandbox.dockerfile import expand_vars, parse
from conch.sandbox.standins import SUPPORTED, standin_for
from conch.sandbox.standins import note as standin_note

BUILD_DIR = ".conch-build"  # generated files inside the build context
CA_IN_IMAGE = BUILD_CA  # the same path as in the local builder's RUN steps


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)



_announced: set[str] = set()
_announce_lock = threading.Lock()


def is_standin_ref(ref: str) -> bool:
    """True for FROM references that are replaced by the offline base (the table in conch/sandbox/standins.py)."""
    return standin_for(ref) is not None


@dataclass(frozen=True)
class GeneratedDockerfile:
    text: str
    standins: tuple[str, ...]  # original references replaced by the base image
    parents: tuple[str, ...]  # image references the build starts from (after replacement)


def _instruction_end(lines: list[str], first: int, escape: str) -> int:
    """Index of the last physical line of the instruction starting at index `first`."""
    i = first
    while lines[i].rstrip().endswith(escape) and i + 1 < len(lines):
        i += 1
        while i + 1 < len(lines) and (not lines[i].strip() or lines[i].lstrip().startswith("#")):
            i += 1
    return i


def generate_dockerfile(text: str, base_ref: str, source: str, image_exists: Callable[[str], bool],
                        base_args: dict[str, str] | None = None) -> GeneratedDockerfile:
    """Rewrite the FROM lines of Dockerfile `text` (offline stand-ins, build CA); `source` names it in errors.
    Stages that start from the base also get `base_args` as build ARGs (environment of their RUN steps).

    Parsing (continuations, heredocs, the escape directive) is the shared parser's (conch/sandbox/dockerfile.py);
    every other line is passed through unchanged, so the engine builds exactly what the task wrote."""
    df = parse(Path(source), text)
    lines = text.splitlines()
    stages: set[str] = set()
    global_args: dict[str, str] = {}
    standins: list[str] = []
    parents: list[str] = []
    replacements: dict[int, tuple[int, list[str]]] = {}
    for ins in df.instructions:
        if ins.keyword == "ARG" and not replacements:
            for decl in ins.value.split():
                k, _, v = decl.partition("=")
                global_args[k] = v.strip("\"'")
            continue
        if ins.keyword != "FROM":
            continue
        words = ins.value.split()
        if not words:
            raise SandboxError(f"{source}:{ins.line}: FROM without an image")
        try:
            ref = expand_vars(words[0], global_args)
        except ValueError as exc:
            raise SandboxError(f"{source}:{ins.line}: FROM {words[0]}: {exc}") from exc
        alias = words[2] if len(words) >= 3 and words[1].upper() == "AS" else None
        if ref.lower() in stages or ref == "scratch":
            new_ref = ref
        elif image_exists(ref):
            new_ref = ref
            parents.append(ref)
        elif is_standin_ref(ref):
            new_ref = base_ref
            standins.append(ref)
            parents.append(base_ref)
        else:
            raise SandboxError(f"{source}:{ins.line}: FROM {ref} cannot be pulled (no registry access) and has no "
                               f"offline stand-in ({SUPPORTED}); load it into the engine first (`docker load`)")
        # --platform names the platform to pull for; the local base has exactly one (the classic builder may
        # even refuse the flag), so it is dropped for stand-ins
        flags = [f"--{k}={v}" for k, v in ins.flags if not (new_ref == base_ref and k == "platform")]
        head = " ".join(["FROM", *flags, new_ref] + (["AS", alias] if alias else []))
        block = [head]
        if new_ref != "scratch":
            block += [f"COPY {BUILD_DIR}/ca.crt {CA_IN_IMAGE}"] + [f"ARG {var}={CA_IN_IMAGE}" for var in CA_VARS]
        if new_ref == base_ref:
            block += [f"ARG {k}={v}" for k, v in (base_args or {}).items()]
            standin = standin_for(ref)
            if standin is not None and standin.workdir:  # what the original image sets (t-bench: /app)
                block.append(f"WORKDIR {standin.workdir}")
        if alias:
            stages.add(alias.lower())
        first = ins.line - 1
        replacements[first] = (_instruction_end(lines, first, df.escape), block)
    if not replacements:
        raise SandboxError(f"{source}: no FROM instruction")
    out: list[str] = []
    i = 0
    while i < len(lines):
        if i in replacements:
            last, block = replacements[i]
            out.extend(block)
            i = last + 1
        else:
            out.append(lines[i])
            i += 1
    return GeneratedDockerfile("\n".join(out) + "\n", tuple(standins), tuple(parents))


def announce_standins(standins: tuple[str, ...], base_ref: str, source: str) -> None:
    """Say once per process and original reference that it was replaced by the offline base."""
    with _announce_lock:
        for ref in standins:
            if ref not in _announced:
                _announced.add(ref)
                _stderr(f"conch: {source}: {standin_note(ref)} (image {base_ref})")
