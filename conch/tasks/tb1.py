"""Loader for the Terminal-Bench 1 task layout.

    task/
      task.yaml            instruction (or descriptions[key=base]), max_agent_timeout_sec, max_test_timeout_sec, ...
      Dockerfile           environment, build context = the task folder
      docker-compose.yaml  optional
      run-tests.sh         the verifier, run with TEST_DIR=/tests; prints pytest output (no reward file)
      tests/               test files, uploaded to /tests
      solution.sh | solution.yaml   reference solution (yaml: list of commands, strings or {command: ...})

Why TB1 still matters: much public task data (and many synthesized tasks modelled on it) uses this layout;
loading it into the same `Task` lets the verifier and harness treat both layouts alike, the only differences
being `test_script` (run-tests.sh, uploaded next to the tests) and `test_env` (TEST_DIR).
"""

from __future__ import annotations

from pathlib import Path

import yaml

from conch.tasks.fields import FieldError, check_tree, positive_number, printable, read_text
from conch.tasks.model import Task, TaskLoadError
from conch.tasks.testdeps import check_verifier_installs

MARKER = "task.yaml"
DEFAULT_AGENT_TIMEOUT = 360.0  # Terminal-Bench 1 defaults
DEFAULT_TEST_TIMEOUT = 60.0
TEST_DIR = "/tests"


def load_tb1_task(folder: Path) -> Task | TaskLoadError:
    """Load the task in `folder` (which holds task.yaml); never raises for a malformed task."""
    folder = folder.resolve()
    try:
        check_tree(folder)  # before reading anything: task.yaml itself may be a link to a host file
        return _load(folder)
    except FieldError as exc:
        return TaskLoadError(name=printable(folder.name), path=folder, file=exc.file, message=exc.message)


def _yaml(file: Path) -> object:
    try:
        return yaml.safe_load(file.read_text())
    except (OSError, UnicodeDecodeError) as exc:
        raise FieldError(file, f"cannot read: {exc}") from None
    except yaml.YAMLError as exc:
        raise FieldError(file, f"invalid YAML: {' '.join(str(exc).split())}") from None


def _instruction(file: Path, doc: dict) -> str:
    text = doc.get("instruction")
    if text is None and isinstance(doc.get("descriptions"), list):
        # early TB1 tasks: descriptions: [{key: base, description: ...}, ...]
        for entry in doc["descriptions"]:
            if isinstance(entry, dict) and entry.get("key") == "base":
                text = entry.get("description")
    if text is None:
        raise FieldError(file, "missing instruction (expected an `instruction:` string)")
    if not isinstance(text, str):
        raise FieldError(file, f"instruction must be a string, got {type(text).__name__}")
    if not text.strip():
        raise FieldError(file, "instruction is empty")
    return text


def _solution_commands(file: Path) -> tuple[str, ...]:
    doc = _yaml(file)
    if not isinstance(doc, list) or not doc:
        raise FieldError(file, "must be a non-empty list of commands")
    commands = []
    for i, entry in enumerate(doc):
        command = entry.get("command") if isinstance(entry, dict) else entry
        if not isinstance(command, str):
            raise FieldError(file, f"entry {i} must be a string or a mapping with a `command` string, got {entry!r}")
        commands.append(command)
    return tuple(commands)


def _load(folder: Path) -> Task:
    yaml_file = folder / MARKER
    doc = _yaml(yaml_file)
    if not isinstance(doc, dict):
        raise FieldError(yaml_file, f"must be a mapping of fields, got {type(doc).__name__}")
    instruction = _instruction(yaml_file, doc)
    agent_timeout = positive_number(
        yaml_file, "max_agent_timeout_sec", doc.get("max_agent_timeout_sec"), DEFAULT_AGENT_TIMEOUT
    )
    test_timeout = positive_number(
        yaml_file, "max_test_timeout_sec", doc.get("max_test_timeout_sec"), DEFAULT_TEST_TIMEOUT
    )

    test_script = folder / "run-tests.sh"
    read_text(test_script, "verifier script run-tests.sh")
    tests_dir = folder / "tests"
    if not tests_dir.is_dir():
        raise FieldError(tests_dir, "missing tests folder")
    check_verifier_installs(test_script, tests_dir)

    dockerfile = folder / "Dockerfile" if (folder / "Dockerfile").is_file() else None
    compose_file = None
    for name in ("docker-compose.yaml", "docker-compose.yml"):
        if (folder / name).is_file():
            compose_file = folder / name
            break

    solution_script = folder / "solution.sh" if (folder / "solution.sh").is_file() else None
    solution_yaml = folder / "solution.yaml"
    solution_commands = _solution_commands(solution_yaml) if solution_yaml.is_file() else None

    metadata = {k: v for k, v in doc.items() if k not in ("instruction", "descriptions")}
    return Task(
        name=folder.name,
        path=folder,
        fmt="tb1",
        instruction=instruction,
        tests_dir=tests_dir,
        test_script=test_script,
        context_dir=folder,
        dockerfile=dockerfile,
        compose_file=compose_file,
        solution_script=solution_script,
        solution_commands=solution_commands,
        agent_timeout_sec=agent_timeout,
        verifier_timeout_sec=test_timeout,
        test_env={"TEST_DIR": TEST_DIR},
        metadata=metadata,
    )
