"""Benchmarks. Each module: `add_arguments(parser)` and `run(args) -> int`; they measure the real code paths."""

from __future__ import annotations

import argparse
from typing import Any, Iterable, Mapping


def settle_args(args: argparse.Namespace, quick: Mapping[str, Any], at_least_one: Iterable[str]) -> None:
    """Apply the `--quick` settings when asked, then check that the named options are at least 1."""
    from conch.cli import UsageError

    if getattr(args, "quick", False):
        for key, value in quick.items():
            setattr(args, key, value)
    for name in at_least_one:
        if getattr(args, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be at least 1")
