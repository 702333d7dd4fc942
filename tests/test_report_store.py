"""Kept trajectories (`conch/report/store.py`), the run recorder's stage metrics, the progress helper, the
report's per-task table, and ATIF export / import (`conch/report/atif.py`, validated with harbor's models)."""

from __future__ import annotations

import gzip
import io
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from conch.agent.trajectory import StopReason, Trajectory, Turn
from conch.progress import Progress
from conch.report.hooks import eval_metrics
from conch.report.html import per_task
from conch.report.store import (
    MAX_TOKENS,
    TrajectoryStore,
    family_of,
    make_record,
    read_records,
    routing_disagreements,
)


def episode(turns: int, sampled: int = 20, obs_chars: int = 200, layers: int = 2, k: int = 2,
            seed: int = 0) -> Trajectory:
    """A trajectory shaped like the agent loop's: system, user, then (assistant with a bash call, tool) x turns,
    one token sequence with sampled spans, sampler log-probs and routed experts for every position."""
    rng = np.random.default_rng(seed)
    t = Trajectory(task="make-dirs-0123456789", sample=1)
    t.messages = [{"role": "system", "content": "sys"}, {"role": "user", "content": "Make three folders."}]
    for i in range(turns):
        start = len(t.tokens) + 30
        t.tokens += rng.integers(0, 4000, 30).tolist()          # observation / prompt: inserted
        t.mask += [0] * 30
        t.logprobs += [0.0] * 30
        t.tokens += rng.integers(0, 4000, sampled).tolist()     # the assistant turn: sampled
        t.mask += [1] * sampled
        t.logprobs += (-rng.random(sampled) * 3).tolist()
        cmd = f"mkdir -p /app/d{i}"
        t.turns.append(Turn(start=start, end=start + sampled, finish_reason="stop", command=cmd, exit_code=i % 2,
                            gen_seconds=0.01, env_seconds=0.02))
        t.messages.append({"role": "assistant", "content": f"step {i}",
                           "tool_calls": [{"type": "function", "function": {"name": "bash", "arguments": {"command": cmd}}}]})
        t.messages.append({"role": "tool", "content": "x" * obs_chars + "\n[exit code: 0]"})
    t.routed_experts = rng.integers(0, 64, (len(t.tokens), layers, k)).astype(np.int16)
    t.stop_reason = StopReason.MAX_TURNS
    t.n_passed, t.n_total, t.reward = 2, 3, 2.0
    t.tests = [{"name": "test_outputs.py::test_a", "status": "passed"},
               {"name": "test_outputs.py::test_b", "status": "passed"},
               {"name": "test_outputs.py::test_c", "status": "failed"}]
    t.timings = {"total_seconds": 1.5}
    return t


def test_record_holds_what_a_reader_needs():
    t = episode(3)
    r = make_record(t, "ppo", "ppo", iteration=4, trainer_lp=[x + 0.01 for x in t.logprobs], disagreements=[[31, 1]])
    assert r["family"] == "make-dirs" and r["iteration"] == 4 and not r["solved"]
    assert [s["command"] for s in r["steps"]] == ["mkdir -p /app/d0", "mkdir -p /app/d1", "mkdir -p /app/d2"]
    assert [s["exit_code"] for s in r["steps"]] == [0, 1, 0]
    assert r["steps"][0]["output"].endswith("[exit code: 0]") and r["steps"][0]["span"] == [30, 50]
    assert [x["status"] for x in r["tests"]] == ["passed", "passed", "failed"]
    assert r["tokens"] == t.tokens and r["mask"] == t.mask
    assert r["sampler_lp"] == [round(x, 3) for x in t.logprobs]
    assert r["trainer_lp"][31] == round(t.logprobs[31] + 0.01, 3)
    assert r["routing"]["rows"] == "all" and r["routing"]["dtype"] == "uint8"
    assert r["routing_disagreements"] == [[31, 1]] and r["stop_reason"] == "max_turns" and r["cut"] == []


def test_long_episode_is_bounded(tmp_path):
    """A 300-turn episode with a large MoE's routing (48 layers x top-8) and full observations stays a few MB."""
    t = episode(300, sampled=200, obs_chars=2000, layers=48, k=8)
    store = TrajectoryStore(tmp_path)
    with store.writer("ppo-iter0000", "ppo", "ppo", 0) as keep:
        keep(t, trainer_lp=t.logprobs)
    size = (tmp_path / "trajectories" / "ppo-iter0000.jsonl.gz").stat().st_size
    rec = next(read_records(tmp_path))
    assert len(rec["tokens"]) == MAX_TOKENS < len(t.tokens)
    assert rec["routing"] is None and any("routing omitted" in c for c in rec["cut"])
    assert len(rec["steps"]) == 300
    assert size < 4_000_000, size


def test_read_records_opens_a_raw_rollout_file(tmp_path):
    """`conch rollout --out` / `conch eval --out` write raw trajectories, one JSON per line."""
    f = tmp_path / "rollouts.jsonl"
    f.write_text("\n".join(episode(2, seed=s).dumps() for s in range(2)) + "\n{torn")
    recs = list(read_records(f))
    assert len(recs) == 2 and {r["stage"] for r in recs} == {"rollout"} and recs[0]["name"] == "rollouts"
    assert recs[0]["steps"][1]["command"] == "mkdir -p /app/d1"


def test_keep_ppo_samples_and_rewrites(tmp_path):
    class P:  # rl.update.Prepared, the fields keep_ppo reads
        def __init__(self, traj):
            self.traj, self.old_lp = traj, torch.tensor(traj.logprobs)
            self.route_diff = torch.tensor([[30, 0]])

    store = TrajectoryStore(tmp_path)
    prepared = [P(episode(1, seed=s)) for s in range(6)]
    store.keep_ppo(0, prepared, keep=2)
    assert len(list(read_records(tmp_path))) == 2
    store.keep_ppo(0, prepared, keep=-1)  # a resumed iteration rewrites its file
    recs = list(read_records(tmp_path))
    assert len(recs) == 6 and all(r["trainer_lp"] and r["routing_disagreements"] == [[30, 0]] for r in recs)
    assert store.seconds > 0 and store.records == 8


def test_routing_disagreements_compare_sets_on_sampled_tokens():
    own = torch.tensor([[[1, 2], [3, 4]], [[1, 2], [5, 6]], [[0, 1], [0, 1]]])
    rec = torch.tensor([[[2, 1], [3, 5]], [[1, 2], [6, 5]], [[0, 2], [-1, 1]]])
    got = routing_disagreements(own, rec, torch.tensor([1, 1, 0]))
    assert got.tolist() == [[0, 1]]  # set order ignored; masked token and -1 rows not compared
    got = routing_disagreements(own, rec, torch.tensor([1, 1, 1]))
    assert got.tolist() == [[0, 1], [2, 0]]


def test_family_of():
    assert family_of("csv-join-ce7208f04a") == "csv-join" and family_of("my-task") == "my-task"


def test_eval_metrics_per_family():
    m = eval_metrics("warm", {"a-0123456789": {"pass_rate": 1.0}, "a-9876543210": {"pass_rate": 0.0},
                              "b-0123456789": {"pass_rate": 0.5}}, 0.5, 1.2)
    assert m == {"eval/warm/pass_rate": 0.5, "eval/warm/tests_passed_mean": 1.2, "eval/warm/errors": 0.0,
                 "eval/warm/family/a/pass_rate": 0.5, "eval/warm/family/b/pass_rate": 0.5}


def test_eval_metrics_leave_out_what_no_episode_measured():
    """A task that errored on every sample has no pass rate: it is not a zero in its family's mean."""
    m = eval_metrics("final", {"a-0123456789": {"pass_rate": 1.0}, "a-9876543210": {"pass_rate": None}}, None, None, 3)
    assert m == {"eval/final/errors": 3.0, "eval/final/family/a/pass_rate": 1.0}


def test_progress_plain_lines_when_not_a_terminal():
    out = io.StringIO()
    p = Progress(3, "eval warm", stream=out, every_s=3600)
    for _ in range(3):
        p.update(info="t")
    lines = out.getvalue().splitlines()
    assert len(lines) == 2 and lines[0].startswith("eval warm 1/3") and "ETA" in lines[0]
    assert lines[1].startswith("eval warm 3/3 100%") and "done" in lines[1] and "\r" not in out.getvalue()


def test_progress_bar_on_a_terminal():
    out = io.StringIO()
    p = Progress(2, "SFT", stream=out, tty=True)
    p.update()
    p.update()
    assert out.getvalue().count("\r") == 2 and "[" + "#" * 24 + "]" in out.getvalue() and out.getvalue().endswith("\n")


def test_per_task_table_marks_changes(tmp_path):
    (tmp_path / "evals").mkdir()
    for name, rates in (("init", {"a": 0.0, "b": 1.0, "c": 0.0}), ("warm", {"a": 0.5, "b": 1.0, "c": 0.0}),
                        ("final", {"a": 1.0, "b": 0.0, "c": 0.25})):
        (tmp_path / "evals" / f"{name}.json").write_text(json.dumps(
            {"pass_rate": 0, "per_task": {t: {"pass_rate": v} for t, v in rates.items()}}))
    pt = per_task(tmp_path, [])
    assert pt["columns"] == ["init", "warm", "final"]
    assert {r["task"]: r["change"] for r in pt["rows"]} == {"a": "fail→pass", "b": "pass→fail", "c": ""}


# ---------------------------------------------------------------- ATIF

harbor = pytest.importorskip("harbor.models.trajectories", reason="harbor==0.25.0 (make install) not installed")


def test_atif_export_validates_and_import_keeps_messages(tmp_path):
    from harbor.utils.trajectory_validator import TrajectoryValidator

    from conch.report.atif import atif_to_messages, export

    t = episode(3)
    t.messages.insert(4, {"role": "assistant", "content": "<tool_call>{bad"})  # a parse error turn...
    t.messages.insert(5, {"role": "tool", "content": "Error: tool call is not valid JSON"})
    t.messages.append({"role": "assistant", "content": "Done."})
    t.turns.insert(1, Turn(start=0, end=0, finish_reason="stop", parse_error="not JSON"))
    rec = make_record(t, "eval", "final")
    paths = export([rec], tmp_path / "atif", model_name="tiny")
    assert [p.relative_to(tmp_path / "atif").as_posix() for p in paths] == ["eval-final/make-dirs-0123456789-1.json"]
    v = TrajectoryValidator()
    assert v.validate(paths[0]), v.errors
    doc = json.loads(paths[0].read_text())
    agent_steps = [s for s in doc["steps"] if s["source"] == "agent"]
    assert agent_steps[0]["tool_calls"][0]["arguments"] == {"command": "mkdir -p /app/d0"}
    assert agent_steps[0]["observation"]["results"][0]["source_call_id"] == agent_steps[0]["tool_calls"][0]["tool_call_id"]
    assert agent_steps[0]["metrics"]["completion_token_ids"] == t.tokens[30:50]
    assert agent_steps[1]["observation"]["results"][0].get("source_call_id") is None  # the parse error
    assert doc["extra"]["tests"][2] == {"name": "test_outputs.py::test_c", "status": "failed"}
    assert atif_to_messages(paths[0]) == t.messages
    assert atif_to_messages(doc) == t.messages


def test_atif_import_rejects_an_invalid_trajectory():
    from pydantic import ValidationError

    from conch.report.atif import atif_to_messages

    with pytest.raises(ValidationError):
        atif_to_messages({"schema_version": "ATIF-v1.8", "agent": {"name": "x", "version": "1"},
                          "steps": [{"step_id": 2, "source": "user", "message": "hi"}]})


def test_progress_created_late_measures_from_its_first_update():
    out = io.StringIO()
    p = Progress(10, "SFT", stream=out, every_s=0, late=True)
    p.update()
    assert "ETA ?" in out.getvalue()  # one point is no rate
    p.update()
    assert "ETA " in out.getvalue().splitlines()[-1] and "?" not in out.getvalue().splitlines()[-1]


def test_curves_keep_the_last_attempt_of_a_resumed_stage():
    from conch.report.curves import last_attempt

    sft = [{"step": s} for s in (1, 2, 3, 1, 2)]  # SFT interrupted at step 3, run again
    assert [r["step"] for r in last_attempt(sft, "step")] == [1, 2]
    ppo = [{"iteration": 0, "v": 1}, {"iteration": 1, "v": 2}, {"iteration": 1, "v": 3}]
    assert [r["v"] for r in last_attempt(ppo, "iteration")] == [1, 3]


def test_ppo_iteration_keeps_excluded_pairs(tmp_path):
    """The reward partition hands excluded rollouts as (trajectory, reason) pairs; keeping them must not crash
    (it did: `'tuple' object has no attribute 'tokens'` in the first iteration with an errored rollout)."""
    from conch.report.hooks import RunRecorder

    class P:
        def __init__(self, traj):
            self.traj, self.old_lp = traj, torch.tensor(traj.logprobs)
            self.route_diff = torch.tensor([[0, 0]])

    broken = episode(1, seed=9)
    broken.verifier_error, broken.verifier_fault = "verifier could not collect its tests", "infra"
    rec = RunRecorder(tmp_path, metrics=None, keep_rollouts=-1)
    rec.ppo_iteration(0, [P(episode(1, seed=1))], [(broken, "verifier error: ...")])
    recs = list(read_records(tmp_path))
    assert len(recs) == 2 and {r["verifier_fault"] for r in recs} == {None, "infra"}
