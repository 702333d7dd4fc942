"""`conch sandbox gc`: clean what crashed runs of the local sandbox backend left behind.

A sandbox killed with its owner leaves only a state folder under CONCH_HOME/sandboxes/ (its disk image and
cgroups; its processes and mounts die with it). `gc` removes those whose owner process is gone, kills any
survivor, deletes replaced base roots (after an hour) and, with `--layers`, empties the Dockerfile build cache.
"""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("sandbox", help="manage local sandboxes", description=__doc__)
    ssub = p.add_subparsers(dest="sandbox_cmd", metavar="ACTION", required=True)
    gc = ssub.add_parser("gc", help="remove leftovers of crashed sandboxes", description=__doc__)
    gc.add_argument("--layers", action="store_true", help="also delete every cached Dockerfile layer")
    gc.set_defaults(func=run_gc)


def run_gc(args: argparse.Namespace) -> int:
    import shutil

    from conch.sandbox import paths
    from conch.sandbox.baseroot import gc_old_roots
    from conch.sandbox.local import gc_sandboxes

    removed = gc_sandboxes()
    for name in removed:
        print(f"removed sandbox state {name}")
    print(f"{len(removed)} stale sandbox(es) cleaned under {paths.sandboxes_dir()}")
    for name in gc_old_roots():
        print(f"removed old base root folder {name}")
    if args.layers:
        layers = paths.layers_dir()
        n = len([p for p in layers.iterdir() if p.is_dir()]) if layers.is_dir() else 0
        shutil.rmtree(layers, ignore_errors=True)
        print(f"{n} cached layer(s) deleted from {layers}")
    return 0
