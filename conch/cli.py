"""The `conch` command line.

Each subcommand lives in `conch/commands/<name>.py` and exposes `register(subparsers)`. Those modules import
only argparse at load time, and do their heavy imports (torch, transformers, docker) inside the function that
runs the command, so `conch --help` answers in well under a second.

Errors are for users: a bad flag, key, path or config prints one line and exits 2 (a typo gets a "did you
mean"); an unexpected failure prints one line and exits 1; `--debug` (anywhere on the line, or CONCH_DEBUG=1)
shows the traceback instead. A check that ran and found a problem (`check --strict` with a failing task,
`decontam` with a flagged task kept) exits 3 (`FOUND_PROBLEM`), so scripts can tell it from a crash. A closed pipe (`conch config show | head`) ends the command quietly. Warnings
print as `conch: warning: <sentence>`, not as `file.py:170: RuntimeWarning`.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import os
import re
import sys

# Order is the order shown in `conch --help`.
COMMANDS = (
    "train",
    "check",
    "task",
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


FOUND_PROBLEM = 3  # exit status of a check that ran and found a problem (not a crash: that is 1)


class UsageError(Exception):
    """Bad arguments or input detected after parsing; printed without a traceback, exit status 2."""


def suggest(word: str, options) -> str:
    close = difflib.get_close_matches(word, list(options), n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""


class Parser(argparse.ArgumentParser):
    """argparse with a "did you mean" for unknown flags and choices (subparsers inherit the class)."""

    def options(self) -> list[str]:
        return [s for a in self._actions for s in a.option_strings]

    def error(self, message: str):
        m = re.match(r"unrecognized arguments: (.*)", message)
        if m:
            hints = [f"{tok}{suggest(tok.split('=')[0], self.options())}" for tok in m.group(1).split()]
            message = "unrecognized arguments: " + " ".join(hints)
        m = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
        if m:
            message += suggest(m.group(1), re.findall(r"'([^']*)'", m.group(2)))
        super().error(message)


def build_parser() -> Parser:
    parser = Parser(
        prog="conch",
        description="Train long-horizon terminal agents with RL on Mixture-of-Experts models.",
        epilog="`conch COMMAND --help` shows a command's flags; `--debug` anywhere shows tracebacks.",
    )
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    parser.add_argument("--debug", action="store_true", help="show the full traceback when a command fails")
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


def _deepest(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The (sub)parser of the command the user chose, e.g. `model init`'s, whose flags a typo is matched to."""
    while True:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        chosen = subs[0].choices.get(getattr(args, subs[0].dest, None) or "") if subs else None
        if chosen is None:
            return parser
        parser = chosen


def _warning_as_sentence(message, category, filename, lineno, file=None, line=None) -> None:
    text = str(message).strip()
    try:
        print(f"conch: warning: {text}", file=file or sys.stderr)
    except (OSError, ValueError):
        pass


def _quiet_broken_pipe() -> int:
    """stdout's reader went away: send the rest to /dev/null so the exit flush cannot fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    return 141  # 128 + SIGPIPE, what a shell reports for a command killed by a closed pipe


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv or os.environ.get("CONCH_DEBUG", "") not in ("", "0")
    argv = [a for a in argv if a != "--debug"]
    import warnings

    saved = warnings.showwarning
    if not debug:
        warnings.showwarning = _warning_as_sentence
    try:
        return _main(argv, debug)
    finally:
        warnings.showwarning = saved


def _main(argv: list[str], debug: bool) -> int:
    parser = build_parser()
    args, extras = parser.parse_known_args(argv)
    if extras:
        _deepest(parser, args).error(f"unrecognized arguments: {' '.join(extras)}")
    if args.version:
        from conch import __version__

        print(__version__)
        return 0
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        status = int(args.func(args) or 0)
        sys.stdout.flush()
        return status
    except BrokenPipeError:
        return _quiet_broken_pipe()
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        from conch.config import ConfigError

        if debug:
            raise
        if isinstance(exc, (UsageError, ConfigError)):
            print(f"conch {args.command}: error: {exc}", file=sys.stderr)
            return 2
        if isinstance(exc, (FileNotFoundError, NotADirectoryError, IsADirectoryError, PermissionError)):
            # a path the user gave that a command did not check itself
            where = f"{exc.filename}: {exc.strerror}" if exc.filename and exc.strerror else str(exc)
            print(f"conch {args.command}: error: {where}", file=sys.stderr)
            return 2
        print(f"conch {args.command}: error: {type(exc).__name__}: {exc} (run again with --debug for the "
              f"traceback)", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
