"""`conch bench NAME`: benchmarks of the real code paths. Each lives in `conch/bench/<name>.py`."""

from __future__ import annotations

import argparse
import importlib

BENCHES = {
    "sandbox": "sandbox start time and persistent-shell round trip per backend",
    "engine": "decode tokens/s vs batch size, routing-capture overhead, long conversations",
    "horizon": "seconds for 30/100/300-turn conversations with and without prefix reuse",
    "rollout": "agent-loop throughput vs the engine alone and vs sequential trajectories",
    "mismatch": "train/inference log-prob gap: neither / tito / r3 / both",
    "train": "trainer tokens/s and peak memory vs sequence length",
    "scale": "Ray rollout workers: scaling, a killed worker, off-policy overlap, weight sync",
}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="run a benchmark", description=__doc__)
    bsub = p.add_subparsers(dest="bench", metavar="NAME", required=True)
    for name, help_text in BENCHES.items():
        try:
            module = importlib.import_module(f"conch.bench.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"conch.bench.{name}":
                raise
            continue
        bp = bsub.add_parser(name, help=help_text, description=help_text)
        bp.add_argument("--json", action="store_true", help="print one JSON object to stdout")
        module.add_arguments(bp)
        bp.set_defaults(func=module.run)
