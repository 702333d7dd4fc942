"""Loader for the Harbor / Terminal-Bench 2.x task layout.

    task/
      task.toml            version or schema_version "1.0".."1.2"; [verifier] [agent] [environment] tables
      instruction.md       what the agent is asked to do
      environment/         Docker build context: Dockerfile and/or docker-compose.yaml
      tests/test.sh        the verifier; writes /logs/verifier/reward.txt (plus test files beside it)
      solution/solve.sh    optional reference solution
      solution/commands.json  optional: the solution as a list of shell commands, one per agent turn

Why we keep the whole parsed task.toml in `Task.metadata`: tasks in the wild carry keys we do not use
(`[task] keywords`, `docker_image`, `allow_internet`, custom flags); synthesis and decontamination read some
of them, and dropping unknown keys would silently lose information on a round trip.
"""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

from conch.sandbox.base import Limits
from conch.tasks.fields import (
    FieldError,
    check_tree,
    commands_json,
    positive_number,
    printable,
    read_text,
    size_mb,
    string_map,
    table,
)
from conch.tasks.model import Task, TaskLoadError
from conch.tasks.testdeps import check_verifier_installs

MARKER = "task.toml"
SUPPORTED_VERSIONS = ("1.0", "1.1", "1.2")
DEFAULT_AGENT_TIMEOUT = 900.0
DEFAULT_VERIFIER_TIMEOUT = 180.0


def load_harbor_task(folder: Path) -> Task | TaskLoadError:
    """Load the task in `folder` (which holds task.toml); never raises for a malformed task."""
    folder = folder.resolve()
    try:
        check_tree(folder)  # before reading anything: task.toml itself may be a link to a host file
        return _load(folder)
    except FieldError as exc:
        return TaskLoadError(name=printable(folder.name), path=folder, file=exc.file, message=exc.message)


def _warn_bare_base(folder: Path, env_dir: Path, doc: dict) -> None:
    """A task without environment/Dockerfile runs on conch's bare Debian base: say so, never silently."""
    env = doc.get("environment")
    image = env.get("docker_image") if isinstance(env, dict) else None
    why = f"its [environment] docker_image {image!r} is not pulled" if image else "no Dockerfile or compose file"
    from conch.sandbox.standins import BASE_DESCRIPTION  # "Debian 13 trixie, Python 3.13": the base root's own

    print(f"conch: warning: {folder.name}: {env_dir / 'Dockerfile'} is missing ({why}); the task runs on the bare "
          f"base ({BASE_DESCRIPTION})", file=sys.stderr, flush=True)


def _version(file: Path, doc: dict) -> str | None:
    raw = doc.get("schema_version", doc.get("version"))
    if raw is None:
        return None
    version = str(raw)
    if version not in SUPPORTED_VERSIONS:
        raise FieldError(file, f"unsupported schema_version {raw!r} (supported: {', '.join(SUPPORTED_VERSIONS)})")
    return version


def _limits(file: Path, env: dict) -> Limits:
    default = Limits()
    cpus = positive_number(file, "[environment] cpus", env.get("cpus"), default.cpus)
    if "memory_mb" in env:
        memory = size_mb(file, "[environment] memory_mb", env["memory_mb"])
    elif "memory" in env:
        memory = size_mb(file, "[environment] memory", env["memory"])
    else:
        memory = default.memory_mb
    if "storage_mb" in env:
        storage = size_mb(file, "[environment] storage_mb", env["storage_mb"])
    elif "storage" in env:
        storage = size_mb(file, "[environment] storage", env["storage"])
    else:
        storage = default.storage_mb
    pids = int(positive_number(file, "[environment] pids", env.get("pids"), default.pids))
    for key in ("build_timeout_sec", "gpus"):  # no backend reads these yet; bounded all the same
        positive_number(file, f"[environment] {key}", env.get(key), 0.0)
    return Limits(cpus=cpus, memory_mb=memory, storage_mb=storage, pids=pids)


def _environment(folder: Path, doc: dict) -> tuple[Path | None, Path | None, Path | None]:
    """(build context, Dockerfile, compose file) of the task; each None when absent."""
    env_dir = folder / "environment"
    context_dir = dockerfile = compose_file = None
    if env_dir.exists():
        if not env_dir.is_dir():
            raise FieldError(env_dir, "environment must be a folder (the Docker build context)")
        context_dir = env_dir
        if (env_dir / "Dockerfile").is_file():
            dockerfile = env_dir / "Dockerfile"
        for name in ("docker-compose.yaml", "docker-compose.yml"):
            if (env_dir / name).is_file():
                compose_file = env_dir / name
                break

    if dockerfile is None and compose_file is None:
        _warn_bare_base(folder, env_dir, doc)

    return context_dir, dockerfile, compose_file


def _load(folder: Path) -> Task:
    toml_file = folder / MARKER
    try:
        doc = tomllib.loads(toml_file.read_text())
    except (OSError, UnicodeDecodeError) as exc:
        raise FieldError(toml_file, f"cannot read: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise FieldError(toml_file, f"invalid TOML: {exc}") from None
    _version(toml_file, doc)

    verifier = table(toml_file, "verifier", doc.get("verifier"))
    agent = table(toml_file, "agent", doc.get("agent"))
    environment = table(toml_file, "environment", doc.get("environment"))
    verifier_timeout = positive_number(
        toml_file, "[verifier] timeout_sec", verifier.get("timeout_sec"), DEFAULT_VERIFIER_TIMEOUT
    )
    agent_timeout = positive_number(toml_file, "[agent] timeout_sec", agent.get("timeout_sec"), DEFAULT_AGENT_TIMEOUT)
    limits = _limits(toml_file, environment)
    test_env = string_map(toml_file, "[verifier.env]", verifier.get("env"))
    env = string_map(toml_file, "[environment.env]", environment.get("env"))

    instruction = read_text(folder / "instruction.md", "instruction (instruction.md)")

    tests_dir = folder / "tests"
    test_script = tests_dir / "test.sh"
    if not tests_dir.is_dir():
        raise FieldError(tests_dir, "missing tests folder")
    if not test_script.is_file():
        raise FieldError(test_script, "missing verifier script tests/test.sh")
    check_verifier_installs(test_script, tests_dir)

    context_dir, dockerfile, compose_file = _environment(folder, doc)

    solution_dir = folder / "solution"
    solution_script = solution_dir / "solve.sh" if (solution_dir / "solve.sh").is_file() else None
    commands_file = solution_dir / "commands.json"
    solution_commands = commands_json(commands_file) if commands_file.is_file() else None

    return Task(
        name=folder.name,
        path=folder,
        fmt="harbor",
        instruction=instruction,
        tests_dir=tests_dir,
        test_script=test_script,
        context_dir=context_dir,
        dockerfile=dockerfile,
        compose_file=compose_file,
        solution_script=solution_script,
        solution_commands=solution_commands,
        agent_timeout_sec=agent_timeout,
        verifier_timeout_sec=verifier_timeout,
        limits=limits,
        test_env=test_env,
        metadata=doc,
        env=env,
    )
