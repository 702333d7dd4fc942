"""The one table of base images that conch replaces offline, and what the replacement promises.

Why: nothing can be pulled from a registry here, yet task Dockerfiles start `FROM python:3.13-slim`,
`FROM ubuntu:24.04` or `FROM ghcr.io/laude-institute/t-bench/python-3-13`. Both backends start such stages
from the same Debian trixie base root (python3 3.13, pip, uv, pytest, the usual CLI tools) and apply what
the original image would have set: the Terminal-Bench base images set `WORKDIR /app` (TB1 tasks rely on it:
their files land in `/` and their verifier aborts otherwise). Where the stand-in cannot keep a promise
(`python:3.14` asks for a Python the root lacks), `note` says so, once per image, instead of staying silent.
The docs' table (docs/readme/24-tasks.md) is this table in words.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from conch.sandbox.baseroot import DEBIAN_RELEASE, PYTHON_VERSION, SUITE

# What the base root is, in every message that names it: derived from the recipe, so it cannot go stale.
BASE_DESCRIPTION = f"Debian {DEBIAN_RELEASE} {SUITE}, Python {PYTHON_VERSION}"
BASE_PYTHON = tuple(int(x) for x in PYTHON_VERSION.split("."))


@dataclass(frozen=True)
class StandIn:
    """What replacing `pattern` means: the image's own WORKDIR (None: `/`), and a label for messages."""

    pattern: re.Pattern
    label: str
    workdir: str | None = None


STANDINS: tuple[StandIn, ...] = (
    StandIn(re.compile(r"^(docker\.io/)?(library/)?python:3(\.\d+){0,2}(-slim)?(-(bookworm|trixie|bullseye))?$"),
            "python:3.x"),
    StandIn(re.compile(r"^(docker\.io/)?(library/)?debian(:[\w.-]+)?$"), "debian:*"),
    StandIn(re.compile(r"^(docker\.io/)?(library/)?ubuntu(:[\w.-]+)?$"), "ubuntu:*"),
    StandIn(re.compile(r"^ghcr\.io/laude-institute/t-bench/[\w./-]+(:[\w.-]+)?$"), "t-bench/*", workdir="/app"),
)
SUPPORTED = "python:3.x, debian:*, ubuntu:*, ghcr.io/laude-institute/t-bench/*"


def standin_for(ref: str) -> StandIn | None:
    """The stand-in replacing FROM reference `ref` (digest ignored), or None when it has none."""
    ref = ref.split("@", 1)[0]
    return next((s for s in STANDINS if s.pattern.match(ref)), None)


def requested_python(ref: str) -> tuple[int, int] | None:
    """The Python version a FROM reference promises (`python:3.12-slim`, `t-bench/python-3-13`), if any."""
    m = re.search(r"python[:-]3[.-](\d+)", ref)
    return (3, int(m.group(1))) if m else None


def note(ref: str) -> str:
    """One line saying what `ref` runs on, including any promise the stand-in does not keep."""
    text = f"FROM {ref} cannot be pulled here; it runs on the offline base ({BASE_DESCRIPTION})"
    want = requested_python(ref)
    if want and want != BASE_PYTHON:
        text += (f"; Python {want[0]}.{want[1]} is not available offline, so python3 is "
                 f"{BASE_PYTHON[0]}.{BASE_PYTHON[1]} (uv/uvx requests for {want[0]}.{want[1]} are mapped to it, "
                 "with a warning)")
    s = standin_for(ref)
    if s and s.workdir:
        text += f"; WORKDIR {s.workdir} as in the original image"
    return text
