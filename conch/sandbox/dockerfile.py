"""Dockerfile parsing and planning, shared by the local builder and any backend that must read a Dockerfile.

Why our own parser: the local backend has no Docker engine, but Terminal-Bench tasks ship Dockerfiles. We
parse the syntax Docker documents (line continuations, comments, parser directives, JSON and shell forms,
heredocs, ARG/ENV substitution), split it into build stages, and turn each stage into a `BuildPlan`: plain
steps (RUN, COPY/ADD, `COPY --from=<stage>`, WORKDIR) plus the image config (ENV, WORKDIR, CMD...). Anything
the local builder cannot reproduce faithfully (`ADD <url>`, `ONBUILD`, a non-root `USER`, ...) is rejected here
with the file, the line and the instruction, so the user can switch to `--sandbox docker` instead of getting a
subtly wrong box.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from conch.sandbox.base import SandboxError
from conch.sandbox.standins import standin_for

_HEREDOC_RE = re.compile(r"<<(-?)([\"']?)([A-Za-z_][A-Za-z0-9_]*)\2")
_DIRECTIVE_RE = re.compile(r"^#\s*([a-zA-Z][a-zA-Z0-9_-]*)\s*=\s*(.*?)\s*$")
_KNOWN = {"FROM", "RUN", "CMD", "LABEL", "MAINTAINER", "EXPOSE", "ENV", "ADD", "COPY", "ENTRYPOINT", "VOLUME",
          "USER", "WORKDIR", "ARG", "ONBUILD", "STOPSIGNAL", "HEALTHCHECK", "SHELL"}
_FLAG_TAKERS = {"FROM", "RUN", "COPY", "ADD", "HEALTHCHECK"}
_ROOT_USERS = {"", "root", "0", "root:root", "0:0", "root:0", "0:root"}


@dataclass(frozen=True)
class Heredoc:
    name: str
    body: str  # the lines between the opening line and the delimiter, each with its newline
    strip_tabs: bool
    quoted: bool  # quoted delimiter: no variable expansion in the body
    raw: str  # body plus delimiter line, as written (for passing the whole text to a shell)


@dataclass(frozen=True)
class Instruction:
    keyword: str
    value: str  # after keyword and flags, continuation lines joined
    flags: tuple[tuple[str, str], ...]
    line: int  # 1-based line of the keyword
    raw: str
    heredocs: tuple[Heredoc, ...] = ()

    def json_list(self) -> list[str] | None:
        text = self.value.strip()
        if not text.startswith("["):
            return None
        try:
            data = json.loads(text)
        except json.JSONDecodeError:
            return None
        return data if isinstance(data, list) and all(isinstance(x, str) for x in data) else None


@dataclass(frozen=True)
class Dockerfile:
    path: Path
    instructions: tuple[Instruction, ...]
    escape: str = "\\"


def parse(path: Path, text: str | None = None) -> Dockerfile:
    """Parse a Dockerfile into instructions. Syntax errors raise SandboxError naming the file and line."""
    if text is None:
        try:
            text = path.read_text()
        except OSError as exc:
            raise SandboxError(f"cannot read Dockerfile {path}: {exc}") from exc
    lines = text.splitlines()
    escape = "\\"
    i = 0
    while i < len(lines):  # parser directives: only at the very top
        m = _DIRECTIVE_RE.match(lines[i])
        if not m:
            break
        if m.group(1).lower() == "escape":
            if m.group(2) not in ("\\", "`"):
                raise SandboxError(f"{path}:{i + 1}: invalid escape directive {m.group(2)!r}")
            escape = m.group(2)
        i += 1
    out: list[Instruction] = []
    while i < len(lines):
        stripped = lines[i].strip()
        if not stripped or stripped.startswith("#"):
            i += 1
            continue
        start = i
        parts: list[str] = []
        while True:
            line = lines[i]
            body = line.rstrip()
            if body.endswith(escape):
                parts.append(body[: -len(escape)])
                i += 1
                while i < len(lines) and (not lines[i].strip() or lines[i].lstrip().startswith("#")):
                    i += 1  # comments and blank lines inside a continuation are dropped
                if i >= len(lines):
                    break
                continue
            parts.append(line)
            i += 1
            break
        joined = "".join(parts).strip()
        keyword, _, rest = joined.partition(" ")
        if "\t" in keyword:
            keyword, _, more = keyword.partition("\t")
            rest = more + " " + rest
        keyword = keyword.upper()
        if keyword not in _KNOWN:
            raise SandboxError(f"{path}:{start + 1}: unknown instruction {keyword!r}")
        flags: list[tuple[str, str]] = []
        rest = rest.strip()
        if keyword in _FLAG_TAKERS:
            while rest.startswith("--"):
                token, _, rest = rest.partition(" ")
                name, eq, value = token.partition("=")
                flags.append((name[2:].lower(), value if eq else "true"))
                rest = rest.strip()
        heredocs: list[Heredoc] = []
        if keyword in ("RUN", "COPY", "ADD"):
            for m in _HEREDOC_RE.finditer(rest):
                strip_tabs, quoted, name = m.group(1) == "-", bool(m.group(2)), m.group(3)
                body_lines: list[str] = []
                while i < len(lines):
                    candidate = lines[i].lstrip("\t") if strip_tabs else lines[i]
                    i += 1
                    if candidate == name:
                        break
                    body_lines.append(candidate + "\n")
                else:
                    raise SandboxError(f"{path}:{start + 1}: heredoc <<{name} is not terminated")
                body = "".join(body_lines)
                heredocs.append(Heredoc(name, body, strip_tabs, quoted, body + name + "\n"))
        out.append(Instruction(keyword, rest, tuple(flags), start + 1, joined, tuple(heredocs)))
    return Dockerfile(path, tuple(out), escape)


# --- word expansion (Docker's shell-lexer subset) --------------------------------------------------------------

def _lookup(expr: str, env: dict[str, str]) -> str:
    m = re.fullmatch(r"([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-+?])(.*))?", expr, re.S)
    if not m:
        raise ValueError(f"bad substitution ${{{expr}}}")
    name, op, word = m.group(1), m.group(2), m.group(3) or ""
    value = env.get(name)
    if op is None:
        return value or ""
    empty_counts = op.startswith(":")
    is_set = value is not None and (value != "" or not empty_counts)
    if op.endswith("-"):
        return value if is_set else word  # type: ignore[return-value]
    if op.endswith("+"):
        return word if is_set else ""
    if not is_set:
        raise ValueError(word or f"{name}: parameter not set")
    return value  # type: ignore[return-value]


def _lex(text: str, env: dict[str, str], escape: str = "\\") -> list[str]:
    """Split into words, removing quotes and substituting $VAR, ${VAR}, ${VAR:-x}, ${VAR:+x}."""
    words: list[str] = []
    cur: list[str] = []
    have = False
    i, n = 0, len(text)
    quote = ""
    while i < n:
        c = text[i]
        if quote == "'":
            if c == "'":
                quote = ""
            else:
                cur.append(c)
            i += 1
            continue
        if c == escape and i + 1 < n:
            nxt = text[i + 1]
            if quote == '"' and nxt not in ('"', "$", escape):
                cur.append(c)
            cur.append(nxt)
            have = True
            i += 2
            continue
        if c == "$" and i + 1 < n:
            if text[i + 1] == "{":
                end = text.find("}", i + 2)
                if end < 0:
                    raise ValueError("missing '}' in substitution")
                cur.append(_lookup(text[i + 2 : end], env))
                have = True
                i = end + 1
                continue
            m = re.match(r"[A-Za-z_][A-Za-z0-9_]*", text[i + 1 :])
            if m:
                cur.append(env.get(m.group(0), ""))
                have = True
                i += 1 + m.end()
                continue
        if quote == '"':
            if c == '"':
                quote = ""
            else:
                cur.append(c)
            i += 1
            continue
        if c in "'\"":
            quote = c
            have = True
        elif c.isspace():
            if have or cur:
                words.append("".join(cur))
            cur, have = [], False
        else:
            cur.append(c)
            have = True
        i += 1
    if quote:
        raise ValueError(f"unterminated {quote} quote")
    if have or cur:
        words.append("".join(cur))
    return words


def raw_split(text: str, escape: str = "\\") -> list[str]:
    """Split on whitespace outside quotes, keeping quotes and escapes for a later `expand`."""
    words, cur, quote, i = [], [], "", 0
    while i < len(text):
        c = text[i]
        if c == escape and quote != "'" and i + 1 < len(text):
            cur.append(text[i : i + 2])
            i += 2
            continue
        if quote:
            quote = "" if c == quote else quote
        elif c in "'\"":
            quote = c
        elif c.isspace():
            if cur:
                words.append("".join(cur))
            cur = []
            i += 1
            continue
        cur.append(c)
        i += 1
    if cur:
        words.append("".join(cur))
    return words


def expand_vars(text: str, env: dict[str, str]) -> str:
    """Substitute $VAR and ${VAR...} only (heredoc bodies with an unquoted delimiter)."""
    def one(m: re.Match) -> str:
        return _lookup(m.group(1), env) if m.group(1) is not None else env.get(m.group(2), "")

    return re.sub(r"\$\{([^}]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)", one, text)


def expand(text: str, env: dict[str, str], escape: str = "\\") -> str:
    """One value: substitution and quote removal, inner whitespace kept."""
    return " ".join(_lex(text, env, escape)) if text.strip() else ""


def split_words(text: str, env: dict[str, str], escape: str = "\\") -> list[str]:
    return _lex(text, env, escape)


# --- planning --------------------------------------------------------------------------------------------------

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


DOCKER_DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


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
    path, esc = df.path, df.escape
    build_args = dict(build_args or {})
    global_args: dict[str, str] = {}
    args: dict[str, str] = {}
    env: dict[str, str] = dict(base_env if base_env is not None else {"PATH": DOCKER_DEFAULT_PATH})
    cfg: dict = {"workdir": base_workdir, "shell": ("/bin/sh", "-c"), "cmd": None, "entrypoint": None,
                 "labels": {}, "exposed": []}
    steps: list[BuildStep] = []
    notes: list[str] = []
    base = ""
    seen_from = False

    def subst(ins: Instruction, text: str, words: bool = False):
        try:
            scope = {**args, **env}
            return split_words(text, scope, esc) if words else expand(text, scope, esc)
        except ValueError as exc:
            raise SandboxError(f"{path}:{ins.line}: {ins.keyword}: {exc}") from exc

    for ins in df.instructions:
        kw, flags = ins.keyword, dict(ins.flags)
        if not seen_from and kw not in ("ARG", "FROM"):
            raise SandboxError(f"{path}:{ins.line}: {kw} before FROM")
        if kw == "ARG":
            for word in raw_split(ins.value, esc):
                name, eq, default = word.partition("=")
                if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
                    raise SandboxError(f"{path}:{ins.line}: ARG: invalid name {name!r}")
                scope = global_args if not seen_from else args
                if name in build_args:
                    scope[name] = build_args[name]
                elif eq:
                    scope[name] = expand(default, {**global_args, **args, **env}, esc)
                elif seen_from and name in global_args:
                    scope[name] = global_args[name]
                elif seen_from:
                    scope.pop(name, None)
        elif kw == "FROM":
            if seen_from:
                raise SandboxError(f"{path}:{ins.line}: a second FROM: plan() takes one build stage "
                                   "(split a multi-stage Dockerfile with split_stages first)")
            if flags.keys() - {"platform"}:
                raise _unsupported(path, ins, f"FROM flag --{next(iter(flags.keys() - {'platform'}))}")
            words = split_words(ins.value, global_args, esc)
            if not words or (len(words) not in (1, 3)) or (len(words) == 3 and words[1].lower() != "as"):
                raise SandboxError(f"{path}:{ins.line}: FROM: expected 'FROM image [AS name]'")
            base, seen_from = words[0], True
            standin = standin_for(base)
            if standin is not None and standin.workdir:  # what the original image sets (t-bench: /app)
                cfg["workdir"] = standin.workdir
                steps.append(BuildStep("workdir", ins.line, ins.raw, standin.workdir, dest=standin.workdir))
        elif kw == "ENV":
            words = subst(ins, ins.value, words=True)
            if words and "=" not in words[0]:
                key = words[0]
                value = ins.value.strip()[len(ins.value.strip().split(None, 1)[0]):].strip()
                env[key] = subst(ins, value)
            else:
                for word in words:
                    key, eq, value = word.partition("=")
                    if not eq or not key:
                        raise SandboxError(f"{path}:{ins.line}: ENV: expected KEY=VALUE, got {word!r}")
                    env[key] = value
        elif kw == "WORKDIR":
            target = subst(ins, ins.value)
            if not target:
                raise SandboxError(f"{path}:{ins.line}: WORKDIR needs a path")
            cfg["workdir"] = _join(cfg["workdir"], target).rstrip("/") or "/"
            steps.append(BuildStep("workdir", ins.line, ins.raw, cfg["workdir"], dest=cfg["workdir"]))
        elif kw == "RUN":
            mount = flags.get("mount", "")
            if mount and "type=cache" not in mount:
                raise _unsupported(path, ins, f"RUN --mount={mount}")
            if mount:
                notes.append(f"{path}:{ins.line}: RUN --mount=type=cache ignored (runs without a cache mount)")
            if flags.keys() - {"mount", "network"}:
                raise _unsupported(path, ins, f"RUN flag --{sorted(flags.keys() - {'mount', 'network'})[0]}")
            run_env = tuple({**args, **env}.items())
            argv = ins.json_list()
            stdin = None
            if argv is None:
                cmd = ins.value
                if ins.heredocs and _HEREDOC_RE.fullmatch(cmd.strip()) and len(ins.heredocs) == 1:
                    stdin = ins.heredocs[0].body
                    first = stdin.split("\n", 1)[0]
                    argv = first[2:].split() if first.startswith("#!") else [*cfg["shell"][:1]]
                    if first.startswith("#!"):
                        argv.append("/dev/stdin")
                else:
                    full = cmd + "".join("\n" + h.raw.rstrip("\n") for h in ins.heredocs)
                    argv = [*cfg["shell"], full]
            if not argv:
                raise SandboxError(f"{path}:{ins.line}: RUN needs a command")
            steps.append(BuildStep("run", ins.line, ins.raw, cfg["workdir"], argv=tuple(argv), env=run_env,
                                   stdin=stdin))
        elif kw in ("COPY", "ADD"):
            for bad in ("parents", "exclude"):
                if bad in flags:
                    raise _unsupported(path, ins, f"{kw} --{bad}")
            from_stage = subst(ins, flags["from"]).lower() if "from" in flags else ""
            extra = flags.keys() - {"chown", "chmod", "link", "checksum", "keep-git-dir", "from"}
            if extra:
                raise _unsupported(path, ins, f"{kw} --{sorted(extra)[0]}")
            words = ins.json_list()
            words = [subst(ins, w) for w in words] if words is not None else subst(ins, ins.value, words=True)
            if len(words) < 2:
                raise SandboxError(f"{path}:{ins.line}: {kw} needs at least one source and a destination")
            *srcs, dest = words
            inline: list[tuple[str, str]] = []
            sources: list[str] = []
            docs = {h.name: h for h in ins.heredocs}
            for src in srcs:
                m = _HEREDOC_RE.fullmatch(src)
                if m and m.group(3) in docs:
                    doc = docs[m.group(3)]
                    try:
                        body = doc.body if doc.quoted else expand_vars(doc.body, {**args, **env})
                    except ValueError as exc:
                        raise SandboxError(f"{path}:{ins.line}: {kw}: {exc}") from exc
                    inline.append((doc.name, body))
                    continue
                if _is_url(src):
                    raise _unsupported(path, ins, f"{kw} from a URL ({src})")
                if from_stage and any(ch in src for ch in "*?["):
                    raise _unsupported(path, ins, f"{kw} --from with a wildcard source ({src})")
                sources.append(src)
            multi = len(srcs) > 1 or any(ch in s for s in sources for ch in "*?[")
            dest_abs = _join(cfg["workdir"], dest)
            if (dest.endswith("/") or dest in (".", "./")) and not dest_abs.endswith("/"):
                dest_abs += "/"
            if multi and not dest_abs.endswith("/"):
                dest_abs += "/"
            chown = subst(ins, flags["chown"]) if "chown" in flags else None
            steps.append(BuildStep("copy", ins.line, ins.raw, cfg["workdir"], sources=tuple(sources),
                                   inline=tuple(inline), dest=dest_abs, chown=chown, chmod=flags.get("chmod"),
                                   add=kw == "ADD" and not from_stage, from_stage=from_stage))
        elif kw == "USER":
            user = subst(ins, ins.value)
            if user not in _ROOT_USERS:
                raise _unsupported(path, ins, f"USER {user} (a non-root user)")
        elif kw == "SHELL":
            shell = ins.json_list()
            if not shell:
                raise SandboxError(f"{path}:{ins.line}: SHELL must be a JSON array, e.g. [\"/bin/bash\", \"-c\"]")
            cfg["shell"] = tuple(shell)
        elif kw in ("CMD", "ENTRYPOINT"):
            form = ins.json_list()
            cfg[kw.lower()] = tuple(form) if form is not None else (*cfg["shell"], ins.value)
        elif kw == "LABEL":
            for word in subst(ins, ins.value, words=True):
                key, _, value = word.partition("=")
                cfg["labels"][key] = value
        elif kw == "EXPOSE":
            cfg["exposed"].extend(subst(ins, ins.value, words=True))
        elif kw == "ONBUILD":
            raise _unsupported(path, ins, "ONBUILD")
        # MAINTAINER, VOLUME, STOPSIGNAL, HEALTHCHECK: no effect on a local box.
    if not seen_from:
        raise SandboxError(f"{path}: no FROM instruction")
    config = ImageConfig(base_image=base, env=tuple(env.items()), workdir=cfg["workdir"], shell=cfg["shell"],
                         cmd=cfg["cmd"], entrypoint=cfg["entrypoint"], labels=tuple(cfg["labels"].items()),
                         exposed=tuple(cfg["exposed"]))
    return BuildPlan(path, tuple(steps), config, tuple(notes))
