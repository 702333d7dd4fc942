"""End to end: `conch train` on a folder of the user's own Harbor tasks (one malformed) with SFT demonstrations
from their solution/solve.sh, then `conch eval --from-run` reproducing the run's final evaluation exactly.
Real CLI, tiny model, real local sandboxes; nothing is faked."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from own_tasks import write_task_set

TINY = [
    "sft.steps=4", "sft.eval_every=2", "sft.batch_size=2", "sft.val_fraction=0.0",
    "critic.iterations=1", "critic.epochs=1",
    "ppo.iterations=1", "ppo.tasks_per_iter=2", "ppo.n_per_task=2", "ppo.epochs=1", "ppo.micro_batch=2",
    "ppo.grad_accum=1", "ppo.concurrency=4",
    "agent.max_turns=2", "agent.max_new_tokens=12",
    "eval.n_per_task=3",
]


def conch(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "conch", *args], capture_output=True, text=True, timeout=900)


def test_train_on_own_tasks_then_eval_from_run(tmp_path, base_root):
    tasks = write_task_set(tmp_path / "tasks", n=7)
    run = tmp_path / "run"
    p = conch("train", "--out", str(run), f"corpus.train_tasks={tasks}", "corpus.split=0.4,0.3,0.3", *TINY)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "skipping malformed task broken-task" in p.stderr
    assert "synthesizing" not in p.stderr  # nothing unrelated is made up when the user names their tasks
    assert "SFT skipped" not in p.stderr

    corpus = json.loads((run / "corpus.done.json").read_text())
    parts = corpus["tasks"]
    assert "broken-task" not in sum(parts.values(), [])
    assert sorted(sum(parts.values(), [])) == sorted(f"word-{w}" for w in
                                                     ("apple", "birch", "cedar", "delta", "ember", "fjord", "grove"))
    assert [len(parts[k]) for k in ("sft", "rl", "eval")] == [3, 2, 2]  # 7 x [0.4, 0.3, 0.3], by task
    demos = [json.loads(line) for line in Path(corpus["trajectories"]).read_text().splitlines()]
    assert sorted(d["task"] for d in demos) == parts["sft"]  # every solution passed and was kept
    calls = [m for m in demos[0]["messages"] if m.get("tool_calls")]
    assert [c["tool_calls"][0]["function"]["arguments"]["command"].split()[0] for c in calls] == \
        ["mkdir", "cd", "cat", "for"]  # one tool call per command of solve.sh; `set -e` and comments dropped
    assert "wrote word-" in demos[0]["messages"][-2]["content"]  # a real observation from the sandbox
    sft = json.loads((run / "sft.done.json").read_text())
    assert sft.get("steps", 0) >= 1 and not sft.get("skipped")

    final = json.loads((run / "evals" / "final.json").read_text())
    assert final["tasks"] == 2 and final["samples"] == 6
    assert final["sampled_tokens_mean"] > 0  # compared below: any change in what was sampled changes it
    e = conch("eval", "--from-run", str(run), "--json")
    assert e.returncode == 0, e.stderr[-3000:]
    figures = lambda d: {k: v for k, v in d.items() if k not in ("policy", "setup")}  # noqa: E731 (cache key)
    assert figures(json.loads(e.stdout.strip().splitlines()[-1])) == figures(final)
    warm = json.loads((run / "evals" / "warm.json").read_text())
    w = conch("eval", "--from-run", str(run), "--stage", "warm", "--json")
    assert w.returncode == 0, w.stderr[-3000:]
    assert figures(json.loads(w.stdout.strip().splitlines()[-1])) == figures(warm)

    # The corpus stage is pinned: a resume may not change it, and says so in one line.
    r = conch("train", "--resume", str(run), "corpus.split=0.2,0.4,0.4")
    assert r.returncode == 2 and "corpus.split cannot change" in r.stderr and "Traceback" not in r.stderr
