"""Metrics logger: JSONL records, key validation, the live table, optional backends absent or faked."""

import io
import json
import sys
import types

import pytest
import torch

from conch.rl.metrics import MetricsLogger, MetricsTable, format_value, namespaced, read_metrics


def test_jsonl_one_flushed_line_per_iteration(tmp_path):
    log = MetricsLogger(tmp_path, stream=io.StringIO())
    log.log(0, {"reward/mean": 2.5, "train/policy_loss": torch.tensor(-0.125), "stop/max_turns": 3,
                "eval/note": "ok"})
    # Flushed before close: a crashed run keeps what it logged.
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 1
    rec = json.loads(lines[0])
    assert rec["iteration"] == 0 and rec["reward/mean"] == 2.5 and rec["train/policy_loss"] == -0.125
    assert rec["stop/max_turns"] == 3 and rec["eval/note"] == "ok" and rec["time"] > 0
    log.log(1, {"train/policy_loss": float("nan"), "train/approx_kl": float("inf")})
    log.close()
    recs = read_metrics(tmp_path)
    assert [r["iteration"] for r in recs] == [0, 1]
    assert recs[1]["train/policy_loss"] is None and recs[1]["train/approx_kl"] is None  # strict JSON
    # Appends across restarts; a torn last line (crash mid-write) is skipped by the reader.
    with MetricsLogger(tmp_path, stream=io.StringIO()) as again:
        again.log(2, {"reward/mean": 1})
    with open(tmp_path / "metrics.jsonl", "a") as fh:
        fh.write('{"iteration": 3, "rew')
    assert [r["iteration"] for r in read_metrics(tmp_path)] == [0, 1, 2]


def test_keys_are_validated(tmp_path):
    with MetricsLogger(tmp_path, stream=io.StringIO()) as log:
        for bad in ("loss", "foo/bar", "train/", "/x"):
            with pytest.raises(ValueError, match="namespace"):
                log.log(0, {bad: 1.0})
        with pytest.raises(TypeError, match="shape"):
            log.log(0, {"train/loss": torch.ones(3)})
    assert namespaced("sandbox", {"start_s": 1.0}) == {"sandbox/start_s": 1.0}
    with pytest.raises(ValueError):
        namespaced("misc", {"a": 1})


def test_format_value():
    assert format_value(None) == "-"
    assert format_value(3) == "3"
    assert format_value(True) == "1"
    assert format_value(0.123456) == "0.1235"
    assert format_value(1234567.0) == "1.235e+06"
    assert format_value(-2.5e-7) == "-2.5e-07"
    assert format_value(float("nan")) == "nan"
    assert format_value(float("-inf")) == "-inf"


def test_table_layout():
    table = MetricsTable([("reward/mean", "reward"), ("train/approx_kl", "kl"), ("time/iteration_s", "s/it")],
                         header_every=2)
    out = table.lines(0, {"reward/mean": 1.5, "train/approx_kl": 0.000123456})
    assert out[0].split() == ["iter", "reward", "kl", "s/it"]
    assert out[1].split() == ["0", "1.5", "0.0001235", "-"]
    assert len(out[0]) == len(out[1])  # columns line up
    assert len(table.lines(1, {})) == 1  # no header
    again = table.lines(2, {"reward/mean": -123456.0, "time/iteration_s": 12.0})
    assert len(again) == 2 and again[1].split() == ["2", "-1.235e+05", "-", "12"]
    assert len(again[1]) == len(again[0])


def test_table_goes_to_stream(tmp_path):
    stream = io.StringIO()
    with MetricsLogger(tmp_path, stream=stream, columns=[("reward/mean", "reward")]) as log:
        log.log(7, {"reward/mean": 0.5, "train/policy_loss": 1.0})
    assert stream.getvalue().splitlines() == [f"{'iter':>6} {'reward':>10}", f"{7:>6} {0.5:>10}"]


def test_missing_backends_warn_not_crash(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # import raises ImportError
    monkeypatch.setitem(sys.modules, "wandb", None)
    with pytest.warns(RuntimeWarning) as warned:
        log = MetricsLogger(tmp_path, stream=io.StringIO(), tensorboard=True, wandb=True)
    text = " ".join(str(w.message) for w in warned)
    assert "tensorboard" in text and "wandb" in text
    log.log(0, {"reward/mean": 1.0})
    log.close()
    assert read_metrics(tmp_path)[0]["reward/mean"] == 1.0


def test_wandb_receives_metrics(tmp_path, monkeypatch):
    """Each stage has its own W&B x axis (define_metric), so SFT steps logged before PPO never hold back PPO's
    iterations; nothing passes `step=` (which W&B requires to increase across all logs)."""
    calls = {}

    class Run:
        def log(self, data, step=None):
            calls.setdefault("log", []).append((step, data))

        def define_metric(self, name, step_metric=None):
            calls.setdefault("define", {})[name] = step_metric

        def finish(self):
            calls["finished"] = True

    fake = types.ModuleType("wandb")
    fake.init = lambda **kw: calls.setdefault("init", kw) and Run()
    monkeypatch.setitem(sys.modules, "wandb", fake)
    with MetricsLogger(tmp_path, stream=io.StringIO(), wandb=True, config={"lr": 1e-6}, wandb_project="p",
                       wandb_run_name="r", wandb_mode="offline") as log:
        log.log_event("sft", 3, {"sft/loss": 2.5})
        log.log(4, {"reward/mean": 2.0, "eval/pass_at_1": 0.25})
    assert calls["init"]["config"] == {"lr": 1e-6} and calls["init"]["project"] == "p"
    assert calls["init"]["name"] == "r" and calls["init"]["mode"] == "offline"
    assert calls["define"]["sft/*"] == "sft/step" and calls["define"]["reward/*"] == "iteration"
    assert calls["log"] == [(None, {"sft/loss": 2.5, "sft/step": 3}),
                            (None, {"iteration": 4, "reward/mean": 2.0, "eval/pass_at_1": 0.25})]
    assert calls["finished"]


def test_stage_events_share_the_file_but_not_the_ppo_rows(tmp_path):
    with MetricsLogger(tmp_path, stream=io.StringIO()) as log:
        log.log_event("sft", 1, {"sft/loss": 3.0, "sft/lr": 1e-4})
        log.log_event("eval", 0, {"eval/warm/pass_rate": 0.5, "eval/warm/family/make-dirs/pass_rate": 1.0})
        log.log(0, {"reward/mean": 1.0})
        with pytest.raises(ValueError):
            log.log_event("sft", 2, {"loss": 1.0})
    assert [r["iteration"] for r in read_metrics(tmp_path)] == [0]
    rows = read_metrics(tmp_path, stages=True)
    assert [r.get("stage") for r in rows] == ["sft", "eval", None]
    assert rows[0] == {"stage": "sft", "step": 1, "time": rows[0]["time"], "sft/loss": 3.0, "sft/lr": 1e-4}
