"""`conch images build-base`: build the base environment the sandboxes start from.

`--local` builds the Debian trixie (Python 3.13) base root of the local (bubblewrap) backend under CONCH_HOME, with the
offline verifier toolchain (pytest, pytest-json-ctrf, uv). It is idempotent: seconds when already built.
`--tarball` also writes the root as a tar (e.g. for `docker import`) and prints its path.
`--docker` imports that same root (built first when missing) as the docker backend's base image
`conch/base:<recipe id>`, so both backends run the same toolchain; `--force` re-imports it.
Each backend of the sandbox registry (conch/sandbox/registry.py) gets its own option.
"""

from __future__ import annotations

import argparse
import sys

from conch.sandbox.registry import BACKENDS


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("images", help="build sandbox base images", description=__doc__)
    isub = p.add_subparsers(dest="images_cmd", metavar="ACTION", required=True)
    b = isub.add_parser("build-base", help="build the base root/image of a sandbox backend", description=__doc__)
    for name, backend in BACKENDS.items():
        b.add_argument(f"--{name}", action="store_true", help=backend.build_help)
    b.add_argument("--force", action="store_true", help="rebuild even when up to date")
    b.add_argument("--tarball", action="store_true", help="also write the base root as a tar and print its path")
    b.set_defaults(func=run_build_base)


def run_build_base(args: argparse.Namespace) -> int:
    import time

    from conch.sandbox.base import SandboxError

    chosen = [name for name in BACKENDS if getattr(args, name, False)] or ["local"]
    for name in chosen:
        t0 = time.monotonic()
        try:
            BACKENDS[name].build_base(args.force, args.tarball, print)
        except SandboxError as exc:
            print(f"conch images build-base: {exc}", file=sys.stderr)
            return 1
        print(f"done in {time.monotonic() - t0:.1f} s", file=sys.stderr)
    return 0
