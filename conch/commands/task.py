"""`conch task new NAME [--dir PARENT]`: write a new task folder in the Harbor / Terminal-Bench 2.x layout.

Why: writing a task by hand means getting six files right at once (task.toml, the instruction, a Dockerfile,
the standard verifier script with its CTRF and reward file, the tests, a reference solution) before `conch check`
has anything to say. The skeleton is a small task that already works: its oracle passes every test and an agent
that does nothing passes none, so `conch check PARENT/NAME` is green from the start and each edit can be checked
on its own. Its Dockerfile starts `FROM` the image the example tasks use (examples/tasks/), which conch replaces
offline by its Debian base; its `tests/test.sh` is Terminal-Bench 2's own form (`uvx` with pinned pytest and
pytest-json-ctrf, `--ctrf /logs/verifier/ctrf.json`, the reward in `/logs/verifier/reward.txt`).

The folder is written under a temporary name and renamed into place, so a failed write leaves nothing behind;
an existing folder is never touched.
"""

from __future__ import annotations

import argparse
import re

NAME_RULE = re.compile(r"^[a-z0-9](?:[a-z0-9._-]{0,62}[a-z0-9])?$")
BASE_IMAGE = "python:3.13-slim-bookworm"  # what examples/tasks/*/environment/Dockerfile start from

TASK_TOML = '''\
schema_version = "1.1"

[task]
name = "{name}"
description = "TODO: one sentence saying what the agent must do."
keywords = []

[metadata]
difficulty = "easy"
category = "TODO"
tags = []

[verifier]
timeout_sec = 180.0

[agent]
timeout_sec = 300.0

[environment]
cpus = 1
memory_mb = 1024
storage_mb = 2048
allow_internet = false
'''

INSTRUCTION = '''\
Write a file `/app/greeting.txt` that holds exactly one line: `hello from {name}`.
'''

DOCKERFILE = f'''\
FROM {BASE_IMAGE}

WORKDIR /app
'''

# Terminal-Bench 2's standard verifier script (examples/tasks/port-conflicts has it too). Offline, the apt-get
# and curl lines fail harmlessly: the sandbox already has uv, pytest and the CTRF plugin.
TEST_SH = '''\
#!/bin/bash

apt-get update
apt-get install -y curl

curl -LsSf https://astral.sh/uv/0.9.5/install.sh | sh

source $HOME/.local/bin/env

uvx \\
  -p 3.13 \\
  -w pytest==8.4.1 \\
  -w pytest-json-ctrf==0.3.5 \\
  pytest --ctrf /logs/verifier/ctrf.json /tests/test_outputs.py -rA


if [ $? -eq 0 ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
'''

TEST_OUTPUTS = '''\
"""Checks for {name}: one test per requirement, so partial work shows as a partial count."""

from pathlib import Path

OUT = Path("/app/greeting.txt")


def test_greeting_file_exists():
    assert OUT.is_file(), f"{{OUT}} is missing"


def test_greeting_text():
    assert OUT.read_text().splitlines() == ["hello from {name}"]
'''

SOLVE_SH = '''\
#!/bin/bash
# Reference solution for {name}: `conch check` runs it and expects every test to pass.
set -euo pipefail
echo "hello from {name}" > /app/greeting.txt
'''


def files(name: str) -> dict[str, str]:
    """The skeleton's files, by path relative to the task folder."""
    return {
        "task.toml": TASK_TOML.format(name=name),
        "instruction.md": INSTRUCTION.format(name=name),
        "environment/Dockerfile": DOCKERFILE,
        "tests/test.sh": TEST_SH,
        "tests/test_outputs.py": TEST_OUTPUTS.format(name=name),
        "solution/solve.sh": SOLVE_SH.format(name=name),
    }


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("task", help="write a new task folder (one action so far: new)", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    tsub = p.add_subparsers(dest="task_command", metavar="ACTION", required=True)
    np = tsub.add_parser("new", help="write a Harbor-layout task skeleton that passes `conch check` as made",
                         description="Write PARENT/NAME: task.toml, instruction.md, environment/Dockerfile, "
                                     "tests/test.sh (Terminal-Bench 2's standard verifier), tests/test_outputs.py "
                                     "and solution/solve.sh. The oracle passes it and nop does not, as made; "
                                     "check it with `conch check PARENT/NAME`. An existing folder is refused.")
    np.add_argument("name", metavar="NAME", help="task name, also the folder's: lowercase letters, digits, "
                                                  "'-', '_' and '.', at most 64 characters")
    np.add_argument("--dir", default=".", metavar="PARENT", help="folder to create the task in (default: .)")
    np.set_defaults(func=run_new)


def run_new(args: argparse.Namespace) -> int:
    import os
    import shutil
    import sys
    import tempfile
    from pathlib import Path

    from conch.cli import UsageError

    name = args.name
    if not NAME_RULE.match(name):
        raise UsageError(f"invalid task name {name!r}: use lowercase letters, digits, '-', '_' and '.', starting "
                         "and ending with a letter or digit, at most 64 characters")
    parent = Path(args.dir)
    if parent.exists() and not parent.is_dir():
        raise UsageError(f"--dir {parent}: not a folder")
    target = parent / name
    if target.exists() or target.is_symlink():
        raise UsageError(f"{target} already exists; choose another NAME or --dir (nothing was written)")
    parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=parent))
    try:
        for rel, text in files(name).items():
            path = tmp / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            if rel.endswith(".sh"):
                path.chmod(0o755)
        tmp.chmod(0o755)
        os.rename(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    print(f"wrote {target}: edit instruction.md, tests/test_outputs.py and solution/solve.sh, then "
          f"`conch check {target}`", file=sys.stderr)
    print(target)
    return 0
