"""Presets (conch/configs/*.toml) and the real-run defaults: precedence defaults < preset < --config < overrides,
the demo preset holding exactly the old demo values, unknown names, the first-line notice, resumes that do not
apply a preset twice, and `agent.max_context = 0` resolved from the model."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from conch.config import Config, ConfigError, describe, load_config
from conch.presets import PRESETS_DIR, demo_notice, list_presets, preset_info, wants_demo

REPO = Path(__file__).resolve().parents[1]

# The defaults before presets existed: the demo preset must hold exactly these (same figures from `make run`).
OLD_DEMO = {("run", "time_budget_minutes"): 16.0, ("agent", "max_turns"): 4, ("agent", "max_new_tokens"): 64,
            ("agent", "max_context"): 2048, ("sft", "lr"): 4e-3, ("ppo", "lr"): 1e-4, ("ppo", "critic_lr"): 1e-3,
            ("corpus", "families"): ["make-dirs", "count-lines", "count-files", "copy-files", "remove-files"]}


def conch(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "conch", *args], capture_output=True, text=True, timeout=120)


def test_defaults_are_a_real_run():
    c = Config()
    assert (c.run.time_budget_minutes, c.agent.max_turns, c.agent.max_context, c.corpus.families) == (0, 300, 0, [])
    assert c.agent.max_new_tokens == 2048 and c.ppo.lr == 1e-6 and c.sft.lr == 1e-5


def test_demo_preset_is_exactly_the_old_demo_defaults():
    demo, defaults = load_config(preset="demo").to_dict(), Config().to_dict()
    differ = {(s, k) for s in demo for k in demo[s] if demo[s][k] != defaults[s][k]}
    assert differ == set(OLD_DEMO)
    for (s, k), old in OLD_DEMO.items():
        assert demo[s][k] == old, (s, k)


def test_precedence_defaults_preset_file_overrides(tmp_path):
    f = tmp_path / "c.toml"
    f.write_text("[agent]\nmax_turns = 7\nmax_new_tokens = 99\n")
    cfg = load_config(f, ["agent.max_new_tokens=5"], preset="demo")
    assert cfg.agent.max_turns == 7            # the file over the preset
    assert cfg.agent.max_new_tokens == 5       # the override over the file
    assert cfg.agent.max_context == 2048       # the preset over the defaults
    assert cfg.agent.obs_token_budget == Config().agent.obs_token_budget and cfg.preset == "demo"


@pytest.mark.parametrize("name", list_presets())
def test_every_preset_loads_and_says_what_it_is(name):
    assert load_config(preset=name).preset == name
    assert preset_info(name)["about"]
    assert set(tomllib.loads((PRESETS_DIR / f"{name}.toml").read_text())) - {"preset"} <= set(Config().to_dict())


def test_real_model_preset_needs_a_model_path():
    from conch.commands.train import new_run_config

    args = argparse.Namespace(preset="qwen3-30b-a3b", config=None, overrides=[])
    with pytest.raises(ConfigError, match="needs model.path"):
        new_run_config(args)
    args.overrides = ["model.path=/models/Qwen3-30B-A3B"]
    cfg, notice = new_run_config(args)
    assert notice == "" and cfg.engine.backend == "vllm" and cfg.model.trainer_device == "cuda"
    assert cfg.cluster.learner_ranks == 6 and cfg.ppo.grad_accum % 6 == 0 and cfg.agent.max_context == 0


def test_train_without_model_path_uses_the_demo_preset_and_says_so():
    from conch.commands.train import new_run_config

    assert wants_demo(None, []) and wants_demo(None, ["corpus.train_tasks=t", "model.path= "])
    assert not wants_demo(None, ["model.path=/m"]) and not wants_demo("c.toml", [])
    cfg, notice = new_run_config(argparse.Namespace(preset=None, config=None, overrides=["ppo.iterations=2"]))
    assert cfg.preset == "demo" and cfg.agent.max_turns == 4 and cfg.ppo.iterations == 2
    assert notice == demo_notice()
    assert notice.startswith("conch train: no model.path: using the demo preset (conch/configs/demo.toml: ")
    assert "16-minute budget" in notice and "--preset NAME or model.path=..." in notice and "\n" not in notice
    cfg, notice = new_run_config(argparse.Namespace(preset=None, config=None, overrides=["model.path=/m"]))
    assert notice == "" and cfg.preset == "" and cfg.agent.max_turns == 300


def test_run_config_records_the_preset_and_is_not_resolved_again(tmp_path):
    cfg = load_config(None, ["agent.max_turns=9"], preset="demo")
    f = tmp_path / "config.toml"
    f.write_text(describe(cfg))
    assert f.read_text().startswith("# preset: demo (")
    again = load_config(f, ["ppo.iterations=3"])  # what --resume does
    assert again.preset == "demo" and again.agent.max_turns == 9 and again.ppo.iterations == 3
    assert {**again.to_dict(), "ppo": {}} == {**cfg.to_dict(), "ppo": {}}
    assert not describe(load_config(None)).startswith("#")


def test_unknown_preset_is_one_line_with_the_presets():
    for argv in (["config", "show", "--preset", "dmeo"], ["train", "--preset", "dmeo", "--out", "/nonexistent/r"]):
        p = conch(*argv)
        assert p.returncode == 2 and "Traceback" not in p.stderr
        [line] = p.stderr.strip().splitlines()
        assert "unknown preset 'dmeo' (did you mean demo?)" in line and "demo, qwen3-30b-a3b" in line


def test_resume_refuses_a_preset(tmp_path):
    (tmp_path / "config.toml").write_text(describe(load_config(preset="demo")))
    p = conch("train", "--resume", str(tmp_path), "--preset", "demo")
    assert p.returncode == 2 and "new runs only" in p.stderr and len(p.stderr.strip().splitlines()) == 1


def test_config_show_preset_prints_the_demo_values():
    p = conch("config", "show", "--preset", "demo")
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("# preset: demo")
    for line in ("max_turns = 4  #", "max_new_tokens = 64  #", "max_context = 2048  #", "time_budget_minutes = 16.0  #",
                 'families = ["make-dirs", "count-lines", "count-files", "copy-files", "remove-files"]  #'):
        assert line in p.stdout, line
    plain = conch("config", "show").stdout
    assert "max_turns = 300  #" in plain and "max_context = 0  #" in plain


def test_presets_ship_as_package_data():
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert "configs/*.toml" in pyproject["tool"]["setuptools"]["package-data"]["conch"]
    assert PRESETS_DIR == REPO / "conch" / "configs" and {"demo", "qwen3-30b-a3b"} <= set(list_presets())


def test_max_context_zero_is_the_models(tmp_path):
    from types import SimpleNamespace

    from conch.model.context import context_length

    assert context_length(2048, 32768) == 2048 and context_length(65536, 40960) == 40960
    assert context_length(0, 40960) == 40960 and context_length(4096, None) == 4096
    (tmp_path / "config.json").write_text(json.dumps({"max_position_embeddings": 40960}))
    assert context_length(0, tmp_path) == 40960
    assert context_length(0, SimpleNamespace(config=SimpleNamespace(max_position_embeddings=512))) == 512
    with pytest.raises(ValueError, match="agent.max_context"):
        context_length(0, None)
    with pytest.raises(ConfigError, match="agent.max_context must be 0"):
        load_config(None, ["agent.max_context=8"])


def test_agent_loop_takes_the_engines_context_when_max_context_is_zero():
    from conch.agent.loop import context_limit
    from conch.config import AgentLoopConfig

    engine = type("Engine", (), {"max_positions": 1000})()
    assert context_limit(engine, AgentLoopConfig(max_context=0)) == 1000
    assert context_limit(engine, AgentLoopConfig(max_context=300)) == 300
    assert context_limit(engine, AgentLoopConfig(max_context=4000)) == 1000


def test_sft_examples_are_uncut_at_max_context_zero():
    from transformers import AutoTokenizer

    from conch.agent.tito import ChatCodec
    from conch.model.init import cached_model
    from conch.rl.sft import build_example
    from conch.tasks.synth.trajectories import BASH_TOOL

    codec = ChatCodec(AutoTokenizer.from_pretrained(str(cached_model())), tools=[BASH_TOOL])
    chat = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"},
            {"role": "assistant", "content": "word " * 50}]
    whole = build_example(codec, chat, 0)
    assert len(whole.tokens) > 40 and len(whole.tokens) == len(whole.mask)
    assert build_example(codec, chat, 40).tokens == whole.tokens[:40]
