"""End to end: the real `conch train` CLI on a minute-sized config (tiny model, real local sandboxes), then
`--resume` continuing from the last complete iteration; and config-time failures."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

TINY = [
    "corpus.n_train=5", "corpus.n_eval=3", "corpus.n_heldout=0", "corpus.n_rl=4",
    "sft.steps=4", "sft.eval_every=2", "sft.batch_size=2",
    "critic.iterations=1", "critic.epochs=1",
    "ppo.iterations=1", "ppo.tasks_per_iter=2", "ppo.n_per_task=2", "ppo.epochs=1", "ppo.micro_batch=2",
    "ppo.grad_accum=1", "ppo.concurrency=4",
    "agent.max_turns=2", "agent.max_new_tokens=12",
    "eval.n_per_task=1",
]


def conch(*args: str, home: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "conch", *args], capture_output=True, text=True, timeout=900)


@pytest.fixture(scope="module")
def home(base_root) -> None:
    """The real CONCH_HOME (base root and toolchain prepared by `make install`)."""
    return None


def test_train_then_resume(tmp_path, home):
    run = tmp_path / "run"
    p = conch("train", "--out", str(run), "--json", *TINY, home=home)
    assert p.returncode == 0, p.stderr[-3000:]
    summary = json.loads(p.stdout.strip().splitlines()[-1])
    assert json.loads((run / "summary.json").read_text()) == summary
    for key in ("pass_rate", "tests_passed_mean"):
        assert set(summary[key]) == {"init", "warm", "final"}
        assert all(0.0 <= v <= (1.0 if key == "pass_rate" else 10.0) for v in summary[key].values())
    assert summary["eval_tasks"] >= 1 and summary["minutes"] > 0
    assert {"logprob_abs_diff", "routing_disagreement"} <= set(summary["mismatch"])
    assert summary["mismatch"]["logprob_abs_diff"] >= 0.0
    assert "pass rate" in p.stderr  # the summary table

    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "stage" not in r]  # the PPO iterations (SFT, critic and evals are "stage" rows)
    assert [r["iteration"] for r in rows] == [0]
    for key in ("reward/mean", "mismatch/logprob_abs_diff", "mismatch/k3_kl", "mismatch/routing_disagreement",
                "train/policy_loss", "train/value_loss", "train/clip_frac", "rollout/turns_mean"):
        assert key in rows[0], key
    sft = json.loads((run / "sft.done.json").read_text())
    assert sft["steps"] >= 1 and sft["val_curve"]
    assert (run / "warm" / "config.json").exists() and (run / "critic.done.json").exists()
    assert (run / "final" / "config.json").exists() and (run / "final" / "tokenizer.json").exists()
    corpus = json.loads((run / "corpus.done.json").read_text())
    assert corpus["rl"] == str(run / "corpus" / "rl")  # PPO's pool: tasks without expert trajectories
    rl_tasks = {p.name for p in (run / "corpus" / "rl").iterdir()}
    assert rl_tasks and not rl_tasks & {p.name for p in (run / "corpus" / "train").iterdir()}
    assert "synthesizing 4 PPO tasks" in p.stderr

    # What a kill leaves: a row logged for iteration 1 without its checkpoint, half a row, an empty eval cache.
    with open(run / "metrics.jsonl", "a") as fh:
        fh.write(json.dumps({**rows[0], "iteration": 1}) + "\n" + '{"iteration": 1, "rew')
    (run / "evals" / "init.json").write_text("")
    # Resume with a larger iteration budget: the stages are skipped and PPO continues at iteration 1.
    # Extending the finished run by two iterations: the final evaluation measures the new policy, not the cached
    # figures of the old one, and the run's minutes count both processes.
    p2 = conch("train", "--resume", str(run), "ppo.iterations=3", home=home)
    assert p2.returncode == 0, p2.stderr[-3000:]
    assert "resumed from" in p2.stderr and "Traceback" not in p2.stderr
    assert "init.json: evaluation cache is empty" in p2.stderr
    assert "SFT warm start" not in p2.stderr and "synthesizing" not in p2.stderr
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in rows if "stage" not in r] == [0, 1, 2]
    assert "evals/final.json measured ppo-1" in p2.stderr and "evaluating final (ppo-3)" in p2.stderr
    assert json.loads((run / "evals" / "final.json").read_text())["policy"] == "ppo-3"
    assert "PPO iteration 3/3:" in p2.stderr and "elapsed" in p2.stderr
    summary2 = json.loads((run / "summary.json").read_text())
    assert summary2["minutes"] > summary["minutes"]
    assert json.loads((run / "time.json").read_text())["processes"] == 2


def test_ctrl_c_stops_with_one_line_and_resume_completes(tmp_path, home):
    """SIGINT to the whole process group, as a terminal sends it, in the middle of PPO: one line naming the
    stage, the last checkpoint and the resume command; exit 130; no traceback; `--resume` then finishes."""
    import os
    import signal
    import time

    run = tmp_path / "run"
    err = tmp_path / "stderr.txt"
    with open(err, "w") as fh:
        proc = subprocess.Popen([sys.executable, "-m", "conch", "train", "--out", str(run), *TINY,
                                 "ppo.iterations=3"], stdout=subprocess.DEVNULL, stderr=fh, start_new_session=True)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and "PPO iteration 1/3:" not in err.read_text():
        assert proc.poll() is None, err.read_text()[-3000:]
        time.sleep(0.5)
    os.killpg(proc.pid, signal.SIGINT)
    rc = proc.wait(timeout=300)
    text = err.read_text()
    assert rc == 130, text[-3000:]
    assert "Traceback" not in text and "exception was never retrieved" not in text, text[-3000:]
    lines = [line for line in text.splitlines() if "interrupted" in line]
    assert len(lines) == 1 and "during PPO iteration" in lines[0], text[-3000:]
    assert f"conch train --resume {run}" in lines[0] and "last checkpoint" in lines[0]
    p = conch("train", "--resume", str(run), home=home)
    assert p.returncode == 0, p.stderr[-3000:]
    assert json.loads((run / "evals" / "final.json").read_text())["policy"] == "ppo-3"


def test_routing_replay_on_a_dense_model_fails_at_config_time(tmp_path, home):
    dense = tmp_path / "dense"
    dense.mkdir()
    (dense / "config.json").write_text(json.dumps({"model_type": "qwen3", "hidden_size": 64}))
    p = conch("train", "--out", str(tmp_path / "run"), f"model.path={dense}", home=home)
    assert p.returncode == 2
    assert "routing_replay" in p.stderr and "no MoE layers" in p.stderr
    assert not (tmp_path / "run" / "corpus").exists()


def test_bad_override_is_a_usage_error(tmp_path, home):
    p = conch("train", "--out", str(tmp_path / "run"), "ppo.no_such_key=1", home=home)
    assert p.returncode == 2 and "ppo.no_such_key" in p.stderr


@pytest.mark.slow
def test_train_on_ray_workers_with_one_step_off_policy(tmp_path, home):
    """`cluster.backend=ray`: PPO's rollouts run on two Ray worker actors (a local Ray instance that conch
    starts itself), the rollout of iteration k+1 overlapping the update of k."""
    pytest.importorskip("ray", reason="ray is not installed (make install pins it)")
    run = tmp_path / "run"
    p = conch("train", "--out", str(run), *TINY, "ppo.iterations=2", "cluster.backend=ray",
              "cluster.rollout_workers=2", "cluster.sandboxes_per_worker=2", "cluster.worker_cpus=0.5",
              "ppo.off_policy_steps=1", "ppo.mask_low=0.5", "ppo.mask_high=2.0", home=home)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "Ray rollout workers" in p.stderr
    rows = [r for line in (run / "metrics.jsonl").read_text().splitlines() if "iteration" in (r := json.loads(line))]
    assert [r["iteration"] for r in rows] == [0, 1]
    assert [r["mismatch/staleness"] for r in rows] == [0, 1]  # iteration 1 was sampled before update 0 landed
    assert rows[1]["sync/bytes"] > 0 and rows[1]["time/sync_s"] >= 0
    assert "train/mismatch_masked_frac" in rows[1]
    assert rows[1]["rollout/trajectories"] == 4
