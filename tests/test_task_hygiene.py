"""Task folders are hostile data: links out, `..` requirement paths, non-UTF-8 names and absurd numbers are
refused at load, by name, one task at a time (issue 33)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from collections import namedtuple
from pathlib import Path

import pytest

from conch.sandbox.base import SandboxError
from conch.tasks import fields
from conch.tasks.loader import load_task, load_tasks
from conch.tasks.model import Task, TaskLoadError
from conch.tasks.testdeps import pinned_requirements, prefetch, unsafe_requirements_file

REPO = Path(__file__).resolve().parents[1]

TOML = """\
version = "1.0"

[verifier]
timeout_sec = 120.0

[agent]
timeout_sec = 600

[environment]
build_timeout_sec = 600.0
cpus = 2
memory_mb = 2048
storage_mb = 10240
gpus = 0
"""

SENTINEL = "sentinel-pkg-from-the-host==6.6.6"


def make_task(root: Path, name: str = "t", toml: str = TOML, test_sh: str = "#!/bin/bash\ntrue\n") -> Path:
    d = root / name
    for sub in ("environment", "tests", "solution"):
        (d / sub).mkdir(parents=True)
    (d / "task.toml").write_text(toml)
    (d / "instruction.md").write_text("Do the thing.\n")
    (d / "environment" / "Dockerfile").write_text("FROM debian:bookworm\n")
    (d / "tests" / "test.sh").write_text(test_sh)
    (d / "tests" / "test_outputs.py").write_text("def test_a():\n    pass\n")
    (d / "solution" / "solve.sh").write_text("#!/bin/bash\ntrue\n")
    return d


def host_folder(root: Path) -> Path:
    """A folder outside every task, holding what a hostile task would like to read."""
    host = root / "host"
    host.mkdir(exist_ok=True)
    (host / "secret.txt").write_text(SENTINEL + "\n")
    (host / "Dockerfile").write_text("FROM debian:bookworm\n")
    (host / "test.sh").write_text("#!/bin/bash\ntrue\n")
    (host / "solve.sh").write_text("#!/bin/bash\ntrue\n")
    return host


def refused(task_dir: Path) -> TaskLoadError:
    got = load_task(task_dir)
    assert isinstance(got, TaskLoadError), f"loaded: {got}"
    line = str(got)
    assert "\n" not in line
    line.encode("utf-8")  # printable as it is
    return got


def test_a_plain_task_and_links_that_stay_inside_load(tmp_path):
    """The control: links inside the task folder stay allowed (passes before and after the checks)."""
    d = make_task(tmp_path / "tasks")
    (d / "environment" / "data").mkdir()
    (d / "environment" / "data" / "x.txt").write_text("x\n")
    os.symlink("data", d / "environment" / "data-link")  # a folder link inside
    os.symlink("../tests/test_outputs.py", d / "environment" / "copy.py")  # a file link to a sibling folder
    task = load_task(d)
    assert isinstance(task, Task), task
    assert (task.limits.cpus, task.limits.memory_mb, task.limits.storage_mb) == (2.0, 2048, 10240)


@pytest.mark.parametrize("sub", ["environment", "tests", "solution"])
def test_a_task_folder_that_is_a_link_out_is_refused(tmp_path, sub):
    host = host_folder(tmp_path)
    d = make_task(tmp_path / "tasks")
    for f in (d / sub).iterdir():
        f.unlink()
    (d / sub).rmdir()
    os.symlink(host, d / sub)
    err = refused(d)
    assert err.file == d.resolve() / sub
    assert str(err) == f"{d.resolve() / sub}: symlink to a path outside the task folder ({host})"


@pytest.mark.parametrize("rel,target", [
    ("environment/passwd", "/etc/passwd"),
    ("environment/Dockerfile", "{host}/Dockerfile"),
    ("tests/test.sh", "{host}/test.sh"),
    ("solution/solve.sh", "{host}/solve.sh"),
    ("instruction.md", "{host}/secret.txt"),
    ("environment/up", "../../../host/secret.txt"),  # relative, with `..`
    ("environment/dangling", "/nonexistent/x"),
])
def test_a_file_link_out_is_refused(tmp_path, rel, target):
    host = host_folder(tmp_path)
    d = make_task(tmp_path / "tasks")
    link = d / rel
    if link.exists():
        link.unlink()
    os.symlink(target.format(host=host), link)
    err = refused(d)
    assert err.file == d.resolve() / rel
    assert err.message.startswith("symlink to a path outside the task folder (")


def test_a_named_pipe_is_refused(tmp_path):
    d = make_task(tmp_path / "tasks")
    os.mkfifo(d / "tests" / "test_pipe.py")
    err = refused(d)
    assert err.file == d.resolve() / "tests" / "test_pipe.py"
    assert "named pipe" in err.message


@pytest.mark.parametrize("command,path", [
    ("pip install -r {path}", "/tests/../../../host/secret.txt"),
    ("uv pip install --system --requirement={path}", "/tests/../../../host/secret.txt"),
    ("uvx --with-requirements {path} pytest", "$TEST_DIR/../../../host/secret.txt"),
    ("uv run --with-requirements {path} pytest", "../x.txt"),
    ("pip install -r {path}", "/tests/{host}/secret.txt"),  # /tests/ + an absolute path
])
def test_test_time_requirements_out_of_the_tests_folder_are_refused_and_never_read(tmp_path, monkeypatch, command,
                                                                                 path):
    monkeypatch.setenv("CONCH_HOME", str(tmp_path / "home"))
    path = path.format(host=host_folder(tmp_path))
    script = f"#!/bin/bash\n{command.format(path=path)}\n"
    d = make_task(tmp_path / "tasks", test_sh=script)
    err = refused(d)
    assert err.file == d.resolve() / "tests" / "test.sh"
    assert err.message.startswith(f"requirements file {path!r} ") and SENTINEL not in str(err)
    # the points of use refuse it too, when called directly
    tests_dir = d / "tests"
    assert unsafe_requirements_file(path, tests_dir) is not None
    assert SENTINEL not in pinned_requirements(script, tests_dir)
    wheels, problem = prefetch(tests_dir / "test.sh", tests_dir)
    assert wheels is None and "requirements file" in problem and SENTINEL not in problem


def test_a_requirements_link_out_of_tests_is_never_read(tmp_path):
    host = host_folder(tmp_path)
    tests_dir = tmp_path / "tests"
    tests_dir.mkdir()
    os.symlink(host / "secret.txt", tests_dir / "requirements.txt")
    assert pinned_requirements("pip install -r /tests/requirements.txt\n", tests_dir) == []
    assert "outside the tests folder" in unsafe_requirements_file("/tests/requirements.txt", tests_dir)
    (tests_dir / "ok.txt").write_text("numpy==2.3.1\n")
    assert pinned_requirements("pip install -r /tests/ok.txt\n", tests_dir) == ["numpy==2.3.1"]


Case = namedtuple("Case", "table key value message")
HARBOR_FIELDS = [("verifier", "timeout_sec", "1e9"), ("agent", "timeout_sec", "86401"),
                 ("environment", "build_timeout_sec", "1e9"), ("environment", "cpus", "100000"),
                 ("environment", "memory", '"15T"'), ("environment", "memory_mb", "15728640"),
                 ("environment", "storage", '"15T"'), ("environment", "storage_mb", "15728640"),
                 ("environment", "pids", "1000000000"), ("environment", "gpus", "1000")]
BAD_VALUES = [("inf", "is not finite"), ("nan", "is not a number"), ("-inf", "must be"), ("-1", "must be"),
              ("0", "must be positive"), (None, "is over the")]
HARBOR_CASES = [Case(t, k, absurd if v is None else v, m)
                for t, k, absurd in HARBOR_FIELDS for v, m in BAD_VALUES if not (k == "gpus" and v == "0")]


def _toml_with(table: str, key: str, value: str) -> str:
    lines = [ln for ln in TOML.splitlines() if not ln.startswith(f"{key} =") and not ln.startswith(f"{key}_mb =")]
    at = lines.index(f"[{table}]") + 1
    return "\n".join(lines[:at] + [f"{key} = {value}"] + lines[at:]) + "\n"


@pytest.mark.parametrize("case", HARBOR_CASES, ids=lambda c: f"{c.table}.{c.key}={c.value}")
def test_harbor_numbers_out_of_bounds_are_refused_by_name(tmp_path, case):
    d = make_task(tmp_path, toml=_toml_with(case.table, case.key, case.value))
    err = refused(d)
    assert err.file == d.resolve() / "task.toml"
    parsed = tomllib.loads(f"x = {case.value}")["x"]
    shown = json.dumps(parsed) if isinstance(parsed, str) else repr(parsed)  # "15T", 1000000000.0, inf, -1
    assert err.message.startswith(f"[{case.table}] {case.key} = {shown} "), err.message
    assert case.message in err.message


@pytest.mark.parametrize("key,value,message", [
    ("cpus", "0.001", "[environment] cpus = 0.001 is under the 0.01 cpus minimum"),
    ("pids", "1.5", "[environment] pids = 1.5 must be a whole number"),
    ("gpus", "0.5", "[environment] gpus = 0.5 must be a whole number"),
    ("memory", '"0G"', '[environment] memory = "0G" must be positive'),
])
def test_numbers_that_no_box_can_use_are_refused_by_name(tmp_path, key, value, message):
    d = make_task(tmp_path, toml=_toml_with("environment", key, value))
    assert refused(d).message == message


def test_zero_gpus_and_sizes_as_strings_load(tmp_path):
    """The control: what real tasks write still loads (passes before and after the bounds)."""
    toml = _toml_with("environment", "memory", '"1.5GiB"').replace("storage_mb = 10240", 'storage = "10G"')
    task = load_task(make_task(tmp_path, toml=toml))
    assert isinstance(task, Task) and (task.limits.memory_mb, task.limits.storage_mb) == (1536, 10240)


def _disk_of(total: int):
    return lambda path: namedtuple("Usage", "total used free")(total, 0, 0)


def test_the_over_cap_message_names_field_and_bound(tmp_path, monkeypatch):
    monkeypatch.setattr(fields.shutil, "disk_usage", _disk_of(4 << 40))  # a 4 TiB disk: the fixed 1 TiB cap holds
    d = make_task(tmp_path, toml=_toml_with("environment", "storage_mb", "15728640"))
    assert str(refused(d)).endswith("task.toml: [environment] storage_mb = 15728640 is over the 1048576 MiB cap")
    d = make_task(tmp_path, "u", toml=_toml_with("verifier", "timeout_sec", "86401"))
    assert str(refused(d)).endswith("task.toml: [verifier] timeout_sec = 86401 is over the 86400 s cap")


def test_storage_is_capped_by_the_disk_holding_conch_home(tmp_path, monkeypatch):
    monkeypatch.setenv("CONCH_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(fields.shutil, "disk_usage", _disk_of(8 << 30))
    d = make_task(tmp_path, toml=_toml_with("environment", "storage_mb", "10240"))
    assert refused(d).message == ("[environment] storage_mb = 10240 is over the 8192 MiB cap (the size of the disk "
                                  "holding CONCH_HOME)")


TB1_CASES = [(key, value, message) for key in ("max_agent_timeout_sec", "max_test_timeout_sec")
             for value, message in ((".inf", "is not finite"), (".nan", "is not a number"), ("-5", "must be positive"),
                                    ("0", "must be positive"), ("1.0e+9", "is over the 86400 s cap"),
                                    ("9" * 400, "is over the 86400 s cap"))]


@pytest.mark.parametrize("key,value,message", TB1_CASES, ids=lambda x: str(x)[:12])
def test_tb1_numbers_out_of_bounds_are_refused_by_name(tmp_path, key, value, message):
    d = tmp_path / "t1"
    (d / "tests").mkdir(parents=True)
    (d / "task.yaml").write_text(f"instruction: Fix it.\n{key}: {value}\n")
    (d / "run-tests.sh").write_text("#!/bin/bash\npytest $TEST_DIR -rA\n")
    err = refused(d)
    assert err.file == d.resolve() / "task.yaml"
    assert err.message.startswith(f"{key} = ") and message in err.message, err.message


def test_a_file_name_that_is_not_utf8_is_refused_by_name(tmp_path):
    d = make_task(tmp_path / "tasks")
    with open(os.fsencode(d) + b"/environment/bad\xff.txt", "wb") as f:
        f.write(b"x")
    err = refused(d)
    assert str(err) == f"{d.resolve()}/environment/bad\\xff.txt: file name is not valid UTF-8"


def test_a_task_folder_name_that_is_not_utf8_is_refused_by_name(tmp_path):
    make_task(tmp_path / "tasks", "good")
    os.rename(tmp_path / "tasks" / "good", os.fsencode(tmp_path / "tasks") + b"/bad\xff")
    [err] = load_tasks([tmp_path / "tasks"])
    assert isinstance(err, TaskLoadError) and err.name == "bad\\xff"
    assert str(err) == f"{tmp_path / 'tasks'}/bad\\xff: task folder path is not valid UTF-8"


def _bad_tasks(root: Path) -> dict[str, str]:
    """Task folders below `root`, each broken one way; {name: what its error must say}."""
    make_task(root, "inf-memory", toml=_toml_with("environment", "memory", "inf"))
    make_task(root, "nan-cpus", toml=_toml_with("environment", "cpus", "nan"))
    make_task(root, "huge-storage", toml=_toml_with("environment", "storage", '"15T"'))
    d = make_task(root, "env-link")
    (d / "environment" / "Dockerfile").unlink()
    (d / "environment").rmdir()
    os.symlink(host_folder(root.parent), d / "environment")
    d = make_task(root, "bad-name")
    Path(os.fsdecode(os.fsencode(d) + b"/environment/bad\xff.txt")).write_bytes(b"x")
    return {"inf-memory": "[environment] memory = inf is not finite", "nan-cpus": "[environment] cpus = nan is not",
            "huge-storage": '[environment] storage = "15T" is over the',
            "env-link": "environment: symlink to a path outside the task folder",
            "bad-name": "environment/bad\\xff.txt: file name is not valid UTF-8"}


def test_a_batch_with_bad_tasks_loads_the_others(tmp_path):
    root = tmp_path / "tasks"
    expected = _bad_tasks(root)
    make_task(root, "good-a")
    make_task(root, "good-z")
    results = {r.name: r for r in load_tasks([root])}
    assert sorted(results) == sorted([*expected, "good-a", "good-z"])
    assert isinstance(results["good-a"], Task) and isinstance(results["good-z"], Task)
    for name, words in expected.items():
        assert isinstance(results[name], TaskLoadError) and words in str(results[name]), results[name]


def test_conch_check_reports_each_bad_task_and_exits_as_usual(tmp_path):
    root = tmp_path / "tasks"
    expected = _bad_tasks(root)
    env = {**os.environ, "CONCH_HOME": str(tmp_path / "home")}
    proc = subprocess.run([sys.executable, "-m", "conch", "check", str(root), "--no-nop", "--json"], cwd=REPO,
                          capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {r["task"]: r for r in json.loads(proc.stdout)}
    assert sorted(rows) == sorted(expected)
    for name, words in expected.items():
        assert rows[name]["error"].startswith("task did not load: ") and words in rows[name]["error"], rows[name]


def test_docker_tars_name_a_file_name_that_is_not_utf8(tmp_path):
    from conch.sandbox.docker_files import tar_for_upload
    from conch.sandbox.docker_images import _context_tar

    (tmp_path / "ctx").mkdir()
    Path(os.fsdecode(os.fsencode(tmp_path / "ctx") + b"/bad\xff.txt")).write_bytes(b"x")
    rel = os.fsdecode(b"bad\xff.txt")
    with pytest.raises(SandboxError, match=r"bad\\xff\.txt: file name is not valid UTF-8"):
        _context_tar(tmp_path / "ctx", [rel], "FROM scratch\n", b"")
    with pytest.raises(SandboxError, match=r"bad\\xff\.txt: file name is not valid UTF-8"):
        tar_for_upload(tmp_path / "ctx", "tests")
