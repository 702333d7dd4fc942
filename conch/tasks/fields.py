"""Field checks shared by the task loaders.

Why a module of its own: both layouts need the same "is this a positive number / a size / a list of
strings" checks, and every failure must name the file and the field, so a batch of hundreds of tasks reports
exactly which one is broken and why. Checks raise `FieldError`; loaders turn it into a `TaskLoadError`.

Task folders are written by whoever wrote the task, who may be hostile, so two more things live here: the
numeric bounds of every field (`BOUNDS`: a timeout of `inf`, `memory = "15T"` or `cpus = nan` must be refused
by name, not reach a sandbox or crash a batch with an OverflowError), and `check_tree`, which refuses a task
folder holding anything that is not plain data inside it (a symlink out of the folder, a device, a file name
that is not UTF-8).
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class FieldError(Exception):
    """A task file has a bad or missing field; `file` is the offending file."""

    def __init__(self, file: Path, message: str):
        super().__init__(message)
        self.file = file
        self.message = message


def printable(text: str) -> str:
    """`text` (a path from the file system) with bytes that are not UTF-8 written as `\\xff`, so it can be printed."""
    try:
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")


# ------------------------------------------------------------------------------------------- numbers


@dataclass(frozen=True)
class Bound:
    """The largest value a field may take (in `unit`), whether 0 is allowed (else it must be > 0), the smallest
    positive value that works (`least`) and whether it must be a whole number."""

    cap: float
    unit: str
    zero_ok: bool = False
    least: float = 0.0
    integer: bool = False


DAY_SEC = 86400.0
TIB_MB = 1024 * 1024

BOUNDS: dict[str, Bound] = {
    # Harbor task.toml
    "[verifier] timeout_sec": Bound(DAY_SEC, "s"),
    "[agent] timeout_sec": Bound(DAY_SEC, "s"),
    "[environment] build_timeout_sec": Bound(DAY_SEC, "s"),
    "[environment] cpus": Bound(256, "cpus", least=0.01),  # a CFS quota under 1 ms per 100 ms is invalid
    "[environment] gpus": Bound(64, "gpus", zero_ok=True, integer=True),
    "[environment] pids": Bound(65536, "pids", integer=True),
    "[environment] memory": Bound(TIB_MB, "MiB"),
    "[environment] memory_mb": Bound(TIB_MB, "MiB"),
    "[environment] storage": Bound(TIB_MB, "MiB"),
    "[environment] storage_mb": Bound(TIB_MB, "MiB"),
    # Terminal-Bench 1 task.yaml
    "max_agent_timeout_sec": Bound(DAY_SEC, "s"),
    "max_test_timeout_sec": Bound(DAY_SEC, "s"),
}
"""Per-field bounds of every number a loader reads. All must be finite (TOML and YAML both spell `inf`/`nan`)
and positive (`gpus` may be 0). Timeouts: at most a day. cpus: 0.01 to 256 (a fixed cap, not this host's
count, so a task that loads here loads everywhere). memory: 1 TiB. storage (the box's disk): 1 TiB, and no
more than the size of the disk that holds CONCH_HOME (`storage_cap_mb`): a box cannot get a disk larger than
the machine's; free space changes by the minute, so it is left to the backends at run time. pids: 65536, and
pids and gpus are whole numbers. Sizes given as strings ("15T") are converted to MiB and meet the same cap."""

_STORAGE_FIELDS = ("[environment] storage", "[environment] storage_mb")


def storage_cap_mb() -> tuple[float, str]:
    """(cap in MiB, why) for the box disk: 1 TiB, or the size of the disk holding CONCH_HOME when smaller."""
    from conch.sandbox.paths import conch_home

    here = conch_home()
    while not here.exists() and here.parent != here:
        here = here.parent
    try:
        disk_mb = shutil.disk_usage(here).total // (1 << 20)
    except OSError:
        return TIB_MB, ""
    if 0 < disk_mb < TIB_MB:
        return disk_mb, " (the size of the disk holding CONCH_HOME)"
    return TIB_MB, ""


def _show(value: Any) -> str:
    text = json.dumps(value) if isinstance(value, str) else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _in_bounds(file: Path, field: str, value: Any, magnitude: int | float) -> None:
    """Refuse `magnitude` (the field's value in its unit; `value` as written) unless finite and within BOUNDS."""
    bound = BOUNDS[field]
    cap, why = storage_cap_mb() if field in _STORAGE_FIELDS else (bound.cap, "")
    shown, cap_text = f"{field} = {_show(value)}", f"{int(cap)}" if float(cap).is_integer() else f"{cap:g}"
    if isinstance(magnitude, float) and math.isnan(magnitude):
        raise FieldError(file, f"{shown} is not a number")
    if magnitude < 0 or (magnitude == 0 and not bound.zero_ok):
        raise FieldError(file, f"{shown} must be {'at least 0' if bound.zero_ok else 'positive'}")
    if isinstance(magnitude, float) and math.isinf(magnitude):
        raise FieldError(file, f"{shown} is not finite (the cap is {cap_text} {bound.unit})")
    if magnitude < bound.least:
        raise FieldError(file, f"{shown} is under the {bound.least:g} {bound.unit} minimum")
    if bound.integer and magnitude != int(magnitude):
        raise FieldError(file, f"{shown} must be a whole number")
    if magnitude > cap:  # int vs float compares exactly, so a 400-digit YAML integer cannot overflow here
        raise FieldError(file, f"{shown} is over the {cap_text} {bound.unit} cap{why}")


def positive_number(file: Path, field: str, value: Any, default: float) -> float:
    """A number within `BOUNDS[field]`, or `default` when the field is absent."""
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise FieldError(file, f"{field} must be a positive number, got {value!r}")
    _in_bounds(file, field, value, value)
    return float(value)


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?\s*$", re.IGNORECASE)
_MB_PER_UNIT = {"": 1.0, "k": 1 / 1024, "m": 1.0, "g": 1024.0, "t": 1024.0 * 1024}


def size_mb(file: Path, field: str, value: Any) -> int:
    """A size in MiB within `BOUNDS[field]`: an integer (already MiB) or a string like "2G", "512M", "1.5GiB"."""
    if isinstance(value, bool):
        raise FieldError(file, f"{field} must be a size like 2048 or \"2G\", got {value!r}")
    if isinstance(value, (int, float)):
        mb: int | float = value
    elif isinstance(value, str) and (m := _SIZE.match(value)):
        mb = float(m.group(1)) * _MB_PER_UNIT[m.group(2).lower()]  # a 400-digit string is inf, refused below
    else:
        raise FieldError(file, f"{field} must be a size like 2048 or \"2G\", got {value!r}")
    _in_bounds(file, field, value, mb)
    return max(1, int(round(mb)))


# ------------------------------------------------------------------------------------------- other fields


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


# ------------------------------------------------------------------------------------------- the folder


_KINDS = ((stat.S_ISFIFO, "a named pipe"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"))


def is_inside(path: str, root: str) -> bool:
    """Whether the resolved `path` is `root` or below it (both real paths)."""
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def _check_entry(path: str, root: str) -> None:
    """One entry below the task folder: a UTF-8 name, a regular file, folder, or symlink that stays inside."""
    name = os.path.basename(path)
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        raise FieldError(Path(path), "file name is not valid UTF-8") from None
    try:
        mode = os.lstat(path).st_mode
    except OSError as exc:
        raise FieldError(Path(path), f"cannot read: {exc.strerror}") from None
    if stat.S_ISLNK(mode):
        if not is_inside(os.path.realpath(path), root):
            target = printable(os.readlink(path))
            raise FieldError(Path(path), f"symlink to a path outside the task folder ({target})")
        return
    for test, kind in _KINDS:
        if test(mode):
            raise FieldError(Path(path), f"is {kind}, not a regular file, folder or symlink")


def check_tree(folder: Path) -> None:
    """Refuse a task folder that is not plain data inside itself (raises FieldError naming the entry).

    Every file below `folder` may be copied into a box (the build context, tests, solution) or read on the host
    (task.toml, instruction.md, test-time requirement files), so each must resolve inside the task folder: a
    symlink out of it (an `environment/` that links to a host folder, a Dockerfile that links to /etc/shadow)
    would hand host files to the task. Symlinks that stay inside are allowed; symlinked folders are not entered
    (what they point at is inside, so it is checked where it lies). Names must be UTF-8, so every later message,
    tar and JSON can spell them; pipes and devices are refused, since reading one blocks or never ends."""
    root = os.path.realpath(folder)
    try:
        root.encode("utf-8")
    except UnicodeEncodeError:
        raise FieldError(Path(root), "task folder path is not valid UTF-8") from None

    def fail(exc: OSError) -> None:
        raise FieldError(Path(exc.filename or root), f"cannot read folder: {exc.strerror}")

    for dirpath, dirnames, filenames in os.walk(root, onerror=fail):
        for name in sorted(dirnames + filenames):
            _check_entry(os.path.join(dirpath, name), root)
