"""The verifier on the real local sandbox: normal runs, and each verifier error case.

Every task here is a throwaway folder with its own tests/test.sh; the test files hold 3 test functions so a
verifier error must read 0/3 (static count), never 0/0.
"""

from __future__ import annotations

import asyncio
import shutil
import textwrap
from pathlib import Path

import pytest

from conch.harness import run_task
from conch.sandbox import make_sandbox
from conch.tasks.loader import load_task
from conch.tasks.model import Task
from conch.verify import VerifyResult, verify

TEST_FILE = textwrap.dedent(
    """
    import os
    from pathlib import Path

    def test_cwd_is_workdir():
        assert os.getcwd() == "/app"

    def test_marker():
        assert Path("/app/marker.txt").read_text().strip() == "ok"

    def test_always():
        assert True
    """
)


def _local_sandbox_missing() -> str | None:
    if shutil.which("bwrap") is None:
        return "bubblewrap (bwrap) is not installed"
    try:
        import conch.sandbox.local  # noqa: F401
    except ImportError as exc:
        return f"local sandbox backend not importable: {exc}"
    return None


pytestmark = pytest.mark.skipif(_local_sandbox_missing() is not None, reason=str(_local_sandbox_missing()))


def harbor_task(root: Path, test_sh: str, timeout: float = 60.0, test_file: str = TEST_FILE) -> Task:
    d = root / "t"
    (d / "environment").mkdir(parents=True)
    (d / "tests").mkdir()
    (d / "task.toml").write_text(f'version = "1.0"\n[verifier]\ntimeout_sec = {timeout}\n')
    (d / "instruction.md").write_text("Write ok to /app/marker.txt\n")
    (d / "environment" / "Dockerfile").write_text("FROM debian:bookworm\nWORKDIR /app\n")
    (d / "tests" / "test.sh").write_text(test_sh)
    (d / "tests" / "test_outputs.py").write_text(test_file)
    task = load_task(d)
    assert isinstance(task, Task), task
    return task


async def _verify(task: Task, setup: str | None = None) -> VerifyResult:
    sandbox = make_sandbox("local", task.sandbox_spec())
    await sandbox.start()
    try:
        if setup:
            r = await sandbox.exec(setup)
            assert r.exit_code == 0, r
        return await verify(sandbox, task)
    finally:
        await sandbox.stop()


PYTEST_SH = "pytest --ctrf /logs/verifier/ctrf.json /tests/test_outputs.py -rA\n"
TB2_SH = PYTEST_SH + "if [ $? -eq 0 ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi\n"


def test_partial_pass_with_reward(tmp_path):
    task = harbor_task(tmp_path, TB2_SH)
    r = asyncio.run(_verify(task))
    assert r.error is None, r.output_tail
    assert (r.n_passed, r.n_total, r.reward) == (2, 3, 0.0)
    assert r.source == "ctrf"
    assert {t.name.split("::")[-1]: t.status for t in r.tests}["test_marker"] == "failed"

    r = asyncio.run(_verify(task, setup="echo ok > /app/marker.txt"))
    assert (r.n_passed, r.n_total, r.reward, r.error) == (3, 3, 1.0, None)


def test_tests_without_reward_file(tmp_path):
    task = harbor_task(tmp_path, "pytest /tests/test_outputs.py -rA\n")
    r = asyncio.run(_verify(task))
    assert (r.n_passed, r.n_total, r.reward, r.error) == (2, 3, None, None)
    assert r.source == "pytest-summary"


def test_timeout_is_an_error(tmp_path):
    task = harbor_task(tmp_path, "sleep 30\necho 1 > /logs/verifier/reward.txt\n", timeout=1.5)
    r = asyncio.run(_verify(task))
    assert r.error and "timed out" in r.error
    assert (r.reward, r.n_passed, r.n_total) == (None, 0, 3)
    assert r.seconds < 20


def test_no_reward_no_results_is_an_error(tmp_path):
    task = harbor_task(tmp_path, "echo 'nothing to see'\n")
    r = asyncio.run(_verify(task))
    assert r.error and "no reward file and no test results" in r.error
    assert (r.reward, r.n_total) == (None, 3)


def test_bootstrap_crash_is_an_error(tmp_path):
    task = harbor_task(tmp_path, "set -e\n/opt/no-such-tool/bin/uvx pytest /tests\necho 1 > /logs/verifier/reward.txt\n")
    r = asyncio.run(_verify(task))
    assert r.error and "crashed before any test ran" in r.error and "exit 127" in r.error
    assert (r.reward, r.n_passed, r.n_total) == (None, 0, 3)


def test_reward_zero_without_results_is_an_error(tmp_path):
    """The TB2 test.sh pattern writes 0 when pytest cannot even start: that is no plain 0."""
    task = harbor_task(tmp_path, TB2_SH.replace("pytest --ctrf", "no-such-pytest --ctrf"))
    r = asyncio.run(_verify(task))
    assert r.error and "no test results" in r.error
    assert (r.reward, r.n_total) == (None, 3)


def test_bad_reward_file_is_an_error(tmp_path):
    task = harbor_task(tmp_path, PYTEST_SH + "echo pass > /logs/verifier/reward.txt\n")
    r = asyncio.run(_verify(task))
    assert r.error and "not a number" in r.error
    assert r.reward is None and r.n_total == 3


def test_run_task_reports_build_failure_with_static_count(tmp_path):
    task = harbor_task(tmp_path, TB2_SH)
    (task.path / "environment" / "Dockerfile").write_text("FROM debian:bookworm\nCOPY missing-file.txt /app/\n")
    result = asyncio.run(run_task(task, "nop", "local"))
    assert result.error and (result.n_passed, result.n_total, result.reward) == (0, 3, None)


def test_run_task_load_error_and_missing_solution(tmp_path):
    task = harbor_task(tmp_path, TB2_SH)
    result = asyncio.run(run_task(task, "oracle", "local"))  # no solution in this task
    assert result.error and "no solution" in result.error and result.n_total == 3
    (task.path / "instruction.md").unlink()
    broken = load_task(task.path)
    result = asyncio.run(run_task(broken, "oracle", "local"))
    assert result.error and "instruction.md" in result.error and result.n_total == 3
    out = result.to_json()
    assert set(out) == {"task", "n_passed", "n_total", "reward", "error", "fault", "tampered", "seconds"}
    assert out["fault"] == "infra" and out["tampered"] is None


def test_tb1_verifier_env_and_separate_script(tmp_path):
    d = tmp_path / "tb1"
    (d / "tests").mkdir(parents=True)
    (d / "task.yaml").write_text("instruction: x\nmax_test_timeout_sec: 60\n")
    (d / "Dockerfile").write_text("FROM debian:bookworm\nWORKDIR /app\n")
    (d / "run-tests.sh").write_text('test "$TEST_DIR" = /tests || exit 3\npytest "$TEST_DIR/test_outputs.py" -rA\n')
    (d / "tests" / "test_outputs.py").write_text(TEST_FILE)
    task = load_task(d)
    r = asyncio.run(_verify(task, setup="echo ok > /app/marker.txt"))
    assert (r.n_passed, r.n_total, r.reward, r.error) == (3, 3, None, None), r.output_tail


def test_environment_env_reaches_verifier(tmp_path):
    """[environment.env] is set for every command of the sandbox, [verifier.env] for the verifier only."""
    task = harbor_task(tmp_path, 'test "$GREETING-$LEVEL" = hi-strict && echo 1 > /logs/verifier/reward.txt\n')
    toml = task.path / "task.toml"
    toml.write_text(toml.read_text() + '[verifier.env]\nLEVEL = "strict"\n[environment.env]\nGREETING = "hi"\n')
    task = load_task(task.path)
    r = asyncio.run(_verify(task, setup='test "$GREETING" = hi && test -z "$LEVEL"'))
    assert (r.reward, r.error) == (1.0, None), r.output_tail
