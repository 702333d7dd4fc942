"""Starter families: one- or two-command tasks sized for the embedded demo's tiny model.

Why they exist: the demo (`conch train` with its defaults) must show learning on a 2-core CPU in minutes,
with a 5.6M-parameter model trained from scratch. The other families need many turns of long pipelines, which
such a model cannot learn in that budget. These keep what matters for the recipe: a real shell, real files,
the task's own tests, several tests per task (so the count reward is dense: 2 of 3 beats 0 of 3), and names
drawn at random per seed, so a policy must read the instruction and copy the right names into its commands —
a new seed cannot be solved by replaying a memorised command.
"""

from __future__ import annotations

import random

from conch.tasks.synth.base import TRAIN, TaskDraft, family, literal, pick, q, words

FINAL = "Done."


def _join(items: list[str]) -> str:
    return ", ".join(items[:-1]) + " and " + items[-1] if len(items) > 1 else items[0]


@family("make-dirs", TRAIN, "starter", "create three named directories")
def make_dirs(rng: random.Random) -> TaskDraft:
    names = words(rng, "animal", 3)
    paths = [f"/app/{n}" for n in names]
    verb = pick(rng, ["Create", "Make"])
    instruction = f"{verb} the directories {_join(paths)}.\n"
    tests = [f"def test_dir_{n}():\n    assert os.path.isdir({p!r})\n" for n, p in zip(names, paths)]
    return TaskDraft(instruction=instruction, tests=tests, solution=["mkdir -p " + " ".join(paths)],
                     files={"README": "scratch space\n"}, final_message=FINAL, tags=("starter", "mkdir"))


@family("write-words", TRAIN, "starter", "write given words into named files")
def write_words(rng: random.Random) -> TaskDraft:
    targets = words(rng, "animal", 2)
    values = words(rng, "fruit", 2)
    pairs = [(f"/app/{t}.txt", v) for t, v in zip(targets, values)]
    form = pick(rng, ["Put {v} into {p}.", "Save {v} in {p}.", "Store {v} in {p}."])
    instruction = " ".join(form.format(v=v, p=p) for p, v in pairs) + "\n"
    tests = []
    for (p, v), t in zip(pairs, targets):
        tests.append(f"def test_{t}_exists():\n    assert os.path.isfile({p!r})\n")
        tests.append(f"def test_{t}_content():\n    assert read({p!r}).strip() == {v!r}\n")
    return TaskDraft(instruction=instruction, tests=tests, solution=[f"echo {v} > {p}" for p, v in pairs],
                     files={"README": "scratch space\n"}, final_message=FINAL, tags=("starter", "echo"))


@family("count-lines", TRAIN, "starter", "count the lines of a named file")
def count_lines(rng: random.Random) -> TaskDraft:
    name = pick(rng, ["fruit", "city", "animal"])
    src = f"/app/{words(rng, name, 1)[0]}.txt"
    n = rng.randint(3, 40)
    body = "".join(pick(rng, ["alpha", "beta", "gamma", "delta", "omega"]) + f" {rng.randint(0, 999)}\n"
                   for _ in range(n))
    form = pick(rng, ["Write the number of lines in {src} to /app/count.txt.",
                      "Count the lines of {src} and save the number in /app/count.txt.",
                      "Save the line count of {src} in /app/count.txt."])
    instruction = form.format(src=src) + "\n"
    tests = [
        "def test_count_exists():\n    assert os.path.isfile('/app/count.txt')\n",
        "def test_count_is_a_number():\n    assert read('/app/count.txt').strip().isdigit()\n",
        f"def test_count_value():\n    assert int(read('/app/count.txt').strip()) == {n}\n",
    ]
    return TaskDraft(instruction=instruction, tests=tests, solution=[f"wc -l < {src} > /app/count.txt"],
                     files={src[5:]: body}, final_message=FINAL, tags=("starter", "wc"))


@family("copy-files", TRAIN, "starter", "copy two named files into a folder")
def copy_files(rng: random.Random) -> TaskDraft:
    names = words(rng, "city", 4)
    chosen = names[:2]
    files = {f"in/{n}.txt": f"{n} {rng.randint(1000, 9999)}\n" for n in names}
    srcs = [f"/app/in/{n}.txt" for n in chosen]
    instruction = f"Copy {_join(srcs)} into the folder /app/out.\n"
    prelude = f"EXPECTED = {literal({f'{n}.txt': files[f'in/{n}.txt'] for n in chosen})}\n"
    tests = ["def test_out_folder():\n    assert os.path.isdir('/app/out')\n"]
    for n in chosen:
        tests.append(f"def test_copied_{n}():\n    assert read('/app/out/{n}.txt') == EXPECTED['{n}.txt']\n")
    tests.append("def test_nothing_else_copied():\n"
                 "    assert sorted(os.listdir('/app/out')) == sorted(EXPECTED)\n")
    return TaskDraft(instruction=instruction, tests=tests, test_prelude=prelude,
                     solution=["mkdir -p /app/out && cp " + " ".join(srcs) + " /app/out/"],
                     files=files, final_message=FINAL, tags=("starter", "cp"))


@family("remove-files", TRAIN, "starter", "delete two named files, keep the rest")
def remove_files(rng: random.Random) -> TaskDraft:
    names = words(rng, "name", 5)
    doomed, kept = names[:2], names[2:]
    files = {f"tmp/{n}.log": f"{n} log\n" for n in names}
    paths = [f"/app/tmp/{n}.log" for n in doomed]
    instruction = f"Delete {_join(paths)}. Keep the other files in /app/tmp.\n"
    tests = [f"def test_removed_{n}():\n    assert not os.path.exists('/app/tmp/{n}.log')\n" for n in doomed]
    tests.append(f"def test_others_kept():\n    assert sorted(os.listdir('/app/tmp')) == {sorted(f'{n}.log' for n in kept)!r}\n")
    return TaskDraft(instruction=instruction, tests=tests, solution=["rm -f " + " ".join(q(p) for p in paths)],
                     files=files, final_message=FINAL, tags=("starter", "rm"))


STARTER_FAMILIES = ("make-dirs", "write-words", "count-lines", "copy-files", "remove-files")
