"""Decontamination: scores on controlled pairs, artifacts, identical files, reworded and paraphrased benchmark
instructions, the synth corpus, scale, CLI.

tests/data/decontam holds tasks written for these tests in our own words (never benchmark text):
paraphrases/<reference>/ restate a Terminal-Bench 2 task (same files, paths, expected outputs), weak/<reference>/
restate tasks whose reference names almost nothing concrete, unrelated/ are different tasks on the same topics;
heldout/<reference>/ are paraphrases written after the signals were fixed (a check against tuning to the data).
"""

from __future__ import annotations

import json
import random
import re
import time
from pathlib import Path

import pytest

from conch.cli import main
from conch.tasks.artifacts import candidate_keys, docker_images, extract_artifacts
from conch.tasks.decontam import DEFAULT_THRESHOLD, Reference, decontaminate, find_instructions, load_docs

REFERENCE = Path(__file__).resolve().parents[2] / "shared" / "reference" / "terminal-bench-2"
needs_reference = pytest.mark.skipif(not REFERENCE.is_dir(), reason=f"{REFERENCE} not present (no ../shared)")
DATA = Path(__file__).resolve().parent / "data" / "decontam"
EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "tasks"

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
    # Margin: the corpus peaks near 0.30 (JSON reshaping vs a JSON-recovery reference); paraphrases start at 0.57.
    assert worst.score < 0.4, (worst.task, worst.nearest, worst.score, worst.detail)


@pytest.mark.slow
def test_ten_thousand_tasks_against_one_hundred_references(tmp_path):
    """Scale: every task gets a nearest reference. The time is printed, not asserted (docs/decontam.md has
    the measured figures; a loaded CI machine must not fail a correctness test)."""
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
    assert main(["decontam", str(tasks), "--against", str(refs), "--json"]) == 3  # flagged and kept (3: found a problem)
    rows = json.loads(capsys.readouterr().out)
    assert sorted(r["task"] for r in rows) == ["clean", "dirty"]
    assert all(set(r) == {"task", "nearest", "score", "flagged", "why"} for r in rows)  # old keys kept
    dirty = next(r for r in rows if r["task"] == "dirty")
    assert dirty["nearest"] == "r2" and dirty["flagged"] is True
    # A threshold above the dirty task's score flags nothing.
    assert main(["decontam", str(tasks), "--against", str(refs), "--json", "--threshold", "0.999"]) == 0
    assert not any(r["flagged"] for r in json.loads(capsys.readouterr().out))
    assert main(["decontam", str(tasks), "--against", str(refs), "--drop"]) == 0
    assert not (tasks / "dirty").exists() and (tasks / "clean").is_dir()
    assert main(["decontam", str(tasks), "--against", str(tmp_path / "missing")]) == 2


# ---------------------------------------------------------------------------------------------- paraphrases


def test_artifacts_are_the_concrete_things_a_task_names():
    text = ("Write `/app/out/weekly_sales.json` from /app/data/input.csv, served by api.py on port 8080. Use numpy "
            "1.26.4 and call `summarize_rows(path)` in class RowStats; print \"All rows valid\" and the value of "
            "$HOME. Dates are YYYY-MM-DD. Output keys: \"total\", \"mean\". See https://example.org/spec.")
    a = extract_artifacts(text)
    # A file path is keyed by its basename (the same file with or without /app); a generic name counts little.
    assert a["weekly_sales.json"] == 1.0 and a["api.py"] == 1.0 and a["input.csv"] == 0.25
    assert "/app" not in a and "/app/out/weekly_sales.json" not in a
    for key in ("1.26.4", "summarize_rows", "rowstats", "all rows valid", "$home", "yyyy-mm-dd", "total",
                "https://example.org/spec", "8080"):
        assert key in a, key
    assert a["8080"] < 1.0 and a["total"] < 1.0  # a bare number, a quoted word: weak on their own
    assert "numpy" not in a and "served" not in a  # plain words are for the similarity signal, not artifacts
    # The cheap task-side keys contain every single-word artifact, however the other text writes it.
    keys = candidate_keys("weekly_sales.json is built (by api.py) from /data/input.csv with numpy==1.26.4; "
                          "summarize_rows, RowStats, $HOME, YYYY-MM-DD, https://example.org/spec: 8080, total and mean")
    assert {k for k in a if " " not in k} <= keys


def test_docker_image_read_from_task_toml_and_dockerfile(tmp_path):
    (tmp_path / "environment").mkdir()
    (tmp_path / "task.toml").write_text('[environment]\ndocker_image = "someone/my-task:20251031"\n')
    (tmp_path / "environment" / "Dockerfile").write_text("FROM --platform=linux/amd64 python:3.13-slim AS build\n")
    assert docker_images(tmp_path) == {"image:someone/my-task", "image:python"}


def _refs_with_artifacts(root: Path) -> None:
    write_task(root, "log-rollup", "Every night our collector drops files into /app/incoming named like "
               "2024-01-31_web.log. Build the script /app/rollup.py which reads them all and writes "
               "/app/rollup/daily_totals.csv with the header day,level,count for levels CRIT and NOTE, "
               "and prints \"rollup complete\" when it is done. Use pandas 2.2.1 only.")
    write_task(root, "cert-bundle", "Our staging proxy needs a certificate chain. Under /app/pki create "
               "root_ca.key and root_ca.crt valid for 730 days, then issue edge-proxy.internal.test signed by "
               "it, bundle both into /app/pki/chain.pem and record the SHA-256 fingerprint in "
               "/app/pki/fingerprint.txt.")
    rng = random.Random(11)
    for i in range(8):
        write_task(root, f"filler-{i}", prose(rng, 120))


def test_paraphrase_is_flagged_by_artifacts_and_similarity_together(tmp_path):
    refs, tasks = tmp_path / "refs", tmp_path / "tasks"
    _refs_with_artifacts(refs)
    write_task(tasks, "paraphrase", "Files show up in /app/incoming each night, e.g. 2024-01-31_web.log. "
               "Produce /app/rollup.py: it should go over all of them and emit /app/rollup/daily_totals.csv "
               "(columns day,level,count) counting the CRIT and NOTE lines, then say \"rollup complete\". "
               "Only pandas 2.2.1 may be used.")
    # Same artifacts, another job: a bare inventory that happens to name the same files.
    write_task(tasks, "artifacts-only", "Make a tarball of /app/rollup.py and /app/incoming for the backup "
               "robot; list daily_totals.csv in its manifest.")
    # Same topic and words, none of the concrete things: a different log task.
    write_task(tasks, "topic-only", "Every night the collector drops log files somewhere; build a script that "
               "reads them all and counts the levels per day, printing a total when it is done.")
    m = by_task(decontaminate(tasks, refs))
    p = m["paraphrase"]
    assert p.nearest == "log-rollup" and p.flagged, (p.score, p.detail)
    assert p.why["signal"] == "paraphrase" and p.detail["paraphrase"] > max(p.detail["fuzzy"], p.detail.get("c8", 0))
    assert {"/app/incoming", "rollup.py", "daily_totals.csv", "rollup complete"} <= set(p.why["artifacts"])
    assert p.why["similarity"] == p.detail["similarity"] > 0.3
    for name in ("artifacts-only", "topic-only"):
        assert not m[name].flagged, (name, m[name].score, m[name].detail)
    # Each negative is strong on one signal against log-rollup and weak on the other: the product keeps it out.
    ref = Reference(load_docs(refs, reference=True))
    i = [d.name for d in ref.docs].index("log-rollup")
    signals = {d.name: ref.paraphrase_signals(d, ref.shared_artifacts(d)) for d in load_docs(tasks, reference=False)}
    sim, art = signals["artifacts-only"][:2]
    assert art[i] > 0.3 and sim[i] < 0.3, (art[i], sim[i])
    sim, art = signals["topic-only"][:2]
    assert sim[i] > 0.2 and art[i] < 0.1, (art[i], sim[i])


def test_identical_reference_files_flag_a_task_whatever_its_words(tmp_path):
    refs, tasks = tmp_path / "refs", tmp_path / "tasks"
    _refs_with_artifacts(refs)
    verifier = "\n".join(f"def test_case_{i}():\n    assert open('/app/rollup/daily_totals.csv').read().count"
                         f"('CRIT') == {i * 7}\n" for i in range(6))
    standard = "#!/bin/bash\n# the same runner in every task\nuvx -p 3.13 -w pytest==8.4.1 pytest /tests -rA\n"
    for name in ("log-rollup", "cert-bundle"):
        (refs / name / "tests").mkdir()
        (refs / name / "tests" / "test.sh").write_text(standard)
    (refs / "log-rollup" / "tests" / "test_outputs.py").write_text(verifier)
    (refs / "log-rollup" / "task.toml").write_text('[environment]\ndocker_image = "bench/log-rollup:2025"\n')
    write_task(tasks, "copied-verifier", prose(random.Random(4), 60),
               tests="  " + verifier.replace("\n", "  \n"))  # whitespace changes do not hide a copy
    write_task(tasks, "standard-runner-only", prose(random.Random(5), 60))
    (tasks / "standard-runner-only" / "tests").mkdir()
    (tasks / "standard-runner-only" / "tests" / "test.sh").write_text(standard)
    m = by_task(decontaminate(tasks, refs))
    c = m["copied-verifier"]
    assert c.nearest == "log-rollup" and c.flagged and c.detail["files"] == 1.0, c.detail
    assert c.why["signal"] == "files" and c.why["files"] == ["tests/test_outputs.py"]
    # A file several references share (the standard runner) is no evidence.
    assert not m["standard-runner-only"].flagged and "files" not in m["standard-runner-only"].detail


def test_reference_tests_and_solution_add_artifacts(tmp_path):
    """What only the reference's tests or solution name (an output file, a port) is evidence too."""
    refs, tasks = tmp_path / "refs", tmp_path / "tasks"
    _refs_with_artifacts(refs)
    write_task(refs, "terse", "Stand up the quote service described in the repository and keep it running.",
               tests="import requests\n\ndef test_quote():\n"
                     "    r = requests.get('http://127.0.0.1:7319/v2/quote')\n"
                     "    assert r.json()['symbol'] == 'ZXQW'\n"
                     "    assert open('/srv/quotes/ledger_snapshot.bin', 'rb')\n")
    (refs / "terse" / "solution").mkdir()
    (refs / "terse" / "solution" / "solve.sh").write_text("cd /srv/quotes && ./quoted --port 7319 -s ZXQW &\n")
    write_task(tasks, "restated", "Start the quote service from the repo on port 7319 (endpoint /v2/quote, symbol "
               "ZXQW) and leave it running; it keeps /srv/quotes/ledger_snapshot.bin up to date.")
    m = by_task(decontaminate(tasks, refs))["restated"]
    assert m.nearest == "terse" and m.flagged, (m.score, m.detail)
    assert {"7319", "zxqw", "ledger_snapshot.bin", "/srv/quotes"} <= set(m.why["artifacts"]), m.why


def _paraphrase_dirs(kind: str) -> list[Path]:
    return sorted(p for p in (DATA / kind).iterdir() if (p / "instruction.md").is_file())


@needs_reference
def test_paraphrases_of_terminal_bench_2_tasks_are_flagged():
    """Paraphrases written for this test (own words; same task, files and expected outputs) of 38 TB2 tasks:
    paraphrases/ (31) were at hand while the signals were designed, heldout/ (7) were written after.

    The word-copy signals alone scored 0.09-0.69 on paraphrases/ (3 flagged)."""
    paraphrases = [f"{kind}/{p.name}" for kind in ("paraphrases", "heldout") for p in _paraphrase_dirs(kind)]
    assert len(paraphrases) >= 20
    m = by_task(decontaminate(DATA, REFERENCE))
    for name in paraphrases:
        r = m[name]
        assert r.nearest == name.split("/")[1], (r.task, r.nearest, r.detail)
        assert r.flagged, (r.task, r.score, r.detail, r.why)
        assert r.why["artifacts"] and r.why["signal"], r.why
    # References naming at most two concrete things are found (right nearest) but not flagged on that alone.
    for folder in _paraphrase_dirs("weak"):
        assert m[f"weak/{folder.name}"].nearest == folder.name, m[f"weak/{folder.name}"]
    # Different tasks on the same topics (a web server on 8080, a SQLite export, a regex, a key pair).
    for folder in _paraphrase_dirs("unrelated"):
        r = m[f"unrelated/{folder.name}"]
        assert not r.flagged and r.score < 0.4, (r.task, r.nearest, r.score, r.detail)


@needs_reference
def test_examples_and_a_synth_sample_of_every_family_are_clean(tmp_path):
    """A few hundred synthesized tasks (every family) and examples/tasks: nothing flagged, a wide margin."""
    out = tmp_path / "corpus"
    assert main(["synth", "--out", str(out), "--n", "240", "--seed", "3", "--no-validate"]) == 0
    for root, n in ((out, 240), (EXAMPLES, None)):
        matches = decontaminate(root, REFERENCE)
        assert n is None or len(matches) == n
        worst = max(matches, key=lambda m: m.score)
        assert not worst.flagged and worst.score < 0.4, (worst.task, worst.nearest, worst.score, worst.detail)


def test_cli_text_report_says_why(tmp_path, capsys):
    refs, tasks = tmp_path / "refs", tmp_path / "tasks"
    _refs_with_artifacts(refs)
    write_task(tasks, "suspect", "Take the CRIT and NOTE counts per day from the 2024-01-31_web.log style files "
               "in /app/incoming, write them with /app/rollup.py to /app/rollup/daily_totals.csv "
               "(day,level,count) and finish by printing \"rollup complete\"; pandas 2.2.1 only.")
    assert main(["decontam", str(tasks), "--against", str(refs)]) == 3
    out = capsys.readouterr().out
    why = next(line for line in out.splitlines() if "why:" in line)
    assert "paraphrase" in why and "daily_totals.csv" in why and "/app/incoming" in why
