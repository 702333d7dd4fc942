"""The `conch` command line.

Each subcommand lives in `conch/commands/<name>.py` and exposes `register(subparsers)`. Those modules import
only argparse at load time, and do their heavy imports (torch, transformers, docker) inside the function that
runs the command, so `conch --help` answers in well under a second.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# Order is the order shown in `conch --help`.
COMMANDS = (
    "train",
    "check",
    "rollout",
    "eval",
    "report",
    "export",
    "synth",
    "decontam",
    "model",
    "images",
    "sandbox",
    "config",
    "bench",
)


class UsageError(Exception):
    """Bad arguments or input detected after parsing; printed without a traceback, exit status 2."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="conch",
        description="Train long-horizon terminal agents with RL on Mixture-of-Experts models.",
    )
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"conch.commands.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"conch.commands.{name}":
                raise
            continue  # command not built yet
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.version:
        from conch import __version__

        print(__version__)
        return 0
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except UsageError as exc:
        print(f"conch {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
