"""Test-time dependencies: fetch what a verifier script pins while the network is there, serve it offline.

Why: many verifiers install packages when they run (`uvx -w numpy==2.3.1 pytest`, `uv pip install
requests==2.32.3`, `pip install pandas==2.2.3`), but a sandbox has no network, so the install fails and every
test would read as failed. The pins are plain text in `tests/test.sh` / `run-tests.sh`, so they are
downloaded once on the host (which may reach the package index, like an image build) as wheels for the
sandbox's interpreter (CPython 3.13 on Linux x86-64), cached in CONCH_HOME/testdeps/<hash of the pins>, and
copied into the sandbox's wheelhouse (/opt/conch/wheels, where its offline pip and uv look) before the
verifier runs. Requirement files in the tests folder named by the command (`-r /tests/requirements.txt`) are
read too, and only those: the script is written by the task, so a path that climbs out with `..` or resolves
outside the tests folder through a symlink (`-r /tests/../../etc/passwd`) is never opened; the loaders refuse
such a task (`check_verifier_installs`) and `prefetch` reports it as a problem. Only pinned requirements
(`name==version`) are fetched: an unpinned one would make the cache depend on the day. What cannot be fetched
(no wheel for the platform, no such version) is returned as a problem; the verifier then fails offline and
`conch.verify` reports that as an error with its cause.
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
from conch.tasks.fields import FieldError, is_inside

WHEELS_IN_SANDBOX = WHEELS_IN_ROOT
TARGET_PYTHON = "3.13"
# pip expands none of these to each other; list what a trixie (glibc 2.41) x86-64 box can load.
_PLATFORMS = ("manylinux_2_39_x86_64", "manylinux_2_34_x86_64", "manylinux_2_31_x86_64", "manylinux_2_28_x86_64",
              "manylinux_2_27_x86_64", "manylinux_2_24_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
              "manylinux2010_x86_64", "manylinux1_x86_64", "linux_x86_64")
_INSTALL_CMD = re.compile(r"\b(pip3?(\.\d+)? install|uv pip install|uvx|uv tool (run|install)|uv run|uv add)\b")
_PIN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(\[[A-Za-z0-9_,.-]*\])?==[A-Za-z0-9.+!_-]+$")


_REQ_OPTIONS = ("-r", "--requirement", "--requirements", "--with-requirements")
_TESTS_PREFIXES = ("/tests/", "$TEST_DIR/", "${TEST_DIR}/")


def _install_words(script: str) -> list[list[str]]:
    """The shell words of each line of `script` that runs an install command (comments dropped)."""
    lines = []
    for line in script.replace("\\\n", " ").splitlines():
        code = line.split("#", 1)[0] if not line.lstrip().startswith("#") else ""
        if not _INSTALL_CMD.search(code):
            continue
        try:
            lines.append(shlex.split(code))
        except ValueError:
            lines.append(code.split())
    return lines


def _requirement_option(words: list[str], i: int) -> str | None:
    """The requirements file named by words[i] (`-r FILE`, `--requirement=FILE`, ...), or None."""
    word = words[i]
    if word in _REQ_OPTIONS:
        return words[i + 1] if i + 1 < len(words) else None
    option, eq, value = word.partition("=")
    return value if eq and option in _REQ_OPTIONS[1:] else None


def requirements_files(script: str) -> list[str]:
    """Every requirements file an install command in `script` names, as written (`/tests/requirements.txt`)."""
    return [path for words in _install_words(script) for i in range(len(words))
            if (path := _requirement_option(words, i)) is not None]


def unsafe_requirements_file(path: str, tests_dir: Path | None) -> str | None:
    """Why requirements file `path` (as a verifier script names it) must never be read, or None when it may.

    A file under /tests is read on the host from `tests_dir`, so it must resolve inside that folder: a `..`
    or a symlink out would read any host file (`-r /tests/../../etc/passwd`). A `..` anywhere is refused too,
    whatever the path is relative to (`--with-requirements ../x.txt`): a task has no business there."""
    if ".." in path.replace("\\", "/").split("/"):
        return f"requirements file {path!r} climbs out of its folder with '..'"
    for prefix in _TESTS_PREFIXES:
        if path.startswith(prefix) and tests_dir is not None:
            root = os.path.realpath(tests_dir)
            if not is_inside(os.path.realpath(os.path.join(root, path[len(prefix):])), root):
                return f"requirements file {path!r} is a path outside the tests folder"
    return None


def check_requirements_files(script: str, tests_dir: Path | None) -> str | None:
    """The first requirements file of `script` that must not be read (see `unsafe_requirements_file`), or None."""
    for path in requirements_files(script):
        if (why := unsafe_requirements_file(path, tests_dir)) is not None:
            return why
    return None


def check_verifier_installs(script: Path, tests_dir: Path) -> None:
    """For the loaders: a FieldError when verifier `script` names a requirements file that must not be read."""
    try:
        text = script.read_text(errors="replace")
    except OSError as exc:
        raise FieldError(script, f"cannot read: {exc.strerror}") from None
    if (unsafe := check_requirements_files(text, tests_dir)) is not None:
        raise FieldError(script, unsafe)


def pinned_requirements(script: str, tests_dir: Path | None = None) -> list[str]:
    """`name==version` requirements given to an install command in `script` (deduplicated, in order), minus
    the verifier toolchain the base root already has. Requirement files the command names under /tests
    (`-r /tests/requirements.txt`, `--with-requirements ...`) are read from `tests_dir`; one that resolves
    outside it is never read."""
    found: list[str] = []

    def add(word: str) -> None:
        if _PIN.match(word) and word not in found and word not in VERIFIER_PINS:
            found.append(word)

    for words in _install_words(script):
        skip = False
        for i, word in enumerate(words):
            if skip:
                skip = False
                continue
            if (path := _requirement_option(words, i)) is not None:
                for req in _requirements_file(path, tests_dir):
                    add(req)
                skip = word in _REQ_OPTIONS
                continue
            add(word.split("=", 1)[1] if word.startswith("--with=") else word)
    return found


def _requirements_file(path: str, tests_dir: Path | None) -> list[str]:
    """The requirement lines of `path` when it is a regular file of the task's tests folder (uploaded to
    /tests); nothing for a path outside it, which is never opened."""
    if tests_dir is None or unsafe_requirements_file(path, tests_dir) is not None:
        return []
    for prefix in _TESTS_PREFIXES:
        if path.startswith(prefix):
            file = Path(os.path.realpath(os.path.join(tests_dir, path[len(prefix):])))
            if not file.is_file():
                return []
            try:
                text = file.read_text(errors="replace")
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
        text = script.read_text(errors="replace")
    except OSError:
        return None, None
    if (unsafe := check_requirements_files(text, tests_dir)) is not None:
        return None, f"{script.name}: {unsafe}; not read"
    pins = pinned_requirements(text, tests_dir)
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
