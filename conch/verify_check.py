"""Cross-check a verifier's results against the tests the task defines: a count can never exceed the tests.

Why: the reward is a count of passing tests, so a forged record is an unbounded reward. conch knows the task's
tests without running them (`verify_parsers.static_test_ids`, by `ast`), so every record is checked against
that collection before it counts:

- a record listing the same test twice, more results than the task has tests, or a test the task does not
  define is *inconsistent*: the outcome is an error (`verifier result inconsistent with the task's tests`),
  marked tampered, never a count;
- the console is a second witness: the CTRF/JUnit record may not claim more passing tests than pytest's own
  final tally printed, and a tally may not exceed the "collected N items" of its run;
- when the static collection cannot be exact (a parametrize over computed values, `pytest_generate_tests`,
  inherited test classes, a custom `python_files` rule), only the checks that hold for any collection are
  made (duplicates, the console witness, the absolute cap `MAX_RESULTS`), so an honest task is never flagged.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

from conch.verify_parsers import (_HEADER, TestOutcome, _clean, _literal_len, is_test_file, parse_final_line,
                                  static_test_ids)

MAX_RESULTS = 100_000  # results in one record, whatever the task (a record past this is refused unparsed)
_INI_RULES = re.compile(r"^\s*(python_files|python_classes|python_functions|testpaths)\s*=", re.M)
_COLLECTED = re.compile(r"^collect(?:ed|ing) .*?(\d+) items?\b")
_PARAMS = re.compile(r"\[.*\]$")


@dataclass(frozen=True)
class StaticTests:
    """The task's tests as `ast` sees them. `exact`: pytest would collect exactly `ids`."""

    ids: tuple[str, ...]
    exact: bool

    @property
    def functions(self) -> set[str]:
        return {_PARAMS.sub("", i).split("::")[-1] for i in self.ids}


def static_tests(tests_dir: Path | None) -> StaticTests:
    ids = tuple(static_test_ids(tests_dir)) if tests_dir else ()
    return StaticTests(ids, bool(ids) and _exact(tests_dir))


def _exact(tests_dir: Path | None) -> bool:
    """False when the tests folder does something `ast` cannot count (see the module docstring)."""
    if tests_dir is None or not tests_dir.is_dir():
        return False
    for ini in ("pytest.ini", "tox.ini", "setup.cfg", "pyproject.toml"):
        try:
            if _INI_RULES.search((tests_dir / ini).read_text(errors="replace")):
                return False
        except OSError:
            continue
    for path in sorted(tests_dir.rglob("*.py")):
        try:
            tree = ast.parse(path.read_text(errors="replace"))
        except (OSError, SyntaxError, ValueError):
            return False
        if not _exact_module(tree, is_test_file(path)):
            return False
    return True


def _exact_module(tree: ast.Module, test_file: bool) -> bool:
    names = {n.targets[0].id: n.value for n in tree.body
             if isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name)}
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == "pytest_generate_tests":
            return False
        if isinstance(node, ast.Name) and node.id == "pytestmark" and isinstance(node.ctx, ast.Store):
            return False
        if test_file and isinstance(node, ast.ClassDef) and node.bases:
            return False  # inherited tests (unittest.TestCase, mixins): pytest collects what ast cannot see
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr == "parametrize":
                values = node.args[1] if len(node.args) >= 2 else next(
                    (k.value for k in node.keywords if k.arg == "argvalues"), None)
                if values is None or _literal_len(values, names) is None:
                    return False
            if node.func.attr == "fixture" and any(k.arg == "params" and _literal_len(k.value, names) is None
                                                   for k in node.keywords):
                return False
    return True


def _function(name: str) -> str:
    """The test function of a result name: node ids, JUnit `classname::name`, CTRF names alike."""
    return _PARAMS.sub("", name.strip()).split("::")[-1].split(".")[-1]


def console_witness(output: str) -> tuple[int | None, str | None]:
    """(passing tests summed over every pytest run's final tally or None, a problem with the tallies).

    Only pytest's own tally lines count, one per run: a run that printed its header ("test session starts")
    counts its *last* tally before the next header, because pytest prints its own after every test's output. A
    session header printed inside an open run (a program the tests ran, imitating pytest) is nested: from then
    on only the output's last tally counts, for the enclosing run. Without headers (-q), a tally inside a
    FAILURES / PASSES / captured-output section is something a test printed, unless it ends the output."""
    passed, seen, region = 0, False, "run"
    collected, pending, opened, nested = None, None, False, False

    def commit() -> str | None:
        nonlocal passed
        if pending is None:
            return None
        ran = pending["passed"] + pending["failed"] + pending["error"] + pending["skipped"]
        if collected is not None and ran > collected + pending["error"]:
            return f"pytest's tally ({ran} tests) exceeds the {collected} items it collected"
        passed += pending["passed"]
        return None

    for line in _clean(output):
        counts = parse_final_line(line)
        if counts is not None and (nested or opened):
            pending, seen = counts, True
            continue
        if nested:
            continue
        m = _COLLECTED.match(line.strip())
        if m and region == "run":
            collected = int(m.group(1))
            continue
        header = _HEADER.match(line)
        if counts is None:
            if header:
                title = header.group(1).strip()
                if title == "test session starts":
                    if opened and pending is None:
                        nested = True
                        continue
                    if problem := commit():
                        return None, problem
                    collected, pending, opened = None, None, True
                region = {"test session starts": "run", "short test summary info": "summary"}.get(title, "other")
            elif line.startswith("---") or line.startswith("___"):
                region = "other" if region != "run" or line.startswith("---") else region
            continue
        if region == "other" and (header is None or not _ends_run(output, line)):
            continue
        seen, pending = True, counts
        if problem := commit():
            return None, problem
        collected, pending, region = None, None, "run"
    if problem := commit():
        return None, problem
    return (passed if seen else None), None


def _ends_run(output: str, line: str) -> bool:
    """A tally line printed in a FAILURES/PASSES section is pytest's own only when it is the run's last
    (-rA off): nothing but another run may follow it."""
    rest = output[output.rfind(line) + len(line):]
    return not rest.strip() or "test session starts" in rest


def reconcile(tests: list[TestOutcome], n_passed: int, n_total: int, source: str, static: StaticTests,
              output: str) -> str | None:
    """None when the results could be the outcomes of the task's tests; else why they cannot."""
    if n_total > MAX_RESULTS:
        return f"{n_total} results, over the {MAX_RESULTS} a record may hold"
    names = [t.name for t in tests]
    if len(set(names)) < len(names):
        dup = next(n for i, n in enumerate(names) if n in names[:i])
        return f"test {dup!r} is reported more than once"
    if static.exact:
        if n_total > len(static.ids):
            return f"{n_total} results for the task's {len(static.ids)} tests"
        known = static.functions
        unknown = [n for n in names if _function(n) not in known and not n.endswith("::skipped[0]")]
        unknown = [n for n in unknown if "::skipped[" not in n]
        if unknown:
            return f"result for a test the task does not define: {unknown[0]!r}"
    witness, problem = console_witness(output)
    if problem:
        return problem
    if source in ("ctrf", "junit") and witness is not None and n_passed > witness:
        return f"the {source} record says {n_passed} passed, pytest's own tally {witness}"
    return None


# ---------------------------------------------------------------- where a test module's syntax error is

_SYNTAX = re.compile(r"^(SyntaxError|IndentationError|TabError)\b")
_FILE_LINE = re.compile(r'File "([^"]+)", line (\d+)')


def syntax_errors(tests_dir: Path | None, prefix: str = "tests") -> list[str]:
    """`tests/test_outputs.py:12: SyntaxError: invalid syntax` for each Python file below `tests_dir` that this
    Python cannot parse, the path relative to the task folder (`prefix`: the tests folder's own path in it)."""
    out: list[str] = []
    if tests_dir is None or not tests_dir.is_dir():
        return out
    for path in sorted(tests_dir.rglob("*.py")):
        rel = f"{prefix}/{path.relative_to(tests_dir).as_posix()}"
        try:
            ast.parse(path.read_bytes(), filename=rel)
        except SyntaxError as exc:
            out.append(f"{rel}:{exc.lineno}: {type(exc).__name__}: {exc.msg}")
        except (OSError, ValueError):
            continue
    return out


def locate_syntax_error(cause: str, output: str, tests_dir: Path | None, prefix: str = "tests",
                        remote: str = "/tests") -> str:
    """`cause`, pytest's `SyntaxError: invalid syntax`, with the file and line it is about: the location pytest
    printed above it (`File "/tests/test_outputs.py", line 4`, what the box's Python saw), else the first file
    of the task's tests that does not parse here; any other cause comes back unchanged."""
    if not _SYNTAX.match(cause):
        return cause
    lines = _clean(output)
    at = next((i for i in range(len(lines) - 1, -1, -1) if cause in lines[i]), None)
    for line in reversed(lines[max(0, at - 8):at] if at is not None else []):
        m = _FILE_LINE.search(line)
        if m:
            path = m.group(1)
            if path == remote or path.startswith(remote + "/"):
                path = prefix + path[len(remote):]
            return f"{path}:{m.group(2)}: {cause}"
    found = syntax_errors(tests_dir, prefix)
    return found[0] if found else cause
