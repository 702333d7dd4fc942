"""Result parsers (CTRF, JUnit, pytest console) and the static test count.

JUnit and console inputs come from real pytest runs of a small suite (5 plain + 3 parametrized cases, with
passes, failures, an error and a skip); CTRF input is the document shape pytest-json-ctrf 0.3.5 writes.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conch.verify import outcomes_from, read_reward
from conch.verify_parsers import (
    find_ctrf,
    find_junit,
    is_ctrf,
    parse_ctrf,
    parse_final_line,
    parse_junit,
    parse_pytest_console,
    static_test_count,
    static_test_ids,
    static_test_ids_in_source,
)

SUITE = textwrap.dedent(
    """
    import pytest

    @pytest.fixture
    def broken():
        raise RuntimeError("fixture setup fails")

    def test_ok():
        assert True

    def test_bad():
        assert 1 == 2

    def test_uses_broken(broken):
        pass

    @pytest.mark.skip(reason="not today")
    def test_skipped():
        pass

    @pytest.mark.parametrize("n", [1, 2, 3])
    def test_param(n):
        assert n != 2

    class TestGroup:
        def test_in_class(self):
            assert True
    """
)
# passed: test_ok, param[1], param[3], TestGroup::test_in_class = 4; failed: test_bad, param[2] = 2;
# error: test_uses_broken = 1; skipped: 1. Total 8.


@pytest.fixture(scope="module")
def suite_run(tmp_path_factory) -> tuple[str, Path]:
    root = tmp_path_factory.mktemp("suite")
    (root / "test_suite.py").write_text(SUITE)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-rA", "-p", "no:cacheprovider", f"--junitxml={root / 'junit.xml'}", str(root)],
        capture_output=True,
        text=True,
        cwd=root,
        timeout=60,
    )
    assert proc.returncode == 1, proc.stdout[-2000:]
    return proc.stdout + proc.stderr, root


def _tally(tests) -> dict[str, int]:
    out: dict[str, int] = {}
    for t in tests:
        out[t.status] = out.get(t.status, 0) + 1
    return out


EXPECTED = {"passed": 4, "failed": 2, "error": 1, "skipped": 1}


def test_rA_summary_gives_each_case(suite_run):
    output, _ = suite_run
    console = parse_pytest_console(output)
    assert _tally(console.tests) == EXPECTED
    names = {t.name for t in console.tests}
    assert any(n.endswith("test_param[2]") for n in names)
    assert any(n.endswith("TestGroup::test_in_class") for n in names)
    assert console.collection_errors == []


def test_final_counts_line(suite_run):
    output, _ = suite_run
    assert parse_final_line(output) == EXPECTED
    assert parse_final_line("==== 5 passed, 2 warnings in 0.03s ====") == {"passed": 5, "failed": 0, "skipped": 0, "error": 0}
    assert parse_final_line("3 failed, 1 passed, 2 errors, 1 xfailed in 1.20s") == {
        "passed": 1, "failed": 3, "error": 2, "skipped": 1
    }
    assert parse_final_line("no output at all") is None


def test_counts_only_output_is_used_when_no_summary_lines(tmp_path):
    output = "collected 6 items\n\n../tests/test_outputs.py ..F.F.\n\n===== 2 failed, 4 passed in 0.31s =====\n"
    tests, n_passed, n_total, source = outcomes_from(tmp_path, output, [])
    assert (n_passed, n_total, source) == (4, 6, "pytest-counts")


def test_verbose_lines(tmp_path):
    output = textwrap.dedent(
        """
        ../tests/test_outputs.py::test_a PASSED                                  [ 33%]
        ../tests/test_outputs.py::test_b[x] FAILED                               [ 66%]
        ../tests/test_outputs.py::test_b[y] PASSED                               [100%]
        """
    )
    console = parse_pytest_console(output)
    assert _tally(console.tests) == {"passed": 2, "failed": 1}


def test_junit_from_real_pytest(suite_run):
    _, root = suite_run
    tests = parse_junit((root / "junit.xml").read_text())
    assert _tally(tests) == EXPECTED
    assert find_junit(root) == tests
    assert parse_junit("<html><body/></html>") is None
    assert parse_junit("not xml") is None


CTRF_DOC = {
    "results": {
        "tool": {"name": "pytest", "version": "8.4.1"},
        "summary": {"tests": 4, "passed": 2, "failed": 1, "skipped": 1, "pending": 0, "other": 0},
        "tests": [
            {"name": "test_outputs.py::test_a", "status": "passed", "duration": 0.01},
            {"name": "test_outputs.py::test_b", "status": "failed", "duration": 0.02, "message": "boom"},
            {"name": "test_outputs.py::test_c", "status": "skipped", "duration": 0.0},
            {"name": "test_outputs.py::test_d", "status": "passed", "duration": 0.0},
        ],
    }
}


def test_ctrf(tmp_path):
    import json

    assert is_ctrf(CTRF_DOC) and not is_ctrf({"results": {}}) and not is_ctrf([1, 2])
    assert _tally(parse_ctrf(CTRF_DOC)) == {"passed": 2, "failed": 1, "skipped": 1}
    (tmp_path / "other.json").write_text('{"not": "ctrf"}')
    assert find_ctrf(tmp_path) is None
    (tmp_path / "ctrf.json").write_text(json.dumps(CTRF_DOC))
    tests, n_passed, n_total, source = outcomes_from(tmp_path, "", [])
    assert (n_passed, n_total, source) == (2, 4, "ctrf")


def test_console_wins_over_collapsed_ctrf(tmp_path):
    """pytest-json-ctrf merges parametrized cases; the -rA lines keep one per case."""
    import json

    doc = {"results": {"tests": [{"name": "t.py::test_p", "status": "failed"}, {"name": "t.py::test_q", "status": "passed"}]}}
    (tmp_path / "ctrf.json").write_text(json.dumps(doc))
    output = "PASSED t.py::test_p[1]\nFAILED t.py::test_p[2] - assert\nPASSED t.py::test_p[3]\nPASSED t.py::test_q\n"
    tests, n_passed, n_total, source = outcomes_from(tmp_path, output, [])
    assert (n_passed, n_total, source) == (3, 4, "pytest-summary")


def test_collection_error_counts_every_static_test(tmp_path):
    ids = ["test_outputs.py::test_a", "test_outputs.py::test_b", "test_other.py::test_c"]
    output = "ERROR ../tests/test_outputs.py - ModuleNotFoundError: No module named 'solution'\n=== 1 error in 0.1s ===\n"
    tests, n_passed, n_total, source = outcomes_from(tmp_path, output, ids)
    assert (n_passed, n_total) == (0, 2)
    assert {t.status for t in tests} == {"error"}


def test_rewards(tmp_path):
    assert read_reward(tmp_path) == (None, None)
    (tmp_path / "reward.json").write_text('{"reward": 0.5, "other": 2}')
    assert read_reward(tmp_path) == (0.5, None)
    (tmp_path / "reward.json").write_text('{"accuracy": 0.25}')
    assert read_reward(tmp_path) == (0.25, None)
    (tmp_path / "reward.json").write_text('{"a": 1, "b": 2}')
    assert read_reward(tmp_path)[1] is not None
    (tmp_path / "reward.txt").write_text("1\n")
    assert read_reward(tmp_path) == (1.0, None)
    (tmp_path / "reward.txt").write_text("yes")
    value, problem = read_reward(tmp_path)
    assert value is None and "not a number" in problem


STATIC_SOURCE = textwrap.dedent(
    """
    import pytest

    CASES = [1, 2]

    def helper():
        pass

    def test_one():
        pass

    async def test_async():
        pass

    @pytest.mark.parametrize("a", [1, 2, 3])
    @pytest.mark.parametrize("b", ("x", "y"))
    def test_grid(a, b):
        pass

    @pytest.mark.parametrize(argnames="v", argvalues=[pytest.param(1), pytest.param(2)])
    def test_kw(v):
        pass

    @pytest.mark.parametrize("v", CASES)
    def test_named_literal(v):
        pass

    @pytest.mark.parametrize("v", list(range(4)))
    def test_not_literal(v):
        pass

    @pytest.mark.parametrize("k", [1, 2])
    class TestThings:
        def test_m(self, k):
            pass

        def helper(self):
            pass

    class Helper:
        def test_ignored(self):
            pass

    def not_a_test():
        def test_nested():
            pass
    """
)


def test_static_count_source():
    ids = static_test_ids_in_source(STATIC_SOURCE, "test_x.py")
    # one + async + 3*2 grid + 2 kw + 2 (CASES) + 4 (list(range(4))) + 2 class-parametrized
    assert len(ids) == 1 + 1 + 6 + 2 + 2 + 4 + 2
    assert "test_x.py::test_one" in ids and "test_x.py::TestThings::test_m[1]" in ids
    assert static_test_ids_in_source("def test_(:\n", "broken.py") == []


def test_static_count_folder(tmp_path):
    (tmp_path / "test_a.py").write_text(STATIC_SOURCE)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b_test.py").write_text("def test_b():\n    pass\n")
    (tmp_path / "helpers.py").write_text("def test_not_collected():\n    pass\n")
    assert static_test_count(tmp_path) == 18 + 1
    assert "sub/b_test.py::test_b" in static_test_ids(tmp_path)
    assert static_test_count(tmp_path / "missing") == 0


def test_static_count_matches_pytest_collection(tmp_path):
    source = STATIC_SOURCE.replace("async def test_async", "def test_async").replace("list(range(4))", "[0]")
    (tmp_path / "test_s.py").write_text(source)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    collected = [line for line in proc.stdout.splitlines() if "::" in line]
    assert len(collected) == static_test_count(tmp_path)


def test_a_syntax_error_in_a_test_file_is_a_collection_failure(tmp_path):
    (tmp_path / "test_broken.py").write_text("def test_x(:\n    pass\n")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-rA", "-p", "no:cacheprovider", str(tmp_path)],
                          capture_output=True, text=True)
    from conch.verify_parsers import collection_failed

    assert proc.returncode != 0 and collection_failed(proc.stdout + proc.stderr)
    assert not collection_failed("1 passed in 0.1s")
