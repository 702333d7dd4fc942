"""Build planning: one Dockerfile build stage turned into the steps the local builder runs and an image config.

Why apart from the parser (conch/sandbox/dockerfile.py): parsing is Docker's syntax and is shared with the docker
backend (which reads a task's Dockerfile for its environment); planning is the local backend's reading of what
each instruction does. A stage becomes a `BuildPlan`: plain steps (RUN, COPY/ADD, `COPY --from=<stage>`,
WORKDIR) plus the image config (ENV, WORKDIR, CMD...). Anything the local builder cannot reproduce faithfully
(`ADD <url>`, `ONBUILD`, a non-root `USER`, ...) is rejected here with the file, the line and the instruction,
so the user can switch to `--sandbox docker` instead of getting a subtly wrong box.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from conch.sandbox.base import SandboxError
from conch.sandbox.dockerfile import (HEREDOC_RE, Dockerfile, Instruction, expand, expand_vars, raw_split,
                                      split_words)
from conch.sandbox.standins import standin_for

ROOT_USERS = {"", "root", "0", "root:root", "0:0", "root:0", "0:root"}
DOCKER_DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
COPY_FLAGS = {"chown", "chmod", "link", "checksum", "keep-git-dir", "from"}


@dataclass(frozen=True)
class BuildStep:
    """One filesystem-changing step. kind: "run" | "copy" | "workdir"."""

    kind: str
    line: int
    text: str
    workdir: str
    argv: tuple[str, ...] = ()  # run
    env: tuple[tuple[str, str], ...] = ()  # run: ENV plus ARG values
    stdin: str | None = None  # run: a heredoc script fed to the interpreter
    sources: tuple[str, ...] = ()  # copy: context-relative paths or globs
    inline: tuple[tuple[str, str], ...] = ()  # copy: heredoc sources (name, content)
    dest: str = ""  # copy/workdir: absolute path; copy dest ending in "/" is a directory
    chown: str | None = None
    chmod: str | None = None
    add: bool = False  # ADD: local tar archives are extracted
    from_stage: str = ""  # copy: `COPY --from=<stage name or index>`; sources are paths in that stage


@dataclass(frozen=True)
class ImageConfig:
    base_image: str = ""
    env: tuple[tuple[str, str], ...] = ()
    workdir: str = "/"
    shell: tuple[str, ...] = ("/bin/sh", "-c")
    cmd: tuple[str, ...] | None = None
    entrypoint: tuple[str, ...] | None = None
    labels: tuple[tuple[str, str], ...] = ()
    exposed: tuple[str, ...] = ()


@dataclass(frozen=True)
class BuildPlan:
    dockerfile: Path
    steps: tuple[BuildStep, ...]
    config: ImageConfig
    notes: tuple[str, ...] = field(default_factory=tuple)


def _unsupported(df: Path, ins: Instruction, what: str) -> SandboxError:
    return SandboxError(f"{df}:{ins.line}: {ins.keyword}: {what} is not supported by the local sandbox backend "
                        f"(instruction: {ins.raw[:120]!r}); use --sandbox docker for this task")


def _join(workdir: str, path: str) -> str:
    joined = path if path.startswith("/") else f"{workdir.rstrip('/')}/{path}"
    norm = re.sub(r"/+", "/", joined)
    parts: list[str] = []
    for comp in norm.split("/"):
        if comp in ("", "."):
            continue
        if comp == "..":
            if parts:
                parts.pop()
            continue
        parts.append(comp)
    out = "/" + "/".join(parts)
    return out + "/" if path.endswith("/") and out != "/" else out


def _is_url(src: str) -> bool:
    return bool(re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*://", src)) or src.startswith("git@")


def split_stages(df: Dockerfile) -> list[tuple[str, Dockerfile]]:
    """The build stages of a (multi-stage) Dockerfile: (lower-case alias or "", the stage as its own Dockerfile,
    the global ARGs before the first FROM prepended). One element for a single-stage file."""
    head: list[Instruction] = []
    stages: list[list[Instruction]] = []
    for ins in df.instructions:
        if ins.keyword == "FROM":
            stages.append([ins])
        elif stages:
            stages[-1].append(ins)
        else:
            head.append(ins)
    if not stages:
        return [("", df)]
    out = []
    for body in stages:
        words = body[0].value.split()
        alias = words[2].lower() if len(words) == 3 and words[1].lower() == "as" else ""
        out.append((alias, Dockerfile(df.path, tuple(head + body), df.escape)))
    return out


def plan(df: Dockerfile, build_args: dict[str, str] | None = None,
         base_env: dict[str, str] | None = None, base_workdir: str = "/") -> BuildPlan:
    """Turn the (single) build stage into steps and an image config (`split_stages` first for several).

    `base_env` is the environment the FROM image brings (default: Docker's default PATH), so that
    `ENV PATH=/x:$PATH` extends it as it would under Docker; `base_workdir` its WORKDIR (a stage built on an
    earlier stage inherits both).
    """
    stage = _Stage(df, dict(build_args or {}), base_env, base_workdir)
    for ins in df.instructions:
        stage.apply(ins)
    return stage.result()


class _Stage:
    """The state of one stage while its instructions are read in order (ARG scopes, ENV, image config)."""

    def __init__(self, df: Dockerfile, build_args: dict[str, str], base_env: dict[str, str] | None,
                 base_workdir: str) -> None:
        self.path, self.esc, self.build_args = df.path, df.escape, build_args
        self.global_args: dict[str, str] = {}
        self.args: dict[str, str] = {}
        self.env: dict[str, str] = dict(base_env if base_env is not None else {"PATH": DOCKER_DEFAULT_PATH})
        self.cfg: dict = {"workdir": base_workdir, "shell": ("/bin/sh", "-c"), "cmd": None, "entrypoint": None,
                          "labels": {}, "exposed": []}
        self.steps: list[BuildStep] = []
        self.notes: list[str] = []
        self.base = ""
        self.seen_from = False

    def error(self, ins: Instruction, what: str) -> SandboxError:
        return SandboxError(f"{self.path}:{ins.line}: {what}")

    def subst(self, ins: Instruction, text: str, words: bool = False):
        try:
            scope = {**self.args, **self.env}
            return split_words(text, scope, self.esc) if words else expand(text, scope, self.esc)
        except ValueError as exc:
            raise self.error(ins, f"{ins.keyword}: {exc}") from exc

    def apply(self, ins: Instruction) -> None:
        kw, flags = ins.keyword, dict(ins.flags)
        if not self.seen_from and kw not in ("ARG", "FROM"):
            raise self.error(ins, f"{kw} before FROM")
        handler = _HANDLERS.get(kw)
        if handler is not None:  # MAINTAINER, VOLUME, STOPSIGNAL, HEALTHCHECK: no effect on a local box.
            handler(self, ins, flags)

    def result(self) -> BuildPlan:
        if not self.seen_from:
            raise SandboxError(f"{self.path}: no FROM instruction")
        cfg = self.cfg
        config = ImageConfig(base_image=self.base, env=tuple(self.env.items()), workdir=cfg["workdir"],
                             shell=cfg["shell"], cmd=cfg["cmd"], entrypoint=cfg["entrypoint"],
                             labels=tuple(cfg["labels"].items()), exposed=tuple(cfg["exposed"]))
        return BuildPlan(self.path, tuple(self.steps), config, tuple(self.notes))

    # --- one method per instruction -------------------------------------------------------------------------

    def arg(self, ins: Instruction, flags: dict) -> None:
        for word in raw_split(ins.value, self.esc):
            name, eq, default = word.partition("=")
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
                raise self.error(ins, f"ARG: invalid name {name!r}")
            scope = self.global_args if not self.seen_from else self.args
            if name in self.build_args:
                scope[name] = self.build_args[name]
            elif eq:
                scope[name] = expand(default, {**self.global_args, **self.args, **self.env}, self.esc)
            elif self.seen_from and name in self.global_args:
                scope[name] = self.global_args[name]
            elif self.seen_from:
                scope.pop(name, None)

    def from_(self, ins: Instruction, flags: dict) -> None:
        if self.seen_from:
            raise self.error(ins, "a second FROM: plan() takes one build stage (split a multi-stage Dockerfile "
                                  "with split_stages first)")
        if flags.keys() - {"platform"}:
            raise _unsupported(self.path, ins, f"FROM flag --{next(iter(flags.keys() - {'platform'}))}")
        words = split_words(ins.value, self.global_args, self.esc)
        if not words or (len(words) not in (1, 3)) or (len(words) == 3 and words[1].lower() != "as"):
            raise self.error(ins, "FROM: expected 'FROM image [AS name]'")
        self.base, self.seen_from = words[0], True
        standin = standin_for(self.base)
        if standin is not None and standin.workdir:  # what the original image sets (t-bench: /app)
            self.cfg["workdir"] = standin.workdir
            self.steps.append(BuildStep("workdir", ins.line, ins.raw, standin.workdir, dest=standin.workdir))

    def env_(self, ins: Instruction, flags: dict) -> None:
        words = self.subst(ins, ins.value, words=True)
        if words and "=" not in words[0]:
            key = words[0]
            value = ins.value.strip()[len(ins.value.strip().split(None, 1)[0]):].strip()
            self.env[key] = self.subst(ins, value)
            return
        for word in words:
            key, eq, value = word.partition("=")
            if not eq or not key:
                raise self.error(ins, f"ENV: expected KEY=VALUE, got {word!r}")
            self.env[key] = value

    def workdir(self, ins: Instruction, flags: dict) -> None:
        target = self.subst(ins, ins.value)
        if not target:
            raise self.error(ins, "WORKDIR needs a path")
        self.cfg["workdir"] = _join(self.cfg["workdir"], target).rstrip("/") or "/"
        self.steps.append(BuildStep("workdir", ins.line, ins.raw, self.cfg["workdir"], dest=self.cfg["workdir"]))

    def run(self, ins: Instruction, flags: dict) -> None:
        mount = flags.get("mount", "")
        if mount and "type=cache" not in mount:
            raise _unsupported(self.path, ins, f"RUN --mount={mount}")
        if mount:
            self.notes.append(f"{self.path}:{ins.line}: RUN --mount=type=cache ignored (runs without a cache mount)")
        if flags.keys() - {"mount", "network"}:
            raise _unsupported(self.path, ins, f"RUN flag --{sorted(flags.keys() - {'mount', 'network'})[0]}")
        run_env = tuple({**self.args, **self.env}.items())
        argv = ins.json_list()
        stdin = None
        if argv is None:
            shell = self.cfg["shell"]
            if ins.heredocs and HEREDOC_RE.fullmatch(ins.value.strip()) and len(ins.heredocs) == 1:
                stdin = ins.heredocs[0].body
                first = stdin.split("\n", 1)[0]
                argv = first[2:].split() if first.startswith("#!") else [*shell[:1]]
                if first.startswith("#!"):
                    argv.append("/dev/stdin")
            else:
                argv = [*shell, ins.value + "".join("\n" + h.raw.rstrip("\n") for h in ins.heredocs)]
        if not argv:
            raise self.error(ins, "RUN needs a command")
        self.steps.append(BuildStep("run", ins.line, ins.raw, self.cfg["workdir"], argv=tuple(argv), env=run_env,
                                    stdin=stdin))

    def copy(self, ins: Instruction, flags: dict) -> None:
        kw = ins.keyword
        for bad in ("parents", "exclude"):
            if bad in flags:
                raise _unsupported(self.path, ins, f"{kw} --{bad}")
        from_stage = self.subst(ins, flags["from"]).lower() if "from" in flags else ""
        extra = flags.keys() - COPY_FLAGS
        if extra:
            raise _unsupported(self.path, ins, f"{kw} --{sorted(extra)[0]}")
        words = ins.json_list()
        words = [self.subst(ins, w) for w in words] if words is not None else self.subst(ins, ins.value, words=True)
        if len(words) < 2:
            raise self.error(ins, f"{kw} needs at least one source and a destination")
        *srcs, dest = words
        sources, inline = self._copy_sources(ins, srcs, from_stage)
        multi = len(srcs) > 1 or any(ch in s for s in sources for ch in "*?[")
        dest_abs = _join(self.cfg["workdir"], dest)
        if (dest.endswith("/") or dest in (".", "./")) and not dest_abs.endswith("/"):
            dest_abs += "/"
        if multi and not dest_abs.endswith("/"):
            dest_abs += "/"
        chown = self.subst(ins, flags["chown"]) if "chown" in flags else None
        self.steps.append(BuildStep("copy", ins.line, ins.raw, self.cfg["workdir"], sources=tuple(sources),
                                    inline=tuple(inline), dest=dest_abs, chown=chown, chmod=flags.get("chmod"),
                                    add=kw == "ADD" and not from_stage, from_stage=from_stage))

    def _copy_sources(self, ins: Instruction, srcs: list[str],
                      from_stage: str) -> tuple[list[str], list[tuple[str, str]]]:
        """A COPY/ADD's sources: paths (or globs) and heredoc bodies (name, content)."""
        inline: list[tuple[str, str]] = []
        sources: list[str] = []
        docs = {h.name: h for h in ins.heredocs}
        for src in srcs:
            m = HEREDOC_RE.fullmatch(src)
            if m and m.group(3) in docs:
                doc = docs[m.group(3)]
                try:
                    body = doc.body if doc.quoted else expand_vars(doc.body, {**self.args, **self.env})
                except ValueError as exc:
                    raise self.error(ins, f"{ins.keyword}: {exc}") from exc
                inline.append((doc.name, body))
                continue
            if _is_url(src):
                raise _unsupported(self.path, ins, f"{ins.keyword} from a URL ({src})")
            if from_stage and any(ch in src for ch in "*?["):
                raise _unsupported(self.path, ins, f"{ins.keyword} --from with a wildcard source ({src})")
            sources.append(src)
        return sources, inline

    def user(self, ins: Instruction, flags: dict) -> None:
        user = self.subst(ins, ins.value)
        if user not in ROOT_USERS:
            raise _unsupported(self.path, ins, f"USER {user} (a non-root user)")

    def shell(self, ins: Instruction, flags: dict) -> None:
        shell = ins.json_list()
        if not shell:
            raise self.error(ins, "SHELL must be a JSON array, e.g. [\"/bin/bash\", \"-c\"]")
        self.cfg["shell"] = tuple(shell)

    def command(self, ins: Instruction, flags: dict) -> None:  # CMD, ENTRYPOINT
        form = ins.json_list()
        self.cfg[ins.keyword.lower()] = tuple(form) if form is not None else (*self.cfg["shell"], ins.value)

    def label(self, ins: Instruction, flags: dict) -> None:
        for word in self.subst(ins, ins.value, words=True):
            key, _, value = word.partition("=")
            self.cfg["labels"][key] = value

    def expose(self, ins: Instruction, flags: dict) -> None:
        self.cfg["exposed"].extend(self.subst(ins, ins.value, words=True))

    def onbuild(self, ins: Instruction, flags: dict) -> None:
        raise _unsupported(self.path, ins, "ONBUILD")


_HANDLERS = {"ARG": _Stage.arg, "FROM": _Stage.from_, "ENV": _Stage.env_, "WORKDIR": _Stage.workdir,
             "RUN": _Stage.run, "COPY": _Stage.copy, "ADD": _Stage.copy, "USER": _Stage.user,
             "SHELL": _Stage.shell, "CMD": _Stage.command, "ENTRYPOINT": _Stage.command, "LABEL": _Stage.label,
             "EXPOSE": _Stage.expose, "ONBUILD": _Stage.onbuild}
