"""The starter families each draw one slot, a folder from a shared set of three, that the instruction names."""

from __future__ import annotations

import re

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
