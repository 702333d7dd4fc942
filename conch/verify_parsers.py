"""Turn what a verifier leaves behind into per-test outcomes, and count tests without running them.

Why several parsers: Terminal-Bench 2.x test scripts write a CTRF report (`pytest --ctrf`), other suites write
JUnit XML, Terminal-Bench 1 only leaves pytest's console output (`-rA` short summary), and a crashed or
truncated run may leave nothing but the final "N passed, M failed" line. We take the richest source present,
in that order, so a partial solution shows as e.g. 3/5 instead of a bare 0.

Why a static count: when the verifier crashes before pytest runs (missing interpreter, broken test.sh) no
report exists, yet the score must read 0/N rather than 0/0 so a crash never looks like an empty, vacuously
passed task. `static_test_ids` reads the test files with `ast` (never imports them).

Status vocabulary is fixed: passed, failed, skipped, error. Each parametrized case is one test.
"""

from __future__ import annotations

import ast
import json
import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

from conch.sandbox.readback import REPORT_CAP, ReadBackError, read_text, walk_regular

STATUSES = ("passed", "failed", "skipped", "error")


@dataclass(frozen=True)
class TestOutcome:
    """One test (one parametrized case) and how it ended."""

    __test__ = False  # not a pytest test class, despite the name

    name: str
    status: str


# ---------------------------------------------------------------- CTRF

_CTRF_STATUS = {"passed": "passed", "failed": "failed", "skipped": "skipped", "pending": "skipped", "other": "error"}


def is_ctrf(doc: object) -> bool:
    """True when `doc` (parsed JSON) has the CTRF shape: {"results": {"tests": [...]}}."""
    return (
        isinstance(doc, dict)
        and isinstance(doc.get("results"), dict)
        and isinstance(doc["results"].get("tests"), list)
    )


def parse_ctrf(doc: dict) -> list[TestOutcome]:
    """Outcomes of a CTRF report (https://ctrf.io). Unknown statuses count as errors."""
    out = []
    for i, test in enumerate(doc["results"]["tests"]):
        if not isinstance(test, dict):
            continue
        name = str(test.get("name") or f"test_{i}")
        status = _CTRF_STATUS.get(str(test.get("status", "")).lower(), "error")
        out.append(TestOutcome(name, status))
    return out


def _results(folder: Path, suffix: str) -> list[str]:
    """Regular files (links never followed) below a folder copied out of a sandbox, by suffix."""
    if not folder.is_dir() or folder.is_symlink():
        return []
    try:
        return [rel for rel in walk_regular(folder) if rel.endswith(suffix)]
    except ReadBackError:
        return []


_NAMED_REPORT = re.compile(r"--(ctrf|junitxml|junit-xml)(?:=|\s+)[\"']?/logs/verifier/([^\s\"';|&)]+)")


def named_reports(script: str) -> dict[str, list[str]]:
    """The result records a test script names (`--ctrf /logs/verifier/ctrf.json`, `--junitxml=...`), as paths
    relative to /logs/verifier, by kind ("ctrf", "junit"). When a script names its record, that file is the
    record: another one beside it (written by a program the tests ran) is not read."""
    found: dict[str, list[str]] = {}
    for kind, rel in _NAMED_REPORT.findall(script):
        if ".." not in rel.split("/") and "$" not in rel:
            found.setdefault("ctrf" if kind == "ctrf" else "junit", []).append(rel)
    return found


def _candidates(folder: Path, suffix: str, only: list[str] | None) -> list[str]:
    return [rel for rel in _results(folder, suffix) if not only or rel in only]


def find_ctrf(folder: Path, only: list[str] | None = None) -> list[TestOutcome] | None:
    """Outcomes from the first CTRF-shaped *.json below `folder` (sorted by path; only the paths in `only` when
    given), or None if there is none."""
    for rel in _candidates(folder, ".json", only):
        try:
            doc = json.loads(read_text(folder, rel, REPORT_CAP))
        except (OSError, ValueError, ReadBackError):  # a link, a special file, over the cap: not a report
            continue
        if is_ctrf(doc):
            return parse_ctrf(doc)
    return None


# ---------------------------------------------------------------- JUnit XML


def parse_junit(text: str) -> list[TestOutcome] | None:
    """Outcomes of a JUnit XML report (<testsuites>/<testsuite>/<testcase>), or None if it is not one."""
    try:
        root = ET.fromstring(text)
    except ET.ParseError:
        return None
    if root.tag not in ("testsuites", "testsuite"):
        return None
    out = []
    for case in root.iter("testcase"):
        cls, name = case.get("classname", ""), case.get("name", "")
        full = f"{cls}::{name}" if cls else name
        tags = {child.tag for child in case}
        if "error" in tags:
            status = "error"
        elif "failure" in tags:
            status = "failed"
        elif "skipped" in tags:
            status = "skipped"
        else:
            status = "passed"
        out.append(TestOutcome(full, status))
    return out


def find_junit(folder: Path, only: list[str] | None = None) -> list[TestOutcome] | None:
    """Outcomes from the first JUnit *.xml below `folder` that holds test cases (only the paths in `only` when
    given), or None."""
    for rel in _candidates(folder, ".xml", only):
        try:
            outcomes = parse_junit(read_text(folder, rel, REPORT_CAP))
        except (OSError, ValueError, ReadBackError):
            continue
        if outcomes:
            return outcomes
    return None


def report_problems(folder: Path) -> list[str]:
    """One line per result report below `folder` that was ignored: a *.json or *.xml file that is unreadable
    (a link, over its cap) or does not parse, so a malformed CTRF/JUnit file is reported, not silently lost."""
    problems = []
    for rel in _results(folder, ".json") + _results(folder, ".xml"):
        try:
            text = read_text(folder, rel, REPORT_CAP)
        except (OSError, ReadBackError) as exc:
            problems.append(f"{rel}: {exc}")
            continue
        try:
            json.loads(text) if rel.endswith(".json") else ET.fromstring(text)
        except (ValueError, ET.ParseError) as exc:
            kind = "JSON" if rel.endswith(".json") else "XML"
            problems.append(f"{rel}: not valid {kind} ({str(exc)[:80]}); ignored")
    for rel in _links_and_specials(folder):
        problems.append(f"{rel}: not a regular file (a link or a special file); ignored")
    return problems


def _links_and_specials(folder: Path) -> list[str]:
    out = []
    if folder.is_dir() and not folder.is_symlink():
        for path in folder.rglob("*"):
            if path.suffix in (".json", ".xml") and (path.is_symlink() or not (path.is_file() or path.is_dir())):
                out.append(path.relative_to(folder).as_posix())
    return sorted(out)[:20]


# ---------------------------------------------------------------- pytest console output

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# `-rA` short test summary: "PASSED tests/t.py::test_a", "FAILED t.py::test_b[1-2] - AssertionError: ..."
_SUMMARY_LINE = re.compile(r"^(PASSED|FAILED|ERROR|XFAIL|XPASS)\s+(\S+?)(?:\s+-\s+.*)?$")
# skipped tests are summarized per location: "SKIPPED [2] tests/t.py:12: reason"
_SKIPPED_LINE = re.compile(r"^SKIPPED\s+\[(\d+)\]\s+(\S+?):")
# `-v` progress lines: "tests/t.py::test_a PASSED   [ 20%]"
_VERBOSE_LINE = re.compile(r"^(\S+::\S+)\s+(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\b")
# final tally, "=== 3 passed, 1 failed, 2 warnings in 0.21s ===" (or without the "=" in -q mode)
_FINAL_LINE = re.compile(r"^=*\s*((?:\d+ \w+|no tests ran)(?:, \d+ \w+)*) in \d+(?:\.\d+)?s\b")
_COUNT = re.compile(r"(\d+) (passed|failed|errors?|skipped|xfailed|xpassed)")
_WORD_STATUS = {
    "PASSED": "passed",
    "XPASS": "passed",
    "FAILED": "failed",
    "ERROR": "error",
    "SKIPPED": "skipped",
    "XFAIL": "skipped",
}


@dataclass(frozen=True)
class PytestConsole:
    """What pytest's console output says.

    `tests`: named outcomes from `-rA` summary or `-v` lines (collection errors are in `collection_errors`,
    keyed by file, not here). `counts`: the final line's tally by status, or None when no final line was seen.
    """

    tests: list[TestOutcome]
    counts: dict[str, int] | None
    collection_errors: list[str]


def _clean(text: str) -> list[str]:
    return [_ANSI.sub("", line).rstrip() for line in text.splitlines()]


def parse_final_line(text: str) -> dict[str, int] | None:
    """The tally of pytest's last "=== 3 passed, 1 failed in 0.2s ===" line, or None."""
    counts = None
    for line in _clean(text):
        m = _FINAL_LINE.match(line)
        if not m:
            continue
        counts = dict.fromkeys(STATUSES, 0)
        for n, word in _COUNT.findall(m.group(1)):
            status = {"errors": "error", "xfailed": "skipped", "xpassed": "passed"}.get(word, word)
            counts[status] += int(n)
    return counts


_HEADER = re.compile(r"^=+ (.+?) =+$")


def parse_pytest_console(text: str) -> PytestConsole:
    """Named outcomes and the final tally from pytest output. Later lines win for a repeated name.

    Only pytest's own lines are read: `-rA` lines inside a "short test summary info" section, `-v` lines in the
    run's progress section. What a test printed (shown in the FAILURES / PASSES sections) is never a result."""
    named: dict[str, str] = {}
    skipped_anon: list[TestOutcome] = []
    collection_errors: list[str] = []
    verbose: dict[str, str] = {}
    region = "run"
    lines = _clean(text)
    # without a summary section (no -rA), summary-shaped lines count only outside captured-output sections
    summary_regions = ("summary",) if any(_HEADER.match(x) and "short test summary info" in x for x in lines) \
        else ("summary", "run")
    for line in lines:
        header = _HEADER.match(line)
        if header:
            title = header.group(1).strip()
            region = {"test session starts": "run", "short test summary info": "summary"}.get(title, "other")
            if _FINAL_LINE.match(line):
                region = "run"  # a tally ends a run; another may follow
            continue
        if region in summary_regions:
            m = _SUMMARY_LINE.match(line)
            if m:
                word, node = m.groups()
                if word == "ERROR" and "::" not in node:
                    collection_errors.append(node)  # "ERROR tests/t.py - ImportError": the module failed to import
                else:
                    named[node] = _WORD_STATUS[word]
                continue
            m = _SKIPPED_LINE.match(line)
            if m:
                n, where = int(m.group(1)), m.group(2)
                skipped_anon.extend(TestOutcome(f"{where}::skipped[{len(skipped_anon) + k}]", "skipped")
                                    for k in range(n))
                continue
        if region == "run":
            m = _VERBOSE_LINE.match(line)
            if m:
                verbose[m.group(1)] = _WORD_STATUS[m.group(2)]
    if named or skipped_anon:
        tests = [TestOutcome(k, v) for k, v in named.items()] + skipped_anon
    else:
        tests = [TestOutcome(k, v) for k, v in verbose.items()]
    return PytestConsole(tests=tests, counts=parse_final_line(text), collection_errors=collection_errors)


# ---------------------------------------------------------------- why a verifier could not run

# Lines that report what went wrong but are not the cause: offline, a test script's `apt-get update` and
# `curl ... | sh` (installing uv, which the sandbox already has) always fail first.
_NOISE = re.compile(
    r"curl: \(\d+\)|Could not resolve host|Temporary failure (in name )?resolution|^(W|Err|Ign):|"
    r"^E: (Unable to locate|Failed to fetch|Some index files)|apt-get update|Reading package lists|"
    r"Building dependency tree|Reading state information|/\.local/bin/env: No such file"
)
# (kind, pattern) in priority order: the first kind with a matching line is the cause.
_CAUSES: tuple[tuple[str, re.Pattern], ...] = (
    ("missing interpreter", re.compile(
        r"No (interpreter|Python) (found|installation)|[Rr]equested Python version .* not (found|installed)|"
        r"Python downloads are not allowed|Invalid version request|python3?(\.\d+)?: (command )?not found")),
    ("test collection failed", re.compile(r"^E\s+(\w+(Error|Exception)|ModuleNotFoundError)\b.*")),
    ("test collection failed", re.compile(r"^(ERROR collecting .*|ImportError while importing test module.*|"
                                          r"Interrupted: \d+ errors? during collection.*)")),
    ("dependency unavailable offline", re.compile(r"Because .* (was|were) not found|not found in the "
                                                  r"(package registry|provided package locations)")),
    ("dependency unavailable offline", re.compile(
        r"No solution found when resolving|Failed to (fetch|download)|"
        r"Could not find a version that satisfies|No matching distribution found|"
        r"Network connectivity is disabled|offline mode")),
    ("module not found", re.compile(r"(ModuleNotFoundError|ImportError): .*|No module named .*")),
    ("command not found", re.compile(r"(\S+: )+command not found|^\S+: not found$|No such file or directory.*"
                                     r"(pytest|uvx?|python3?)\b")),
    ("verifier tool failed", re.compile(r"^(error|ERROR): .*|^\s*[×x] .*|^INTERNALERROR.*|"
                                        r"^ERROR: file or directory not found.*")),
)


def verifier_failure_cause(text: str) -> tuple[str, str] | None:
    """(kind, decisive line) when the output shows that the verifier itself could not run its tests (an
    interpreter, module or dependency missing, a test module that does not import, a tool that failed), else
    None. Known offline noise (apt, curl) is skipped so it never hides the real cause."""
    lines = [line.strip() for line in _clean(text) if line.strip() and not _NOISE.search(line)]
    for kind, rx in _CAUSES:
        for line in lines:
            if rx.search(line):
                return kind, re.sub(r"^(E\s+|[×╰─▶\s]+)", "", line)[:300]
    return None


def collection_failed(text: str) -> bool:
    """True when pytest reports that a test module could not be collected (import error and the like)."""
    for line in _clean(text):
        if re.match(r"^(ERROR collecting |ImportError while importing test module|"
                    r"Interrupted: \d+ errors? during collection)", line.strip("=!_ ")):
            return True
    return False


# ---------------------------------------------------------------- static count


_SAME_LEN_CALLS = ("sorted", "list", "tuple", "reversed", "enumerate")


def _literal_len(node: ast.expr | None, names: dict[str, ast.expr], depth: int = 0) -> int | None:
    """How many cases a parametrize argument literally holds: a list/tuple/set/dict literal, a module-level
    name bound to one, `sorted(...)`/`list(...)`/`d.items()` of one, `range(...)` of constants, a
    comprehension over one, or a `+`/`*` of those. None when it cannot be known without running code."""
    if node is None or depth > 8:
        return None
    again = lambda n: _literal_len(n, names, depth + 1)  # noqa: E731
    if isinstance(node, ast.Name):  # CASES = [...] at module level
        return again(names[node.id]) if node.id in names else None
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        return None if any(isinstance(e, ast.Starred) for e in node.elts) else len(node.elts)
    if isinstance(node, ast.Dict):
        return None if any(k is None for k in node.keys) else len(node.keys)
    if isinstance(node, (ast.ListComp, ast.GeneratorExp, ast.SetComp)) and len(node.generators) == 1:
        gen = node.generators[0]
        return None if gen.ifs else again(gen.iter)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = again(node.left), again(node.right)
        return left + right if left is not None and right is not None else None
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
        for seq, k in ((node.left, node.right), (node.right, node.left)):
            if isinstance(k, ast.Constant) and isinstance(k.value, int) and (n := again(seq)) is not None:
                return n * k.value
        return None
    if isinstance(node, ast.Call):
        func = node.func
        if isinstance(func, ast.Name) and func.id in _SAME_LEN_CALLS and len(node.args) == 1:
            return again(node.args[0])
        if isinstance(func, ast.Name) and func.id == "range" and 1 <= len(node.args) <= 3:
            if all(isinstance(a, ast.Constant) and isinstance(a.value, int) for a in node.args):
                return len(range(*(a.value for a in node.args)))  # type: ignore[misc]
        if isinstance(func, ast.Attribute) and func.attr in ("items", "keys", "values") and not node.args:
            return again(func.value)
    return None


def _parametrize_cases(decorators: list[ast.expr], names: dict[str, ast.expr]) -> int:
    """Product of the case counts of `@pytest.mark.parametrize(...)` decorators (1 when not literal)."""
    total = 1
    for dec in decorators:
        if not isinstance(dec, ast.Call):
            continue
        func = dec.func
        if not (isinstance(func, ast.Attribute) and func.attr == "parametrize"):
            continue
        values = dec.args[1] if len(dec.args) >= 2 else None
        for kw in dec.keywords:
            if kw.arg == "argvalues":
                values = kw.value
        n = _literal_len(values, names) if values is not None else None
        if n is not None:
            total *= n
    return total


def _fixture_params(tree: ast.Module, names: dict[str, ast.expr]) -> dict[str, int]:
    """Module-level `@pytest.fixture(params=[...])` fixtures and how many cases each gives a test using it."""
    out: dict[str, int] = {}
    for node in tree.body:
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for dec in node.decorator_list:
            if isinstance(dec, ast.Call) and isinstance(dec.func, (ast.Attribute, ast.Name)) and \
                    getattr(dec.func, "attr", getattr(dec.func, "id", "")) == "fixture":
                for kw in dec.keywords:
                    if kw.arg == "params" and (n := _literal_len(kw.value, names)):
                        out[node.name] = n
    return out


def _function_ids(prefix: str, fn: ast.FunctionDef | ast.AsyncFunctionDef, extra: int,
                  names: dict[str, ast.expr], fixtures: dict[str, int]) -> list[str]:
    n = _parametrize_cases(fn.decorator_list, names) * extra
    for arg in fn.args.args:
        n *= fixtures.get(arg.arg, 1)
    base = f"{prefix}::{fn.name}"
    return [base] if n == 1 else [f"{base}[{i}]" for i in range(n)]


def static_test_ids_in_source(source: str, filename: str = "test.py") -> list[str]:
    """Test ids pytest would collect from one file by default rules (parametrized cases numbered, not named;
    cases of `parametrize` and of parametrized module fixtures included)."""
    try:
        tree = ast.parse(source, filename=filename)
    except SyntaxError:
        return []
    names: dict[str, ast.expr] = {}  # module-level NAME = <literal>, for parametrize(..., NAME)
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            names[node.targets[0].id] = node.value
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            names[node.target.id] = node.value
    fixtures = _fixture_params(tree, names)
    ids: list[str] = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"):
            ids.extend(_function_ids(filename, node, 1, names, fixtures))
        elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
            class_cases = _parametrize_cases(node.decorator_list, names)
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name.startswith("test"):
                    ids.extend(_function_ids(f"{filename}::{node.name}", item, class_cases, names, fixtures))
    return ids


def is_test_file(path: Path) -> bool:
    return path.suffix == ".py" and (path.name.startswith("test_") or path.stem.endswith("_test"))


def static_test_ids(tests_dir: Path) -> list[str]:
    """Test ids of every `test_*.py` / `*_test.py` below `tests_dir`, ids relative to it; [] if none."""
    if not tests_dir or not tests_dir.is_dir():
        return []
    ids: list[str] = []
    for path in sorted(tests_dir.rglob("*.py")):
        if is_test_file(path):
            try:
                source = path.read_text(errors="replace")
            except OSError:
                continue
            ids.extend(static_test_ids_in_source(source, str(path.relative_to(tests_dir))))
    return ids


def static_test_count(tests_dir: Path) -> int:
    return len(static_test_ids(tests_dir))
