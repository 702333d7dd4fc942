"""Dockerfile parsing, shared by the local builder and any backend that must read a Dockerfile.

Why our own parser: the local backend has no Docker engine, but Terminal-Bench tasks ship Dockerfiles. We
parse the syntax Docker documents (line continuations, comments, parser directives, JSON and shell forms,
heredocs, ARG/ENV substitution) into `Instruction`s, and expand words and variables as Docker does; turning a
build stage into the steps the local builder runs is conch/sandbox/buildplan.py's job.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from conch.sandbox.base import SandboxError

HEREDOC_RE = re.compile(r"<<(-?)([\"']?)([A-Za-z_][A-Za-z0-9_]*)\2")
_DIRECTIVE_RE = re.compile(r"^#\s*([a-zA-Z][a-zA-Z0-9_-]*)\s*=\s*(.*?)\s*$")
_KNOWN = {"FROM", "RUN", "CMD", "LABEL", "MAINTAINER", "EXPOSE", "ENV", "ADD", "COPY", "ENTRYPOINT", "VOLUME",
          "USER", "WORKDIR", "ARG", "ONBUILD", "STOPSIGNAL", "HEALTHCHECK", "SHELL"}
_FLAG_TAKERS = {"FROM", "RUN", "COPY", "ADD", "HEALTHCHECK"}


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
            for m in HEREDOC_RE.finditer(rest):
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
