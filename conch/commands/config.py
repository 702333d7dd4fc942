"""`conch config show`: print the resolved training config with every field's documentation.

`--preset NAME` shows a preset (conch/configs/NAME.toml) resolved over the defaults, as `conch train --preset
NAME` would run it; precedence: defaults < preset < --config file < section.key=value."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("config", help="show the resolved config, every field documented (one action: show)",
                       description=__doc__)
    csub = p.add_subparsers(dest="config_cmd", metavar="ACTION", required=True)
    show = csub.add_parser("show", help="print the resolved config (TOML with docs)")
    show.add_argument("--preset", metavar="NAME", help="a named config (e.g. demo, qwen3-30b-a3b) applied over the "
                                                       "defaults, before --config and the overrides")
    show.add_argument("--config", help="TOML config file (applied over the defaults and the preset, before the "
                                       "overrides)")
    show.add_argument("overrides", nargs="*", metavar="section.key=value", help="config overrides")
    show.set_defaults(func=run_show)


def run_show(args: argparse.Namespace) -> int:
    from conch.cli import UsageError
    from conch.config import ConfigError, describe, load_config

    try:
        cfg = load_config(args.config, args.overrides, preset=args.preset)
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    print(describe(cfg))
    return 0
