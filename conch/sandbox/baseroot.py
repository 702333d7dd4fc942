"""The Debian base root of the local backend (and of the docker base image), with the offline verifier
toolchain baked in.

Why: every local sandbox is an overlay over one read-only root, so it must be built once per machine
(debootstrap from Debian packages, about a minute) and then cost nothing. The standard Terminal-Bench 2.x
verifier is `uvx -p 3.13 -w pytest==8.4.1 -w pytest-json-ctrf==0.3.5 pytest ...` and the box has no network,
so the requested interpreter must already be there: the root is Debian 13 "trixie", whose python3 is 3.13.
The wheels are downloaded on the host at build time, pytest and the CTRF plugin are installed into the root's
python3, the wheelhouse stays in the root, and the sandbox's default environment points pip and uv at it,
offline.

uv/uvx are reached through a small shim (`/usr/local/bin/uv`, `uvx`): when a command asks for a Python
version this root does not have (`-p 3.11`, `--python 3.12`, UV_PYTHON), the shim substitutes the closest
installed one and says so on stderr and in WARNINGS_FILE, which the verifier reports as a result warning:
never a silent substitution, and never a verifier that dies on "no interpreter found". The build runs the
verifier forms offline before it publishes the root, so a broken toolchain never ships.

Each recipe gets its own folder (`root-<recipe id>`), so building a new recipe never disturbs sandboxes or
other checkouts still running on the previous one.

The root is built in a temporary folder and renamed into place; a file lock makes concurrent builders wait.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import secrets
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

from conch.sandbox import paths, uvshim
from conch.sandbox.base import SandboxError
from conch.sandbox.bwrap import DEFAULT_PATH, BoxConfig, require_host, run_box, shift_tree, write_id_maps
from conch.sandbox.enter import enter_binary

SUITE = "trixie"
DEBIAN_RELEASE = "13"  # SUITE's release number, for messages ("Debian 13 trixie")
MIRROR = "http://deb.debian.org/debian"
PACKAGES = ("python3", "python3-venv", "python3-pip", "python-is-python3", "tmux", "procps", "ca-certificates",
            "curl", "wget", "git", "less", "xz-utils", "bzip2", "unzip", "patch", "file", "gzip", "findutils",
            "grep", "sed", "diffutils")
PYTHON_VERSION = "3.13"  # the python3 of SUITE; what `uvx -p 3.13` (the TB2 verifier) asks for
VERIFIER_PINS = ("pytest==8.4.1", "pytest-json-ctrf==0.3.5")
UV_PIN = "uv==0.13.9"
# Marker-conditional dependencies of pytest: not installed on 3.13, but `uv add`/`uv lock` resolve for every
# Python version and need their metadata.
UNIVERSAL_EXTRAS = ("colorama==0.4.6", "exceptiongroup==1.3.2", "tomli==2.5.0", "typing_extensions==4.16.0")
RECIPE_VERSION = 5  # 5: stored with box ids shifted by bwrap.ID_BASE
WHEELS_IN_ROOT = "/opt/conch/wheels"
STAMP_IN_ROOT = "opt/conch/base.json"
# Offline, apt's retries with back-off make every `apt-get update` of a verifier script wait ~7 s for nothing.
APT_OFFLINE_CONF = "/opt/conch/apt-offline.conf"
# The real uv binaries; /usr/local/bin/uv and uvx are the interpreter shim (UV_SHIM) in front of them.
UV_REAL_DIR = "/usr/local/lib/conch/uv"
# Lines the shims write when they substitute an interpreter; the verifier reports them as warnings.
WARNINGS_FILE = "/var/log/conch/warnings.log"

# Default environment of every local sandbox (agent shells, exec, verifier). Offline package tools resolve from
# the wheelhouse; pip may install into the system python like in the python:* images.
RUNTIME_ENV = {
    "PATH": DEFAULT_PATH,
    "HOME": "/root",
    "LANG": "C.UTF-8",
    "DEBIAN_FRONTEND": "noninteractive",
    "PIP_BREAK_SYSTEM_PACKAGES": "1",
    "PIP_NO_INDEX": "1",
    "PIP_FIND_LINKS": WHEELS_IN_ROOT,
    "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    "UV_OFFLINE": "1",
    "UV_NO_INDEX": "1",
    "UV_FIND_LINKS": WHEELS_IN_ROOT,
    "UV_PYTHON_DOWNLOADS": "never",
    "UV_PYTHON_PREFERENCE": "only-system",
    "APT_CONFIG": APT_OFFLINE_CONF,
}
# Mount point of the host's CA bundle in Dockerfile RUN steps of the local builder (an empty file in the root,
# so the bind leaves no trace in a layer); the docker builder copies the bundle to the same path.
BUILD_CA = "/usr/local/share/conch/build-ca.crt"
# Variables through which common tools find a CA bundle; all point at BUILD_CA in RUN steps.
CA_VARS = ("SSL_CERT_FILE", "PIP_CERT", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "NODE_EXTRA_CA_CERTS",
           "GIT_SSL_CAINFO", "CARGO_HTTP_CAINFO")
# Environment of Dockerfile RUN steps (they have network).
BUILD_ENV = {
    "PATH": DEFAULT_PATH,
    "HOME": "/root",
    "LANG": "C.UTF-8",
    "DEBIAN_FRONTEND": "noninteractive",
    "PIP_BREAK_SYSTEM_PACKAGES": "1",
    "PIP_DISABLE_PIP_VERSION_CHECK": "1",
}

_UV_ENV_SCRIPT = """#!/bin/sh
# add binaries to PATH if they aren't added yet (as written by uv's installer)
case ":${PATH}:" in
    *:"$HOME/.local/bin":*)
        ;;
    *)
        export PATH="$HOME/.local/bin:$PATH"
        ;;
esac
"""


def recipe() -> dict:
    return {"suite": SUITE, "mirror": MIRROR, "packages": list(PACKAGES), "verifier": list(VERIFIER_PINS),
            "uv": UV_PIN, "extras": list(UNIVERSAL_EXTRAS), "version": RECIPE_VERSION}


def recipe_id() -> str:
    return hashlib.sha256(json.dumps(recipe(), sort_keys=True).encode()).hexdigest()[:16]


def root_path() -> Path:
    """`base/root-<recipe id>`: a new recipe is built beside the old root, never over it."""
    return paths.base_dir() / f"root-{recipe_id()}"


def base_ready() -> bool:
    try:
        stamp = json.loads((root_path() / STAMP_IN_ROOT).read_text())
    except (OSError, ValueError):
        return False
    return stamp.get("id") == recipe_id()


def _log(msg: str) -> None:
    print(f"conch: {msg}", file=sys.stderr, flush=True)


def ensure_base_root(quiet: bool = False) -> Path:
    """Return the base root, building it first when missing or stale (needs network to Debian and PyPI)."""
    if base_ready():
        return root_path()
    return build_base_root(quiet=quiet)


def build_base_root(force: bool = False, quiet: bool = False) -> Path:
    require_host()
    if shutil.which("debootstrap") is None:
        raise SandboxError("debootstrap is not installed (apt-get install debootstrap); it builds the base root")
    base = paths.base_dir()
    base.mkdir(parents=True, exist_ok=True)
    with open(base / "build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if base_ready() and not force:
            return root_path()
        tmp = base / f".build-{os.getpid()}-{secrets.token_hex(4)}"
        tmp.mkdir()
        try:
            t0 = time.monotonic()
            root = tmp / "root"
            _debootstrap(root, quiet)
            _configure(root)
            wheels = download_wheelhouse(quiet)
            _install_toolchain(root, tmp, wheels, quiet)
            (root / STAMP_IN_ROOT).write_text(json.dumps({"id": recipe_id(), **recipe(),
                                                           "built_at": time.time()}, indent=1))
            shift_tree(root)
            _publish(root, base)
            if not quiet:
                _log(f"base root ready at {root_path()} ({time.monotonic() - t0:.0f} s)")
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return root_path()


def _run_host(argv: list[str], what: str, quiet: bool) -> None:
    proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if proc.returncode != 0:
        raise SandboxError(f"{what} failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}")
    if not quiet:
        _log(f"{what}: done")


def _debootstrap(root: Path, quiet: bool) -> None:
    cache = paths.debs_cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    if not quiet:
        _log(f"debootstrap {SUITE} into {root} (about a minute)...")
    # A private mount namespace: the mounts debootstrap makes inside the target can never leak to the host.
    _run_host(["unshare", "--mount", "--propagation", "private", "--", "debootstrap", "--variant=minbase",
               f"--include={','.join(PACKAGES)}", f"--cache-dir={cache}", SUITE, str(root), MIRROR],
              "debootstrap", quiet)


def _configure(root: Path) -> None:
    etc = root / "etc"
    (etc / "hosts").write_text("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n")
    (etc / "hostname").write_text("sandbox\n")
    resolv = etc / "resolv.conf"
    if resolv.is_symlink() or resolv.exists():
        resolv.unlink()
    resolv.write_text("")
    (etc / "apt" / "sources.list").write_text(
        f"deb {MIRROR} {SUITE} main\ndeb {MIRROR} {SUITE}-updates main\n"
        f"deb http://deb.debian.org/debian-security {SUITE}-security main\n")
    for sub in ("var/cache/apt/archives", "var/lib/apt/lists"):
        for entry in (root / sub).glob("*"):
            if entry.is_file() and entry.name not in ("lock",):
                entry.unlink()
    for d in ("logs/agent", "logs/verifier", "root/.local/bin", "opt/conch"):
        (root / d).mkdir(parents=True, exist_ok=True)
    (root / APT_OFFLINE_CONF.lstrip("/")).write_text('Acquire::Retries "0";\n')
    ca = root / BUILD_CA.lstrip("/")
    ca.parent.mkdir(parents=True, exist_ok=True)
    ca.write_bytes(b"")
    env_script = root / "root/.local/bin/env"
    env_script.write_text(_UV_ENV_SCRIPT)
    env_script.chmod(0o755)


def download_wheelhouse(quiet: bool = False) -> Path:
    """Download the toolchain wheels on the host (cached in CONCH_HOME/wheelhouse)."""
    dest = paths.wheelhouse_dir()
    dest.mkdir(parents=True, exist_ok=True)
    pip = [sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check", "--only-binary=:all:",
           "-d", str(dest)]
    _run_host([*pip, *VERIFIER_PINS, UV_PIN], "pip download (verifier toolchain)", quiet)
    _run_host([*pip, "--no-deps", *UNIVERSAL_EXTRAS], "pip download (resolution metadata)", quiet)
    return dest


def _install_toolchain(root: Path, tmp: Path, wheels: Path, quiet: bool) -> None:
    target = root / WHEELS_IN_ROOT.lstrip("/")
    target.mkdir(parents=True, exist_ok=True)
    uv_wheel = None
    for whl in sorted(wheels.glob("*.whl")):
        shutil.copy2(whl, target / whl.name)
        if whl.name.startswith(f"uv-{UV_PIN.split('==')[1]}-"):
            uv_wheel = whl
    if uv_wheel is None:
        raise SandboxError(f"the uv wheel ({UV_PIN}) is missing from {wheels}")
    real_dir = root / UV_REAL_DIR.lstrip("/")
    real_dir.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(uv_wheel) as zf:
        for name in zf.namelist():
            if ".data/scripts/" in name:
                out = real_dir / name.rsplit("/", 1)[1]
                out.write_bytes(zf.read(name))
                out.chmod(0o755)
    shim = uvshim.render(UV_REAL_DIR, WARNINGS_FILE)
    for tool in ("uv", "uvx"):
        out = root / "usr/local/bin" / tool
        out.write_text(shim)
        out.chmod(0o755)
        link = root / "root/.local/bin" / tool
        if not link.is_symlink():
            link.symlink_to(f"/usr/local/bin/{tool}")
    # Like the python:3.x images: no PEP 668 marker, so `pip install` / `uv pip install --system` just work.
    for marker in (root / "usr/lib").glob("python3*/EXTERNALLY-MANAGED"):
        marker.unlink()
    shift_tree(root)  # box root must own the root it installs into (host ids are "nobody" in a box)
    box = BoxConfig(state_dir=tmp / "box", bind_root=root)
    pins = " ".join("-w " + p for p in VERIFIER_PINS)
    script = (
        f"set -e; uv pip install -q --system {' '.join(VERIFIER_PINS)}\n"
        "pytest --version\n"
        f"python3 -c 'import sys; assert sys.version.startswith(\"{PYTHON_VERSION}.\"), sys.version'\n"
        "cd /tmp && mkdir -p conch-check && cd conch-check\n"
        "printf 'import pytest\\n@pytest.mark.parametrize(\"x\", [1, 2])\\ndef test_ok(x):\\n    assert x\\n'"
        " > test_ok.py\n"
        "pytest -q --ctrf ctrf1.json test_ok.py\n"
        f"uvx -p {PYTHON_VERSION} {pins} pytest -q --ctrf ctrf2.json test_ok.py -p no:cacheprovider\n"
        f"uvx --python={PYTHON_VERSION} {pins} pytest -q test_ok.py\n"
        f"uv venv -q -p {PYTHON_VERSION} /tmp/conch-check/venv && /tmp/conch-check/venv/bin/python -V\n"
        f"uv run -q --no-project -p {PYTHON_VERSION} --with pytest==8.4.1 pytest -q test_ok.py\n"
        # a version the root lacks: the closest one runs, and the substitution is written down
        f"uvx -p 3.11 {pins} pytest -q test_ok.py 2>err.txt; grep -q 'using Python {PYTHON_VERSION}' err.txt\n"
        f"grep -q 'Python 3.11 was requested' {WARNINGS_FILE}\n"
        "test -s ctrf1.json && test -s ctrf2.json\n"
        f"cd / && rm -rf /tmp/conch-check {WARNINGS_FILE}\n"
    )
    if not quiet:
        _log("installing pytest, pytest-json-ctrf and uv into the base root; checking them offline...")
    rc, out = run_box(box, ["/bin/bash", "-c", script], env=RUNTIME_ENV, capture=True)
    if rc != 0:
        raise SandboxError(f"installing the offline verifier toolchain failed (exit {rc}):\n{out[-3000:]}")


def _publish(root: Path, base: Path) -> None:
    """Rename the new root into place. A previous root is only moved aside: running sandboxes may still have
    it as their overlay's lowest layer; `gc_old_roots` deletes it later."""
    final = root_path()
    if final.exists():
        os.rename(final, base / f".old-{int(time.time())}-{secrets.token_hex(4)}")
    os.rename(root, final)


def gc_old_roots(min_age_s: float = 3600.0) -> list[str]:
    """Delete base roots replaced more than `min_age_s` ago (a forced rebuild's `.old-*`, the `root-<id>` of other
    recipes, unchanged for that long) and build folders of crashed builds."""
    removed = []
    base = paths.base_dir()
    current = root_path().name
    stale = [*base.glob(".old-*"), *(r for r in base.glob("root-*") if r.name != current)] if base.is_dir() else []
    for entry in stale:
        if time.time() - entry.stat().st_mtime > min_age_s:
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry.name)
    for tar in base.glob("rootfs-*.tar") if base.is_dir() else []:
        if tar.name != f"rootfs-{recipe_id()}.tar":
            tar.unlink(missing_ok=True)
            removed.append(tar.name)
    if base.is_dir():
        with open(base / "build.lock", "w") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return removed  # a build is running
            for entry in base.glob(".build-*"):
                shutil.rmtree(entry, ignore_errors=True)
                removed.append(entry.name)
    return removed


def rootfs_tarball() -> Path:
    """A tar of the base root (numeric owners), e.g. for `docker import`. Built once per recipe."""
    root = ensure_base_root()
    out = paths.base_dir() / f"rootfs-{recipe_id()}.tar"
    if out.exists():
        return out
    tmp = out.with_name(f".{out.name}.{secrets.token_hex(4)}")
    # The root is stored with box ids shifted by ID_BASE (bwrap.shift_tree): tar it from inside a user
    # namespace that maps them back, so the image has the ids 0..65535 of an ordinary root.
    with open(tmp, "wb") as out_fh:
        proc = subprocess.Popen([enter_binary(), "--new-userns", "--", "tar", "--numeric-owner", "--xattrs", "-cf",
                                 "-", "."], cwd=root, stdin=subprocess.PIPE, stdout=out_fh, stderr=subprocess.PIPE)
        try:
            write_id_maps(proc.pid)
            _, err = proc.communicate(b"go\n")
        except BaseException:
            proc.kill()
            proc.wait()
            raise
    if proc.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise SandboxError(f"tar of the base root failed: {err.decode(errors='replace')[-2000:]}")
    os.rename(tmp, out)
    return out
