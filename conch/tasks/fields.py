"""Field checks shared by the task loaders.

Why a module of its own: both layouts need the same "is this a positive number / a size / a list of
strings" checks, and every failure must name the file and the field, so a batch of hundreds of tasks reports
exactly which one is broken and why. Checks raise `FieldError`; loaders turn it into a `TaskLoadError`.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any


class FieldError(Exception):
    """A task file has a bad or missing field; `file` is the offending file."""

    def __init__(self, file: Path, message: str):
        super().__init__(message)
        self.file = file
        self.message = message


def positive_number(file: Path, field: str, value: Any, default: float) -> float:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise FieldError(file, f"{field} must be a positive number, got {value!r}")
    return float(value)


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?\s*$", re.IGNORECASE)
_MB_PER_UNIT = {"": 1.0, "k": 1 / 1024, "m": 1.0, "g": 1024.0, "t": 1024.0 * 1024}


def size_mb(file: Path, field: str, value: Any) -> int:
    """A size in MiB: an integer (already MiB) or a string like "2G", "512M", "1.5GiB", "2048"."""
    if isinstance(value, bool):
        raise FieldError(file, f"{field} must be a size like 2048 or \"2G\", got {value!r}")
    if isinstance(value, (int, float)):
        mb = float(value)
    elif isinstance(value, str) and (m := _SIZE.match(value)):
        mb = float(m.group(1)) * _MB_PER_UNIT[m.group(2).lower()]
    else:
        raise FieldError(file, f"{field} must be a size like 2048 or \"2G\", got {value!r}")
    if mb <= 0:
        raise FieldError(file, f"{field} must be positive, got {value!r}")
    return max(1, int(round(mb)))


def string_map(file: Path, field: str, value: Any) -> dict[str, str]:
    """An environment table: string keys, scalar values (converted to strings)."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise FieldError(file, f"{field} must be a table of NAME = value, got {type(value).__name__}")
    out = {}
    for k, v in value.items():
        if isinstance(v, (dict, list)) or v is None:
            raise FieldError(file, f"{field}.{k} must be a string or number, got {v!r}")
        out[str(k)] = str(v).lower() if isinstance(v, bool) else str(v)
    return out


def table(file: Path, field: str, value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise FieldError(file, f"[{field}] must be a table, got {type(value).__name__}")
    return value


def read_text(file: Path, what: str) -> str:
    """The non-empty text of `file`, or a FieldError saying it is missing/empty/unreadable."""
    if not file.is_file():
        raise FieldError(file, f"missing {what}")
    try:
        text = file.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise FieldError(file, f"cannot read {what}: {exc}") from None
    if not text.strip():
        raise FieldError(file, f"{what} is empty")
    return text


def commands_json(file: Path) -> tuple[str, ...]:
    """A solution as a JSON list of shell command strings (one per agent turn)."""
    try:
        doc = json.loads(file.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise FieldError(file, f"invalid JSON: {exc}") from None
    if not isinstance(doc, list) or not all(isinstance(c, str) for c in doc):
        raise FieldError(file, "must be a JSON list of command strings")
    if not doc:
        raise FieldError(file, "has no commands")
    return tuple(doc)
