"""One metrics logger for training: JSONL on disk, a compact live table on stderr, optional TensorBoard / W&B.

Why one: every number a user sees (table, plots, reports) must come from the same record, written once per
iteration. RUN_DIR/metrics.jsonl is the source of truth: one JSON object per line, flushed after each
iteration so a crashed run keeps everything it logged:
  {"iteration": 7, "time": 1712345678.9, "reward/mean": 2.5, "train/policy_loss": -0.01, ...}
Keys are "namespace/name" with the namespace one of NAMESPACES; non-finite floats are written as null (strict
JSON). TensorBoard and W&B are optional mirrors: asked for but not installed gives a warning, never a crash.

The stages before PPO (SFT steps and validation, critic warm-up, every evaluation) are logged with
`log_event(stage, step, metrics)` into the same file, as records with a "stage" key:
  {"stage": "sft", "step": 40, "time": ..., "sft/loss": 1.9, "sft/lr": 1e-4}
`read_metrics` returns the PPO iterations only unless asked for the stage records.
"""

from __future__ import annotations

import json
import math
import sys
import time
import warnings
from pathlib import Path
from typing import IO, Any, Mapping, Sequence

NAMESPACES = ("rollout", "reward", "train", "mismatch", "sandbox", "stop", "eval", "time", "sync", "sft",
              "critic")

# (metric key, column label) shown in the live table.
DEFAULT_COLUMNS: tuple[tuple[str, str], ...] = (
    ("reward/mean", "reward"),
    ("reward/pass_all", "pass"),
    ("reward/excluded", "excluded"),
    ("train/policy_loss", "pg_loss"),
    ("train/value_loss", "v_loss"),
    ("train/approx_kl", "kl"),
    ("train/clip_frac", "clip"),
    ("mismatch/k3_kl", "mis_kl"),
    ("time/iteration_s", "s/it"),
)

Scalar = int | float | bool | str | None


def namespaced(namespace: str, values: Mapping[str, Any]) -> dict[str, Any]:
    """{"name": v} -> {"namespace/name": v} (checks the namespace)."""
    if namespace not in NAMESPACES:
        raise ValueError(f"unknown metrics namespace {namespace!r}; choose one of {', '.join(NAMESPACES)}")
    return {f"{namespace}/{k}": v for k, v in values.items()}


def check_key(key: str) -> None:
    ns, sep, name = key.partition("/")
    if not sep or not name or ns not in NAMESPACES:
        raise ValueError(f"metric key {key!r} must be 'namespace/name' with namespace one of {', '.join(NAMESPACES)}")


def to_scalar(key: str, value: Any) -> Scalar:
    """Python scalar of a metric value: numbers, bools, strings, None, 0-dim tensors / numpy scalars."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if hasattr(value, "item") and getattr(value, "ndim", 0) == 0:
        return value.item()
    raise TypeError(f"metric {key!r}: expected a scalar, got {type(value).__name__}"
                    f"{' of shape ' + str(tuple(value.shape)) if hasattr(value, 'shape') else ''}")


def _json_safe(v: Scalar) -> Scalar:
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def format_value(v: Scalar) -> str:
    """Compact cell text: 4 significant digits for floats, '-' for missing."""
    if v is None:
        return "-"
    if isinstance(v, bool):
        return str(int(v))
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return f"{v:.4g}"
    return str(v)


class MetricsTable:
    """Fixed-width rows, header repeated every `header_every` rows so a scrolled terminal stays readable.
    Width 10 fits any `format_value` number ("-1.235e+05"); longer strings widen their cell rather than be cut."""

    def __init__(self, columns: Sequence[tuple[str, str]] = DEFAULT_COLUMNS, header_every: int = 20,
                 min_width: int = 10) -> None:
        self.columns = list(columns)
        self.header_every = header_every
        self.widths = [max(min_width, len(label)) for _, label in self.columns]
        self.rows = 0

    def header(self) -> str:
        cells = [f"{'iter':>6}"] + [f"{label:>{w}}" for (_, label), w in zip(self.columns, self.widths)]
        return " ".join(cells)

    def row(self, iteration: int, metrics: Mapping[str, Scalar]) -> str:
        cells = [f"{iteration:>6}"]
        for (key, _), w in zip(self.columns, self.widths):
            cells.append(f"{format_value(metrics.get(key)):>{w}}")  # never truncated: a cut number lies
        return " ".join(cells)

    def lines(self, iteration: int, metrics: Mapping[str, Scalar]) -> list[str]:
        out = []
        if self.header_every > 0 and self.rows % self.header_every == 0:
            out.append(self.header())
        out.append(self.row(iteration, metrics))
        self.rows += 1
        return out


class MetricsLogger:
    """`log(iteration, metrics)` once per iteration. Use as a context manager or call `close()`."""

    def __init__(self, run_dir: str | Path, *, columns: Sequence[tuple[str, str]] = DEFAULT_COLUMNS,
                 stream: IO[str] | None = None, header_every: int = 20, tensorboard: bool = False,
                 wandb: bool = False, wandb_project: str = "conch", wandb_run_name: str | None = None,
                 wandb_mode: str | None = None, config: Mapping[str, Any] | None = None) -> None:
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.run_dir / "metrics.jsonl"
        _drop_torn_tail(self.path)
        self._fh: IO[str] | None = open(self.path, "a")
        self.stream = stream if stream is not None else sys.stderr
        self.table = MetricsTable(columns, header_every) if columns else None
        self._tb = self._open_tensorboard() if tensorboard else None
        self._wandb = self._open_wandb(wandb_project, wandb_run_name, wandb_mode, config) if wandb else None

    def _open_tensorboard(self) -> Any:
        try:
            import tensorboard  # noqa: F401  (torch.utils.tensorboard needs it)
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            warnings.warn("TensorBoard logging was requested but the 'tensorboard' package is not installed "
                          "(pip install tensorboard); continuing with metrics.jsonl only", RuntimeWarning,
                          stacklevel=3)
            return None
        return SummaryWriter(log_dir=str(self.run_dir / "tensorboard"))

    def _open_wandb(self, project: str, name: str | None, mode: str | None, config: Mapping[str, Any] | None) -> Any:
        try:
            import wandb
        except ImportError:
            warnings.warn("W&B logging was requested but the 'wandb' package is not installed (pip install wandb); "
                          "continuing with metrics.jsonl only", RuntimeWarning, stacklevel=3)
            return None
        kwargs: dict[str, Any] = {"project": project, "name": name, "dir": str(self.run_dir),
                                  "config": dict(config or {})}
        if mode is not None:
            kwargs["mode"] = mode
        run = wandb.init(**kwargs)
        run = run if run is not None else wandb
        # Each stage has its own x axis, so SFT steps logged before PPO never hold back PPO's iterations.
        run.define_metric("iteration")
        for ns in NAMESPACES:
            if ns in ("sft", "critic"):
                run.define_metric(f"{ns}/step")
                run.define_metric(f"{ns}/*", step_metric=f"{ns}/step")
            else:
                run.define_metric(f"{ns}/*", step_metric="iteration")
        return run

    def log(self, iteration: int, metrics: Mapping[str, Any]) -> dict[str, Scalar]:
        """Validate keys, write one JSONL line (flushed), print the table row, mirror to TB / W&B.
        Returns the record as written (before non-finite floats became null)."""
        if self._fh is None:
            raise RuntimeError(f"metrics logger for {self.path} is closed")
        record: dict[str, Scalar] = {"iteration": int(iteration), "time": time.time()}
        for key, value in metrics.items():
            check_key(key)
            record[key] = to_scalar(key, value)
        self._fh.write(json.dumps({k: _json_safe(v) for k, v in record.items()}, allow_nan=False) + "\n")
        self._fh.flush()
        if self.table is not None:
            for line in self.table.lines(iteration, record):
                print(line, file=self.stream, flush=True)
        numeric = {k: float(v) for k, v in record.items()
                   if k not in ("iteration", "time") and isinstance(v, (int, float)) and not isinstance(v, bool)}
        if self._tb is not None:
            for k, v in numeric.items():
                self._tb.add_scalar(k, v, iteration)
            self._tb.flush()
        if self._wandb is not None:
            self._wandb.log({k: v for k, v in record.items() if k != "time"})
        return record

    def log_event(self, stage: str, step: int, metrics: Mapping[str, Any]) -> dict[str, Scalar]:
        """One record of a stage outside the PPO loop (`stage` "sft", "critic" or "eval"; `step` its own
        counter): JSONL and the TensorBoard / W&B mirrors, no table row. Eval keys may carry the evaluation's
        name and family ("eval/warm/pass_rate", "eval/warm/family/make-dirs/pass_rate")."""
        if self._fh is None:
            raise RuntimeError(f"metrics logger for {self.path} is closed")
        record: dict[str, Scalar] = {"stage": stage, "step": int(step), "time": time.time()}
        for key, value in metrics.items():
            check_key(key)
            record[key] = to_scalar(key, value)
        self._fh.write(json.dumps({k: _json_safe(v) for k, v in record.items()}, allow_nan=False) + "\n")
        self._fh.flush()
        numeric = {k: float(v) for k, v in record.items()
                   if "/" in k and isinstance(v, (int, float)) and not isinstance(v, bool)}
        if self._tb is not None:
            for k, v in numeric.items():
                self._tb.add_scalar(k, v, step)
            self._tb.flush()
        if self._wandb is not None:
            axis = "iteration" if stage == "eval" else f"{stage}/step"
            self._wandb.log({**numeric, axis: int(step)})
        return record

    def keep_before(self, iteration: int) -> int:
        """On resume from a checkpoint: drop the rows of `iteration` and later (logged by the killed run after
        its last checkpoint, about to be redone), so the file holds exactly one row per iteration. The file is
        replaced atomically. Returns how many rows were dropped."""
        if self._fh is None:
            raise RuntimeError(f"metrics logger for {self.path} is closed")
        self._fh.close()
        rows = []
        for line in self.path.read_text().splitlines():
            try:
                rows.append(json.loads(line))
            except ValueError:
                continue
        last = {int(r["iteration"]): i for i, r in enumerate(rows) if "iteration" in r}  # a redone row wins
        out = [r for i, r in enumerate(rows)
               if "iteration" not in r or (int(r["iteration"]) < iteration and last[int(r["iteration"])] == i)]
        dropped = len(self.path.read_text().splitlines()) - len(out)
        if dropped:
            from conch.rl.checkpoint import atomic_write_text

            atomic_write_text(self.path, "".join(json.dumps(r, allow_nan=False) + "\n" for r in out))
        self._fh = open(self.path, "a")
        return dropped

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None
        if self._tb is not None:
            self._tb.close()
            self._tb = None
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None

    def __enter__(self) -> "MetricsLogger":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _drop_torn_tail(path: Path) -> None:
    """A kill mid-write leaves a last line without its newline: cut it, or the next row would be glued to it."""
    try:
        with open(path, "rb+") as fh:
            data = fh.read()
            if data and not data.endswith(b"\n"):
                fh.truncate(data.rfind(b"\n") + 1)
    except FileNotFoundError:
        pass


def read_metrics(run_dir: str | Path, stages: bool = False) -> list[dict[str, Any]]:
    """The PPO records of RUN_DIR/metrics.jsonl (a torn last line from a crash is skipped); with `stages`, the
    stage records (`log_event`) too, in file order."""
    path = Path(run_dir) / "metrics.jsonl"
    out = []
    if not path.exists():
        return out
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if stages or "stage" not in row:
            out.append(row)
    return out
