"""`conch images build-base`: build the base environment the sandboxes start from.

`--local` builds the Debian trixie (Python 3.13) base root of the local (bubblewrap) backend under CONCH_HOME, with the
offline verifier toolchain (pytest, pytest-json-ctrf, uv). It is idempotent: seconds when already built.
`--tarball` also writes the root as a tar (e.g. for `docker import`) and prints its path.
`--docker` imports that same root (built first when missing) as the docker backend's base image
`conch/base:<recipe id>`, so both backends run the same toolchain; `--force` re-imports it.
Backends are listed in BUILDERS so another backend can add its own option.
"""

from __future__ import annotations

import argparse
import sys
from typing import Callable


def _build_local(args: argparse.Namespace) -> int:
    import time

    from conch.sandbox.base import SandboxError
    from conch.sandbox.baseroot import base_ready, build_base_root, recipe_id, rootfs_tarball, root_path

    t0 = time.monotonic()
    try:
        if base_ready() and not args.force:
            print(f"base root {recipe_id()} already built at {root_path()}", file=sys.stderr)
        else:
            build_base_root(force=args.force)
        print(root_path())
        if args.tarball:
            print(rootfs_tarball())
    except SandboxError as exc:
        print(f"conch images build-base: {exc}", file=sys.stderr)
        return 1
    print(f"done in {time.monotonic() - t0:.1f} s", file=sys.stderr)
    return 0


def _build_docker(args: argparse.Namespace) -> int:
    import time

    from conch.sandbox import docker_images
    from conch.sandbox.base import SandboxError

    t0 = time.monotonic()
    try:
        c = docker_images.client()
        try:
            print(docker_images.ensure_base_image(c, force=args.force))
        finally:
            c.close()
    except SandboxError as exc:
        print(f"conch images build-base: {exc}", file=sys.stderr)
        return 1
    print(f"done in {time.monotonic() - t0:.1f} s", file=sys.stderr)
    return 0


# backend name -> builder; each gets a `--<name>` flag.
BUILDERS: dict[str, tuple[str, Callable[[argparse.Namespace], int]]] = {
    "local": ("build the local backend's Debian base root (debootstrap, needs root)", _build_local),
    "docker": ("docker import the same base root as the docker backend's base image (needs an engine)",
               _build_docker),
}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("images", help="build sandbox base images", description=__doc__)
    isub = p.add_subparsers(dest="images_cmd", metavar="ACTION", required=True)
    b = isub.add_parser("build-base", help="build the base root/image of a sandbox backend", description=__doc__)
    for name, (help_text, _) in BUILDERS.items():
        b.add_argument(f"--{name}", action="store_true", help=help_text)
    b.add_argument("--force", action="store_true", help="rebuild even when up to date")
    b.add_argument("--tarball", action="store_true", help="also write the base root as a tar and print its path")
    b.set_defaults(func=run_build_base)


def run_build_base(args: argparse.Namespace) -> int:
    chosen = [name for name in BUILDERS if getattr(args, name, False)] or ["local"]
    for name in chosen:
        rc = BUILDERS[name][1](args)
        if rc:
            return rc
    return 0
