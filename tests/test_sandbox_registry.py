"""The backend registries: the sandbox backends (conch/sandbox/registry.py) behind every `--sandbox` flag, the
`sandbox.backend` key, gc and base build, and the rollout placements (conch/rl/placement.py) behind
`cluster.backend`; the moved key `run.sandbox` still loads with a warning; started boxes say what they hold on the
host through the protocol (`netns_pid`, `cleanup`), not through private fields."""

from __future__ import annotations

import argparse
import asyncio
import os
import warnings

import pytest

from conch.cli import build_parser, main
from conch.config import Config, describe, load_config
from conch.sandbox import BACKENDS, Cleanup, SandboxSpec, make_sandbox, registry


def _subparser(parser: argparse.ArgumentParser, *path: str) -> argparse.ArgumentParser:
    for name in path:
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = sub.choices[name]
    return parser


def _choices(parser: argparse.ArgumentParser, flag: str) -> tuple:
    action = next(a for a in parser._actions if flag in a.option_strings)
    return tuple(action.choices)


def test_every_sandbox_flag_and_the_config_key_offer_the_registry_names():
    names = registry.names()
    assert names == tuple(registry.BACKENDS) == BACKENDS == ("local", "docker")
    parser = build_parser()
    for path in (("check",), ("rollout",), ("eval",), ("synth",), ("bench", "sandbox"), ("bench", "mismatch")):
        assert _choices(_subparser(parser, *path), "--sandbox") == names, path
    for flag in ("--backend",):  # the deprecated spellings take the same names
        assert _choices(_subparser(parser, "synth"), flag) == names
        assert _choices(_subparser(parser, "bench", "sandbox"), flag) == names
    build = _subparser(parser, "images", "build-base")
    assert all(any(f"--{n}" in a.option_strings for a in build._actions) for n in names)
    import dataclasses

    meta = {f.name: f.metadata for f in dataclasses.fields(Config().sandbox)}["backend"]
    assert meta["choices"] == names


def test_an_unknown_backend_names_the_known_ones():
    with pytest.raises(ValueError, match="unknown sandbox backend 'qemu'; choose one of local, docker"):
        make_sandbox("qemu", SandboxSpec(name="x"))
    with pytest.raises(ValueError, match="local, docker"):
        registry.get("qemu")
    from conch.config import ConfigError

    with pytest.raises(ConfigError, match=r"sandbox\.backend must be one of.*local.*docker"):
        load_config(overrides=["sandbox.backend=qemu"])


def test_run_sandbox_warns_once_and_sets_sandbox_backend(tmp_path):
    with pytest.warns(FutureWarning, match=r"override: run\.sandbox is deprecated; it sets sandbox\.backend") as rec:
        cfg = load_config(overrides=["run.sandbox=docker"])
    assert cfg.sandbox.backend == "docker" and len(rec) == 1
    assert "\n" not in str(rec[0].message)
    f = tmp_path / "c.toml"
    f.write_text('[run]\nsandbox = "docker"\n')
    with pytest.warns(FutureWarning, match=rf"{f}: run\.sandbox is deprecated"):
        assert load_config(f).sandbox.backend == "docker"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the new key is silent
        assert load_config(overrides=["sandbox.backend=docker"]).sandbox.backend == "docker"
        assert load_config().sandbox.backend == "local"
    assert not hasattr(cfg.run, "sandbox")


def test_an_old_run_folders_config_toml_loads_and_writes_the_new_key(tmp_path):
    old = describe(Config()).replace("[run]\n", '[run]\nsandbox = "docker"  # sandbox backend: local or docker\n')
    old = old.replace('backend = "local"  # sandbox backend', "#")  # before the move [sandbox] had no backend
    (tmp_path / "config.toml").write_text(old)
    with pytest.warns(FutureWarning, match="run.sandbox is deprecated"):
        cfg = load_config(tmp_path / "config.toml")
    assert cfg.sandbox.backend == "docker"
    again = tmp_path / "again.toml"
    again.write_text(describe(cfg))
    text = again.read_text()
    assert '[sandbox]\nbackend = "docker"' in text and "\nsandbox = " not in text
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert load_config(again) == cfg


def test_conch_prints_the_deprecation_as_one_line(capsys):
    assert main(["config", "show", "run.sandbox=docker"]) == 0
    out, err = capsys.readouterr()
    assert '[sandbox]\nbackend = "docker"' in out
    err = err.strip().splitlines()
    assert [line for line in err if "run.sandbox" in line] == [
        "conch: warning: override: run.sandbox is deprecated; it sets sandbox.backend (write that instead)"]


def test_gc_runs_every_backend_and_skips_an_optional_one_that_does_not_answer(monkeypatch, capsys):
    calls = []
    fake = registry.SandboxBackend("fake", lambda spec: None, lambda t: "no engine", lambda a, out: calls.append(a),
                                   "", lambda f, t, out: None, optional=True)
    here = registry.SandboxBackend("here", lambda spec: None, lambda t: "never asked", lambda a, out: out("gc here"),
                                   "", lambda f, t, out: out("/built"))
    monkeypatch.setattr(registry, "BACKENDS", {"here": here, "fake": fake})
    from conch.commands.sandbox import run_gc

    assert run_gc(argparse.Namespace(unused_days=None, layers=False, images=False)) == 0
    assert capsys.readouterr().out.splitlines() == ["gc here", "fake: skipped (no engine)"] and not calls
    assert registry.default_set(1.0, warn=calls.append) == ["here"] and calls == ["fake skipped (no engine)"]


def test_bench_sandbox_old_backend_flag_warns_and_still_chooses(monkeypatch, capsys):
    import conch.bench.sandbox as bench

    seen = []

    async def fake_measure(backend, roundtrips, spawns, starts):
        seen.append(backend)
        return {k: 1.0 for k in bench._LABELS}

    monkeypatch.setattr(bench, "measure", fake_measure)
    assert main(["bench", "sandbox", "--sandbox", "local", "--json"]) == 0
    assert "deprecated" not in capsys.readouterr().err
    assert main(["bench", "sandbox", "--backend", "local", "--json"]) == 0
    err = capsys.readouterr().err
    assert "`conch bench sandbox --backend` is deprecated; use --sandbox" in err
    assert seen == ["local", "local"]


def test_started_boxes_say_what_they_hold_through_the_protocol(backend):
    """`netns_pid` is a host pid in the box's own network namespace; `cleanup` names what `stop` releases, and
    is empty before start and after stop."""
    box = make_sandbox(backend, SandboxSpec(name="registry-probe"))
    assert box.cleanup() == Cleanup()

    async def go() -> tuple[Cleanup, str]:
        await box.start()
        try:
            pid = await box.netns_pid()
            return box.cleanup(), os.readlink(f"/proc/{pid}/ns/net")
        finally:
            await box.stop()

    held, netns = asyncio.run(go())
    assert netns != os.readlink("/proc/self/ns/net")
    if backend == "local":
        assert held.dirs and held.cgroups and not held.containers
        assert not any(p.exists() for p in (*held.dirs, *held.cgroups))
    else:
        assert len(held.containers) == 1 and not held.dirs
    assert box.cleanup() == Cleanup()


def test_rollout_placements_are_the_cluster_backend_choices():
    import dataclasses

    from conch.rl import placement
    from conch.rl.rollout_source import LocalRolloutSource

    meta = {f.name: f.metadata for f in dataclasses.fields(Config().cluster)}["backend"]
    assert tuple(meta["choices"]) == tuple(placement.PLACEMENTS) == ("local", "ray")
    cfg = load_config(overrides=["sandbox.backend=docker", "ppo.concurrency=3"])
    source = placement.rollout_source(cfg, engine=None, codec=None, model_dir=None)
    assert isinstance(source, LocalRolloutSource)
    assert (source.backend, source.concurrency) == ("docker", 3)
    cfg.cluster.backend = "slurm"  # past the config's check: the registry still names what it knows
    with pytest.raises(ValueError, match="unknown rollout placement 'slurm'; choose one of local, ray"):
        placement.rollout_source(cfg, None, None, None)
