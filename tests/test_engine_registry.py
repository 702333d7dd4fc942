"""The engine registry and `[engine]` config: which engine a command gets, and clear errors (no server needed)."""

from __future__ import annotations

import sys

import pytest

from conch.config import ConfigError, load_config
from conch.engine.registry import BACKENDS, EngineOptions, build_engine, options_from_config
from conch.engine.vllm_server import server_command, vllm_available
from conch.engine.weight_sync import parse_metrics


def test_config_engine_section_and_constraints():
    cfg = load_config(None, ["engine.backend=vllm", "engine.url=http://127.0.0.1:8000",
                             'engine.extra_args=["--max-model-len", "4096"]', "model.sampler_dtype=bfloat16"])
    opts = options_from_config(cfg)
    assert (opts.backend, opts.url, opts.dtype) == ("vllm", "http://127.0.0.1:8000", "bfloat16")
    assert opts.extra_args == ("--max-model-len", "4096")
    assert options_from_config(load_config(None, ["engine.dtype=float32", "model.sampler_dtype=bfloat16"])).dtype \
        == "float32"
    for bad in ("engine.backend=sglang", "engine.device=tpu", "engine.port=70000", "model.trainer_device=mps"):
        with pytest.raises(ConfigError, match=bad.split("=")[0]):
            load_config(None, [bad])


def test_engine_options_are_the_engine_section_not_a_copy():
    """Every `[engine]` field, with the config's own default, is an option (a field added there needs no edit in
    the registry); the engine choices are the registry's; flags left out keep the config's values."""
    import argparse
    import dataclasses

    from conch.config import Config, EngineConfig
    from conch.engine.registry import add_engine_arguments, options_for_command, options_from_args

    assert issubclass(EngineOptions, EngineConfig)
    defaults = EngineOptions()
    for f in dataclasses.fields(EngineConfig):
        assert f.name in {g.name for g in dataclasses.fields(EngineOptions)}
        expect = getattr(EngineConfig(), f.name)
        assert getattr(defaults, f.name) == (tuple(expect) if isinstance(expect, list) else expect), f.name
    meta = {f.name: f.metadata for f in dataclasses.fields(Config().engine)}["backend"]
    assert tuple(meta["choices"]) == tuple(BACKENDS)
    parser = argparse.ArgumentParser()
    add_engine_arguments(parser, from_config=True)
    cfg = load_config(None, ["engine.backend=vllm", "engine.port=8123", "engine.startup_timeout=5"])
    opts = options_for_command(cfg, parser.parse_args(["--engine-arg=--seed=1"]))
    assert (opts.backend, opts.port, opts.startup_timeout, opts.extra_args) == ("vllm", 8123, 5.0, ("--seed=1",))
    plain = argparse.ArgumentParser()
    add_engine_arguments(plain)
    opts = options_from_args(plain.parse_args([]))
    assert (opts.backend, opts.device, opts.dtype, opts.extra_args) == ("hf", "cpu", "float32", ())


def test_build_engine_errors_name_the_problem(tmp_path):
    assert set(BACKENDS) == {"hf", "vllm"}
    with pytest.raises(ValueError, match="unknown engine backend 'sglang'"):
        build_engine(EngineOptions(backend="sglang"), tmp_path)
    with pytest.raises(ValueError, match="checkpoint folder"):
        build_engine(EngineOptions(backend="vllm"), object())
    with pytest.raises(ValueError, match="engine.url .* or engine.launch"):
        build_engine(EngineOptions(backend="vllm", launch=False), tmp_path)


def test_missing_vllm_says_how_to_install():
    why = vllm_available(sys.executable)  # conch's own venv has no vLLM
    assert why is not None and "make install-vllm" in why


def test_server_command_cpu_uses_the_plugin_gpu_plain_vllm(tmp_path):
    cpu = server_command("py", tmp_path, 8000, "cpu", "float32", ("--x",))
    gpu = server_command("py", tmp_path, 8000, "cuda", "bfloat16", ())
    assert cpu[1:4] == ["-m", "conch_vllm_cpu", "serve"] and gpu[1:3] == ["-m", "vllm.entrypoints.cli.main"]
    for cmd in (cpu, gpu):
        assert cmd[cmd.index("--host") + 1] == "127.0.0.1" and "--enable-return-routed-experts" in cmd
    assert "--enforce-eager" in cpu and "conch_vllm_cpu.reload.ReloadExt" in cpu and cpu[-1] == "--x"
    assert "--enforce-eager" not in gpu and "conch_vllm_cpu.reload.ReloadExt" not in gpu


def test_parse_metrics_sums_labels():
    text = ('vllm:prefix_cache_hits_total{engine="0",model_name="m"} 64.0\n'
            'vllm:prefix_cache_hits_total{engine="1",model_name="m"} 32.0\n'
            'vllm:num_requests_running{engine="0"} 3.0\n# HELP x\n')
    assert parse_metrics(text) == {"vllm:prefix_cache_hits_total": 96.0}


def test_a_server_that_fails_to_start_shows_its_log(tmp_path):
    from conch.engine.vllm_server import VLLMServer

    log = tmp_path / "server.log"
    with pytest.raises(RuntimeError, match="No module named conch_vllm_cpu") as err:
        VLLMServer(tmp_path, python=sys.executable, log_path=str(log), startup_timeout=60)
    assert "exited with code" in str(err.value) and str(log) in str(err.value)
