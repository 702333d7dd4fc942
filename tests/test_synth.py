"""Task synthesis: registry and splits, layout, determinism, variety, and every family run for real.

The sandbox tests run each family's oracle and nop through the real harness and local sandbox (several
families per test, two at a time): the oracle must pass every test, nop must fail at least one.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import tomllib
from pathlib import Path

import pytest

from conch.cli import main
from conch.tasks.synth import (
    FamilyStats,
    draft_for,
    emit,
    load_families,
    select_families,
    synthesize,
)
from conch.tasks.synth.base import HELDOUT, REGISTRY, TRAIN, Family, TaskDraft, count_tests, task_name
from conch.tasks.synth.trajectories import SYSTEM_PROMPT, format_observation

FAMILIES = load_families()
REQUIRED_CATEGORIES = {"file-operations", "text-processing", "data-wrangling", "log-analysis", "debugging",
                       "version-control", "archives", "permissions", "processes", "config-editing",
                       "search-and-discover", "long-horizon"}


def tree(root: Path) -> dict[str, tuple[bytes, int]]:
    out = {}
    for dirpath, _dirs, names in os.walk(root):
        for nm in names:
            p = Path(dirpath) / nm
            out[str(p.relative_to(root))] = (p.read_bytes(), p.stat().st_mode & 0o777)
    return out


# ------------------------------------------------------------------------------------------- static checks


def test_registry_families_splits_and_categories():
    assert len(FAMILIES) >= 15
    splits = [f.split for f in FAMILIES.values()]
    assert splits.count(TRAIN) >= 12 and splits.count(HELDOUT) >= 3
    assert REQUIRED_CATEGORIES <= {f.category for f in FAMILIES.values()}
    heldout = select_families(split=HELDOUT)
    assert heldout and all(f.split == HELDOUT for f in heldout)
    assert {f.name for f in select_families(split=TRAIN)} | {f.name for f in heldout} == set(FAMILIES)
    with pytest.raises(ValueError, match="unknown families"):
        select_families(["no-such-family"])


def test_every_family_writes_a_loadable_harbor_task(tmp_path):
    from conch.tasks.loader import load_tasks

    for fam in FAMILIES.values():
        for seed in (1, 2):
            emit(fam, seed, tmp_path)
    tasks = load_tasks([tmp_path])
    assert len(tasks) == 2 * len(FAMILIES)
    for task in tasks:
        assert not hasattr(task, "message"), str(task)  # a TaskLoadError
        meta = task.metadata["metadata"]
        fam = FAMILIES[meta["family"]]
        assert task.metadata["version"] == "1.0" and meta["split"] == fam.split
        assert task.name == task_name(fam.name, meta["seed"])
        assert task.name.startswith(fam.name + "-")
        docker = (task.path / "environment" / "Dockerfile").read_text().splitlines()
        assert docker[0] in ("FROM debian:bookworm-slim", "FROM python:3.11-slim-bookworm")
        assert "WORKDIR /app" in docker and "COPY files/ /app/" in docker
        test_sh = (task.path / "tests" / "test.sh").read_text()
        assert "pytest --ctrf /logs/verifier/ctrf.json /tests/test_outputs.py -rA" in test_sh
        assert "/logs/verifier/reward.txt" in test_sh
        n_tests = len(re.findall(r"^def test_", (task.path / "tests" / "test_outputs.py").read_text(), re.M))
        assert 3 <= n_tests <= 8 and n_tests == meta["n_tests"]
        commands = json.loads((task.path / "solution" / "commands.json").read_text())
        assert list(task.solution_commands) == commands and commands
        assert (task.path / "solution" / "solve.sh").read_text() == "#!/bin/bash\n" + "\n".join(commands) + "\n"
        for key in ("timeout_sec",):
            assert task.metadata["verifier"][key] > 0 and task.metadata["agent"][key] > 0
        assert task.metadata["environment"]["memory_mb"] > 0


def test_same_seed_gives_byte_identical_folders(tmp_path):
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    for out, seed in ((a, 5), (b, 5), (c, 6)):
        assert main(["synth", "--out", str(out), "--n", str(2 * len(FAMILIES)), "--seed", str(seed),
                     "--no-validate"]) == 0
    ta, tb, tc = tree(a), tree(b), tree(c)
    assert ta == tb
    assert len({p.split("/")[0] for p in ta}) == 2 * len(FAMILIES)
    assert set(ta) != set(tc)  # another corpus seed: other task seeds, other folder names


def test_tasks_of_a_family_differ_in_surface_form():
    for fam in FAMILIES.values():
        drafts = [draft_for(fam, seed) for seed in range(12)]
        no_digits = {re.sub(r"[0-9]+", "#", d.instruction) for d in drafts}
        openings = {" ".join(d.instruction.split()[:4]) for d in drafts}
        assert len(no_digits) == 12, fam.name
        assert len(openings) >= 2, (fam.name, openings)
        assert len({count_tests(d) for d in drafts} | {len(d.solution) for d in drafts}) >= 2, fam.name


def test_long_horizon_families_reach_hundreds_of_turns():
    for name in ("chain-follow", "batch-tickets"):
        turns = [len(draft_for(FAMILIES[name], seed).solution) for seed in range(80)]
        assert min(turns) >= 10 and max(turns) >= 300, (name, min(turns), max(turns))
    assert max(len(draft_for(FAMILIES["manifest-audit"], s).solution) for s in range(40)) >= 50


def test_stats_and_split_selection_cli(tmp_path, capsys):
    out = tmp_path / "heldout"
    assert main(["synth", "--out", str(out), "--n", "10", "--seed", "3", "--split", "heldout", "--no-validate"]) == 0
    capsys.readouterr()
    for folder in out.iterdir():
        meta = tomllib.loads((folder / "task.toml").read_text())["metadata"]
        assert meta["split"] == HELDOUT and FAMILIES[meta["family"]].split == HELDOUT
    assert main(["synth", "--stats", str(out), "--json"]) == 0
    st = json.loads(capsys.readouterr().out)
    assert set(st) >= {"families", "tests_per_task", "turns"}
    assert sum(st["families"].values()) == 10 and set(st["families"]) <= {f.name for f in select_families(split=HELDOUT)}
    assert st["splits"] == {HELDOUT: 10}
    assert 3 <= st["tests_per_task"]["min"] <= st["tests_per_task"]["mean"] <= st["tests_per_task"]["max"] <= 8
    assert st["turns"]["min"] >= 1
    assert main(["synth", "--out", str(tmp_path / "x"), "--families", "nope", "--no-validate"]) == 2
    assert main(["synth", "--out", str(tmp_path / "x"), "--no-validate", "--trajectories", "t.jsonl"]) == 2


def test_observation_format():
    assert format_observation("hello", 0) == "hello\n[exit code: 0]"
    assert format_observation("", 2) == "[exit code: 2]"
    assert format_observation("x\n", None) == "x\n[command timed out]"
    long = format_observation("a" * 50_000 + "END", 1, cap=1000)
    assert len(long) < 1200 and long.endswith("END\n[exit code: 1]") and "omitted" in long
    assert "bash" in SYSTEM_PROMPT


# ------------------------------------------------------------------------------------------- real sandboxes

GROUPS = [
    ["files-organize", "archive-pack", "perms-fix", "dir-sync", "text-pipeline"],
    ["log-triage", "config-patch", "csv-aggregate", "json-reshape", "csv-join"],
    ["shell-bugfix", "python-bugfix", "git-history", "service-daemon", "http-service"],
    ["discover-value", "chain-follow", "batch-tickets", "manifest-audit"],
    ["make-dirs", "count-lines", "count-files", "copy-files", "remove-files"],
]


def test_groups_cover_every_family():
    assert sorted(n for g in GROUPS for n in g) == sorted(FAMILIES)


def _long_seed(name: str, at_least: int) -> int:
    return next(s for s in range(500) if len(draft_for(FAMILIES[name], s).solution) >= at_least)


@pytest.mark.parametrize("group", range(len(GROUPS)))
def test_oracle_passes_and_nop_fails_in_local_sandbox(group, tmp_path, base_root):
    from conch.harness import run_tasks
    from conch.tasks.loader import load_task

    paths = []
    for name in GROUPS[group]:
        seed = 1
        if name == "chain-follow":
            seed = _long_seed(name, 300)  # a 300+ turn oracle in one persistent shell
        elif name == "batch-tickets":
            seed = _long_seed(name, 100)
        paths.append(emit(FAMILIES[name], seed, tmp_path))
    tasks = [load_task(p) for p in paths]

    async def both():
        return await run_tasks(tasks, "oracle", "local", jobs=2), await run_tasks(tasks, "nop", "local", jobs=2)

    oracle, nop = asyncio.run(both())
    for o, n in zip(oracle, nop):
        assert o.error is None and o.n_total >= 3 and o.n_passed == o.n_total, (o.task, o.to_json())
        assert n.error is None and n.n_total == o.n_total and n.n_passed < n.n_total, (n.task, n.to_json())
    if "chain-follow" in GROUPS[group]:
        long = next(o for o in oracle if o.task.startswith("chain-follow"))
        assert len(long.steps) >= 300 and all(s.exit_code == 0 for s in long.steps)


def test_synthesize_validates_drops_and_writes_trajectories(tmp_path, base_root):
    fams = select_families(["python-bugfix", "config-patch"])
    traj = tmp_path / "traj.jsonl"
    report = synthesize(tmp_path / "out", 3, 4, fams, validate=True, jobs=2, trajectories=traj, log=lambda m: None)
    assert len(report.kept) == 3 and all(p.is_dir() for p in report.kept)
    assert sum(st.kept for st in report.families.values()) == 3
    rows = [json.loads(line) for line in traj.read_text().splitlines()]
    assert [r["task"] for r in rows] == [p.name for p in report.kept]
    for row in rows:
        msgs = row["messages"]
        assert msgs[0] == {"role": "system", "content": SYSTEM_PROMPT}
        assert msgs[1]["role"] == "user" and msgs[1]["content"] == (report.out / row["task"] / "instruction.md").read_text()
        commands = json.loads((report.out / row["task"] / "solution" / "commands.json").read_text())
        calls = msgs[2:-1:2]
        assert [c["tool_calls"][0]["function"]["arguments"]["command"] for c in calls] == commands
        assert all(c["role"] == "assistant" and c["content"] == "" and c["tool_calls"][0]["type"] == "function"
                   and c["tool_calls"][0]["function"]["name"] == "bash" for c in calls)
        tools = msgs[3:-1:2]
        assert all(t["role"] == "tool" and re.search(r"\[exit code: \d+\]$", t["content"]) for t in tools)
        assert msgs[-1]["role"] == "assistant" and "tool_calls" not in msgs[-1]
        assert row["family"] in ("python-bugfix", "config-patch")
    # the first observation of a python-bugfix run is `cat -n` of the module it has to fix: real output
    pb = next(r for r in rows if r["family"] == "python-bugfix")
    assert "def " in pb["messages"][3]["content"]


def _broken(rng) -> TaskDraft:
    draft = draft_for(FAMILIES["config-patch"], rng.randrange(1000))
    draft.solution = ["true"]  # the oracle does nothing: it cannot pass
    return draft


def _vacuous(rng) -> TaskDraft:
    tests = [f"def test_{i}():\n    assert os.path.isdir('/app')\n" for i in range(3)]
    return TaskDraft(instruction=f"Nothing to do {rng.random()}.", tests=tests, solution=["true"])


def test_validation_drops_failing_tasks_and_retries(tmp_path, base_root):
    fams = [Family("test-broken", TRAIN, "debugging", "oracle fails", _broken),
            Family("test-vacuous", TRAIN, "debugging", "nop passes", _vacuous)]
    REGISTRY.update({f.name: f for f in fams})
    try:
        report = synthesize(tmp_path, 2, 0, fams, validate=True, jobs=2, max_attempts=2, log=lambda m: None)
    finally:
        for f in fams:
            REGISTRY.pop(f.name, None)
    assert report.kept == [] and list(tmp_path.iterdir()) == []
    broken, vacuous = report.families["test-broken"], report.families["test-vacuous"]
    assert isinstance(broken, FamilyStats)
    assert (broken.generated, broken.oracle_failed, broken.gave_up, broken.kept) == (2, 2, 1, 0)
    assert (vacuous.generated, vacuous.nop_passed, vacuous.gave_up, vacuous.kept) == (2, 2, 1, 0)
