"""`conch sandbox gc`: clean what crashed runs of the local sandbox backend left behind.

A sandbox killed with its owner leaves only a state folder under CONCH_HOME/sandboxes/ (its disk image and
cgroups; its processes and mounts die with it). `gc` removes those whose owner process is gone, kills any
survivor, deletes replaced base roots (after an hour) and, with `--layers` (all) or `--unused-days N`, prunes the
Dockerfile build cache.
Docker backend: removes the containers (labelled io.conch.kind=sandbox) of conch processes that are gone and,
with `--images`, the cached task images no container uses.
"""

from __future__ import annotations

import argparse

from conch.sandbox import registry


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("sandbox", help="clean up after crashed sandboxes (one action so far: gc)", description=__doc__)
    ssub = p.add_subparsers(dest="sandbox_cmd", metavar="ACTION", required=True)
    gc = ssub.add_parser("gc", help="remove leftovers of crashed sandboxes", description=__doc__)
    gc.add_argument("--layers", action="store_true", help="also delete every cached Dockerfile layer")
    gc.add_argument("--unused-days", type=float, metavar="N",
                    help="also delete cached Dockerfile layers not used for N days")
    gc.add_argument("--images", action="store_true",
                    help="docker: also delete cached task images (and base images of older recipes) not in use")
    gc.set_defaults(func=run_gc)


def run_gc(args: argparse.Namespace) -> int:
    from conch.cli import UsageError

    if args.unused_days is not None and args.unused_days < 0:
        raise UsageError("--unused-days must be >= 0")
    for backend in registry.BACKENDS.values():  # an optional backend (docker) only when it answers
        problem = backend.problem(3.0) if backend.optional else None
        if problem is not None:
            print(f"{backend.name}: skipped ({problem})")
            continue
        backend.gc(args, print)
    return 0
