"""Smoke test of `conch bench train` (real forward + backward passes on the tiny model, small lengths)."""

from __future__ import annotations

import json
import random

from conch.bench.train import agent_mask
from conch.cli import main as conch_main


def test_bench_train_quick_json(capsys):
    assert conch_main(["bench", "train", "--quick", "--json"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["device"] in ("cpu", "cuda") or out["device"].startswith("cuda")
    assert out["replay"] is True and out["memory_measure"]
    for kind in ("policy", "critic"):
        rows = out[kind]
        assert [(r["seq_len"], r["checkpointing"]) for r in rows] == [(128, True), (128, False), (256, True),
                                                                       (256, False)]
        for r in rows:
            assert r["tokens_per_s"] > 0 and r["seconds"] > 0
            assert abs(r["tokens_per_s"] * r["seconds"] - r["seq_len"]) <= 0.01 * r["seq_len"] + 1
            assert r["peak_mem_mb"] > 0
            assert 0 < r["sampled_tokens"] < r["seq_len"]
            assert r["chunked_logprobs"] == (kind == "policy" and r["checkpointing"])


def test_bench_train_rejects_lengths_beyond_the_model(capsys):
    assert conch_main(["bench", "train", "--lengths", "1024,40000"]) == 2
    assert "max_position_embeddings" in capsys.readouterr().err


def test_agent_mask_looks_like_an_episode():
    mask = agent_mask(32768, random.Random(0))
    assert len(mask) == 32768 and mask[0] == 0
    frac = sum(mask) / len(mask)
    assert 0.1 < frac < 0.4  # model turns are short next to observations
    turns = sum(1 for a, b in zip(mask, mask[1:]) if a == 0 and b == 1)
    assert turns > 50
