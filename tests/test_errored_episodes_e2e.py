"""End to end: `conch train` on the user's own tasks where some episodes cannot be scored, as offline
Terminal-Bench tasks often cannot: one task's tests import a module the box lacks (its verifier errors on every
sample) and another task's sandbox is killed from outside while its episodes run (the test kills the box's
bwrap process with SIGKILL, as the kernel's OOM killer or a lost node would). The run must finish, count and
keep the errored episodes with their reason, show them in the report, and update PPO on the rest.

Real CLI, tiny model, real local sandboxes; the only thing the test does to the run is the kill."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from conch.report.store import read_records
from own_tasks import write_task

TINY = [
    "sft.steps=2", "sft.eval_every=2", "sft.batch_size=2", "sft.val_fraction=0.0",
    "critic.iterations=1", "critic.epochs=1",
    "ppo.iterations=1", "ppo.tasks_per_iter=4", "ppo.n_per_task=2", "ppo.epochs=1", "ppo.micro_batch=2",
    "ppo.grad_accum=1", "ppo.concurrency=4",
    "agent.max_turns=3", "agent.max_new_tokens=12",
    "eval.n_per_task=2", "run.keep_rollouts=-1",
]
DOOMED = "doomed-box"
MISSING = "import conch_module_the_box_lacks\n\n"


def _box_killer(stop: threading.Event, killed: list[int], age: float = 0.4) -> None:
    """SIGKILL every bwrap of the doomed task once it has lived `age` seconds (its episode is under way)."""
    seen: dict[int, float] = {}
    while not stop.is_set():
        for pid_dir in Path("/proc").iterdir():
            if not pid_dir.name.isdigit():
                continue
            try:
                argv = (pid_dir / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if not argv or not argv[0].endswith(b"bwrap") or f"{DOOMED}".encode() not in b" ".join(argv):
                continue
            pid = int(pid_dir.name)
            first = seen.setdefault(pid, time.monotonic())
            if time.monotonic() - first >= age and pid not in killed:
                try:
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
                except OSError:
                    pass
        time.sleep(0.05)


def test_errored_episodes_are_counted_kept_and_shown_and_ppo_trains_on_the_rest(tmp_path, base_root):
    train, evals = tmp_path / "train", tmp_path / "eval"
    for name, word in (("word-apple", "apple"), ("word-birch", "birch"), (DOOMED, "cedar")):
        write_task(train, name, word)
    broken = write_task(train, "needs-missing-module", "delta")
    (broken / "tests" / "test_outputs.py").write_text(MISSING + (broken / "tests" / "test_outputs.py").read_text())
    write_task(evals, "word-ember", "ember")
    broken_eval = write_task(evals, "eval-needs-missing-module", "fjord")
    (broken_eval / "tests" / "test_outputs.py").write_text(
        MISSING + (broken_eval / "tests" / "test_outputs.py").read_text())

    run = tmp_path / "run"
    stop, killed = threading.Event(), []
    killer = threading.Thread(target=_box_killer, args=(stop, killed), daemon=True)
    killer.start()
    try:
        p = subprocess.run([sys.executable, "-m", "conch", "train", "--out", str(run),
                            f"corpus.train_tasks={train}", f"corpus.eval_tasks={evals}", *TINY],
                           capture_output=True, text=True, timeout=900)
    finally:
        stop.set()
        killer.join()
    assert p.returncode == 0, p.stderr[-3000:]
    assert "Traceback" not in p.stderr, p.stderr[-3000:]
    assert killed, "the doomed task's sandbox was never seen running"

    # PPO updated on the episodes that ran; the errored ones are counted apart.
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    ppo = [r for r in rows if "stage" not in r]
    assert [r["iteration"] for r in ppo] == [0]
    row = ppo[0]
    assert row["rollout/excluded"] >= 4, row  # both samples of both broken tasks, at least
    assert row["rollout/excluded"] < 8, row  # the good tasks' episodes were trained on
    assert math.isfinite(row["train/policy_loss"]) and math.isfinite(row["train/value_loss"]), row
    assert (run / "final" / "config.json").exists()

    # Kept with their reason: every episode of the broken tasks in PPO is stored, each with its error.
    recs = [r for r in read_records(run) if r.get("stage") == "ppo"]
    by_task: dict[str, list[dict]] = {}
    for r in recs:
        by_task.setdefault(r["task"], []).append(r)
    for name in (DOOMED, "needs-missing-module"):
        assert len(by_task.get(name, [])) == 2, (name, sorted(by_task))
        for r in by_task[name]:
            reason = r.get("error") or r.get("verifier_error") or ""
            assert reason and not r["solved"], r
    assert any("conch_module_the_box_lacks" in (r.get("verifier_error") or r.get("error") or "")
               for r in by_task["needs-missing-module"]), by_task["needs-missing-module"]
    assert all(not (r["error"] or r["verifier_error"]) for name in ("word-apple", "word-birch")
               for r in by_task.get(name, []))

    # Evaluations: figures over the episodes that ran, errors beside them, the always-failing task named once.
    final = json.loads((run / "evals" / "final.json").read_text())
    assert final["errors"] == 2 and list(final["error_tasks"]) == ["eval-needs-missing-module"], final
    assert "conch_module_the_box_lacks" in final["error_tasks"]["eval-needs-missing-module"], final
    assert final["samples"] == 4 and final["pass_rate"] is not None, final  # over the 2 that ran
    assert "2 of 4 episodes ran; 2 errors not counted" in p.stderr, p.stderr[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["eval_errors"]["final"] == 2, summary

    # The report shows them, with their reason.
    out = tmp_path / "report.html"
    r = subprocess.run([sys.executable, "-m", "conch", "report", str(run), "--out", str(out), "--no-png"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    html = out.read_text()
    assert DOOMED in html and "conch_module_the_box_lacks" in html
