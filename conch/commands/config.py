"""`conch config show`: print the resolved training config with every field's documentation."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("config", help="show the resolved config, every field documented (one action: show)",
                       description=__doc__)
    csub = p.add_subparsers(dest="config_cmd", metavar="ACTION", required=True)
    show = csub.add_parser("show", help="print the resolved config (TOML with docs)")
    show.add_argument("--config", help="TOML config file (applied over the defaults, before the overrides)")
    show.add_argument("overrides", nargs="*", metavar="section.key=value", help="config overrides")
    show.set_defaults(func=run_show)


def run_show(args: argparse.Namespace) -> int:
    from conch.cli import UsageError
    from conch.config import ConfigError, describe, load_config

    try:
        cfg = load_config(args.config, args.overrides)
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    print(describe(cfg))
    return 0
