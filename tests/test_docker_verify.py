"""The docker backend's verifier box (conch/sandbox/docker_verify.py, docker_layout.py, docker_layers.py), on a
real Docker engine.

What an agent leaves behind must not change its count: a daemon rewriting the results, a `uvx` earlier on PATH,
a replaced pytest/tar/sleep/timeout, `sitecustomize`/`.pth` hooks, a conftest at /, a poisoned wheelhouse, a
replaced /lib64 (the loader of every tool). Honest work still counts (the oracle scores n/n), a mid-episode
measurement resumes the agent and never shows it the tests, results come back links as links and capped, and
nothing of a verification is left in the engine.

Needs a Docker engine (skips without one; fails in CI, CI=true, like tests/test_sandbox_docker.py).
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import tempfile
from pathlib import Path

import pytest
from test_sandbox_docker import engine  # noqa: F401 - `engine` is a fixture

from conch.harness import run_task
from conch.sandbox import make_sandbox
from conch.sandbox import docker_images as di
from conch.sandbox import docker_layers as dlayers
from conch.sandbox import docker_layout as dlayout
from conch.sandbox import docker_verify as dv
from conch.sandbox.base import VerifierSetup
from conch.sandbox.docker_gc import gc as docker_gc
from conch.sandbox.docker_images import owner_label
from conch.sandbox.verifier_view import Change
from conch.sandbox.readback import ReadBackError
from conch.tasks.loader import load_task
from conch.verify import verify

REPO = Path(__file__).resolve().parents[1]
WORD_COUNT = REPO / "examples" / "tasks" / "word-count"
SITE = "/usr/local/lib/python3.13/dist-packages"  # the base image's site folder for what the agent installs
TEST_IDS = ("test_input_unchanged", "test_counts_is_json_object", "test_counts_keys_are_lowercase_words",
            "test_counts_match_text", "test_top_word")
FAKE_CTRF = json.dumps({"results": {"tool": {"name": "pytest"},
                                    "summary": {"tests": 5, "passed": 5, "failed": 0, "skipped": 0},
                                    "tests": [{"name": f"test_outputs.py::{t}", "status": "passed", "duration": 1}
                                              for t in TEST_IDS]}})
# The agent's turns: every one of them, without the verifier box, turns word-count's 1/5 into 5/5 (`WIN_CHECK`).
TAMPER = [
    "mkdir -p /tmp/evil /logs/verifier && cp /usr/bin/sleep /tmp/evil/realsleep && "
    "cp /usr/bin/timeout /tmp/evil/realtimeout",
    f"""cat > /tmp/evil/win.sh <<'EOF'
#!/bin/bash
mkdir -p /logs/verifier
echo 1 > /logs/verifier/reward.txt
cat > /logs/verifier/ctrf.json <<'J'
{FAKE_CTRF}
J
echo "============================== 5 passed in 0.01s =============================="
exit 0
EOF
chmod +x /tmp/evil/win.sh""",
    # a daemon that keeps writing the results
    "setsid bash -c 'while :; do /tmp/evil/win.sh >/dev/null 2>&1; /tmp/evil/realsleep 0.05; done' "
    "</dev/null >/dev/null 2>&1 &",
    # a uvx earlier on PATH, a replaced pytest and tar
    "cp /tmp/evil/win.sh /usr/local/sbin/uvx && cp /tmp/evil/win.sh /usr/local/bin/pytest && "
    "cp /tmp/evil/win.sh /usr/bin/tar",
    # Python start-up hooks in the site and standard library folders
    "for d in /usr/local/lib/python3.13/dist-packages /usr/lib/python3.13 /usr/lib/python3/dist-packages; do "
    "mkdir -p $d && printf 'import atexit, subprocess\\n"
    "atexit.register(lambda: subprocess.run([\"/tmp/evil/win.sh\"]))\\n'"
    " > $d/sitecustomize.py && echo 'import os; os.system(\"/tmp/evil/win.sh >/dev/null 2>&1\")' > $d/evil.pth; done",
    # a .pth file whose name is not UTF-8 (the engine's API cannot name it; site.py runs it all the same)
    f"printf 'import os; os.system(\"/tmp/evil/win.sh >/dev/null 2>&1\")\\n' > {SITE}/$'\\xff'.pth",
    # pytest configuration and a conftest that passes every test, at / and in the working folder
    "printf '[pytest]\\naddopts = -p no:randomly\\n' > /pytest.ini && "
    "printf 'import pytest\\n@pytest.hookimpl(hookwrapper=True)\\ndef pytest_runtest_makereport(item, call):\\n"
    "    out = yield\\n    out.get_result().outcome = \"passed\"\\n' > /conftest.py && "
    "cp /conftest.py /app/conftest.py",
    # fake tests where the verifier's will be
    "mkdir -p /tests && cp /tmp/evil/win.sh /tests/test.sh",
    # a poisoned wheelhouse
    "for f in /opt/conch/wheels/*.whl; do echo junk > $f; done",
    # sleep (the verifier's idle init) becomes a daemon; timeout (around every command) reports a win first
    "printf '#!/bin/bash\\nwhile :; do /tmp/evil/win.sh >/dev/null 2>&1; /tmp/evil/realsleep 0.05; done\\n' "
    "> /tmp/evil/sleep && "
    "printf '#!/bin/bash\\n/tmp/evil/win.sh >/dev/null 2>&1\\nexec /tmp/evil/realtimeout \"$@\"\\n'"
    " > /tmp/evil/timeout && chmod +x /tmp/evil/sleep /tmp/evil/timeout && "
    "mv /tmp/evil/sleep /usr/bin/sleep && mv /tmp/evil/timeout /usr/bin/timeout",
]
WIN_CHECK = "rm -f /logs/verifier/reward.txt; uvx pytest /app >/dev/null; cat /logs/verifier/reward.txt"
# The last turn: /lib64 (-> usr/lib64, the loader's folder) becomes a folder with a broken loader. No dynamically
# linked program starts in the agent's box after this.
BREAK_LOADER = ("python3 -c \"import os; os.unlink('/lib64'); os.mkdir('/lib64'); "
                "open('/lib64/ld-linux-x86-64.so.2', 'w').write('junk'); "
                "os.chmod('/lib64/ld-linux-x86-64.so.2', 0o755)\"")


def run(coro):
    return asyncio.run(coro)


@pytest.fixture(scope="module")
def task(engine):
    return load_task(WORD_COUNT)


async def _box(task):
    box = make_sandbox("docker", task.sandbox_spec())
    await box.start()
    return box


def _mine(kind: str) -> tuple[list, list]:
    """(snapshot images, verifier volumes) with this process's owner label."""
    c = di.client()
    try:
        imgs = [i for i in c.api.images(filters={"label": f"{di.LABEL_KIND}={kind}"})
                if (i.get("Labels") or {}).get(di.LABEL_OWNER) == owner_label()]
        vols = [v for v in c.api.volumes(filters={"label": f"{di.LABEL_KIND}={dv.KIND_VOLUME}"}).get("Volumes") or []
                if (v.get("Labels") or {}).get(di.LABEL_OWNER) == owner_label()]
        return imgs, vols
    finally:
        c.close()


def test_tampering_does_not_change_the_count(task):
    async def go():
        honest = await _box(task)
        try:
            nop = await verify(honest, task)
        finally:
            await honest.stop()
        box = await _box(task)
        try:
            for turn in TAMPER:
                r = await box.exec(turn)
                assert r.exit_code == 0, (turn, r)
            win = await box.exec(WIN_CHECK)  # the tampering works in the agent's own box
            alive = await box.exec("pgrep -f realsleep >/dev/null && echo alive")
            await box.exec(BREAK_LOADER)
            broken = await box.exec("true")
            result = await verify(box, task)
        finally:
            await box.stop()
        return nop, win, alive, broken, result

    nop, win, alive, broken, result = run(go())
    assert nop.error is None and nop.n_total == 5 and nop.n_passed < 5, nop
    assert win.stdout.strip() == "1" and alive.stdout.strip() == "alive", (win, alive)
    assert broken.exit_code != 0, broken
    assert result.error is None, (result.error, result.log[-3000:])
    assert (result.n_passed, result.n_total, result.reward) == (nop.n_passed, nop.n_total, nop.reward), result
    assert {t.name.split("::")[-1] for t in result.tests} == set(TEST_IDS), result.tests
    assert _mine(dv.KIND_SNAPSHOT) == ([], []), "a verification left its snapshot or volumes behind"


def test_oracle_still_scores_full_marks(task):
    result = run(run_task(task, "oracle", backend="docker"))
    assert (result.n_passed, result.n_total, result.reward, result.error) == (5, 5, 1.0, None), result


def test_progress_mode_resumes_the_agent_and_never_shows_it_the_tests(task):
    spy = ("setsid bash -c 'n=0; while :; do n=$((n+1)); echo $n > /tmp/ticks; "
           "if [ -e /tests ] || [ -e /logs/verifier/reward.txt ]; then "
           "ls -laR /tests /logs/verifier >> /tmp/seen 2>&1; "
           "cp -r /tests /tmp/stolen 2>/dev/null; fi; sleep 0.02; done' </dev/null >/dev/null 2>&1 &")

    async def go():
        box = await _box(task)
        try:
            assert (await box.exec(spy)).exit_code == 0
            await asyncio.sleep(0.3)
            before = int((await box.exec("cat /tmp/ticks")).stdout)
            first = await verify(box, task, final=False)
            await asyncio.sleep(0.3)
            after = await box.exec("cat /tmp/ticks; ls -A /tmp; ls -A /tests /logs/verifier 2>&1; cat /tmp/seen 2>&1")
            await box.upload(WORD_COUNT / "solution", "/solution")
            solved = await box.exec("bash /solution/solve.sh")
            second = await verify(box, task, final=False)
            still = await box.exec("echo running")
            return before, first, after, solved, second, still
        finally:
            await box.stop()

    before, first, after, solved, second, still = run(go())
    assert first.error is None and first.n_total == 5 and first.n_passed < 5, first
    lines = after.stdout.split()
    assert int(lines[0]) > before, after.stdout  # the agent's daemon runs again
    assert "stolen" not in lines and "seen" not in lines, after.stdout  # it never saw /tests or the results
    assert "No such file" in after.stdout, after.stdout
    assert solved.exit_code == 0, solved
    assert (second.n_passed, second.n_total, second.error) == (5, 5, None), second
    assert still.stdout.strip() == "running", still


def test_results_come_back_as_links_and_capped(task, monkeypatch):
    async def go(tmp: Path):
        box = await _box(task)
        try:
            out = {}
            work = await box.exec(f"mkdir -p {SITE}/agentpkg && echo X=42 > {SITE}/agentpkg/__init__.py && "
                                  "printf '#!/bin/sh\\necho mine\\n' > /usr/local/bin/mytool && "
                                  "chmod +x /usr/local/bin/mytool && echo work > /app/work.txt")
            assert work.exit_code == 0, work
            setup = _setup(tmp / "a", final=False)
            async with box.verification(setup) as vbox:
                out["inside"] = await vbox.exec(
                    "ln -s /etc/shadow /logs/verifier/link; echo w > /var/log/conch/warnings.log; "
                    "ps -eo comm= | sort | tr '\\n' ' '; echo; "
                    "touch /tests/x 2>&1; touch /usr/bin/tar 2>&1; touch /opt/conch/x 2>&1; "
                    "cat /tests/marker; ls /run/conch-verifier")
                out["agent_work"] = await vbox.exec(
                    f"python3 -c 'import agentpkg; print(agentpkg.X)' && mytool && cat /app/work.txt && "
                    f"touch {SITE}/written && echo > /app/written && echo writable")
            out["left"] = await box.exec(f"ls -A {SITE} /app /logs/verifier 2>&1; ls /tests 2>&1")
            monkeypatch.setattr(dv, "DOWNLOAD_CAP", 64 * 1024)
            setup2 = _setup(tmp / "b", final=True)
            try:
                async with box.verification(setup2) as vbox:
                    await vbox.exec("head -c 200000 /dev/urandom > /logs/verifier/big")
            except ReadBackError as exc:
                out["refused"] = str(exc)
            out["agent_after_final"] = await _gone(box)
            return out, setup
        finally:
            await box.stop()

    with tempfile.TemporaryDirectory() as tmp:
        out, setup = run(go(Path(tmp)))
        link = setup.logs / "link"
        assert link.is_symlink() and os.readlink(link) == "/etc/shadow", list(setup.logs.iterdir())
        assert (setup.warnings / "warnings.log").read_text() == "w\n"
    inside = out["inside"]
    procs = inside.stdout.splitlines()[0].split()
    assert set(procs) <= {"docker-init", "sleep", "bash", "timeout", "ps", "sort", "tr"}, procs  # no agent daemon
    assert inside.stdout.count("Read-only file system") == 3, inside.stdout
    assert "staged" in inside.stdout and "uv-cache" in inside.stdout, inside.stdout
    assert out["agent_work"].stdout.split() == ["42", "mine", "work", "writable"], out["agent_work"]
    assert "agentpkg" in out["left"].stdout and "written" not in out["left"].stdout, out["left"]
    assert "link" not in out["left"].stdout and "No such file" in out["left"].stdout, out["left"]
    assert "download cap" in out.get("refused", ""), out
    assert out["agent_after_final"], "a final verification leaves the agent's container running"


def _setup(root: Path, final: bool) -> VerifierSetup:
    (root / "tests").mkdir(parents=True)
    (root / "tests" / "marker").write_text("staged\n")
    (root / "run" / "uv-cache").mkdir(parents=True)
    return VerifierSetup(tests=root / "tests", logs=root / "logs", warnings=root / "warnings", run=root / "run",
                         final=final)


async def _gone(box) -> bool:
    c = di.client()
    try:
        return not c.api.inspect_container(box.container)["State"]["Running"]
    finally:
        c.close()


def test_gc_removes_a_dead_runs_snapshots_and_volumes(task):
    dead = f"{socket.gethostname()}:999999999:1"

    async def image() -> str:
        box = await _box(task)
        await box.stop()
        return box.image

    base = run(image())
    c = di.client()
    try:
        labels = {di.LABEL_KIND: dv.KIND_VOLUME, di.LABEL_OWNER: dead}
        vol = c.api.create_volume(f"conch-verify-test-{os.getpid()}", driver="local", labels=labels)["Name"]
        ct = c.api.create_container(base, entrypoint=["true"], labels={di.LABEL_KIND: "none"})["Id"]
        img = c.api.commit(ct, repository=dv.SNAPSHOT_REPO, tag=f"test-{os.getpid()}",
                           changes=[f"LABEL {di.LABEL_KIND}={dv.KIND_SNAPSHOT}",
                                    f"LABEL {di.LABEL_OWNER}={dead}"])["Id"]
        c.api.remove_container(ct, force=True)
        report = docker_gc()
        assert f"volume {vol}" in report.verifier, report
        assert any(name.endswith(f"test-{os.getpid()}") for name in report.verifier), report
        assert not c.api.images(filters={"label": f"{di.LABEL_OWNER}={dead}"})
        assert img not in {i["Id"] for i in c.api.images()}
    finally:
        c.close()


# ------------------------------------------------------------------------------------------ without an engine


class DictTree:
    """A `TreeReader` over {path: "dir" | "file" | ("link", target)}."""

    def __init__(self, entries: dict) -> None:
        self.entries = entries

    def kind(self, rel):
        e = self.entries.get(rel)
        if e is None:
            return "dir" if any(p.startswith(rel + "/") for p in self.entries) else None
        return e if isinstance(e, str) else "link"

    def listdir(self, rel):
        pre = rel + "/" if rel else ""
        return sorted({p[len(pre):].split("/")[0] for p in self.entries if p.startswith(pre) and p != rel})

    def readlink(self, rel):
        e = self.entries.get(rel)
        return e[1] if isinstance(e, tuple) else None

    def read(self, rel, cap):
        return b"" if self.entries.get(rel) == "file" else None


def test_layout_fixes_what_the_agent_put_in_a_mounts_way():
    pristine = DictTree({"usr/bin/tar": "file", "usr/bin/sh": ("link", "dash"), "usr/bin/dash": "file",
                         "usr/local/sbin": "dir", "lib64": ("link", "usr/lib64"), "opt/conch/x": "file"})
    agent = DictTree({"usr/bin/tar": "dir", "usr/bin/sh": ("link", "dash"), "usr/bin/dash": "file",
                      "usr/local/sbin": ("link", "/tmp"), "lib64": "dir", "opt/conch/x": "file",
                      "opt/conch/evil": "file"})
    entries = [dlayout.Entry("usr/bin/tar", "pristine", "usr/bin/tar", "file"),
               dlayout.Entry("usr/bin/sh", "pristine", "usr/bin/dash", "file"),
               dlayout.Entry("usr/bin/dash", "pristine", "usr/bin/dash", "file"),
               dlayout.Entry("usr/local/sbin/uvx", "mask-file", need="file"),
               dlayout.Entry("opt/conch", "pristine", "opt/conch", "dir"),
               dlayout.Entry("opt/conch/evil", "mask-file", need="file"),  # below a pristine folder: it shows none
               dlayout.Entry("lib64", "link", "usr/lib64", "link")]
    lay = dlayout.layout(entries, pristine, agent)
    assert lay.fixes == [("lib64", "link", "usr/lib64"), ("usr/bin/tar", "file", ""), ("usr/local/sbin", "dir", "")]
    # usr/bin/sh is the agent's link, the same as the image's: its target is bound instead of replacing it
    assert sorted(e.path for e in lay.mounts) == ["opt/conch", "usr/bin/dash", "usr/bin/tar", "usr/local/sbin/uvx"]


def test_layout_around_an_agent_site_folder():
    pristine = DictTree({"py/os.py": "file", "py/encodings/x.py": "file", "py/site-packages/pytest": "file",
                         "py/LICENSE": ("link", "../doc/LICENSE")})
    agent = DictTree({"py/os.py": "file", "py/encodings/x.py": "file", "py/site-packages/pytest": "file",
                      "py/site-packages/mine": "dir", "py/sitecustomize.py": "file", "py/LICENSE": "file",
                      "py/evil": "dir", os.fsdecode(b"py/\xff.pth"): "file"})
    changes = [Change("py", "pristine", "py"), Change("py/site-packages", "agent"),
               Change("py/site-packages/pytest", "pristine", "py/site-packages/pytest")]
    entries = dlayout.entries_of(changes, pristine, agent)
    got = {e.path: e.kind for e in entries}
    assert got == {"py/os.py": "pristine", "py/encodings": "pristine", "py/LICENSE": "link",
                   "py/sitecustomize.py": "mask-file", "py/evil": "mask-dir", os.fsdecode(b"py/\xff.pth"): "mask-file",
                   "py/site-packages/pytest": "pristine"}, got
    lay = dlayout.layout(entries, pristine, agent)
    assert lay.fixes == [("py/LICENSE", "link", "../doc/LICENSE"), (os.fsdecode(b"py/\xff.pth"), "file", "")]


def _whiteout(path: Path) -> None:
    os.mknod(path, 0o600 | 0o020000, os.makedev(0, 0))


def test_layer_stack_reads_layers_as_an_overlay_would(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("whiteouts and opaque folders need root")
    top, mid, low = (tmp_path / n for n in ("top", "mid", "low"))
    for d in (top / "etc", mid / "usr/lib/py", low / "usr/lib/py", low / "usr/lib/gone", low / "etc/opaque"):
        d.mkdir(parents=True)
    (low / "usr/lib/py/a.py").write_text("low")
    (low / "usr/lib/py/b.py").write_text("low")
    (mid / "usr/lib/py/a.py").write_text("mid")
    _whiteout(mid / "usr/lib/py/b.py")
    _whiteout(mid / "usr/lib/gone")
    (low / "etc/opaque/old").write_text("x")
    (top / "etc/opaque").mkdir()
    (top / "etc/opaque/new").write_text("y")
    os.setxattr(top / "etc/opaque", "trusted.overlay.opaque", b"y")
    tree = dlayers.LayerStack([str(top), str(mid), str(low)])
    assert tree.listdir("usr/lib") == ["py"]  # the top layer has no usr/: still listed from below
    assert tree.listdir("usr/lib/py") == ["a.py"] and tree.kind("usr/lib/py/b.py") is None
    assert tree.read("usr/lib/py/a.py", 10) == b"mid" and tree.kind("usr/lib/gone") is None
    assert tree.listdir("etc/opaque") == ["new"]
    assert [p for p, _ in dlayers.stack([str(top), str(mid), str(low)], "usr/lib/py")] == \
        [str(mid / "usr/lib/py"), str(low / "usr/lib/py")]
