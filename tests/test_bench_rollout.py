"""Smoke test of `conch bench rollout` (the real tiny engine, real local sandboxes, small sizes)."""

from __future__ import annotations

import json

from conch.bench.rollout import QUICK
from conch.cli import main as conch_main


def test_bench_rollout_quick_json(base_root, capsys):
    assert conch_main(["bench", "rollout", "--quick", "--json"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    c, turns = QUICK["concurrency"], QUICK["turns"]
    assert (out["concurrency"], out["turns"], out["max_new_tokens"]) == (c, turns, QUICK["max_new_tokens"])
    r, e, s = out["rollout"], out["engine_only"], out["sequential"]
    for row in (r, e, s):
        assert row["seconds"] > 0 and row["tokens_per_s"] > 0 and row["turns_per_s"] > 0
        assert 0 < row["engine_busy"] <= 1.0 and row["tokens_per_step"] > 0 and row["forward_ms_per_step"] > 0
        assert 0 < row["client_cpu_s"] and 0 < row["host_cpu_s"]  # the in-process engine's work is the client's
    # Every turn ran the real command in its sandbox; the engine-only replay did exactly the same token work.
    assert r["sessions"] == e["sessions"] == c and r["turns"] == e["turns"] == r["env_steps"] == c * turns
    assert r["steps_per_s"] > 0 and s["steps_per_s"] > 0 and e["env_steps"] == 0
    assert r["sampled_tokens"] == e["sampled_tokens"] and r["fed_tokens"] == e["fed_tokens"] > 0
    assert 0 < r["sampled_tokens"] <= c * turns * QUICK["max_new_tokens"]
    assert s["sessions"] == QUICK["sequential"] and s["env_steps"] == QUICK["sequential"] * turns
    assert out["ratio_vs_engine"] > 0 and out["speedup_vs_sequential"] > 0
    assert abs(out["ratio_vs_engine"] - r["tokens_per_s"] / e["tokens_per_s"]) < 1e-3
    assert out["per_turn"]["env_seconds_mean"] > 0 and out["sandbox_start_seconds"] > 0


def test_bench_rollout_rejects_zero_concurrency(capsys):
    assert conch_main(["bench", "rollout", "--concurrency", "0"]) == 2
    assert "--concurrency" in capsys.readouterr().err
