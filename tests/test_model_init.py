"""`conch model init`: size, expert config, HF format, determinism; loading local checkpoints."""

from __future__ import annotations

import hashlib
import json

import pytest
import torch

from conch.cli import main as conch_main
from conch.model.init import SIZES, init_model, qwen3_moe_config
from conch.model.loading import check_checkpoint_dir, load_policy


def digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("tiny")
    report = init_model(out, size="tiny", seed=7)
    return out, report


def test_tiny_model_shape(tiny_dir):
    out, report = tiny_dir
    assert 5e6 <= report.parameters <= 20e6
    assert report.num_experts >= 8 and report.top_k == 2 and report.moe_layers == SIZES["tiny"]["num_hidden_layers"]
    for name in ("model.safetensors", "config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
                 "generation_config.json"):
        assert (out / name).is_file(), name
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["model_type"] == "qwen3_moe" and cfg["num_experts_per_tok"] == 2 and cfg["norm_topk_prob"] is True
    assert cfg["vocab_size"] == report.vocab_size


def test_load_policy(tiny_dir):
    out, report = tiny_dir
    pol = load_policy(out, dtype="bfloat16")
    assert pol.model.dtype == torch.bfloat16
    assert (pol.num_moe_layers, pol.num_experts, pol.top_k) == (report.moe_layers, report.num_experts, 2)
    assert sum(p.numel() for p in pol.model.parameters()) == report.parameters
    assert len(pol.tokenizer) == report.vocab_size
    with torch.no_grad():
        logits = pol.model(torch.tensor([[1, 2, 3]])).logits
    assert logits.shape == (1, 3, report.vocab_size) and torch.isfinite(logits.float()).all()


def test_deterministic_given_seed(tiny_dir, tmp_path):
    out, _ = tiny_dir
    init_model(tmp_path / "same", seed=7)
    init_model(tmp_path / "other", seed=8)
    assert digest(tmp_path / "same" / "model.safetensors") == digest(out / "model.safetensors")
    assert digest(tmp_path / "same" / "tokenizer.json") == digest(out / "tokenizer.json")
    assert digest(tmp_path / "other" / "model.safetensors") != digest(out / "model.safetensors")


def test_small_config_is_bigger():
    from conch.model.tokenizer import SpecialTokenIds

    special = SpecialTokenIds(1, 2, 0, (2, 0), 0, 3, 4, 7, 8)
    from transformers import Qwen3MoeForCausalLM

    with torch.device("meta"):
        tiny = Qwen3MoeForCausalLM(qwen3_moe_config("tiny", 4096, special))
        small = Qwen3MoeForCausalLM(qwen3_moe_config("small", 4096, special))
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert count(small) > 4 * count(tiny)
    with pytest.raises(ValueError):
        qwen3_moe_config("huge", 4096, special)


def test_cli_init(tmp_path, capsys):
    out = tmp_path / "m"
    assert conch_main(["model", "init", "--out", str(out), "--seed", "3"]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["parameters"] > 0 and (out / "model.safetensors").is_file()
    assert conch_main(["model", "init", "--out", str(out)]) == 2  # not empty
    assert conch_main(["model", "init", "--out", str(tmp_path / "n"), "--tokenizer-corpus", "/nonexistent"]) == 2


def test_checkpoint_dir_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        check_checkpoint_dir(tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match="config.json"):
        check_checkpoint_dir(tmp_path)
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match="weights"):
        check_checkpoint_dir(tmp_path)


@pytest.mark.parametrize("family", ["qwen2_moe", "olmoe", "mixtral"])
def test_load_other_moe_families_from_folder(tmp_path, family):
    """Any local HF checkpoint folder loads, and its MoE layers are detected."""
    from tests.test_routing import tiny

    model = tiny(family)
    model.save_pretrained(tmp_path)
    pol = load_policy(tmp_path, with_tokenizer=False)
    assert pol.num_moe_layers == 2 and pol.num_experts == 8 and pol.top_k == 2
