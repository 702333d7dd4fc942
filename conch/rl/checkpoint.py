"""Atomic training checkpoints: a crash at any moment leaves the previous checkpoint intact and findable.

Why: PPO runs on agent tasks last days and die in the middle of things (OOM, pre-emption, a full disk). A
half-written checkpoint that `resume` picks up loses the run, or worse, silently resumes from garbage.

Layout under RUN_DIR/checkpoints/:
  iter-000012/                  one complete checkpoint
    model/                      HF format: model.save_pretrained + tokenizer.save_pretrained (loadable by
                                conch.model.loading.load_policy and any HF tool); a plain nn.Module without
                                save_pretrained is stored as model/state_dict.pt instead
    aux/<name>/                 further models (e.g. the critic), same format rules as model/
    trainer_state.pt            optimizer(s), scheduler(s), RNG states, iteration, `extra` (torch.save, plain data)
    manifest.json               written last: format, iteration, every file with its size
  latest                        text file naming the newest published checkpoint ("iter-000012")
  .tmp-iter-000013-<pid>-<hex>/ a save in progress (or the debris of a crashed one, removed by the next save)

Protocol: everything is written into a temp dir in the same parent, every file is fsynced, the manifest goes
last, the dir is published with one os.rename (atomic on POSIX within a filesystem), the parent is fsynced,
then `latest` is replaced atomically (write tmp + fsync + rename). `latest_complete` trusts nothing: it returns
the highest-iteration dir whose manifest parses and whose files all exist with the recorded sizes. `latest` is
for humans and external tools (`conch eval $(cat RUN/checkpoints/latest)`-style use).

Single writer: one trainer process saves here; the learner on N ranks writes DCP shards with the same protocol
(`rl/sharded_checkpoint.py`).
"""

from __future__ import annotations

import json
import os
import random
import re
import secrets
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

import torch

FORMAT = "conch-checkpoint/1"
CKPT_DIR = "checkpoints"
POINTER = "latest"
STATE_FILE = "trainer_state.pt"
MANIFEST = "manifest.json"
MODEL_DIR = "model"
AUX_DIR = "aux"
_NAME = re.compile(r"^iter-(\d{6,})$")

Stateful = Any  # an object with state_dict()/load_state_dict(): optimizer, LR scheduler
StageHook = Callable[[str, Path], None]  # (stage, temp dir): "model", "state", "manifest", "published"


class CheckpointError(RuntimeError):
    """A checkpoint folder is incomplete, corrupt or not a conch checkpoint."""


@dataclass
class CheckpointInfo:
    path: Path
    iteration: int
    manifest: dict[str, Any]
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def model_dir(self) -> Path:
        return self.path / MODEL_DIR


def checkpoint_root(run_dir: str | Path) -> Path:
    return Path(run_dir) / CKPT_DIR


def checkpoint_name(iteration: int) -> str:
    if iteration < 0:
        raise ValueError(f"iteration must be >= 0; got {iteration}")
    return f"iter-{iteration:06d}"


# ---- durability helpers ----

def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems refuse fsync on directories; the rename is still atomic
    finally:
        os.close(fd)


def atomic_write_text(path: Path, text: str) -> None:
    """Replace `path` with `text` so readers see the old or the new content, never a mix."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}")
    with open(tmp, "w") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.rename(tmp, path)
    _fsync_dir(path.parent)


def read_json(path: Path, what: str) -> Any | None:
    """The JSON document at `path`, or None (with a warning naming the file) when it is missing, empty or
    corrupt: a run folder written by a killed run must never stop `--resume` with a traceback. Callers treat
    None as "not done yet" and redo the work."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        print(f"conch: warning: {path}: unreadable {what} ({exc}); it is redone", file=sys.stderr, flush=True)
        return None
    try:
        return json.loads(text)
    except ValueError as exc:
        why = "empty" if not text.strip() else f"not valid JSON: {exc}"
        print(f"conch: warning: {path}: {what} is {why}; it is redone", file=sys.stderr, flush=True)
        return None


def publish_model(model: Any, tokenizer: Any, out: Path, state_dict: dict | None = None) -> Path:
    """Write a loadable model folder (HF format) at `out`, replacing any old one: written beside it, then
    renamed, so `out` is never a half-written model. `state_dict`: the full weights of a sharded `model`."""
    out = Path(out)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}")
    _save_model(model, tokenizer, tmp, state_dict)
    old = out.with_name(f".{out.name}.old-{os.getpid()}-{secrets.token_hex(4)}")
    if out.exists():
        os.rename(out, old)
    os.rename(tmp, out)
    _fsync_dir(out.parent)
    shutil.rmtree(old, ignore_errors=True)
    return out


def _files_with_sizes(root: Path) -> dict[str, int]:
    return {p.relative_to(root).as_posix(): p.stat().st_size for p in sorted(root.rglob("*")) if p.is_file()}


# ---- RNG ----

def rng_state() -> dict[str, Any]:
    """Python, NumPy, torch CPU (and CUDA when initialised) generator states, as weights_only-loadable data."""
    import numpy as np

    name, keys, pos, has_gauss, cached = np.random.get_state()
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": {"name": name, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    import numpy as np

    random.setstate(state["python"])
    n = state["numpy"]
    np.random.set_state((n["name"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"],
                         n["cached_gaussian"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# ---- inspection ----

def read_manifest(path: Path) -> dict[str, Any]:
    """The manifest of checkpoint folder `path` after checking every recorded file; CheckpointError if not."""
    path = Path(path)
    mf = path / MANIFEST
    if not mf.is_file():
        raise CheckpointError(f"{path}: {MANIFEST} is missing (incomplete checkpoint)")
    try:
        manifest = json.loads(mf.read_text())
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{mf}: unreadable manifest: {exc}") from exc
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise CheckpointError(f"{mf}: not a {FORMAT} manifest")
    files = manifest.get("files")
    if not isinstance(files, dict) or STATE_FILE not in files:
        raise CheckpointError(f"{mf}: field 'files' must list {STATE_FILE} and the model files")
    for rel, size in files.items():
        p = path / rel
        if not p.is_file():
            raise CheckpointError(f"{path}: file {rel} listed in the manifest is missing")
        if p.stat().st_size != size:
            raise CheckpointError(f"{path}: file {rel} has {p.stat().st_size} bytes, the manifest says {size}")
    return manifest


def is_complete(path: Path) -> bool:
    try:
        read_manifest(path)
        return True
    except CheckpointError:
        return False


def list_checkpoints(run_dir: str | Path, complete_only: bool = True) -> list[tuple[int, Path]]:
    """[(iteration, path)] sorted by iteration; temp dirs never count."""
    root = checkpoint_root(run_dir)
    if not root.is_dir():
        return []
    out = []
    for p in root.iterdir():
        m = _NAME.match(p.name)
        if m and p.is_dir() and (not complete_only or is_complete(p)):
            out.append((int(m.group(1)), p))
    return sorted(out)


def latest_complete(run_dir: str | Path) -> Path | None:
    """The newest complete checkpoint under RUN_DIR/checkpoints, or None. Incomplete or corrupt ones (a crash
    mid-save, a truncated file) are skipped, whatever `latest` says."""
    found = list_checkpoints(run_dir)
    return found[-1][1] if found else None


# ---- save ----

def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove_stale_temps(root: Path) -> None:
    for p in root.glob(".tmp-iter-*"):
        parts = p.name.split("-")
        pid = int(parts[3]) if len(parts) > 3 and parts[3].isdigit() else -1
        if pid != os.getpid() and pid > 0 and _pid_alive(pid):
            continue  # another live process is writing it
        shutil.rmtree(p, ignore_errors=True)
    for p in root.glob(f".{POINTER}.tmp-*"):
        p.unlink(missing_ok=True)


def _save_model(model: Any, tokenizer: Any, out: Path, state_dict: dict | None = None) -> str:
    out.mkdir(parents=True)
    if hasattr(model, "save_pretrained"):
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        model.save_pretrained(str(out), **({"state_dict": state_dict} if state_dict is not None else {}))
        fmt = "hf"
    else:
        torch.save(model.state_dict(), out / "state_dict.pt")
        fmt = "state_dict"
    if tokenizer is not None:
        tokenizer.save_pretrained(str(out))
    return fmt


def prune_checkpoints(run_dir: str | Path, keep: int, keep_every: int | None = None,
                      protect: Path | None = None) -> list[Path]:
    """Delete complete checkpoints beyond the newest `keep` (those whose iteration is a multiple of
    `keep_every` stay, and so does `protect`). Returns what was deleted. Incomplete dirs are left alone."""
    if keep < 1:
        raise ValueError(f"keep must be >= 1; got {keep}")
    found = list_checkpoints(run_dir)
    removed = []
    for it, p in found[:-keep]:
        if (keep_every and it % keep_every == 0) or (protect is not None and p == protect):
            continue
        shutil.rmtree(p)
        removed.append(p)
    return removed


def _states(obj: Stateful | Mapping[str, Stateful] | None) -> dict[str, Any] | None:
    if obj is None:
        return None
    if isinstance(obj, Mapping):
        return {"named": {name: o.state_dict() for name, o in obj.items()}}
    return {"single": obj.state_dict()}


def _restore(obj: Stateful | Mapping[str, Stateful], saved: dict[str, Any] | None, what: str, path: Path) -> None:
    if saved is None:
        raise CheckpointError(f"{path}: no {what} state was saved")
    if isinstance(obj, Mapping):
        named = saved.get("named")
        if named is None:
            raise CheckpointError(f"{path}: a single {what} was saved; pass one object, not a dict")
        missing = sorted(set(obj) - set(named))
        if missing:
            raise CheckpointError(f"{path}: no {what} state saved for {missing} (saved: {sorted(named)})")
        for name, o in obj.items():
            o.load_state_dict(named[name])
    else:
        if "single" not in saved:
            raise CheckpointError(f"{path}: {what} states were saved by name ({sorted(saved['named'])}); "
                                  f"pass a dict")
        obj.load_state_dict(saved["single"])


def save_checkpoint(run_dir: str | Path, iteration: int, model: Any, *, tokenizer: Any = None,
                    optimizer: Stateful | Mapping[str, Stateful] | None = None,
                    scheduler: Stateful | Mapping[str, Stateful] | None = None,
                    aux_models: Mapping[str, Any] | None = None, extra: dict[str, Any] | None = None,
                    keep: int = 3, keep_every: int | None = None, overwrite: bool = False,
                    on_stage: StageHook | None = None) -> Path:
    """Write checkpoint `iteration` atomically and return its path (RUN_DIR/checkpoints/iter-NNNNNN).

    `optimizer` / `scheduler` may be one object or a dict by name ({"policy": ..., "critic": ...}); load them
    back the same way. `aux_models` ({"critic": value_model}) are stored under aux/<name>/.

    `extra` is plain data (numbers, strings, lists, dicts, tensors) restored by `load_checkpoint`. `keep` newest
    checkpoints survive pruning, plus multiples of `keep_every`. An existing complete checkpoint of the same
    iteration raises FileExistsError unless `overwrite`. `on_stage(stage, tmp_dir)` is called after each stage
    ("model", "state", "manifest", then "published" with the final path): tests use it to crash mid-save."""
    t0 = time.monotonic()
    root = checkpoint_root(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    _remove_stale_temps(root)
    name = checkpoint_name(iteration)
    final = root / name
    if final.exists() and is_complete(final) and not overwrite:
        raise FileExistsError(f"checkpoint {final} already exists (pass overwrite=True to replace it)")
    tmp = root / f".tmp-{name}-{os.getpid()}-{secrets.token_hex(4)}"
    tmp.mkdir()
    try:
        model_format = _save_model(model, tokenizer, tmp / MODEL_DIR)
        aux_formats = {}
        for aux_name, module in (aux_models or {}).items():
            if not re.fullmatch(r"[A-Za-z0-9_.-]+", aux_name) or aux_name.startswith("."):
                raise ValueError(f"aux model name {aux_name!r} must be a plain folder name")
            aux_formats[aux_name] = _save_model(module, None, tmp / AUX_DIR / aux_name)
        if on_stage:
            on_stage("model", tmp)
        state = {
            "iteration": iteration,
            "optimizer": _states(optimizer),
            "scheduler": _states(scheduler),
            "rng": rng_state(),
            "extra": extra or {},
        }
        torch.save(state, tmp / STATE_FILE)
        if on_stage:
            on_stage("state", tmp)
        seal(tmp, final, iteration, {
            "model_format": model_format,
            "model_class": type(model).__name__,
            "aux_models": aux_formats,
            "has_tokenizer": tokenizer is not None,
            "has_optimizer": optimizer is not None,
            "has_scheduler": scheduler is not None,
        }, on_stage)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if on_stage:
        on_stage("published", final)
    atomic_write_text(root / POINTER, name + "\n")
    prune_checkpoints(run_dir, keep, keep_every, protect=final)
    print(f"conch: saved checkpoint {final} in {time.monotonic() - t0:.1f}s", file=sys.stderr)
    return final


def seal(tmp: Path, final: Path, iteration: int, fields: dict[str, Any], on_stage: StageHook | None = None) -> None:
    """Publish the filled temp dir `tmp` as checkpoint `final`: fsync every file, write the manifest (`fields`
    plus format, iteration, time and every file's size) last, fsync the dirs, then one rename. An existing
    `final` (a corrupt leftover, or an overwrite) is moved aside first and deleted after."""
    files = _files_with_sizes(tmp)
    for rel in files:
        _fsync_file(tmp / rel)
    manifest = {"format": FORMAT, "iteration": iteration, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                **fields, "files": files}
    with open(tmp / MANIFEST, "w") as fh:
        json.dump(manifest, fh, indent=1)
        fh.flush()
        os.fsync(fh.fileno())
    for d in [tmp, *(p for p in tmp.rglob("*") if p.is_dir())]:
        _fsync_dir(d)
    if on_stage:
        on_stage("manifest", tmp)
    trash = None
    if final.exists():
        trash = final.with_name(f".tmp-{final.name}-{os.getpid()}-old-{secrets.token_hex(4)}")
        os.rename(final, trash)
    os.rename(tmp, final)
    _fsync_dir(final.parent)
    if trash is not None:
        shutil.rmtree(trash, ignore_errors=True)


# ---- load ----

def _load_model_weights(model: Any, model_dir: Path, model_format: str) -> None:
    if model_format == "state_dict":
        model.load_state_dict(torch.load(model_dir / "state_dict.pt", map_location="cpu", weights_only=True))
        return
    # HF save_pretrained may store weights in a different layout than the live modules (transformers v5 saves
    # MoE experts per expert but fuses them in memory), so go through from_pretrained and copy.
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    dtype = next(model.parameters()).dtype
    loaded = type(model).from_pretrained(str(model_dir), dtype=dtype, local_files_only=True)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    del loaded
    if missing or unexpected:
        raise CheckpointError(f"{model_dir}: weights do not fit {type(model).__name__}: missing {missing[:5]}, "
                              f"unexpected {unexpected[:5]}")


def load_checkpoint(path: str | Path, *, model: Any = None,
                    optimizer: Stateful | Mapping[str, Stateful] | None = None,
                    scheduler: Stateful | Mapping[str, Stateful] | None = None,
                    aux_models: Mapping[str, Any] | None = None, restore_rng: bool = True,
                    map_location: str | torch.device = "cpu") -> CheckpointInfo:
    """Restore what is passed: model weights (into the given model, whose class must match), aux models,
    optimizer and scheduler state (same single/dict shape as saved), and the RNG states; returns the iteration
    and `extra`. The usual resume builds the policy with `conch.model.loading.load_policy(info.model_dir)` and
    passes only the optimizer/scheduler (and aux models) here. CheckpointError on anything inconsistent."""
    path = Path(path)
    manifest = read_manifest(path)
    try:
        state = torch.load(path / STATE_FILE, map_location=map_location, weights_only=True)
    except Exception as exc:
        raise CheckpointError(f"{path / STATE_FILE}: cannot be loaded: {exc}") from exc
    if state.get("iteration") != manifest.get("iteration"):
        raise CheckpointError(f"{path}: iteration {state.get('iteration')} in {STATE_FILE} but "
                              f"{manifest.get('iteration')} in {MANIFEST}")
    if model is not None:
        _load_model_weights(model, path / MODEL_DIR, manifest.get("model_format", "hf"))
    saved_aux = manifest.get("aux_models", {})
    for aux_name, module in (aux_models or {}).items():
        if aux_name not in saved_aux:
            raise CheckpointError(f"{path}: no aux model {aux_name!r} was saved (have: {sorted(saved_aux)})")
        _load_model_weights(module, path / AUX_DIR / aux_name, saved_aux[aux_name])
    if optimizer is not None:
        _restore(optimizer, state["optimizer"], "optimizer", path)
    if scheduler is not None:
        _restore(scheduler, state["scheduler"], "scheduler", path)
    if restore_rng:
        set_rng_state(state["rng"])
    return CheckpointInfo(path=path, iteration=int(state["iteration"]), manifest=manifest,
                          extra=state.get("extra") or {})
