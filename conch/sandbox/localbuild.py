"""Builds a task's Dockerfile into cached overlay layers for the local backend.

Why layers keyed by a hash chain: an RL run starts the same task's sandbox hundreds of times. Each
filesystem-changing step (RUN, COPY/ADD, WORKDIR) becomes one folder `layers/<key>/diff` holding exactly what
that step changed (an overlay upper dir, whiteouts included), and `key` hashes the parent key, the step and,
for COPY, the content of its sources. A second start recomputes the keys (cheap) and finds every folder
present: no rebuild. The sandbox then stacks the non-empty diffs as overlay lowerdirs over the base root.

Concurrency: a step is built in a temporary folder and renamed into place under a per-key file lock, so
concurrent builders of the same task wait for one build instead of racing or seeing half a layer.
"""

from __future__ import annotations

import fcntl
import glob as globmod
import hashlib
import json
import os
import re
import secrets
import shutil
import stat
import sys
import tarfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from conch.sandbox import paths
from conch.sandbox.base import SandboxError
from conch.sandbox.baseroot import BUILD_CA, BUILD_ENV, CA_VARS, ensure_base_root, recipe_id
from conch.sandbox.bwrap import ID_BASE, BoxConfig, run_box, shift_tree, warn_once
from conch.sandbox.network import build_network
from conch.sandbox.buildplan import BuildPlan, BuildStep, plan, split_stages
from conch.sandbox.dockerfile import parse
from conch.sandbox.layerfs import ensure_dir, lookup, own, parse_owner, resolve, safe_extract
from conch.sandbox.stagecopy import copy_from_stage
from conch.sandbox.standins import BASE_DESCRIPTION, standin_for
from conch.sandbox.standins import note as standin_note


@dataclass(frozen=True)
class LocalImage:
    """What a local sandbox mounts: `lowers` top first (the base root last), plus the image config."""

    key: str
    lowers: tuple[Path, ...]
    env: tuple[tuple[str, str], ...] = ()
    workdir: str = "/"
    base_image: str = ""
    built_steps: int = 0  # steps actually executed by this call (0: everything came from the cache)


def build_image(context: Path | None, dockerfile: Path | None, quiet: bool = False) -> LocalImage:
    """The image for a sandbox spec: the base root alone, or the Dockerfile's steps over it (cached). Every
    stage of a multi-stage Dockerfile is built in order (like Docker's classic builder); the last one is the
    image, and `COPY --from` / `FROM <stage>` read the earlier ones."""
    root = ensure_base_root(quiet=quiet)
    if dockerfile is None:
        return LocalImage(key=recipe_id(), lowers=(root,))
    dockerfile = Path(dockerfile)
    context = Path(context) if context is not None else dockerfile.parent
    if not context.is_dir():
        raise SandboxError(f"build context {context} is not a directory")
    built: dict[str, LocalImage] = {}
    image: LocalImage | None = None
    for index, (alias, stage_df) in enumerate(split_stages(parse(dockerfile))):
        p = plan(stage_df)
        parent = built.get(p.config.base_image.lower())
        if parent is not None:  # FROM <an earlier stage>: its filesystem, environment and WORKDIR
            p = plan(stage_df, base_env=dict(parent.env), base_workdir=parent.workdir)
        else:
            _note_base(p.config.base_image, dockerfile)
        for note in p.notes:
            warn_once(note, note, kind="note")
        image = _build(p, context, root, quiet, parent, built)
        built[str(index)] = image
        if alias:
            built[alias] = image
    assert image is not None
    return image


def _note_base(base: str, dockerfile: Path) -> None:
    what = standin_note(base) if standin_for(base) else (f"FROM {base} runs on the local base root "
                                                         f"({BASE_DESCRIPTION}); use --sandbox docker for the exact image")
    warn_once(f"from:{base}", f"{what} (first seen in {dockerfile})", kind="note")


def _build(p: BuildPlan, context: Path, root: Path, quiet: bool, parent: LocalImage | None = None,
           stages: dict[str, LocalImage] | None = None) -> LocalImage:
    ignore = DockerIgnore(context)
    key = parent.key if parent is not None else "base:" + recipe_id()
    lowers: list[Path] = list(parent.lowers) if parent is not None else [root]
    built = 0
    layers = paths.layers_dir()
    layers.mkdir(parents=True, exist_ok=True)
    for n, step in enumerate(p.steps, 1):
        stage = None
        if step.from_stage:
            stage = (stages or {}).get(step.from_stage)
            if stage is None:
                raise SandboxError(f"{p.dockerfile}:{step.line}: COPY --from={step.from_stage}: no earlier build "
                                   "stage has that name or index (images from a registry cannot be pulled)")
            sources: list[str] = []
            key = _step_key(key + "\0from " + stage.key, step, context, [], ignore)
        else:
            sources = _expand_sources(p.dockerfile, step, context, ignore) if step.kind == "copy" else []
            key = _step_key(key, step, context, sources, ignore)
        layer = layers / key[:16]
        meta = _read_meta(layer)
        if meta is None:
            with open(layers / f"{key[:16]}.lock", "w") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                meta = _read_meta(layer)
                if meta is None:
                    if not quiet and step.kind != "copy":  # a COPY is quick: a line per task would be noise
                        print(f"conch: build {p.dockerfile} step {n}/{len(p.steps)}: {step.text[:160]}",
                              file=sys.stderr, flush=True)
                    meta = _run_step(p.dockerfile, step, key, layer, lowers, context, sources, ignore, quiet, stage)
                    built += 1
        if not meta["empty"]:
            lowers.insert(0, layer / "diff")
        _touch(layer)
    return LocalImage(key=key, lowers=tuple(lowers), env=p.config.env, workdir=p.config.workdir,
                      base_image=p.config.base_image, built_steps=built)


def _touch(layer: Path) -> None:
    """Record the last use of a layer (its folder's mtime), for `conch sandbox gc --unused-days`."""
    try:
        os.utime(layer)
    except OSError:
        pass


def prune_layers(unused_days: float | None = None) -> int:
    """Delete cached layers (all, or those unused for `unused_days`); returns how many were deleted."""
    root = paths.layers_dir()
    if not root.is_dir():
        return 0
    cutoff = None if unused_days is None else time.time() - unused_days * 86400
    n = 0
    for entry in root.iterdir():
        if not entry.is_dir():
            continue
        if cutoff is not None and entry.stat().st_mtime > cutoff and not entry.name.startswith(".tmp-"):
            continue
        shutil.rmtree(entry, ignore_errors=True)
        n += 1
    return n


def _read_meta(layer: Path) -> dict | None:
    try:
        return json.loads((layer / "meta.json").read_text())
    except (OSError, ValueError):
        return None


def _step_key(parent: str, step: BuildStep, context: Path, sources: list[str], ignore: DockerIgnore) -> str:
    fields = asdict(step)
    fields.pop("line")
    fields.pop("text")
    h = hashlib.sha256(json.dumps([parent, fields], sort_keys=True).encode())
    for rel in sources:
        _hash_tree(h, context, rel, ignore)
    return h.hexdigest()


def _hash_tree(h: hashlib._Hash, context: Path, rel: str, ignore: DockerIgnore) -> None:
    top = context / rel
    for path, relpath in _walk(top, rel, ignore):
        st = os.lstat(path)
        h.update(f"\0{relpath}\0{stat.S_IFMT(st.st_mode)}\0{stat.S_IMODE(st.st_mode)}\0".encode())
        if stat.S_ISLNK(st.st_mode):
            h.update(os.readlink(path).encode())
        elif stat.S_ISREG(st.st_mode):
            with open(path, "rb") as fh:
                for chunk in iter(lambda: fh.read(1 << 20), b""):
                    h.update(chunk)


def _walk(top: Path, rel: str, ignore: DockerIgnore):
    """(host path, context-relative path) of `top` and, for a directory, everything under it not ignored."""
    yield top, rel
    if top.is_dir() and not top.is_symlink():
        for dirpath, dirnames, filenames in os.walk(top):
            dirnames.sort()
            base = os.path.relpath(dirpath, top)
            for name in [*sorted(filenames), *dirnames]:
                r = os.path.normpath(os.path.join(rel, base, name))
                if ignore.ignored(r):
                    if name in dirnames:
                        dirnames.remove(name)
                    continue
                yield Path(dirpath) / name, r


class DockerIgnore:
    """`.dockerignore` of a build context: glob patterns (`*`, `?`, `**`), `!` exceptions, last match wins."""

    def __init__(self, context: Path) -> None:
        self.rules: list[tuple[re.Pattern, bool]] = []
        try:
            lines = (context / ".dockerignore").read_text().splitlines()
        except OSError:
            return
        for line in lines:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            neg = line.startswith("!")
            pat = os.path.normpath(line.lstrip("!").strip().lstrip("/"))
            rx = "".join(".*" if part == "**" else re.escape(part).replace(r"\*", "[^/]*").replace(r"\?", "[^/]")
                         for part in re.split(r"(\*\*)", pat))
            self.rules.append((re.compile(rf"^{rx}(/.*)?$"), neg))

    def ignored(self, rel: str) -> bool:
        result = False
        for rx, neg in self.rules:
            if rx.match(rel):
                result = not neg
        return result


def _expand_sources(df: Path, step: BuildStep, context: Path, ignore: DockerIgnore) -> list[str]:
    out: list[str] = []
    ctx = os.path.realpath(context)
    for src in step.sources:
        norm = os.path.normpath(src.lstrip("/")) if src.strip("/") else "."
        if norm == ".." or norm.startswith("../"):
            raise SandboxError(f"{df}:{step.line}: COPY source {src!r} is outside the build context")
        if any(ch in norm for ch in "*?["):
            matches = sorted(m for m in globmod.glob(norm, root_dir=context) if not ignore.ignored(m))
        else:
            matches = [norm] if os.path.lexists(context / norm) else []
        if not matches:
            raise SandboxError(f"{df}:{step.line}: COPY source {src!r} not found in build context {context}")
        for m in matches:
            real = os.path.realpath(context / m)
            if real != ctx and not real.startswith(ctx + os.sep):
                raise SandboxError(f"{df}:{step.line}: COPY source {m!r} points outside the build context")
        out.extend(matches)
    return out


def _run_step(df: Path, step: BuildStep, key: str, layer: Path, lowers: list[Path], context: Path,
              sources: list[str], ignore: DockerIgnore, quiet: bool, stage: LocalImage | None = None) -> dict:
    tmp = layer.parent / f".tmp-{layer.name}-{secrets.token_hex(4)}"
    diff = tmp / "diff"
    diff.mkdir(parents=True)
    os.chown(diff, ID_BASE, ID_BASE)  # the root of the box's writable layer belongs to box root
    t0 = time.monotonic()
    try:
        if step.kind == "run":
            (tmp / "work").mkdir()
            binds, ca_env = _build_ca(tmp)
            with build_network() as net:  # the package registries through conch's proxy, nothing else
                cfg = BoxConfig(state_dir=tmp, lowers=tuple(lowers), upper_dir=diff, work_dir=tmp / "work",
                                netns=net.netns, hostname="buildkitsandbox", ro_binds=binds)
                env = {**BUILD_ENV, **ca_env, **net.env, **dict(step.env)}
                rc, tail = run_box(cfg, list(step.argv), env=env, cwd=step.workdir,
                                   stdin_data=step.stdin.encode() if step.stdin is not None else None,
                                   log_prefix="  | ", capture=quiet)
            shutil.rmtree(tmp / "work", ignore_errors=True)
            (tmp / "build-ca.crt").unlink(missing_ok=True)
            if rc != 0:
                raise SandboxError(f"{df}:{step.line}: RUN failed with exit code {rc}: {step.text[:200]}\n"
                                   f"--- last output ---\n{tail[-2000:]}")
        elif step.kind == "workdir":
            ensure_dir(lowers, diff, step.dest, materialize=False)
        elif stage is not None:
            copy_from_stage(df, step, list(stage.lowers), lowers, diff)
        else:
            _copy_step(df, step, lowers, diff, context, sources, ignore)
        if step.kind != "run":
            shift_tree(diff)  # written here on the host: give its files box ids
        empty = not any(os.scandir(diff))
        meta = {"key": key, "kind": step.kind, "line": step.line, "text": step.text, "empty": empty,
                "base": recipe_id(), "seconds": round(time.monotonic() - t0, 3), "created": time.time()}
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
        shutil.rmtree(tmp / "merged", ignore_errors=True)
        try:
            os.rename(tmp, layer)
        except OSError:
            existing = _read_meta(layer)  # another builder won the race
            if existing is None:
                raise
            meta = existing
        return meta
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _build_ca(tmp: Path) -> tuple[tuple[tuple[str, str], ...], dict[str, str]]:
    """(file binds, environment) giving a RUN step this machine's CA bundle, as the docker builder does, so
    `pip install` or `curl https://...` in a Dockerfile work behind a TLS-intercepting proxy. A copy is bound
    (never the host's own file) onto the root's empty BUILD_CA placeholder, so the layer keeps no trace."""
    from conch.sandbox.docker_images import build_ca_bundle

    bundle = build_ca_bundle()
    if not bundle:
        return (), {}
    copy_path = tmp / "build-ca.crt"
    copy_path.write_bytes(bundle)
    return ((str(copy_path), BUILD_CA),), {var: BUILD_CA for var in CA_VARS}


def _copy_step(df: Path, step: BuildStep, lowers: list[Path], diff: Path, context: Path, sources: list[str],
               ignore: DockerIgnore) -> None:
    uid, gid = parse_owner(df, step, lowers)
    mode = int(step.chmod, 8) if step.chmod else None
    dest = step.dest
    dest_parts = resolve(lowers, dest.rstrip("/") or "/")
    existing = lookup(lowers, dest_parts) if dest_parts else None
    to_dir = dest.endswith("/") or (existing is not None and existing.is_dir()) or not dest_parts
    single_dir = len(sources) == 1 and not step.inline and (context / sources[0]).is_dir()
    if to_dir or single_dir:
        ensure_dir(lowers, diff, "/" + "/".join(dest_parts))
    else:
        ensure_dir(lowers, diff, "/" + "/".join(dest_parts[:-1]))

    def place(data_from: Path | None, content: str | None, out: Path) -> None:
        if out.is_dir() and not out.is_symlink():
            shutil.rmtree(out)
        elif out.exists() or out.is_symlink():
            out.unlink()
        if content is not None:
            out.write_text(content)
            os.chmod(out, 0o644)
        else:
            assert data_from is not None
            shutil.copy2(data_from, out, follow_symlinks=False)
        own(out, uid, gid, mode)

    target_dir = diff.joinpath(*dest_parts)
    for name, content in step.inline:
        place(None, content, target_dir / name if to_dir else target_dir)
    for rel in sources:
        src = context / rel
        if src.is_dir():
            base = target_dir
            for path, r in _walk(src, rel, ignore):
                sub = os.path.relpath(r, rel)
                if sub == ".":
                    continue  # the directory itself is not copied, only its contents
                out = base / sub
                if path.is_dir() and not path.is_symlink():
                    if not out.is_dir():
                        if out.exists() or out.is_symlink():
                            out.unlink()
                        out.mkdir()
                    shutil.copystat(path, out)
                    own(out, uid, gid, mode)
                else:
                    place(path, None, out)
        elif step.add and tarfile.is_tarfile(src):
            ensure_dir(lowers, diff, "/" + "/".join(dest_parts))
            with tarfile.open(src) as tf:
                safe_extract(tf, target_dir)
        else:
            place(src.resolve(), None, target_dir / Path(rel).name if to_dir else target_dir)
