"""Decontamination: scores on controlled pairs, reworded benchmark instructions, the synth corpus, scale, CLI."""

from __future__ import annotations

import json
import random
import re
import time
from pathlib import Path

import pytest

from conch.cli import main
from conch.tasks.decontam import DEFAULT_THRESHOLD, decontaminate, find_instructions

REFERENCE = Path(__file__).resolve().parents[2] / "shared" / "reference" / "terminal-bench-2"
needs_reference = pytest.mark.skipif(not REFERENCE.is_dir(), reason=f"{REFERENCE} not present (no ../shared)")

VOCAB = ("file directory server process archive config value output input parse write read sort count line "
         "record field table column json csv log error request response token cache index query build compile "
         "test check verify install package module function class method variable string number list map key "
         "path user group mode permission network port socket thread queue worker job task result report").split()


def prose(rng: random.Random, n: int) -> str:
    words = [rng.choice(VOCAB) for _ in range(n)]
    for i in range(0, n, rng.randint(9, 16)):
        words[i] = words[i].capitalize()
    return " ".join(words) + "."


def write_task(root: Path, name: str, instruction: str, tests: str | None = None) -> Path:
    folder = root / name
    folder.mkdir(parents=True)
    (folder / "instruction.md").write_text(instruction)
    if tests is not None:
        (folder / "tests").mkdir()
        (folder / "tests" / "test_outputs.py").write_text(tests)
    return folder


def reword(text: str, rng: random.Random, fraction: float = 0.05) -> str:
    """Change a few words: what a contaminated task that was 'lightly edited' looks like."""
    words = text.split(" ")
    idx = [i for i, w in enumerate(words) if re.fullmatch(r"[A-Za-z]{4,}", w)]
    for i in rng.sample(idx, min(len(idx), max(3, int(len(words) * fraction)))):
        words[i] = rng.choice(["thing", "item", "stuff", "piece", "entry"])
    return " ".join(words)


def by_task(matches):
    return {m.task: m for m in matches}


def test_scores_copy_paraphrase_passage_tests_and_unrelated(tmp_path):
    rng = random.Random(1)
    refs, tasks = tmp_path / "refs", tmp_path / "tasks"
    texts = {f"ref-{i}": prose(rng, 220) for i in range(20)}
    for name, text in texts.items():
        write_task(refs, name, text)
    write_task(tasks, "copy", texts["ref-3"])
    write_task(tasks, "reworded", reword(texts["ref-7"], rng))
    # Most of a reference buried in four times as much unrelated text: containment, not fuzzy, sees it.
    passage = " ".join(texts["ref-11"].split(" ")[20:180])
    write_task(tasks, "passage", prose(rng, 300) + " " + passage + " " + prose(rng, 300))
    write_task(tasks, "in-tests", prose(rng, 120), tests=f'"""{texts["ref-5"]}"""\n\ndef test_x():\n    pass\n')
    write_task(tasks, "unrelated", "Count the lines of /app/a.txt that mention the word zebra and save it.")
    m = by_task(decontaminate(tasks, refs))
    assert m["copy"].nearest == "ref-3" and m["copy"].score == pytest.approx(1.0)
    assert m["reworded"].nearest == "ref-7" and m["reworded"].score > 0.8 and m["reworded"].flagged
    assert m["passage"].nearest == "ref-11" and m["passage"].flagged
    assert m["passage"].detail["c8"] > m["passage"].detail["fuzzy"]
    assert m["in-tests"].nearest == "ref-5" and m["in-tests"].flagged and m["in-tests"].detail["tests8"] > 0.9
    assert not m["unrelated"].flagged and m["unrelated"].score < 0.3
    assert all(0.0 <= x.score <= 1.0 for x in m.values())


@needs_reference
def test_lightly_reworded_reference_instructions_are_flagged(tmp_path):
    """Reference text is read at run time and only written to a temp folder (never committed)."""
    rng = random.Random(7)
    refs = sorted(find_instructions(REFERENCE))
    assert len(refs) >= 50
    picked = rng.sample(refs, 12)
    for name, _folder, text in picked:
        write_task(tmp_path / "tasks", f"suspect-{name}", reword(text, rng),
                   tests="def test_ok():\n    assert True\n")
    matches = by_task(decontaminate(tmp_path / "tasks", REFERENCE))
    for name, _folder, _text in picked:
        m = matches[f"suspect-{name}"]
        assert m.nearest == name, (m.task, m.nearest, m.detail)
        assert m.flagged and m.score >= 0.7, (m.task, m.score, m.detail)


@pytest.mark.slow
@needs_reference
def test_default_synth_corpus_is_clean_against_reference(tmp_path):
    """The 'must hold' check: 2,000 default synthesized tasks, none flagged against Terminal-Bench 2."""
    out = tmp_path / "corpus"
    assert main(["synth", "--out", str(out), "--n", "2000", "--seed", "0", "--no-validate"]) == 0
    matches = decontaminate(out, REFERENCE)
    assert len(matches) == 2000
    worst = max(matches, key=lambda m: m.score)
    assert not any(m.flagged for m in matches), (worst.task, worst.nearest, worst.score, worst.detail)
    assert worst.score < DEFAULT_THRESHOLD / 2, (worst.task, worst.nearest, worst.score)


@pytest.mark.slow
def test_ten_thousand_tasks_against_one_hundred_references_under_a_minute(tmp_path):
    rng = random.Random(3)
    for i in range(100):
        write_task(tmp_path / "refs", f"ref-{i:03d}", prose(rng, rng.randint(120, 400)))
    for i in range(10_000):
        tests = "\n".join(f"def test_{j}():\n    assert read('/app/out/{rng.choice(VOCAB)}.txt') == "
                          f"'{rng.choice(VOCAB)} {rng.choice(VOCAB)}'" for j in range(rng.randint(3, 8)))
        write_task(tmp_path / "tasks", f"task-{i:05d}", prose(rng, rng.randint(60, 250)), tests=tests)
    start = time.monotonic()
    matches = decontaminate(tmp_path / "tasks", tmp_path / "refs")
    seconds = time.monotonic() - start
    assert len(matches) == 10_000
    assert all(m.nearest is not None for m in matches)
    print(f"decontam: 10,000 tasks vs 100 references in {seconds:.1f}s")
    assert seconds < 60, f"{seconds:.1f}s"


def test_reference_layouts_harbor_tb1_and_bare(tmp_path):
    rng = random.Random(5)
    a, b, c = prose(rng, 150), prose(rng, 150), prose(rng, 150)
    refs = tmp_path / "refs"
    write_task(refs, "harbor-task", a)
    (refs / "harbor-task" / "task.toml").write_text('version = "1.0"\n')
    (refs / "tb1-task").mkdir(parents=True)
    (refs / "tb1-task" / "task.yaml").write_text("instruction: |-\n  " + b + "\ndifficulty: easy\n")
    (refs / "nested" / "bare").mkdir(parents=True)
    (refs / "nested" / "bare" / "instruction.md").write_text(c)
    (refs / "broken").mkdir()
    (refs / "broken" / "task.yaml").write_text(": not yaml [")
    names = {n for n, _f, _t in find_instructions(refs)}
    assert names == {"harbor-task", "tb1-task", "nested/bare"}
    tasks = tmp_path / "tasks"
    write_task(tasks, "t1", b)
    write_task(tasks, "t2", reword(c, rng))
    m = by_task(decontaminate(tasks, refs))
    assert m["t1"].nearest == "tb1-task" and m["t1"].flagged
    assert m["t2"].nearest == "nested/bare" and m["t2"].flagged


def test_cli_json_threshold_and_drop(tmp_path, capsys):
    rng = random.Random(9)
    refs, tasks = tmp_path / "refs", tmp_path / "tasks"
    texts = [prose(rng, 200) for _ in range(5)]
    for i, t in enumerate(texts):
        write_task(refs, f"r{i}", t)
    write_task(tasks, "dirty", reword(texts[2], rng))
    write_task(tasks, "clean", prose(rng, 200))
    assert main(["decontam", str(tasks), "--against", str(refs), "--json"]) == 1  # flagged and kept
    rows = json.loads(capsys.readouterr().out)
    assert sorted(r["task"] for r in rows) == ["clean", "dirty"]
    assert all(set(r) == {"task", "nearest", "score", "flagged"} for r in rows)
    dirty = next(r for r in rows if r["task"] == "dirty")
    assert dirty["nearest"] == "r2" and dirty["flagged"] is True
    # A threshold above the dirty task's score flags nothing.
    assert main(["decontam", str(tasks), "--against", str(refs), "--json", "--threshold", "0.999"]) == 0
    assert not any(r["flagged"] for r in json.loads(capsys.readouterr().out))
    assert main(["decontam", str(tasks), "--against", str(refs), "--drop"]) == 0
    assert not (tasks / "dirty").exists() and (tasks / "clean").is_dir()
    assert main(["decontam", str(tasks), "--against", str(tmp_path / "missing")]) == 2
