"""Test-time dependencies: fetch what a verifier script pins while the network is there, serve it offline.

Why: many verifiers install packages when they run (`uvx -w numpy==2.3.1 pytest`, `uv pip install
requests==2.32.3`, `pip install pandas==2.2.3`), but a sandbox has no network, so the install fails and every
test would read as failed. The pins are plain text in `tests/test.sh` / `run-tests.sh`, so they are
downloaded once on the host (which may reach the package index, like an image build) as wheels for the
sandbox's interpreter (CPython 3.13 on Linux x86-64), cached in CONCH_HOME/testdeps/<hash of the pins>, and
copied into the sandbox's wheelhouse (/opt/conch/wheels, where its offline pip and uv look) before the
verifier runs. Requirement files in the tests folder named by the command (`-r /tests/requirements.txt`) are
read too. Only pinned requirements (`name==version`) are fetched: an unpinned one would make the cache depend
on the day. What cannot be fetched (no wheel for the platform, no such version) is returned as a
problem; the verifier then fails offline and `conch.verify` reports that as an error with its cause.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import secrets
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from conch.sandbox import paths
from conch.sandbox.baseroot import VERIFIER_PINS, WHEELS_IN_ROOT

WHEELS_IN_SANDBOX = WHEELS_IN_ROOT
TARGET_PYTHON = "3.13"
# pip expands none of these to each other; list what a trixie (glibc 2.41) x86-64 box can load.
_PLATFORMS = ("manylinux_2_39_x86_64", "manylinux_2_34_x86_64", "manylinux_2_31_x86_64", "manylinux_2_28_x86_64",
              "manylinux_2_27_x86_64", "manylinux_2_24_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
              "manylinux2010_x86_64", "manylinux1_x86_64", "linux_x86_64")
_INSTALL_CMD = re.compile(r"\b(pip3?(\.\d+)? install|uv pip install|uvx|uv tool (run|install)|uv run|uv add)\b")
_PIN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(\[[A-Za-z0-9_,.-]*\])?==[A-Za-z0-9.+!_-]+$")


def pinned_requirements(script: str, tests_dir: Path | None = None) -> list[str]:
    """`name==version` requirements given to an install command in `script` (deduplicated, in order), minus
    the verifier toolchain the base root already has. Requirement files the command names under /tests
    (`-r /tests/requirements.txt`, `--with-requirements ...`) are read from `tests_dir`."""
    found: list[str] = []

    def add(word: str) -> None:
        if _PIN.match(word) and word not in found and word not in VERIFIER_PINS:
            found.append(word)

    for line in script.replace("\\\n", " ").splitlines():
        code = line.split("#", 1)[0] if not line.lstrip().startswith("#") else ""
        if not _INSTALL_CMD.search(code):
            continue
        try:
            words = shlex.split(code)
        except ValueError:
            words = code.split()
        for i, word in enumerate(words):
            if word in ("-r", "--requirement", "--requirements", "--with-requirements") and i + 1 < len(words):
                for req in _requirements_file(words[i + 1], tests_dir):
                    add(req)
                continue
            add(word.split("=", 1)[1] if word.startswith("--with=") else word)
    return found


def _requirements_file(path: str, tests_dir: Path | None) -> list[str]:
    """The requirement lines of `path` when it is a file of the task's tests folder (uploaded to /tests)."""
    for prefix in ("/tests/", "$TEST_DIR/", "${TEST_DIR}/"):
        if path.startswith(prefix) and tests_dir is not None:
            try:
                text = (tests_dir / path[len(prefix):]).read_text(errors="replace")
            except OSError:
                return []
            return [ln.split("#", 1)[0].strip().replace(" ", "") for ln in text.splitlines()]
    return []


def cache_dir(pins: list[str]) -> Path:
    key = hashlib.sha256(("\n".join(sorted(pins)) + f"\n{TARGET_PYTHON}").encode()).hexdigest()[:16]
    return paths.conch_home() / "testdeps" / key


def prefetch(script: Path, tests_dir: Path | None = None) -> tuple[Path | None, str | None]:
    """(folder of wheels to copy into the sandbox, problem) for the pins of verifier `script`.
    (None, None) when it pins nothing; a problem is one line naming what could not be fetched."""
    try:
        pins = pinned_requirements(script.read_text(errors="replace"), tests_dir)
    except OSError:
        return None, None
    if not pins:
        return None, None
    dest = cache_dir(pins)
    if (dest / ".complete").is_file():
        return dest, None
    dest.parent.mkdir(parents=True, exist_ok=True)
    with open(dest.parent / f"{dest.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (dest / ".complete").is_file():
            return dest, None
        tmp = dest.parent / f".tmp-{dest.name}-{secrets.token_hex(4)}"
        tmp.mkdir()
        try:
            cmd = [sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check",
                   "--only-binary=:all:", "--python-version", TARGET_PYTHON, "--implementation", "cp",
                   *[f"--platform={p}" for p in _PLATFORMS], "-d", str(tmp), *pins]
            proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
            if proc.returncode != 0:
                lines = [ln.strip() for ln in proc.stdout.splitlines() if ln.strip().startswith("ERROR")]
                why = lines[0] if lines else (proc.stdout.strip().splitlines() or ["pip download failed"])[-1]
                return None, f"test-time dependencies {' '.join(pins)} could not be fetched: {why[:240]}"
            (tmp / ".complete").write_text("\n".join(pins) + "\n")
            if dest.exists():
                shutil.rmtree(dest)
            os.rename(tmp, dest)
        except (OSError, subprocess.SubprocessError) as exc:
            return None, f"test-time dependencies {' '.join(pins)} could not be fetched: {exc}"
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return dest, None
