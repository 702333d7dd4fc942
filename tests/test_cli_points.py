"""The smaller CLI points of issue 35, each held by a test: `check --strict`, `task new`, `report` of a file that
is not a run, `synth --sandbox` (and its deprecated `--backend`), one default seed for `rollout` and `eval`,
ATIF ids without Python values, a tests SyntaxError named by file and line, the README's library snippet.
(`decontam`'s exit status 3 is in tests/test_decontam.py, the bare-base warning in tests/test_adversarial.py.)
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from test_cli_errors import one_line_error  # the suite's one-line error check

REPO = Path(__file__).resolve().parents[1]


def conch(*args: str, timeout: float = 300, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "conch", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=timeout)


def new_task(parent: Path, name: str) -> Path:
    p = conch("task", "new", name, "--dir", str(parent))
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == str(parent / name)
    return parent / name


# ---------------------------------------------------------------- conch task new


def test_task_new_writes_a_harbor_skeleton_that_passes_check(tmp_path, base_root):
    task = new_task(tmp_path / "tasks", "hello-task")  # --dir is created when missing
    for rel in ("task.toml", "instruction.md", "environment/Dockerfile", "tests/test.sh", "tests/test_outputs.py",
                "solution/solve.sh"):
        assert (task / rel).is_file(), rel
    examples = {(d / "environment" / "Dockerfile").read_text().splitlines()[0]
                for d in (REPO / "examples" / "tasks").iterdir() if (d / "environment" / "Dockerfile").is_file()}
    assert (task / "environment" / "Dockerfile").read_text().splitlines()[0] in examples
    test_sh = (task / "tests" / "test.sh").read_text()
    assert "--ctrf /logs/verifier/ctrf.json" in test_sh and "/logs/verifier/reward.txt" in test_sh
    p = conch("check", str(task), "--json", "--strict")
    assert p.returncode == 0, p.stderr[-3000:]
    [r] = json.loads(p.stdout)
    assert r["error"] is None and r["n_passed"] == r["n_total"] == 2 and r["reward"] == 1.0
    assert r["nop_passed"] == 0  # an agent that does nothing fails it
    p = conch("check", str(task), "--agent", "nop", "--json")
    [r] = json.loads(p.stdout)
    assert r["error"] is None and r["n_passed"] == 0 and r["reward"] == 0.0


def test_task_new_refuses_an_existing_folder_and_a_bad_name(tmp_path):
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "keep.txt").write_text("mine")
    one_line_error(conch("task", "new", "taken", "--dir", str(tmp_path)), str(tmp_path / "taken"), "already exists")
    assert [f.name for f in (tmp_path / "taken").iterdir()] == ["keep.txt"]
    for bad in ("Bad-Name", "a/b", "..", "_x", "x-", "x" * 65, "with space"):
        one_line_error(conch("task", "new", bad, "--dir", str(tmp_path)), "invalid task name")
    assert sorted(f.name for f in tmp_path.iterdir()) == ["taken"]  # nothing written, no temporary folder left
    (tmp_path / "file").write_text("")
    one_line_error(conch("task", "new", "ok", "--dir", str(tmp_path / "file")), "--dir", "not a folder")


# ---------------------------------------------------------------- conch check --strict


def test_strict_verdict_counts_errors_and_oracle_failures():
    from types import SimpleNamespace as R

    from conch.commands.check import strict_verdict

    ok = R(error=None, n_passed=2, n_total=2, reward=1.0)
    partial = R(error=None, n_passed=1, n_total=2, reward=0.0)
    low = R(error=None, n_passed=2, n_total=2, reward=0.5)  # every test passed, the task's reward says otherwise
    err = R(error="verifier could not run", n_passed=0, n_total=2, reward=None)
    assert strict_verdict([ok, ok], "oracle") == (False, "strict: all 2 tasks passed")
    assert strict_verdict([ok, partial, low, err], "oracle") == (
        True, "strict: 3 of 4 tasks failed (1 errors, 2 oracle not passing)")
    nothing = R(error=None, n_passed=0, n_total=2, reward=0.0)
    assert strict_verdict([nothing], "nop") == (False, "strict: all 1 tasks passed")
    assert strict_verdict([ok, nothing], "nop") == (True, "strict: 1 of 2 tasks failed (0 errors, 1 nop passing fully)")


def test_check_strict_exits_3_with_the_reason_last(tmp_path, base_root):
    root = tmp_path / "tasks"
    new_task(root, "good")
    wrong = new_task(root, "wrong-oracle")
    (wrong / "solution" / "solve.sh").write_text("#!/bin/bash\necho nope > /app/greeting.txt\n")
    broken = new_task(root, "broken")
    (broken / "task.toml").write_text("[task\n")  # does not load: an error
    p = conch("check", str(root), "--no-nop")
    assert p.returncode == 0, p.stderr[-3000:]  # without --strict failing tasks are results
    assert not p.stdout.strip().splitlines()[-1].startswith("strict:")
    p = conch("check", str(root), "--no-nop", "--strict")
    assert p.returncode == 3, p.stderr[-3000:]
    assert p.stdout.strip().splitlines()[-1] == "strict: 2 of 3 tasks failed (1 errors, 1 oracle not passing)"
    p = conch("check", str(root), "--no-nop", "--strict", "--json")
    assert p.returncode == 3
    assert len(json.loads(p.stdout)) == 3  # stdout stays JSON; the verdict is stderr's last line
    assert p.stderr.strip().splitlines()[-1] == "strict: 2 of 3 tasks failed (1 errors, 1 oracle not passing)"
    help_text = conch("check", "--help").stdout
    assert "--strict" in help_text and "exit 3" in re.sub(r"\s+", " ", help_text)


# ---------------------------------------------------------------- a SyntaxError in a task's tests


def test_syntax_error_names_file_and_line_and_the_batch_goes_on(tmp_path, base_root):
    root = tmp_path / "tasks"
    new_task(root, "fine")
    bad = new_task(root, "bad-syntax")
    test_file = bad / "tests" / "test_outputs.py"
    lines = test_file.read_text().splitlines()
    lines.insert(4, "def broken(:")
    test_file.write_text("\n".join(lines) + "\n")
    p = conch("check", str(root), "--json", "--no-nop")
    assert p.returncode == 0, p.stderr[-3000:]
    by = {r["task"]: r for r in json.loads(p.stdout)}
    assert by["fine"]["error"] is None and by["fine"]["n_passed"] == 2
    assert "tests/test_outputs.py:5: SyntaxError: invalid syntax" in by["bad-syntax"]["error"], by["bad-syntax"]


def test_locate_syntax_error_from_pytest_output_or_the_files(tmp_path):
    from conch.verify_check import locate_syntax_error, syntax_errors

    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "test_a.py").write_text("def test_a():\n    assert True\n")
    (tests / "test_b.py").write_text("x = 1\n\ndef oops(:\n    pass\n")
    assert syntax_errors(tests) == ["tests/test_b.py:3: SyntaxError: invalid syntax"]
    output = ('E     File "/tests/test_b.py", line 3\nE       def oops(:\nE               ^\n'
              "E   SyntaxError: invalid syntax\n")
    assert locate_syntax_error("SyntaxError: invalid syntax", output, tests) == \
        "tests/test_b.py:3: SyntaxError: invalid syntax"
    assert locate_syntax_error("SyntaxError: invalid syntax", "", tests) == \
        "tests/test_b.py:3: SyntaxError: invalid syntax"  # pytest said no more: the files say where
    assert locate_syntax_error("ModuleNotFoundError: No module named 'x'", output, tests) == \
        "ModuleNotFoundError: No module named 'x'"


# ---------------------------------------------------------------- conch report of a file that is not a run


def test_report_refuses_a_file_that_is_not_a_run_or_trajectories(tmp_path):
    afile = tmp_path / "afile.txt"
    afile.write_text("hello\n")
    one_line_error(conch("report", str(afile)), str(afile), "not a run folder", "metrics.jsonl")
    assert not (tmp_path / "afile.html").exists()
    other = tmp_path / "other.jsonl"
    other.write_text('{"a": 1}\n')
    one_line_error(conch("report", str(other)), str(other), "not a run folder")
    (tmp_path / "empty").mkdir()
    one_line_error(conch("report", str(tmp_path / "empty")), "not a run folder")


# ---------------------------------------------------------------- conch synth --sandbox


def test_synth_takes_sandbox_and_the_old_backend_flag_warns(monkeypatch, capsys, tmp_path):
    import conch.tasks.synth as synth
    from conch.cli import main
    from conch.sandbox import BACKENDS

    seen = []

    def fake_synthesize(out, n, seed, fams, **kw):
        seen.append(kw["backend"])
        return type("Report", (), {"kept": [None] * n, "trajectories": 0})()

    monkeypatch.setattr(synth, "synthesize", fake_synthesize)
    monkeypatch.setattr(synth, "summary_lines", lambda report, fams: [])
    base = ["synth", "--out", str(tmp_path / "out"), "--n", "1"]
    assert main([*base, "--sandbox", "docker"]) == 0
    assert "deprecated" not in capsys.readouterr().err
    assert main(base) == 0
    assert main([*base, "--backend", "docker"]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--backend" in err[0] and "deprecated" in err[0] and "--sandbox" in err[0]
    assert seen == ["docker", "local", "docker"]
    p = conch("synth", "--out", str(tmp_path / "x"), "--sandbox", "qemu")
    assert p.returncode == 2 and "invalid choice" in p.stderr
    help_text = conch("synth", "--help").stdout
    assert "--sandbox" in help_text and "--backend {" not in help_text
    assert all(b in help_text for b in BACKENDS)


# ---------------------------------------------------------------- seeds


def test_rollout_and_eval_default_to_the_seed_of_trainings_evaluations():
    from conch.cli import build_parser
    from conch.commands.eval import EVAL_SEED

    parser = build_parser()
    rollout = parser.parse_args(["rollout", "--tasks", "t", "--out", "o.jsonl"])
    evaluate = parser.parse_args(["eval", "--tasks", "t"])
    assert rollout.seed == evaluate.seed == EVAL_SEED == 11
    assert "seed=11" in (REPO / "conch" / "rl" / "train.py").read_text().replace(" ", "")  # what training uses
    assert "default 11" in conch("rollout", "--help").stdout


def test_eval_and_rollout_on_the_tiny_model_take_the_demo_preset_and_print_errors_not_zeros(tmp_path, base_root):
    """`conch eval --preset demo` runs the demo's agent settings (its log line says the resolved context, never
    "context 0"); a task whose tests cannot be collected prints as an error, not a 0 and not a crash. `conch
    rollout` without --model (the embedded tiny model) says it uses the demo preset's agent settings."""
    from conch.model.init import cached_model
    from own_tasks import write_task

    task = write_task(tmp_path / "tasks", "needs-missing-module", "apple")
    tests = task / "tests" / "test_outputs.py"
    tests.write_text("import conch_module_the_box_lacks\n" + tests.read_text())
    p = conch("eval", "--model", str(cached_model()), "--tasks", str(tmp_path / "tasks"), "--preset", "demo",
              "--n-per-task", "1", timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "4 turns of 64 tokens, context 2048 tokens" in p.stderr and "context 0" not in p.stderr
    assert "needs-missing-module" in p.stdout and "error:" in p.stdout and "conch_module_the_box_lacks" in p.stdout
    assert "no episode ran (0 of 1 episodes ran; 1 error not counted)" in p.stdout
    one_line_error(conch("eval", "--from-run", str(tmp_path), "--preset", "demo"), "--preset", "--from-run")
    r = conch("rollout", "--tasks", str(tmp_path / "tasks"), "--out", str(tmp_path / "r.jsonl"), "--json",
              timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "demo preset's agent settings" in r.stderr
    [traj] = [json.loads(line) for line in (tmp_path / "r.jsonl").read_text().splitlines()]
    assert len(traj["turns"]) <= 4


# ---------------------------------------------------------------- ATIF ids


def test_atif_ids_carry_no_python_values(tmp_path):
    pytest.importorskip("harbor.models.trajectories", reason="harbor==0.25.0 (make install) not installed")
    from conch.agent.trajectory import Trajectory
    from conch.report.atif import export, to_atif
    from conch.report.store import make_record

    t = Trajectory(task="word-count", sample=2, mode="tito",
                   messages=[{"role": "system", "content": "sys"}, {"role": "user", "content": "do it"}])
    ids = {}
    for args in (("eval", "init"), ("ppo", "ppo", 3), ("ppo", "ppo"), ("rollout", "mine")):
        traj = to_atif(make_record(t, *args))
        ids[args] = (traj.session_id, traj.trajectory_id)
    assert ids == {
        ("eval", "init"): ("word-count-2", "eval-init-word-count-2"),
        ("ppo", "ppo", 3): ("word-count-2", "ppo-iter0003-word-count-2"),
        ("ppo", "ppo"): ("word-count-2", "ppo-word-count-2"),
        ("rollout", "mine"): ("word-count-2", "rollout-mine-word-count-2"),
    }
    for session, trajectory in ids.values():
        assert "None" not in session + trajectory
    paths = export([make_record(t, "eval", "init")], tmp_path)
    assert [p.relative_to(tmp_path).as_posix() for p in paths] == ["eval-init/word-count-2.json"]


# ---------------------------------------------------------------- README's library snippet


def test_readme_library_snippet_runs(base_root):
    """The README's `Use conch as a library` code block, as written: a task, then one agent episode with an engine
    and a codec built the documented way, on the embedded tiny model."""
    readme = (REPO / "README.md").read_text()
    section = readme[readme.index("## Use conch as a library"):]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    assert "build_engine(" in code and "ChatCodec(" in code and "run_one(" in code
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    first, second = p.stdout.strip().splitlines()[-2:]
    assert first.startswith("0 5 ")  # `ls` solves nothing: 0 of the task's 5 tests
    stop, n_passed, n_total, n_tokens = second.split()
    from conch.agent.trajectory import StopReason

    assert stop in {r.value for r in StopReason} - {"error"}, second  # a value, not `StopReason.FINISHED`
    assert n_total == "5" and int(n_tokens) > 0
