"""`conch check` end to end: the real CLI on examples/tasks with the real local sandbox.

Expected counts are per task and exact: the oracle passes every test, nop only the tests that check inputs
were left alone (a task nop passes fully would be vacuous).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples" / "tasks"

ORACLE = {
    "fix-inventory": (5, 5, 1.0),
    "log-levels": (5, 5, 1.0),
    "merge-config": (5, 5, None),  # TB1: no reward file, reward stays None
    "port-conflicts": (5, 5, 1.0),  # exact TB 2.1 layout, the standard `uvx -p 3.13` verifier
    "rotate-backups": (4, 4, None),
    "word-count": (5, 5, 1.0),
}
NOP = {
    "fix-inventory": (1, 5, 0.0),
    "log-levels": (0, 5, 0.0),
    "merge-config": (1, 5, None),
    "port-conflicts": (1, 5, 0.0),
    "rotate-backups": (1, 4, None),
    "word-count": (1, 5, 0.0),
}


def _local_sandbox_missing() -> str | None:
    if shutil.which("bwrap") is None:
        return "bubblewrap (bwrap) is not installed"
    try:
        import conch.sandbox.local  # noqa: F401
    except ImportError as exc:
        return f"local sandbox backend not importable: {exc}"
    return None


def conch(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "conch", *args], capture_output=True, text=True, cwd=REPO, timeout=timeout
    )


@pytest.mark.skipif(_local_sandbox_missing() is not None, reason=str(_local_sandbox_missing()))
@pytest.mark.parametrize("agent,expected", [("oracle", ORACLE), ("nop", NOP)])
def test_check_examples(agent, expected):
    proc = conch("check", str(EXAMPLES), "--agent", agent, "--json", "--jobs", "2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout)
    assert [r["task"] for r in results] == sorted(expected)
    for r in results:
        assert set(r) == {"task", "n_passed", "n_total", "reward", "error", "fault", "tampered", "seconds", "resolved",
                          "nop_passed"}
        assert r["resolved"] == (r["n_passed"] == r["n_total"])
        assert r["nop_passed"] == NOP[r["task"]][0]  # measured once per task (or this run's own nop count)
        assert r["error"] is None, (r["task"], r["error"])
        assert (r["n_passed"], r["n_total"], r["reward"]) == expected[r["task"]], r
        assert r["seconds"] > 0
    progress = [line for line in proc.stderr.splitlines() if line.startswith("[")]
    assert len(progress) == len(expected) and progress[-1].startswith(f"[{len(expected)}/{len(expected)}]")


@pytest.mark.skipif(_local_sandbox_missing() is not None, reason=str(_local_sandbox_missing()))
def test_check_table_output():
    proc = conch("check", str(EXAMPLES / "rotate-backups"), "--agent", "oracle")
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert lines[0].split()[:6] == ["TASK", "TESTS", "RESOLVED", "REWARD", "NOP", "SECONDS"]
    assert lines[1].split()[:5] == ["rotate-backups", "4/4", "yes", "-", "1"]
    assert lines[-1].startswith("1 tasks: 1 fully passed, 0 errors (0 infra, 0 agent-caused, 0 tampered); tests 4/4 passed")


def test_usage_errors(tmp_path):
    proc = conch("check", str(tmp_path / "does-not-exist"))
    assert proc.returncode == 2 and "no such path" in proc.stderr
    proc = conch("check", str(tmp_path))
    assert proc.returncode == 2 and "no tasks found" in proc.stderr
    proc = conch("check", str(EXAMPLES), "--agent", "claude")
    assert proc.returncode == 2 and "invalid choice" in proc.stderr
    proc = conch("check", str(EXAMPLES), "--jobs", "0")
    assert proc.returncode == 2
