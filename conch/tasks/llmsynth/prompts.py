"""Prompt templates, versioned as files: prompts/<version>/{system,generate,repair}.txt.

Why files and a version: the ledger records the prompt version of every candidate, so acceptance rates of
two prompt revisions can be compared and a change of wording is a reviewed diff, not a string in code. A new
wording is a new folder (v2/), never an edit of a version already used. Templates use `$name` placeholders
(string.Template) because seed files are full of braces.
"""

from __future__ import annotations

from pathlib import Path
from string import Template

from conch.tasks.llmsynth import PROMPT_VERSION

ROOT = Path(__file__).resolve().parent / "prompts"
SEED_FILE_CHARS = 6000  # each seed file shown to the model is cut here (a prompt stays well under 32k tokens)
SEED_TEST_SUFFIXES = (".sh", ".py", ".txt", ".json", ".yaml", ".yml", ".toml", ".cfg", ".ini", ".md")


def template(name: str, version: str = PROMPT_VERSION) -> Template:
    path = ROOT / version / f"{name}.txt"
    if not path.is_file():
        raise ValueError(f"no prompt template {name!r} in version {version!r} ({path})")
    return Template(path.read_text())


def _cut(text: str) -> str:
    return text if len(text) <= SEED_FILE_CHARS else text[:SEED_FILE_CHARS] + "\n[... cut ...]"


def _read(path: Path | None) -> str:
    if path is None or not path.is_file():
        return "(none)"
    return _cut(path.read_text(errors="replace"))


def seed_tests(task) -> str:
    parts = []
    for p in sorted(task.tests_dir.rglob("*")):
        if p.is_file() and p.suffix in SEED_TEST_SUFFIXES:
            parts.append(f"# file tests/{p.relative_to(task.tests_dir).as_posix()}\n{_read(p)}")
    return "\n".join(parts) or "(none)"


def generate_messages(task, candidate: str, difficulty: str, skill: str,
                      version: str = PROMPT_VERSION) -> list[dict]:
    """The chat messages asking for one new task from seed `task` (a loaded conch Task)."""
    solution = task.solution_script
    if solution is None and task.solution_commands:
        solution_text = "\n".join(task.solution_commands)
    else:
        solution_text = _read(solution)
    user = template("generate", version).safe_substitute(
        candidate=candidate, difficulty=difficulty, skill=skill, seed_name=task.name,
        seed_instruction=_cut(task.instruction), seed_dockerfile=_read(task.dockerfile),
        seed_tests=seed_tests(task), seed_solution=solution_text)
    return [{"role": "system", "content": template("system", version).template},
            {"role": "user", "content": user}]


def repair_messages(history: list[dict], answer: str, gate: str, message: str,
                    version: str = PROMPT_VERSION) -> list[dict]:
    """The conversation so far, the rejected answer, and the gate's message asking for a fixed task."""
    text = template("repair", version).safe_substitute(gate=gate, message=message[:4000])
    return [*history, {"role": "assistant", "content": answer}, {"role": "user", "content": text}]
