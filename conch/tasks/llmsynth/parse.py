"""An LLM's answer -> a Harbor task folder, or the reason it cannot be one.

The answer format (prompts/v1/system.txt) is a sequence of `<file path="...">...</file>` blocks: tags survive
code with backticks and braces, and a model that wraps the whole answer in a markdown fence is still read.
Why strict paths: the answer is untrusted text written to disk, so a path must be relative, stay inside the
task folder (no `..`, no absolute path) and live where the Harbor layout puts files.
"""

from __future__ import annotations

import re
from pathlib import Path, PurePosixPath

REQUIRED = ("instruction.md", "environment/Dockerfile", "tests/test.sh", "solution/solve.sh")
TOP_FILES = ("task.toml", "instruction.md")
TOP_DIRS = ("environment", "tests", "solution")
MAX_FILES = 40
MAX_BYTES = 1_000_000
DEFAULT_TOML = 'version = "1.0"\n\n[verifier]\ntimeout_sec = 120.0\n\n[agent]\ntimeout_sec = 300.0\n'
_FILE = re.compile(r'<file\s+path\s*=\s*["\']([^"\'\n]+)["\']\s*>\n?(.*?)</file>', re.S)
_FENCE = re.compile(r"^\s*```[\w-]*\n(.*)\n```\s*$", re.S)


class ParseError(ValueError):
    """The answer is not a task; the message says why (it goes to the ledger and to a repair prompt)."""


def _unfence(content: str) -> str:
    """A file's content, without the markdown fence a model sometimes puts inside the tags."""
    m = _FENCE.match(content)
    return m.group(1) + "\n" if m else content


def _check_path(raw: str) -> str:
    path = PurePosixPath(raw.strip())
    if path.is_absolute() or ".." in path.parts or not path.parts:
        raise ParseError(f"file path {raw!r} must be relative and stay inside the task folder")
    rel = path.as_posix()
    if len(path.parts) == 1 and rel not in TOP_FILES:
        raise ParseError(f"file {rel!r} is not part of the Harbor layout (top-level files: {', '.join(TOP_FILES)})")
    if len(path.parts) > 1 and path.parts[0] not in TOP_DIRS:
        raise ParseError(f"file {rel!r} is outside {', '.join(d + '/' for d in TOP_DIRS)}")
    return rel


def parse_answer(text: str) -> dict[str, str]:
    """{relative path: content} of the task in `text`; raises ParseError with the reason."""
    if not text or not text.strip():
        raise ParseError("empty answer")
    if len(text.encode()) > MAX_BYTES:
        raise ParseError(f"answer over {MAX_BYTES} bytes")
    files: dict[str, str] = {}
    for raw, content in _FILE.findall(text):
        rel = _check_path(raw)
        if rel in files:
            raise ParseError(f"file {rel!r} given twice")
        files[rel] = _unfence(content)
    if not files:
        raise ParseError('no <file path="..."> blocks in the answer')
    if len(files) > MAX_FILES:
        raise ParseError(f"{len(files)} files (at most {MAX_FILES})")
    missing = [r for r in REQUIRED if r not in files]
    if missing:
        raise ParseError(f"missing {', '.join(missing)}")
    if not files["instruction.md"].strip():
        raise ParseError("instruction.md is empty")
    files.setdefault("task.toml", DEFAULT_TOML)
    return files


def write_task(folder: Path, files: dict[str, str]) -> Path:
    """Write the parsed files under `folder` (created; must not exist). Scripts get mode 755."""
    folder.mkdir(parents=True)
    for rel, content in sorted(files.items()):
        p = folder / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(content)
        if rel.endswith(".sh"):
            p.chmod(0o755)
    return folder
