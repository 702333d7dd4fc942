"""Starter families: one-command tasks sized for the embedded demo's tiny model.

Why they exist: the demo (`conch train` with its defaults) must show learning on a 2-core CPU in minutes, with
a 5.6M-parameter model trained from scratch. The other families need long multi-turn pipelines, and even
copying arbitrary names from an instruction into a command is beyond such a model in that budget (measured: a
warm start on name-copying tasks reached 0% at temperature 1). These keep what matters for the recipe: a real
shell, real files, the task's own tests, several tests per task (so the count reward is dense: 2 of 4 beats
0 of 4), and instances that differ per seed. The command is a family skeleton plus one slot, the folder the
instruction names (drawn from three), so the policy must read the instruction to fill it; the files themselves
(names, contents, how many) are random per seed and never named, so the command must work on whatever is there
(globs, pipes) rather than replay memorised names.

Why seven wordings per family: with three, 150 expert trajectories covered the instructions so well that the
warm start already passed 0.90 of new instances at temperature 1, leaving PPO nothing to learn (+1.8 points).

Why each family has a `mistake` (a one-token-different command that passes some tests but not all: an
off-by-one range, `wc -w` for `wc -l`, `ls -a`, a glob without its extension): with a perfect expert, whether
PPO had anything to add depended on where SFT happened to stop: by its step budget it had learned to read the
instruction's folder fully (warm 0.93, PPO +0.5), half (+17.1 and +4.8 from two SFT seeds) or not at all
(-4.6). Real demonstrations come from an imperfect teacher; with `corpus.mistake_rate = 0.5` half of the demo's
demonstrations show the family's mistake (a real run, kept only if it fails a test the oracle passes). SFT
imitates the mix, as it must: no instruction says which way the expert would go, so the warm policy makes the
mistake about half the time whatever it learned about folders, and only the verifier's count (n-1 against n
tests) can tell PPO which way passes. Unlike a folder the policy cannot read (below), the right choice is
the same in every task of a family, so PPO can learn it without conditioning on anything. The README has the
measured runs.

Why the slot is a folder: the tiny model learns to read a folder name from the instruction (with three
wordings, after SFT on the demo's 150 expert trajectories p(right folder) was 0.94-1.00 in
`benchmarks/diagnostics/slot_probs.py`; with 50 it was not read at all, 0.25-0.45, with 80 it was). Earlier versions also drew a
file extension or a folder count; the warm policy never learned to read those (p 0.30-0.39, chance is 0.33,
even with the instruction spelling the glob exactly as the command does), and PPO then made those families
worse (copy-files 0.29 -> 0.15, remove-files 0.46 -> 0.16): a choice the policy cannot condition on only
collapses under RL.

Why every family draws from the same three folders: make-dirs once drew its base from its own names (out,
jobs, runs). `/jobs` and `/runs` occurred in no other family, and the warm policy never told them apart: on
jobs tasks and on runs tasks alike it gave p(jobs) 0.57-0.69 and p(runs) 0.26-0.38, while `/out` (also in
copy-files' commands) was read at 0.85. PPO then pushed make-dirs towards whichever of the two the batches
favoured (p(jobs) 0.89 on runs tasks too) and, in longer runs, collapsed it (pass rate 0.71 -> 0.32). A folder
name is read when the policy has seen it copied in many commands, so the slot values are shared.
"""

from __future__ import annotations

import random

from conch.tasks.synth.base import TRAIN, TaskDraft, family, literal, pick, words

FINAL = "Done."
DIRS = ["data", "input", "logs"]
CONTEXT = ["", "", "The files are already in place. ", "Use the shell. ", "Tidy work matters here. ",
           "One command is enough. ", "Small chore: ",
           "Housekeeping: ", "Before the nightly backup runs: ", "Please help. ",
           "Cleanup request: "]
CLOSING = ["", "", " Keep it simple.", " No need to explain.", " Thanks!"]


def _say(rng: random.Random, openings: list[str], **slots: object) -> str:
    """An instruction in one of several wordings, with optional sentences around it (surface variety)."""
    return pick(rng, CONTEXT) + pick(rng, openings).format(**slots) + pick(rng, CLOSING) + "\n"


def _junk(rng: random.Random, n: int) -> list[str]:
    return [f"{pick(rng, ['alpha', 'beta', 'gamma', 'delta', 'omega'])} {rng.randint(0, 999)}\n" for _ in range(n)]


@family("make-dirs", TRAIN, "starter", "create three numbered folders in a named folder")
def make_dirs(rng: random.Random) -> TaskDraft:
    base = pick(rng, DIRS)
    instruction = _say(rng, ["Create the folders /app/{b}/1, /app/{b}/2 and /app/{b}/3.",
                             "Make numbered folders /app/{b}/{{1..3}} (one per number).",
                             "Create three numbered folders in /app/{b}: 1, 2 and 3.",
                             "Inside /app/{b}, set up subfolders named 1, 2 and 3.",
                             "/app/{b} needs three new directories called 1, 2 and 3.",
                             "Add directories 1 through 3 under /app/{b}.",
                             "We want /app/{b} to contain the empty folders 1, 2 and 3."], b=base)
    tests = [f"def test_folder_{i}():\n    assert os.path.isdir('/app/{base}/{i}')\n" for i in range(1, 4)]
    tests.append(f"def test_no_other_folders():\n    assert sorted(os.listdir('/app/{base}')) == ['1', '2', '3']\n")
    return TaskDraft(instruction=instruction, tests=tests, solution=[f"mkdir -p /app/{base}/{{1..3}}"],
                     mistake=[f"mkdir -p /app/{base}/{{0..3}}"],  # off by one: an extra folder 0
                     files={"README": "scratch space\n"}, final_message=FINAL, tags=("starter", "mkdir"))


@family("count-lines", TRAIN, "starter", "count the lines of the file in a folder")
def count_lines(rng: random.Random) -> TaskDraft:
    d, n = pick(rng, DIRS), rng.randint(3, 40)
    name = words(rng, pick(rng, ["fruit", "city", "animal"]), 1)[0]
    instruction = _say(rng, ["Find how many lines the file in /app/{d} has and write that number into /app/count.txt.",
                             "Write the number of lines of the file in /app/{d} to /app/count.txt.",
                             "How many lines are in the file under /app/{d}? Write the answer to /app/count.txt.",
                             "Count the lines of the single file in /app/{d}; store the count in /app/count.txt.",
                             "There is one file in /app/{d}. Put its line count in /app/count.txt.",
                             "Line count of the lone /app/{d} file goes into /app/count.txt.",
                             "Find how many lines the /app/{d} file has; /app/count.txt gets that number."],
                       d=d)
    tests = [
        "def test_count_exists():\n    assert os.path.isfile('/app/count.txt')\n",
        "def test_count_is_a_number():\n    assert read('/app/count.txt').strip().isdigit()\n",
        f"def test_count_value():\n    assert int(read('/app/count.txt').strip()) == {n}\n",
    ]
    return TaskDraft(instruction=instruction, tests=tests, solution=[f"cat /app/{d}/* | wc -l > /app/count.txt"],
                     mistake=[f"cat /app/{d}/* | wc -w > /app/count.txt"],  # words, not lines
                     files={f"{d}/{name}.txt": "".join(_junk(rng, n))}, final_message=FINAL, tags=("starter", "wc"))


@family("count-files", TRAIN, "starter", "count the files in a folder")
def count_files(rng: random.Random) -> TaskDraft:
    d, n = pick(rng, DIRS), rng.randint(2, 12)
    names = words(rng, "name", n)
    instruction = _say(rng, ["Write how many files /app/{d} holds to /app/total.txt.",
                             "Count the files in /app/{d} and save the number in /app/total.txt.",
                             "Put the number of files in /app/{d} into /app/total.txt.",
                             "How many files are there in /app/{d}? Save the answer in /app/total.txt.",
                             "Write the number of files in /app/{d} to /app/total.txt.",
                             "Tally the files of /app/{d} and write the tally to /app/total.txt.",
                             "Store the file count of /app/{d} in /app/total.txt."], d=d)
    tests = [
        "def test_total_exists():\n    assert os.path.isfile('/app/total.txt')\n",
        "def test_total_is_a_number():\n    assert read('/app/total.txt').strip().isdigit()\n",
        f"def test_total_value():\n    assert int(read('/app/total.txt').strip()) == {n}\n",
    ]
    return TaskDraft(instruction=instruction, tests=tests, solution=[f"ls /app/{d} | wc -l > /app/total.txt"],
                     mistake=[f"ls -a /app/{d} | wc -l > /app/total.txt"],  # counts . and .. too
                     files={f"{d}/{x}.dat": pick(rng, _junk(rng, 3)) for x in names}, final_message=FINAL,
                     tags=("starter", "ls"))


def _mixed_files(rng: random.Random, folder: str, ext: str, exts: list[str]) -> tuple[dict[str, str], list, list]:
    """Two or three files with extension `ext` and two with other extensions, random names."""
    names = words(rng, "city", rng.randint(4, 5))
    chosen = names[: len(names) - 2]
    others = [(x, pick(rng, [e for e in exts if e != ext])) for x in names[len(chosen):]]
    files = {f"{folder}/{x}.{ext}": f"{x} {rng.randint(1000, 9999)}\n" for x in chosen}
    files.update({f"{folder}/{x}.{e}": f"{x} {rng.randint(1000, 9999)}\n" for x, e in others})
    return files, [f"{x}.{ext}" for x in chosen], [f"{x}.{e}" for x, e in others]


@family("copy-files", TRAIN, "starter", "copy the .txt files of a folder into /app/out")
def copy_files(rng: random.Random) -> TaskDraft:
    d = pick(rng, DIRS)
    files, chosen, _ = _mixed_files(rng, d, "txt", ["txt", "csv", "log"])
    instruction = _say(rng, ["Copy the .txt files of /app/{d} into /app/out.",
                             "Every .txt file in /app/{d} should also end up in /app/out.",
                             "Put copies of the .txt files in /app/{d} into /app/out.",
                             "Duplicate the text files (.txt) from /app/{d} into a folder /app/out.",
                             "/app/out must receive a copy of each .txt file in /app/{d}.",
                             "Back up the .txt files of /app/{d} to /app/out; leave the originals.",
                             "Gather copies of all .txt files from /app/{d} in /app/out."], d=d)
    prelude = f"EXPECTED = {literal({n: files[f'{d}/{n}'] for n in chosen})}\n"
    tests = ["def test_out_folder():\n    assert os.path.isdir('/app/out')\n"]
    tests += [f"def test_copied_{i}():\n    assert read('/app/out/{n}') == EXPECTED['{n}']\n"
              for i, n in enumerate(chosen)]
    tests.append("def test_nothing_else_copied():\n    assert sorted(os.listdir('/app/out')) == sorted(EXPECTED)\n")
    return TaskDraft(instruction=instruction, tests=tests, test_prelude=prelude,
                     solution=[f"mkdir -p /app/out && cp /app/{d}/*.txt /app/out/"],
                     mistake=[f"mkdir -p /app/out && cp /app/{d}/* /app/out/"],  # copies every file
                     files=files, final_message=FINAL, tags=("starter", "cp"))


@family("remove-files", TRAIN, "starter", "delete the .tmp files of a folder, keep the rest")
def remove_files(rng: random.Random) -> TaskDraft:
    d = pick(rng, DIRS)
    files, doomed, kept = _mixed_files(rng, d, "tmp", ["tmp", "log", "bak"])
    instruction = _say(rng, ["Delete the .tmp files in /app/{d} and keep the others.",
                             "Remove every .tmp file from /app/{d}; leave the other files alone.",
                             "In /app/{d}, delete all .tmp files and nothing else.",
                             "Clean the .tmp files out of /app/{d}, keeping everything else.",
                             "/app/{d} has temporary .tmp files; get rid of them and only them.",
                             "Purge the .tmp files under /app/{d}. The other files stay.",
                             "Only the .tmp files of /app/{d} should be deleted."], d=d)
    tests = [f"def test_removed_{i}():\n    assert not os.path.exists('/app/{d}/{n}')\n" for i, n in enumerate(doomed)]
    tests.append(f"def test_others_kept():\n    assert sorted(os.listdir('/app/{d}')) == {sorted(kept)!r}\n")
    return TaskDraft(instruction=instruction, tests=tests, solution=[f"rm -f /app/{d}/*.tmp"], mistake=[f"rm -f /app/{d}/*"],  # deletes every file
                     files=files, final_message=FINAL, tags=("starter", "rm"))


STARTER_FAMILIES = ("make-dirs", "count-lines", "count-files", "copy-files", "remove-files")
