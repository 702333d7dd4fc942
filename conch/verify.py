"""Run a task's verifier inside its sandbox and turn what it leaves into a `VerifyResult`.

Protocol (the Harbor one, which Terminal-Bench 1 tasks are mapped onto): upload the task's tests to /tests,
create an empty /logs/verifier, run `bash /tests/test.sh` (TB1: `bash /tests/run-tests.sh` with
TEST_DIR=/tests) in the image's working directory under the task's verifier timeout, then download
/logs/verifier and read it.

What the fields mean:
- `reward` is only ever the task's own official reward: /logs/verifier/reward.txt (a float) or reward.json.
  When the verifier wrote none (every TB1 task, and custom Harbor scripts), `reward` is None even though the
  tests are known. We deliberately do not derive it: Terminal-Bench's official outcome for such tasks is
  binary "resolved iff every test passed" (`n_total > 0 and n_passed == n_total`), and keeping `reward`
  None lets a reader tell a reward the task reported from one we would have invented.
- `tests`, `n_passed`, `n_total` come from the richest source present: CTRF JSON, then JUnit XML, then the
  pytest console output (`-rA` summary / `-v` lines, cross-checked with the final "N passed" line).
- `error` is set for a verifier failure: timeout, bootstrap crash (test script exited before any test ran),
  no reward file and no test results, an unreadable reward file, a test module pytest could not collect
  (import error), or a sandbox failure. A verifier error is never a plain 0: with `error` set, `reward` is
  None, and when no test ran `n_total` is the static count of the tests folder, so a crash reads 0/N, never
  0/0. The message names the decisive cause ("missing interpreter: ...", "module not found: No module named
  'x'", "dependency unavailable offline: ..."), found by `verifier_failure_cause`, not the last line of output
  (offline, that is usually an unrelated `curl: Could not resolve host`); `log` keeps the whole output.
- `warnings`: what the sandbox substituted (e.g. the uv shim running Python 3.13 for a `-p 3.11` request).
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from conch.sandbox.base import VERIFIER_RUN, Sandbox, VerifierSetup
from conch.sandbox.readback import LOG_CAP, REWARD_CAP, ReadBackError, clip, read_text, walk_regular
from conch.tasks.model import Task
from conch.tasks.testdeps import WHEELS_IN_SANDBOX, prefetch
from conch.verify_parsers import (
    TestOutcome,
    collection_failed,
    find_ctrf,
    find_junit,
    named_reports,
    parse_pytest_console,
    report_problems,
    verifier_failure_cause,
)
from conch.verify_check import StaticTests, locate_syntax_error, reconcile, static_tests

# conch's pytest plugin: kills what the tests started once they are done (conch/sandbox/pytest_seal.py).
SEAL_PLUGIN = Path(__file__).parent / "sandbox" / "pytest_seal.py"
SEAL_MODULE = "conch_pytest_seal"
# the box's own PYTHONPATH (the image's, the task's) stays, after conch's folder
SEAL_ON_PATH = f"PYTHONPATH={VERIFIER_RUN}/py${{PYTHONPATH:+:$PYTHONPATH}}"
TESTS_DIR = "/tests"
LOGS_DIR = "/logs/verifier"
OUTPUT_CAP = 1024 * 1024  # the pytest summary is at the very end; keep plenty so it survives
TAIL_CHARS = 4000
# Where the base root's uv shim records interpreter substitutions (conch.sandbox.baseroot.WARNINGS_FILE).
SANDBOX_WARNINGS = "/var/log/conch/warnings.log"
# pytest's configuration files, in its own order of precedence; the first one in the tests folder is used.
PYTEST_INIS = ("pytest.ini", "pyproject.toml", "tox.ini", "setup.cfg")


@dataclass(frozen=True)
class VerifyResult:
    """Outcome of one verifier run (plain data). `source` names where the test outcomes came from:
    "ctrf", "junit", "pytest-summary", "pytest-counts" or "static" (no test ran)."""

    reward: float | None
    tests: list[TestOutcome]
    n_passed: int
    n_total: int
    error: str | None
    seconds: float
    output_tail: str
    source: str = "static"
    exit_code: int | None = None
    details: dict = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    log: str = ""  # the verifier's whole output (up to OUTPUT_CAP), kept when `error` is set
    fault: str | None = None  # with `error`: "agent" (scored as a failure) or "infra" (excluded); `fault_of`
    tampered: str | None = None  # why the results cannot be the task's tests' (conch.verify_check.reconcile)


def read_reward(folder: Path) -> tuple[float | None, str | None]:
    """(reward, problem) from reward.txt or reward.json in `folder`; (None, None) when neither exists.

    Read with conch/sandbox/readback.py: a link or special file is refused, the size is capped."""
    raw_txt, problem = _read_result(folder, "reward.txt", REWARD_CAP)
    if problem:
        return None, problem
    if raw_txt is not None:
        raw = raw_txt.strip()
        try:
            value = float(raw)
        except ValueError:
            return None, f"reward.txt is not a number: {clip(raw, 80)!r}"
        return (value, None) if math.isfinite(value) else (None, f"reward.txt is not finite: {clip(raw, 80)!r}")
    raw_js, problem = _read_result(folder, "reward.json", REWARD_CAP)
    if problem:
        return None, problem
    if raw_js is not None:
        try:
            doc = json.loads(raw_js)
        except ValueError as exc:
            return None, f"reward.json is not valid JSON: {clip(str(exc))}"
        if isinstance(doc, dict):
            numbers = {k: v for k, v in doc.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
            if "reward" in numbers:
                doc = numbers["reward"]
            elif len(numbers) == 1:
                doc = next(iter(numbers.values()))
        if isinstance(doc, (int, float)) and not isinstance(doc, bool) and math.isfinite(doc):
            return float(doc), None
        return None, "reward.json holds no single reward (expected a number or {\"reward\": number})"
    return None, None


def _read_result(folder: Path, name: str, cap: int) -> tuple[str | None, str | None]:
    """(text, problem) of a result file from the box; (None, None) when it is absent."""
    try:
        return read_text(folder, name, cap), None
    except FileNotFoundError:
        return None, None
    except ReadBackError as exc:
        return None, f"{name} refused: {clip(str(exc))}"
    except OSError as exc:
        return None, f"{name} unreadable: {clip(str(exc))}"


def _collection_error_tests(files: list[str], static_ids: list[str]) -> list[TestOutcome]:
    """A module that failed to import: each of its statically known tests counts as an error."""
    out = []
    for node in files:
        node = node.replace("\\", "/")
        matched = [i for i in static_ids if node == i.split("::")[0] or node.endswith("/" + i.split("::")[0])]
        if matched:
            out.extend(TestOutcome(i, "error") for i in matched)
        else:
            out.append(TestOutcome(node, "error"))
    return out


def outcomes_from(logs: Path, output: str, static_ids: list[str], named: dict[str, list[str]] | None = None
                  ) -> tuple[list[TestOutcome], int, int, str]:
    """(tests, n_passed, n_total, source) from the downloaded logs folder and the script's output. `named`: the
    records the test script names (`named_reports`); when it names any, only those are read.

    The source holding the most tests wins (ties: CTRF, JUnit, `-rA`/`-v` lines, final tally line). Why not
    simply CTRF first: pytest-json-ctrf 0.3.5, the plugin TB2 test scripts pin, cuts the `[...]` off node ids
    and merges the parametrized cases of a function into one entry, while the console's `-rA` lines keep
    one line per case; and a capped console output can lose summary lines that its final tally still counts.
    """
    candidates: list[tuple[list[TestOutcome], int, int, str]] = []
    named = named or {}
    only = [rel for rels in named.values() for rel in rels] or None
    for source, found in (("ctrf", find_ctrf(logs, only)), ("junit", find_junit(logs, only))):
        if found:
            candidates.append((found, sum(t.status == "passed" for t in found), len(found), source))
    texts = [output]
    texts += [text for rel in _listing(logs) if rel.endswith((".txt", ".log")) and (text := _log_text(logs, rel))]
    for text in texts:
        console = parse_pytest_console(text)
        tests = console.tests + _collection_error_tests(console.collection_errors, static_ids)
        if tests:
            candidates.append((tests, sum(t.status == "passed" for t in tests), len(tests), "pytest-summary"))
        counts = console.counts
        if counts and sum(counts.values()):
            candidates.append((tests, counts["passed"], sum(counts.values()), "pytest-counts"))
        if tests or counts:
            break  # the script's own output is the authority; log files only when it says nothing
    if not candidates:
        return [], 0, 0, "static"
    best = max(range(len(candidates)), key=lambda i: (candidates[i][2], -i))
    return candidates[best]


def _named(task: Task) -> dict[str, list[str]]:
    try:
        return named_reports(task.test_script.read_text(errors="replace"))
    except OSError:
        return {}


def _listing(logs: Path) -> list[str]:
    try:
        return walk_regular(logs)
    except ReadBackError:
        return []


def _log_text(logs: Path, rel: str) -> str:
    try:
        return read_text(logs, rel, LOG_CAP)
    except (ReadBackError, OSError):
        return ""  # a huge or vanished log is not a source of test results


def _script_dest(task: Task) -> tuple[str, bool]:
    """Path of the verifier script inside the sandbox, and whether it must be uploaded separately."""
    try:
        return f"{TESTS_DIR}/{task.test_script.relative_to(task.tests_dir).as_posix()}", False
    except ValueError:
        return f"{TESTS_DIR}/{task.test_script.name}", True  # TB1 run-tests.sh lives beside tests/


def _stage(tmp: Path, task: Task, wheels: Path | None, final: bool) -> VerifierSetup:
    """Host folders for the verifier box: a copy of the tests (the script beside them when it lives outside),
    empty results folders, and conch's own run folder (pytest.ini, uv cache, the task's wheels)."""
    tests = tmp / "tests"
    shutil.copytree(task.tests_dir, tests, symlinks=True)
    _, separate = _script_dest(task)
    if separate:
        shutil.copy2(task.test_script, tests / task.test_script.name)
    run = tmp / "run"
    (run / "uv-cache").mkdir(parents=True)
    (run / "pytest.ini").write_text("[pytest]\n")
    (run / "py").mkdir()
    shutil.copy(SEAL_PLUGIN, run / "py" / f"{SEAL_MODULE}.py")
    if wheels is not None:
        shutil.copytree(wheels, run / "wheels", copy_function=_link_or_copy)
    return VerifierSetup(tests=tests, logs=tmp / "logs", warnings=tmp / "warnings", run=run, final=final)


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def verifier_env(task: Task, has_wheels: bool) -> dict[str, str]:
    """The verifier's environment: the task's, plus what keeps the agent's files out of the toolchain's way
    (docs/safety.md): no user site-packages or script-dir imports, no uv/pip configuration files, an empty uv
    cache, pytest's configuration and conftest search confined to /tests."""
    ini = next((f"{TESTS_DIR}/{n}" for n in PYTEST_INIS if (task.tests_dir / n).is_file()), f"{VERIFIER_RUN}/pytest.ini")
    env = dict(task.test_env)
    addopts = f"--rootdir={TESTS_DIR} --confcutdir={TESTS_DIR} -p no:cacheprovider -p {SEAL_MODULE} -c {ini}"
    env["PYTEST_ADDOPTS"] = f"{addopts} {env['PYTEST_ADDOPTS']}" if env.get("PYTEST_ADDOPTS") else addopts
    env.update({"PYTHONNOUSERSITE": "1", "PYTHONSAFEPATH": "1", "PYTHONDONTWRITEBYTECODE": "1", "UV_NO_CONFIG": "1",
                "UV_CACHE_DIR": f"{VERIFIER_RUN}/uv-cache", "PIP_CONFIG_FILE": os.devnull, "PIP_NO_CACHE_DIR": "1"})
    if has_wheels:
        env["UV_FIND_LINKS"] = f"{WHEELS_IN_SANDBOX},{VERIFIER_RUN}/wheels"
        env["PIP_FIND_LINKS"] = f"{WHEELS_IN_SANDBOX} {VERIFIER_RUN}/wheels"
    return env


def _failed(static: StaticTests, start: float, error: str, fault: str = "infra") -> VerifyResult:
    return VerifyResult(reward=None, tests=[], n_passed=0, n_total=len(static.ids), error=error,
                        seconds=time.monotonic() - start, output_tail="", fault=fault)


async def verify(sandbox: Sandbox, task: Task, final: bool = True) -> VerifyResult:
    """Run the verifier of `task` over the started `sandbox`'s filesystem, in a verifier box of its own
    (`Sandbox.verification`). `final=False` (a mid-episode measurement) resumes the agent afterwards and leaves
    it nothing of the verification. Never raises for a verifier or sandbox failure."""
    start = time.monotonic()
    static = static_tests(task.tests_dir)
    script, _ = _script_dest(task)
    wheels, fetch_problem = await asyncio.to_thread(prefetch, task.test_script, task.tests_dir)
    refused = None
    with tempfile.TemporaryDirectory(prefix="conch-verify-") as tmp:
        try:
            setup = await asyncio.to_thread(_stage, Path(tmp), task, wheels, final)
            async with sandbox.verification(setup) as box:
                result = await box.exec(f"{SEAL_ON_PATH} bash {script}", timeout=task.verifier_timeout_sec,
                                        env=verifier_env(task, wheels is not None), output_cap=OUTPUT_CAP)
        except asyncio.CancelledError:
            raise
        except ReadBackError as exc:  # the results folder over its cap: nothing of it is trusted
            refused = f"verifier results refused: {clip(str(exc))}"
            shutil.rmtree(setup.logs, ignore_errors=True)
            setup.logs.mkdir(parents=True, exist_ok=True)
        except Exception as exc:  # sandbox failure: report it, never a plain 0
            return _failed(static, start, f"verifier could not run: {type(exc).__name__}: "
                                          f"{clip(str(exc).strip(), 300)}")
        output = result.stdout + ("\n" if result.stdout and result.stderr else "") + result.stderr
        logs = setup.logs
        reward, reward_problem = read_reward(logs)
        reward_problem = refused or reward_problem
        tests, n_passed, n_total, source = outcomes_from(logs, output, list(static.ids), _named(task))
        details = {"files": _listing(logs), "report_problems": report_problems(logs)}
        warnings = [w for w in (_internet_note(task, sandbox), fetch_problem) if w]
        warnings += _sandbox_warnings(setup.warnings)
    inconsistent = reconcile(tests, n_passed, n_total, source, static, output)
    if inconsistent:
        return VerifyResult(reward=None, tests=[], n_passed=0, n_total=len(static.ids),
                            error=f"verifier result inconsistent with the task's tests: {inconsistent}",
                            seconds=time.monotonic() - start, output_tail=output[-TAIL_CHARS:], source=source,
                            exit_code=result.exit_code, details=details, warnings=warnings, log=output,
                            fault="agent", tampered=inconsistent)
    error = _diagnose(result.timed_out, result.exit_code, task, reward, reward_problem, n_total, len(static.ids))
    if not error and collection_failed(output):
        error = "verifier could not collect its tests"
    cause = verifier_failure_cause(output) if error and not result.timed_out else None
    if error and details.get("report_problems"):
        error = f"{error}; {clip(details['report_problems'][0])}"
    if cause:  # a test module's SyntaxError gets its file and line (tests/test_outputs.py:12: SyntaxError: ...)
        cause = (cause[0], locate_syntax_error(cause[1], output, task.tests_dir, _tests_prefix(task), TESTS_DIR))
        error = f"{error}: {cause[0]}: {clip(cause[1])}"
    elif error and not result.timed_out and (last := _last_line(output)):
        error = f"{error}; last output: {last}"
    if error:
        reward = None
        n_total = max(n_total, len(static.ids))
    elif n_total == 0:  # no test ran (e.g. a reward-only verifier): the tests folder still sets the scale
        n_total = len(static.ids)
    return VerifyResult(
        reward=reward,
        tests=tests,
        n_passed=n_passed,
        n_total=n_total,
        error=error,
        seconds=time.monotonic() - start,
        output_tail=output[-TAIL_CHARS:],
        source=source,
        exit_code=result.exit_code,
        details=details,
        warnings=warnings,
        log=output if error else "",
        fault=fault_of(error, result.timed_out, result.exit_code, reward_problem, cause, output) if error else None,
    )


def fault_of(error: str, timed_out: bool, exit_code: int | None, reward_problem: str | None,
             cause: tuple[str, str] | None, output: str) -> str:
    """Whose fault a verifier error is: "agent" (scored as a failure and trained on) or "infra" (excluded).

    The agent's: the tests did not finish in the verifier's time (nothing of conch's runs then; what ran was
    the task's tests over the agent's work), the verifier was killed by a signal (a memory limit the agent's
    programs hit), the disk filled, a result file refused (a link or special file where a result belongs, a
    record over its cap). Everything else (a sandbox failure, a missing interpreter or module, a dependency
    conch could not serve offline, a broken test script) is the task's or the infrastructure's."""
    if timed_out or (exit_code is not None and exit_code in (128 + 9, 128 + 15)):
        return "agent"
    if "No space left on device" in output or "Disk quota exceeded" in output:
        return "agent"
    if reward_problem and ("refused" in reward_problem or "download cap" in reward_problem):
        return "agent"
    return "infra"


def _internet_note(task: Task, sandbox: Sandbox) -> str | None:
    """Say what a task asking for the internet (Harbor `allow_internet = true`) got instead."""
    if not task.allow_internet:
        return None
    if getattr(sandbox, "registries", False):
        return "the task sets allow_internet = true: it could reach the package registries only (sandbox.network)"
    return ("the task sets allow_internet = true, but this sandbox had no network at run time "
            "(sandbox.network = never; only pinned test-time installs are served offline)")


def _sandbox_warnings(folder: Path) -> list[str]:
    """Lines the sandbox's tools wrote to SANDBOX_WARNINGS during the verifier run (deduplicated)."""
    try:
        text = read_text(folder, "warnings.log", 20000)
    except (FileNotFoundError, OSError, ReadBackError):
        return []
    return list(dict.fromkeys(line.strip() for line in text.splitlines() if line.strip()))


def _tests_prefix(task: Task) -> str:
    """The tests folder's path inside the task folder (`tests`), as error messages name test files."""
    try:
        return task.tests_dir.relative_to(task.path).as_posix()
    except ValueError:
        return task.tests_dir.name


def _last_line(output: str, limit: int = 160) -> str:
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    return clip(lines[-1], limit) if lines else ""


def _diagnose(
    timed_out: bool,
    exit_code: int | None,
    task: Task,
    reward: float | None,
    reward_problem: str | None,
    n_parsed: int,
    n_static: int,
) -> str | None:
    """The verifier-level error, if any (see the module docstring)."""
    if timed_out:
        return f"verifier timed out after {task.verifier_timeout_sec:g}s"
    if reward_problem:
        return reward_problem
    if n_parsed:
        return None
    if reward is None:
        if exit_code:
            return f"verifier crashed before any test ran (exit {exit_code}); no reward file"
        return "verifier left no reward file and no test results"
    if reward == 0 and n_static:
        # the usual TB2 test.sh writes 0 whenever pytest fails, including when pytest never started
        return f"reward 0 but no test results: the verifier failed before running its {n_static} tests"
    return None
