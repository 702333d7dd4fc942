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
    from conch.sandbox import paths
    from conch.sandbox.baseroot import gc_old_roots
    from conch.sandbox.local import gc_sandboxes
    from conch.sandbox.localbuild import prune_layers

    if args.unused_days is not None and args.unused_days < 0:
        raise UsageError("--unused-days must be >= 0")

    removed = gc_sandboxes()
    for name in removed:
        print(f"removed sandbox state {name}")
    print(f"{len(removed)} stale sandbox(es) cleaned under {paths.sandboxes_dir()}")
    for name in gc_old_roots():
        print(f"removed old base root folder {name}")
    if args.layers or args.unused_days is not None:
        n = prune_layers(None if args.layers else args.unused_days)
        print(f"{n} cached layer(s) deleted from {paths.layers_dir()}")
    return _gc_docker(args)


def _gc_docker(args: argparse.Namespace) -> int:
    """Containers of the docker backend whose conch process is gone (labels name the owner)."""
    from conch.sandbox.docker_images import engine_problem

    problem = engine_problem(timeout=3.0)
    if problem is not None:
        print(f"docker: skipped ({problem})")
        return 0
    from conch.sandbox.docker import gc

    report = gc(remove_images=args.images)
    for name in report.containers:
        print(f"removed docker container {name}")
    print(f"{len(report.containers)} stale docker sandbox(es) removed ({report.kept_running} of live runs kept)")
    if report.verifier:
        print(f"{len(report.verifier)} leftover verifier snapshot(s)/volume(s) removed")
    if args.images:
        print(f"{len(report.images)} cached docker image(s) deleted")
    return 0
