"""A run folder left by a kill at any point resumes to exactly one metrics row per iteration, and no JSON the run
reads back (stage markers, evaluation caches) can stop `--resume` with a traceback.

The kill is simulated at every point of the PPO loop's write sequence (metrics row, then checkpoint every
`checkpoint_every` iterations), including a row torn mid-write; the resume then does what `conch train
--resume` does: start after the latest complete checkpoint and `keep_before` that iteration. The real CLI
resuming such a folder (an extra row, an empty evals/init.json) is in tests/test_train_e2e.py.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from conch.rl.checkpoint import atomic_write_text, read_json
from conch.rl.metrics import MetricsLogger, read_metrics
from conch.rl.stages import marker

ITERATIONS, EVERY = 5, 2


def _events() -> list[tuple[str, int]]:
    out = []
    for it in range(ITERATIONS):
        out.append(("log", it))
        if (it + 1) % EVERY == 0 or it + 1 == ITERATIONS:
            out.append(("checkpoint", it))
    return out


def _run(run_dir: Path, events: list[tuple[str, int]], torn: bool = False) -> None:
    """Play `events` against a run folder: metrics rows and a `latest` checkpoint iteration."""
    logger = MetricsLogger(run_dir, stream=io.StringIO())
    latest = run_dir / "latest.json"
    ckpt = read_json(latest, "checkpoint") if latest.exists() else None
    start = ckpt + 1 if isinstance(ckpt, int) else 0
    logger.keep_before(start)  # what `conch train` does before the PPO loop
    for kind, it in events:
        if it < start:
            continue
        if kind == "log":
            logger.log(it, {"reward/mean": float(it)})
        else:
            atomic_write_text(latest, json.dumps(it))
    logger.close()
    if torn:
        with open(run_dir / "metrics.jsonl", "a") as fh:
            fh.write('{"iteration": 99, "rew')


@pytest.mark.parametrize("torn", [False, True])
def test_resume_after_a_kill_at_any_point_gives_one_row_per_iteration(tmp_path, torn):
    events = _events()
    for cut in range(len(events) + 1):
        run_dir = tmp_path / f"cut{cut}-{torn}"
        _run(run_dir, events[:cut], torn=torn)  # killed after `cut` events
        _run(run_dir, events)  # --resume to the end
        its = [r["iteration"] for r in read_metrics(run_dir)]
        assert its == list(range(ITERATIONS)), (cut, its)
        text = (run_dir / "metrics.jsonl").read_text()
        assert text.endswith("\n") and all(json.loads(line) for line in text.splitlines())


def test_keep_before_removes_duplicates_from_older_runs(tmp_path):
    """The issue's run folder: rows [0, 0, 1, 2, 3] (a resume of a version without the fix) and checkpoint 3."""
    rows = [{"iteration": i, "time": 0.0, "reward/mean": float(n)} for n, i in enumerate([0, 0, 1, 2, 3])]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    logger = MetricsLogger(tmp_path, stream=io.StringIO())
    assert logger.keep_before(4) == 1
    logger.close()
    got = read_metrics(tmp_path)
    assert [r["iteration"] for r in got] == [0, 1, 2, 3] and got[0]["reward/mean"] == 1.0  # the later row


@pytest.mark.parametrize("content", ["", "{", "null", "\x00\x00"])
def test_corrupt_json_read_back_is_redone_with_a_warning(tmp_path, capsys, content):
    path = tmp_path / "init.json"
    path.write_text(content)
    assert read_json(path, "evaluation cache") is None
    warned = capsys.readouterr().err
    if content == "null":
        assert warned == ""  # valid JSON: the callers check its type
    else:
        assert warned.startswith(f"conch: warning: {path}: evaluation cache is ") and "redone" in warned
    (tmp_path / "sft.done.json").write_text(content)
    assert marker(tmp_path, "sft") is None
    assert read_json(tmp_path / "missing.json", "x") is None
