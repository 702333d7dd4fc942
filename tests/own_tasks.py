"""Hand-written Harbor-layout tasks with `solution/solve.sh`, for the tests of training on a user's own tasks.

Each task asks for a file with a given word in it; the solutions are multi-command scripts (comments, `set -e`,
a heredoc, a loop) so that cutting them into one tool call per command is exercised for real.
"""

from __future__ import annotations

from pathlib import Path

TEST_SH = """#!/bin/bash
mkdir -p /logs/verifier
cd /tests
pytest --ctrf /logs/verifier/ctrf.json /tests/test_outputs.py -rA
status=$?
if [ "$status" -eq 0 ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
exit "$status"
"""

TEST_PY = """import os

def test_file_exists():
    assert os.path.isfile('/app/out/{name}.txt')

def test_file_has_word():
    assert open('/app/out/{name}.txt').read().split() == ['{word}']
"""

SOLVE_SH = """#!/bin/bash
set -euo pipefail
# make the output folder first
mkdir -p /app/out
cd /app/out
cat > {name}.txt <<EOF
{word}
EOF
for f in *.txt; do
  echo "wrote $f"
done
"""

WORDS = ("apple", "birch", "cedar", "delta", "ember", "fjord", "grove", "heron")


def write_task(root: Path, name: str, word: str, solve: str | None = None) -> Path:
    d = root / name
    (d / "environment").mkdir(parents=True)
    (d / "environment" / "Dockerfile").write_text("FROM debian:bookworm-slim\nWORKDIR /app\n")
    (d / "tests").mkdir()
    (d / "tests" / "test.sh").write_text(TEST_SH)
    (d / "tests" / "test_outputs.py").write_text(TEST_PY.format(name=name, word=word))
    (d / "solution").mkdir()
    (d / "solution" / "solve.sh").write_text(solve if solve is not None else SOLVE_SH.format(name=name, word=word))
    (d / "instruction.md").write_text(f"Create the file /app/out/{name}.txt holding the single word {word}.\n")
    (d / "task.toml").write_text('version = "1.0"\n\n[verifier]\ntimeout_sec = 60.0\n\n[agent]\ntimeout_sec = 120.0\n')
    return d


def write_malformed(root: Path, name: str = "broken-task") -> Path:
    """A task folder whose tests/ folder is missing: it must be reported by name and skipped."""
    d = root / name
    d.mkdir(parents=True)
    (d / "task.toml").write_text('version = "1.0"\n')
    (d / "instruction.md").write_text("This task has no tests.\n")
    return d


def write_task_set(root: Path, n: int = 7) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        write_task(root, f"word-{WORDS[i]}", WORDS[i])
    write_malformed(root)
    return root
