"""Real Terminal-Bench-layout tasks run unchanged on both backends, and a verifier that cannot run is an error.

The task folders in tests/fixtures/tb2-tasks were written for these tests (own content):
- `sales-summary` (TB 2.1 layout): the standard `uvx -p 3.13 -w pytest==8.4.1 -w pytest-json-ctrf==0.3.5`
  verifier (after the usual offline-failing apt-get/curl lines), a parametrized test, a test module importing
  `tabulate`, which only the verifier's test-time install `-w tabulate==0.9.0` brings, and a t-bench base image
  whose relative `COPY` relies on its WORKDIR /app. One test (input unchanged) passes without any action.
- `broken-verifier`: the same task whose tests import a module nothing installs.
- `multistage-greet` (TB 2.1 layout): a multi-stage Dockerfile (`COPY --from=builder`) installs a tool; it sets
  `allow_internet = true`, which conch does not grant, and says so in the result's warnings.
- `tb1-word-lengths` (TB1 layout): compose file, `uv venv -p 3.12` (not installed: 3.13 runs, with a
  warning), no reward file (so `resolved` is the outcome), and the t-bench WORKDIR /app check of TB1 scripts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conch.sandbox import uvshim
from conch.sandbox.buildplan import plan, split_stages
from conch.sandbox.dockerfile import parse
from conch.sandbox.standins import note, standin_for
from conch.tasks.testdeps import pinned_requirements
from conch.verify_parsers import static_test_count, static_test_ids_in_source, verifier_failure_cause

REPO = Path(__file__).resolve().parents[1]
TASKS = REPO / "tests" / "fixtures" / "tb2-tasks"


def conch(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "conch", *args], capture_output=True, text=True, cwd=REPO,
                          timeout=timeout)


# ------------------------------------------------------------------------------------------- pure functions


def test_failure_cause_skips_offline_noise():
    apt_curl = ("Err:1 http://deb.debian.org/debian trixie InRelease\n  Temporary failure resolving 'deb.debian.org'\n"
                "E: Unable to locate package curl\ncurl: (6) Could not resolve host: astral.sh\n")
    uv_offline = apt_curl + ("  × No solution found when resolving `--with` dependencies:\n"
                             "  ╰─▶ Because numpy was not found in the provided package locations and you require "
                             "numpy==2.3.1, we can conclude that your requirements are unsatisfiable.\n")
    kind, line = verifier_failure_cause(uv_offline)
    assert kind == "dependency unavailable offline" and line.startswith("Because numpy was not found")
    kind, line = verifier_failure_cause(apt_curl + "error: No interpreter found for Python 2.7 in search path\n")
    assert kind == "missing interpreter" and "2.7" in line
    kind, line = verifier_failure_cause(apt_curl + "/tests/test.sh: line 6: uvx: command not found\n")
    assert kind == "command not found" and "uvx" in line
    collect = ("==== ERRORS ====\n____ ERROR collecting tests/test_outputs.py ____\nImportError while importing "
               "test module '/tests/test_outputs.py'.\nE   ModuleNotFoundError: No module named 'pandas'\n")
    assert verifier_failure_cause(apt_curl + collect) == ("test collection failed",
                                                          "ModuleNotFoundError: No module named 'pandas'")
    assert verifier_failure_cause(apt_curl) is None  # only noise: no decisive cause claimed


def test_static_counts_include_parametrized_cases():
    src = """
import pytest
REGIONS = {"a": 1, "b": 2, "c": 3}
@pytest.fixture(params=["x", "y"])
def mode(request):
    return request.param
def test_plain():
    pass
@pytest.mark.parametrize("r", sorted(REGIONS))
def test_region(r):
    pass
@pytest.mark.parametrize("i", range(2, 7))
@pytest.mark.parametrize("k,v", [(k, v) for k, v in REGIONS.items()])
def test_grid(i, k, v):
    pass
def test_modes(mode):
    pass
@pytest.mark.parametrize("x", make_cases())
def test_dynamic(x):
    pass
"""
    ids = static_test_ids_in_source(src, "t.py")
    counts = {name: sum(1 for i in ids if i.split("::")[1].split("[")[0] == name)
              for name in ("test_plain", "test_region", "test_grid", "test_modes", "test_dynamic")}
    assert counts == {"test_plain": 1, "test_region": 3, "test_grid": 15, "test_modes": 2, "test_dynamic": 1}
    assert static_test_count(TASKS / "sales-summary" / "tests") == 7
    assert static_test_count(TASKS / "broken-verifier" / "tests") == 7


def test_pinned_test_time_requirements():
    script = (TASKS / "sales-summary" / "tests" / "test.sh").read_text()
    assert pinned_requirements(script) == ["tabulate==0.9.0"]  # the toolchain pins are already in the root
    assert pinned_requirements("uv pip install --system 'requests==2.32.3' numpy\npip install a==1 \\\n b==2\n"
                               "echo c==3\nuv run --with=attrs==25.3.0 pytest\n") == [
        "requests==2.32.3", "a==1", "b==2", "attrs==25.3.0"]


def test_pinned_requirements_files_under_tests(tmp_path):
    (tmp_path / "requirements.txt").write_text("# test deps\nnumpy==2.3.1\nrich >= 13\npytest==8.4.1\n")
    script = "uv pip install --system -r /tests/requirements.txt\npip install -r $TEST_DIR/requirements.txt\n"
    assert pinned_requirements(script, tmp_path) == ["numpy==2.3.1"]  # unpinned and toolchain pins left out
    assert pinned_requirements("pip install -r /elsewhere/req.txt\n", tmp_path) == []


def test_standin_table():
    assert standin_for("ghcr.io/laude-institute/t-bench/python-3-13:20250620").workdir == "/app"
    assert standin_for("python:3.12-slim-trixie").workdir is None
    assert standin_for("node:20") is None
    assert "Python 3.11 is not available offline" in note("python:3.11-slim")
    assert "not available" not in note("python:3.13-slim-bookworm")
    p = plan(parse(TASKS / "sales-summary" / "environment" / "Dockerfile"))
    assert p.config.workdir == "/app" and p.steps[0].kind == "workdir" and p.steps[1].dest == "/app/"


def test_multi_stage_plan():
    stages = split_stages(parse(TASKS / "multistage-greet" / "environment" / "Dockerfile"))
    assert [alias for alias, _ in stages] == ["builder", ""]
    final = plan(stages[1][1])
    copies = [s for s in final.steps if s.kind == "copy"]
    assert [(c.from_stage, c.sources, c.dest) for c in copies] == [
        ("builder", ("/out/bin/greet",), "/usr/local/bin/greet"), ("builder", ("/out/greet.py",), "/opt/greet/greet.py")]
    assert final.config.workdir == "/app"


def test_multi_service_compose_is_a_clear_error(tmp_path):
    from conch.sandbox.base import SandboxError
    from conch.sandbox.compose import environment_of

    compose = tmp_path / "docker-compose.yaml"
    compose.write_text("services:\n  client:\n    build: .\n  db:\n    image: postgres:16\n")
    with pytest.raises(SandboxError, match=r"defines 2 services \(client, db\).*unsupported"):
        environment_of(tmp_path, None, compose)


def test_docker_standin_sets_tbench_workdir():
    from conch.sandbox.docker_from import generate_dockerfile

    text = (TASKS / "sales-summary" / "environment" / "Dockerfile").read_text()
    gen = generate_dockerfile(text, "conch/base:x", "Dockerfile", lambda ref: False)
    lines = gen.text.splitlines()
    assert lines.index("WORKDIR /app") < lines.index("COPY sales.csv .")


def _shim(tmp_path: Path) -> tuple[Path, Path, list[int]]:
    """The uv shim in front of a fake uv that prints its arguments; the host's python3 minors."""
    real = tmp_path / "real"
    real.mkdir()
    for tool in ("uv", "uvx"):
        (real / tool).write_text('#!/bin/sh\nfor a in "$@"; do printf "%s|" "$a"; done; echo "UV_PYTHON=$UV_PYTHON"\n')
        (real / tool).chmod(0o755)
    shim_dir = tmp_path / "bin"
    shim_dir.mkdir()
    warn = tmp_path / "log" / "warnings.log"
    for tool in ("uv", "uvx"):
        (shim_dir / tool).write_text(uvshim.render(str(real), str(warn)))
        (shim_dir / tool).chmod(0o755)
    minors = sorted({int(p.name[len("python3."):]) for d in ("/usr/bin", "/usr/local/bin") if Path(d).is_dir()
                     for p in Path(d).glob("python3.*") if p.name[len("python3."):].isdigit()})
    return shim_dir, warn, minors


def test_uv_shim_maps_missing_versions_and_says_so(tmp_path):
    shim_dir, warn, minors = _shim(tmp_path)
    if not minors:
        pytest.skip("no python3.N on this host")
    have, newest = f"3.{minors[-1]}", f"3.{minors[-1]}"

    def run(tool: str, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
        return subprocess.run([str(shim_dir / tool), *args], capture_output=True, text=True,
                              env={"PATH": os.environ["PATH"], **(env or {})})

    r = run("uvx", "-p", have, "-w", "pytest==8.4.1", "pytest", "-p", "no:cacheprovider")
    assert r.stdout.startswith(f"-p|{have}|-w|pytest==8.4.1|pytest|-p|no:cacheprovider|") and not warn.exists()
    r = run("uvx", "--python=3.99", "pytest", "-p", "3.1")  # pytest's own -p is never touched
    assert r.stdout.startswith(f"--python={newest}|pytest|-p|3.1|")
    assert "Python 3.99 was requested" in r.stderr and "Python 3.99 was requested" in warn.read_text()
    r = run("uv", "run", "-p", "3.99", "python", "-p", "x", env={"UV_PYTHON": "3.98"})
    assert r.stdout.startswith(f"run|-p|{newest}|python|-p|x|") and f"UV_PYTHON={newest}" in r.stdout
    r = run("uv", "pip", "install", "x==1", "--python", "3.99")
    assert r.stdout.startswith(f"pip|install|x==1|--python|{newest}|")
    r = run("uv", "venv", "-p", ">=3.8", "/tmp/v")  # not a plain version: untouched
    assert r.stdout.startswith("venv|-p|>=3.8|/tmp/v|")


# ------------------------------------------------------------------------------------------- end to end


def _check(backend: str, agent: str, *extra: str) -> dict[str, dict]:
    proc = conch("check", str(TASKS), "--agent", agent, "--sandbox", backend, "--json", "--jobs", "2", *extra)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {r["task"]: r for r in json.loads(proc.stdout)}


def _assert_broken_is_error(r: dict) -> None:
    assert r["reward"] is None and not r["resolved"]
    assert "No module named 'conch_no_such_module'" in r["error"], r["error"]
    assert r["n_total"] == 7  # the static count, parametrized cases included



def test_oracle_passes_nop_gets_the_honest_count_broken_verifier_errors(backend, tmp_path):
    # nop first: its counts are cached by task content, so the oracle run after it shows them without new runs
    res = _check(backend, "nop", "--logs", str(tmp_path / "logs"))
    log = (tmp_path / "logs" / "broken-verifier" / "verifier.log").read_text()  # the whole output is kept
    assert "Could not resolve host" in log and "No module named 'conch_no_such_module'" in log
    assert not (tmp_path / "logs" / "sales-summary").exists()
    s = res["sales-summary"]
    assert (s["n_passed"], s["n_total"], s["reward"], s["error"], s["resolved"]) == (1, 7, 0.0, None, False)
    m = res["multistage-greet"]
    assert (m["n_passed"], m["n_total"], m["reward"], m["error"]) == (1, 4, 0.0, None)
    t = res["tb1-word-lengths"]
    assert (t["n_passed"], t["n_total"], t["error"]) == (1, 4, None)
    _assert_broken_is_error(res["broken-verifier"])

    res = _check(backend, "oracle")
    s = res["sales-summary"]
    assert (s["n_passed"], s["n_total"], s["reward"], s["error"], s["resolved"]) == (7, 7, 1.0, None, True)
    assert "warnings" not in s  # -p 3.13 is served as asked
    assert s["nop_passed"] == 1 and res["tb1-word-lengths"]["nop_passed"] == 1
    assert res["broken-verifier"]["nop_passed"] is None  # unknown, never guessed
    m = res["multistage-greet"]
    assert (m["n_passed"], m["n_total"], m["reward"], m["error"], m["nop_passed"]) == (4, 4, 1.0, None, 1)
    assert any("allow_internet = true" in w for w in m["warnings"])  # asked for, not granted: said so
    t = res["tb1-word-lengths"]
    assert (t["n_passed"], t["n_total"], t["reward"], t["resolved"]) == (4, 4, None, True)
    assert any("Python 3.12 was requested" in w and "using Python 3.13" in w for w in t["warnings"])
    _assert_broken_is_error(res["broken-verifier"])


def test_local_build_steps_get_the_host_ca_bundle(tmp_path, base_root):
    from conch.sandbox.baseroot import BUILD_CA
    from conch.sandbox.docker_images import build_ca_bundle
    from conch.sandbox.localbuild import build_image

    bundle = build_ca_bundle()
    if not bundle:
        pytest.skip("this machine has no CA bundle")
    nonce = os.urandom(6).hex()  # a fresh layer: the RUN step really runs
    (tmp_path / "Dockerfile").write_text(
        f'FROM python:3.13-slim\nRUN test "$PIP_CERT" = "$SSL_CERT_FILE" && cp "$SSL_CERT_FILE" /ca-{nonce}\n')
    image = build_image(tmp_path, tmp_path / "Dockerfile", quiet=True)
    top = image.lowers[0]
    assert (top / f"ca-{nonce}").read_bytes() == bundle
    assert not (top / BUILD_CA.lstrip("/")).exists()  # the bind leaves nothing in the layer


def test_stage_copy_sees_the_merged_layers(tmp_path):
    from conch.sandbox.stagecopy import merged_entries

    top, bottom = tmp_path / "top", tmp_path / "bottom"
    for layer, files in ((bottom, ("a", "b", "c")), (top, ("c", "d"))):
        (layer / "out").mkdir(parents=True)
        for name in files:
            (layer / "out" / name).write_text(layer.name)
    (top / "out" / "b").unlink(missing_ok=True)
    os.mknod(top / "out" / "b", 0o600 | 0o020000, os.makedev(0, 0))  # an overlay whiteout: b was deleted
    seen = merged_entries([top, bottom], ["out"])
    assert sorted(seen) == ["a", "c", "d"]
    assert seen["c"].read_text() == "top"  # the upper layer hides the lower one
