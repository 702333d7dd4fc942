"""Named presets: whole configs for one purpose (the CPU demo, a real model on a named machine), shipped in the
package as conch/configs/NAME.toml.

Why presets: the config defaults are what a real run wants (no time budget, 300 turns, the model's context),
and a demo-sized config that shrinks a real run silently is the bug this replaces. A preset is a config file
with a `[preset]` table of its own (`about`: one line; `needs`: keys a run must set, e.g. model.path), applied
over the defaults and under `--config` and the overrides: defaults < preset < --config file < overrides.
"""

from __future__ import annotations

import difflib
from pathlib import Path

from conch.config import ConfigError, read_toml

PRESETS_DIR = Path(__file__).parent / "configs"
DEMO = "demo"


def list_presets() -> list[str]:
    return sorted(p.stem for p in PRESETS_DIR.glob("*.toml"))


def preset_path(name: str) -> Path:
    """conch/configs/NAME.toml; ConfigError listing the presets (with a "did you mean") when there is none."""
    path = PRESETS_DIR / f"{name}.toml"
    if "/" in name or not path.is_file():
        names = list_presets()
        close = difflib.get_close_matches(name, names, n=1, cutoff=0.5) or [n for n in names if name and name in n]
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise ConfigError(f"--preset: unknown preset {name!r}{hint}; presets: {', '.join(names)}")
    return path


def preset_info(name: str) -> dict:
    """The preset's own `[preset]` table: about (one line), needs (keys a run must set)."""
    info = read_toml(preset_path(name))[0].get("preset", {})
    return {"about": str(info.get("about", "")), "needs": list(info.get("needs", []))}


def preset_tables(name: str) -> dict:
    """The preset's config sections (its `[preset]` table left out), for `load_config`."""
    data = read_toml(preset_path(name))[0]
    data.pop("preset", None)
    return data


def check_needs(name: str, cfg) -> None:
    """ConfigError when a key the preset needs (e.g. model.path) is still empty in the resolved config."""
    info = preset_info(name)
    for key in info["needs"]:
        section, field = key.split(".", 1)
        if not getattr(getattr(cfg, section), field):
            raise ConfigError(f"--preset {name} needs {key}=... ({info['about']})")


def wants_demo(config_file: str | None, overrides: list[str] | tuple) -> bool:
    """`conch train` with neither --config nor a model.path override runs the demo preset."""
    if config_file:
        return False
    keys = {o.split("=", 1)[0].strip(): o.split("=", 1)[1].strip() for o in overrides if "=" in o}
    return not keys.get("model.path")


def demo_notice() -> str:
    """The first log line of a `conch train` that fell back on the demo preset."""
    return (f"conch train: no model.path: using the demo preset (conch/configs/{DEMO}.toml: "
            f"{preset_info(DEMO)['about']}); --preset NAME or model.path=... for a real run "
            f"(presets: {', '.join(list_presets())})")
