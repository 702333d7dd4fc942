"""Task loaders: both layouts, unknown keys kept, every malformed case a TaskLoadError naming its file."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from conch.sandbox.base import Limits
from conch.tasks.loader import find_task_dirs, load_task, load_tasks
from conch.tasks.model import Task, TaskLoadError

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples" / "tasks"
REFERENCE = REPO.parent / "shared" / "reference" / "terminal-bench-2"

HARBOR_TOML = """\
version = "1.0"
custom_flag = true

[metadata]
difficulty = "easy"
tags = ["x"]

[verifier]
timeout_sec = 120.0

[verifier.env]
MODE = "strict"
RETRIES = 3

[agent]
timeout_sec = 600

[environment]
cpus = 2
memory = "4G"
storage_mb = 5120

[environment.env]
GREETING = "hi"
"""


def make_harbor(root: Path, name: str = "h-task", toml: str = HARBOR_TOML) -> Path:
    d = root / name
    (d / "environment").mkdir(parents=True)
    (d / "tests").mkdir()
    (d / "solution").mkdir()
    (d / "task.toml").write_text(toml)
    (d / "instruction.md").write_text("Do the thing.\n")
    (d / "environment" / "Dockerfile").write_text("FROM debian:bookworm\nWORKDIR /app\n")
    (d / "tests" / "test.sh").write_text("#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n")
    (d / "tests" / "test_outputs.py").write_text("def test_a():\n    pass\n")
    (d / "solution" / "solve.sh").write_text("#!/bin/bash\ntrue\n")
    return d


TB1_YAML = """\
instruction: |-
  Fix the config.
author_name: someone
difficulty: medium
tags: [config]
parser_name: pytest
max_agent_timeout_sec: 200
max_test_timeout_sec: 45.5
run_tests_in_same_shell: false
"""


def make_tb1(root: Path, name: str = "t1-task", yaml_text: str = TB1_YAML) -> Path:
    d = root / name
    (d / "tests").mkdir(parents=True)
    (d / "task.yaml").write_text(yaml_text)
    (d / "Dockerfile").write_text("FROM debian:bookworm\nWORKDIR /app\n")
    (d / "docker-compose.yaml").write_text("services:\n  client:\n    build: .\n")
    (d / "run-tests.sh").write_text("#!/bin/bash\npytest $TEST_DIR/test_outputs.py -rA\n")
    (d / "tests" / "test_outputs.py").write_text("def test_a():\n    pass\n")
    (d / "solution.sh").write_text("#!/bin/bash\ntrue\n")
    return d


def test_harbor_task(tmp_path):
    d = make_harbor(tmp_path)
    (d / "solution" / "commands.json").write_text(json.dumps(["cd /app", "echo hi > out.txt"]))
    task = load_task(d)
    assert isinstance(task, Task), task
    assert task.fmt == "harbor" and task.name == "h-task" and task.instruction == "Do the thing.\n"
    assert task.verifier_timeout_sec == 120.0 and task.agent_timeout_sec == 600.0
    assert task.limits == Limits(cpus=2.0, memory_mb=4096, storage_mb=5120)
    assert task.test_env == {"MODE": "strict", "RETRIES": "3"}
    assert task.test_script == d.resolve() / "tests" / "test.sh"
    assert task.context_dir == d.resolve() / "environment"
    assert task.dockerfile == d.resolve() / "environment" / "Dockerfile"
    assert task.compose_file is None
    assert task.solution_script == d.resolve() / "solution" / "solve.sh"
    assert task.solution_commands == ("cd /app", "echo hi > out.txt")
    assert task.metadata["custom_flag"] is True and task.metadata["metadata"]["difficulty"] == "easy"
    spec = task.sandbox_spec()
    assert spec.context_dir == task.context_dir and spec.limits == task.limits
    assert task.env == {"GREETING": "hi"} and spec.env == {"GREETING": "hi"}


def test_harbor_schema_versions_and_compose(tmp_path):
    for i, version in enumerate(["1.0", "1.1", "1.2"]):
        d = make_harbor(tmp_path, f"v{i}", f'schema_version = "{version}"\n[environment]\nmemory_mb = 1024\n')
        (d / "environment" / "docker-compose.yaml").write_text("services: {}\n")
        task = load_task(d)
        assert isinstance(task, Task), task
        assert task.limits.memory_mb == 1024 and task.verifier_timeout_sec == 180.0
        assert task.compose_file == d.resolve() / "environment" / "docker-compose.yaml"


def test_tb1_task(tmp_path):
    d = make_tb1(tmp_path)
    task = load_task(d)
    assert isinstance(task, Task), task
    assert task.fmt == "tb1" and task.instruction == "Fix the config."
    assert task.agent_timeout_sec == 200.0 and task.verifier_timeout_sec == 45.5
    assert task.test_env == {"TEST_DIR": "/tests"}
    assert task.test_script == d.resolve() / "run-tests.sh"
    assert task.tests_dir == d.resolve() / "tests"
    assert task.context_dir == d.resolve() and task.dockerfile == d.resolve() / "Dockerfile"
    assert task.compose_file == d.resolve() / "docker-compose.yaml"
    assert task.solution_script == d.resolve() / "solution.sh" and task.solution_commands is None
    assert task.metadata["parser_name"] == "pytest" and task.metadata["run_tests_in_same_shell"] is False
    assert "instruction" not in task.metadata


def test_tb1_solution_yaml_and_descriptions(tmp_path):
    d = make_tb1(tmp_path, yaml_text="descriptions:\n  - key: base\n    description: Old style.\nextra: 1\n")
    (d / "solution.sh").unlink()
    (d / "solution.yaml").write_text(
        "- command: cd /app\n  min_timeout_sec: 0.1\n  block: true\n- echo done > out.txt\n"
    )
    task = load_task(d)
    assert isinstance(task, Task), task
    assert task.instruction == "Old style." and task.metadata["extra"] == 1
    assert task.solution_commands == ("cd /app", "echo done > out.txt") and task.solution_script is None
    assert task.verifier_timeout_sec == 60.0


def _break(kind: str, tmp_path: Path) -> tuple[Path, str, str]:
    """Make a broken task; returns (task dir, file name expected in the error, message fragment)."""
    if kind.startswith("harbor"):
        d = make_harbor(tmp_path, kind)
    else:
        d = make_tb1(tmp_path, kind)
    if kind == "harbor-bad-toml":
        (d / "task.toml").write_text("version = \n[verifier\n")
        return d, "task.toml", "invalid TOML"
    if kind == "harbor-bad-version":
        (d / "task.toml").write_text('version = "3.0"\n')
        return d, "task.toml", "unsupported schema_version"
    if kind == "harbor-bad-timeout":
        (d / "task.toml").write_text('version = "1.0"\n[verifier]\ntimeout_sec = "soon"\n')
        return d, "task.toml", "[verifier] timeout_sec"
    if kind == "harbor-bad-memory":
        (d / "task.toml").write_text('version = "1.0"\n[environment]\nmemory = "lots"\n')
        return d, "task.toml", "[environment] memory"
    if kind == "harbor-bad-table":
        (d / "task.toml").write_text('version = "1.0"\nagent = 5\n')
        return d, "task.toml", "[agent] must be a table"
    if kind == "harbor-no-instruction":
        (d / "instruction.md").unlink()
        return d, "instruction.md", "missing instruction"
    if kind == "harbor-empty-instruction":
        (d / "instruction.md").write_text("  \n")
        return d, "instruction.md", "empty"
    if kind == "harbor-no-tests":
        shutil.rmtree(d / "tests")
        return d, "tests", "missing tests"
    if kind == "harbor-no-test-sh":
        (d / "tests" / "test.sh").unlink()
        return d, "test.sh", "missing verifier script"
    if kind == "harbor-bad-commands":
        (d / "solution" / "commands.json").write_text('{"cmd": "ls"}')
        return d, "commands.json", "list of command strings"
    if kind == "tb1-bad-yaml":
        (d / "task.yaml").write_text("instruction: [unclosed\n")
        return d, "task.yaml", "invalid YAML"
    if kind == "tb1-not-mapping":
        (d / "task.yaml").write_text("- a\n- b\n")
        return d, "task.yaml", "must be a mapping"
    if kind == "tb1-no-instruction":
        (d / "task.yaml").write_text("difficulty: easy\n")
        return d, "task.yaml", "missing instruction"
    if kind == "tb1-instruction-type":
        (d / "task.yaml").write_text("instruction: [1, 2]\n")
        return d, "task.yaml", "instruction must be a string"
    if kind == "tb1-bad-timeout":
        (d / "task.yaml").write_text("instruction: x\nmax_test_timeout_sec: -3\n")
        return d, "task.yaml", "max_test_timeout_sec"
    if kind == "tb1-no-run-tests":
        (d / "run-tests.sh").unlink()
        return d, "run-tests.sh", "missing verifier script"
    if kind == "tb1-no-tests":
        shutil.rmtree(d / "tests")
        return d, "tests", "missing tests"
    if kind == "tb1-bad-solution-yaml":
        (d / "solution.yaml").write_text("- command: 5\n")
        return d, "solution.yaml", "entry 0"
    raise AssertionError(kind)


BROKEN = [
    "harbor-bad-toml",
    "harbor-bad-version",
    "harbor-bad-timeout",
    "harbor-bad-memory",
    "harbor-bad-table",
    "harbor-no-instruction",
    "harbor-empty-instruction",
    "harbor-no-tests",
    "harbor-no-test-sh",
    "harbor-bad-commands",
    "tb1-bad-yaml",
    "tb1-not-mapping",
    "tb1-no-instruction",
    "tb1-instruction-type",
    "tb1-bad-timeout",
    "tb1-no-run-tests",
    "tb1-no-tests",
    "tb1-bad-solution-yaml",
]


@pytest.mark.parametrize("kind", BROKEN)
def test_malformed_task_names_file(kind, tmp_path):
    d, file_name, fragment = _break(kind, tmp_path)
    err = load_task(d)
    assert isinstance(err, TaskLoadError), err
    assert err.name == kind and err.file.name == file_name
    assert fragment in err.message
    assert str(err).startswith(str(err.file))


def test_batch_keeps_going_and_sorts(tmp_path):
    make_tb1(tmp_path / "group-b", "zeta")
    make_harbor(tmp_path / "group-a", "alpha")
    broken, _, _ = _break("harbor-bad-toml", tmp_path / "group-a")
    (tmp_path / ".hidden").mkdir()
    make_harbor(tmp_path / ".hidden", "ignored")
    # a task folder's own subfolders are not searched for further tasks
    make_harbor(tmp_path / "group-b" / "zeta" / "tests", "nested")
    results = load_tasks([tmp_path, tmp_path / "group-a"])  # overlap: each task once
    assert [r.name for r in results] == ["alpha", "harbor-bad-toml", "zeta"]
    assert [type(r).__name__ for r in results] == ["Task", "TaskLoadError", "Task"]
    assert find_task_dirs(broken / "task.toml") == [broken]
    assert load_tasks([tmp_path / "group-a" / "alpha"])[0].name == "alpha"


def test_examples_load():
    results = load_tasks([EXAMPLES])
    assert len(results) >= 3
    errors = [str(r) for r in results if isinstance(r, TaskLoadError)]
    assert errors == []
    assert {r.fmt for r in results} == {"harbor", "tb1"}
    assert all(r.solution_script or r.solution_commands for r in results)


@pytest.mark.skipif(not REFERENCE.is_dir(), reason=f"reference tasks not present at {REFERENCE}")
def test_reference_task_tomls_parse(tmp_path):
    """Every real Terminal-Bench 2.x task.toml loads (with a stand-in tests folder; the reference has none)."""
    tomls = sorted(REFERENCE.glob("*/task.toml"))
    assert tomls
    for toml in tomls:
        d = tmp_path / toml.parent.name
        (d / "tests").mkdir(parents=True)
        (d / "tests" / "test.sh").write_text("true\n")
        shutil.copy(toml, d / "task.toml")
        (d / "instruction.md").write_text("stand-in instruction\n")  # a few reference tasks lack one
        task = load_task(d)
        assert isinstance(task, Task), str(task)
        assert task.verifier_timeout_sec > 0 and task.limits.memory_mb > 0
        assert "task" in task.metadata or "metadata" in task.metadata


def test_symlinked_task_folders_are_followed_once(tmp_path):
    real = tmp_path / "all"
    make_harbor(real, "alpha")
    make_harbor(real, "beta")
    picked = tmp_path / "picked"
    picked.mkdir()
    (picked / "alpha").symlink_to(real / "alpha", target_is_directory=True)
    (picked / "loop").symlink_to(picked, target_is_directory=True)  # a cycle must not loop
    assert [r.name for r in load_tasks([picked])] == ["alpha"]
    assert [r.name for r in load_tasks([picked, real])] == ["alpha", "beta"]
