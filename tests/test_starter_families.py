"""The starter families each draw one slot, a folder from a shared set of three, that the instruction names."""

from __future__ import annotations

import re
import tomllib

from conch.tasks.synth import draft_for, load_families
from conch.tasks.synth.families_basic import DIRS, STARTER_FAMILIES

FAMILIES = load_families()


def test_each_starter_solution_uses_the_folder_its_instruction_names():
    for name in STARTER_FAMILIES:
        seen = set()
        for seed in range(40):
            d = draft_for(FAMILIES[name], seed)
            folders = set(re.findall(r"/app/(\w+)", d.solution[-1])) & set(DIRS)
            assert len(folders) == 1, (name, seed, d.solution)
            (folder,) = folders
            assert f"/app/{folder}" in d.instruction, (name, seed, d.instruction)
            assert not (set(DIRS) - {folder}) & set(re.findall(r"/app/(\w+)", d.instruction)), (name, seed)
            seen.add(folder)
        assert seen == set(DIRS), (name, seen)  # every value of the slot is drawn


def test_balanced_subset_of_demos():
    from conch.rl.train import balanced_subset

    chats = [{"task": f"{fam}-{i}", "family": fam} for fam in ("a", "b", "c") for i in range(10)]
    sub = balanced_subset(chats, 9, seed=0)
    assert sorted(c["family"] for c in sub) == ["a"] * 3 + ["b"] * 3 + ["c"] * 3
    assert sub == balanced_subset(chats, 9, seed=0) and sub != balanced_subset(chats, 9, seed=1)
    assert len(balanced_subset(chats, 100, seed=0)) == 30
    assert [c["task"] for c in sub] == [c["task"] for c in chats if c in sub]  # corpus order kept


def test_drop_seen_instructions(tmp_path):
    from conch.rl.stages import drop_seen_instructions

    for folder, names in (("a", {"t1": "same\n", "t2": "only in a\n"}), ("b", {"u1": "same\n"})):
        for name, text in names.items():
            (tmp_path / folder / name).mkdir(parents=True)
            (tmp_path / folder / name / "instruction.md").write_text(text)
    assert drop_seen_instructions(tmp_path / "a", tmp_path / "b") == 1
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["t2"]
    assert (tmp_path / "b" / "u1").exists()  # the reference folder is left alone


def test_each_starter_family_has_a_one_token_style_mistake_in_the_same_folder():
    for name in STARTER_FAMILIES:
        for seed in range(10):
            d = draft_for(FAMILIES[name], seed)
            assert len(d.mistake) == len(d.solution) == 1 and d.mistake != d.solution, (name, seed)
            # the mistake names the same folder: only the family's way of doing it differs
            assert set(re.findall(r"/app/(\w+)", d.mistake[0])) == set(re.findall(r"/app/(\w+)", d.solution[0]))


def test_shows_mistake_picks_the_configured_share_by_seed():
    from conch.tasks.synth import shows_mistake

    fam = FAMILIES["count-files"]
    picks = [bool(shows_mistake(fam, seed, 0.5)) for seed in range(400)]
    assert 160 < sum(picks) < 240
    assert picks == [bool(shows_mistake(fam, seed, 0.5)) for seed in range(400)]  # a function of the seed
    assert not any(shows_mistake(fam, seed, 0.0) for seed in range(50))
    assert all(shows_mistake(fam, seed, 1.0) for seed in range(50))
    assert not shows_mistake(FAMILIES["config-patch"], 0, 1.0)  # a family without a mistake: always the oracle


def test_mistaken_demonstrations_are_real_runs_that_fail_some_tests(tmp_path, base_root):
    import json

    from conch.tasks.synth import select_families, synthesize

    fams = select_families(list(STARTER_FAMILIES))
    traj = tmp_path / "expert.jsonl"
    report = synthesize(tmp_path / "out", 5, 2, fams, jobs=2, trajectories=traj, log=lambda m: None, mistake_rate=1.0)
    rows = [json.loads(line) for line in traj.read_text().splitlines()]
    assert report.mistakes == len(rows) == 5
    for row in rows:
        n_passed, n_total = map(int, row["mistake"].split("/"))
        assert 0 < n_passed < n_total, row  # partial credit: the count reward still ranks it above nothing
        meta = tomllib.loads((report.out / row["task"] / "task.toml").read_text())["metadata"]
        shown = [m["tool_calls"][0]["function"]["arguments"]["command"] for m in row["messages"][2:-1:2]]
        assert shown == draft_for(FAMILIES[row["family"]], meta["seed"]).mistake
        assert row["messages"][3]["content"].endswith("[exit code: 0]")
