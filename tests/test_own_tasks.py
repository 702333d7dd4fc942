"""Training on the user's own tasks, piece by piece: cutting solve.sh into commands, demonstrations run in real
sandboxes (kept only when they pass), JSONL chats, the seeded split, and what `--resume` may change."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from conch.config import Config, ConfigError, load_config
from conch.rl.stages import check_resume_changes, config_changes
from conch.rl.user_corpus import parse_split, split_counts, split_tasks
from conch.tasks.demos import DemoFormatError, normalize_chat, read_sft_data, split_script
from own_tasks import write_task


def test_split_script_one_command_per_turn():
    script = """#!/bin/bash
set -euo pipefail
# a comment
mkdir -p /app/out

cd /app/out
cat > a.txt <<'EOF'
line one
EOF
for f in *.txt; do
  echo "$f"
done
echo one \\
  two
if [ -f a.txt ]; then echo yes; fi  # trailing comment
"""
    assert split_script(script) == [
        "mkdir -p /app/out",
        "cd /app/out",
        "cat > a.txt <<'EOF'\nline one\nEOF",
        'for f in *.txt; do\n  echo "$f"\ndone',
        "echo one \\\n  two",
        "if [ -f a.txt ]; then echo yes; fi  # trailing comment",
    ]


def test_split_script_keeps_an_unterminated_tail():
    assert split_script("echo a\nif true; then\n echo b\n") == ["echo a", "if true; then\n echo b"]


def test_normalize_chat_openai_style():
    rec = {"messages": [
        {"role": "user", "content": "make a dir"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": '{"command": "mkdir d"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "[exit code: 0]"},
        {"role": "assistant", "content": "Done."}]}
    chat = normalize_chat(rec, "f:1")
    assert chat["messages"][0]["role"] == "system"  # conch's own system prompt, as rollouts show it
    assert chat["messages"][2]["tool_calls"][0]["function"]["arguments"] == {"command": "mkdir d"}
    assert chat["messages"][2]["content"] == ""


@pytest.mark.parametrize("rec, words", [
    ({"msgs": []}, "messages"),
    ({"messages": [{"role": "user", "content": "x"}]}, "user message after"),
    ({"messages": [{"role": "user", "content": "x"}, {"role": "tool", "content": "y"}]}, "no assistant"),
    ({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "tool_calls": [
        {"function": {"name": "bash", "arguments": "{oops"}}]}]}, "not JSON"),
    ({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "a"},
                   {"role": "user", "content": "again"}]}, "only assistant and tool"),
])
def test_normalize_chat_rejects(rec, words):
    with pytest.raises(DemoFormatError, match=words):
        normalize_chat(rec, "f:3")


def test_read_sft_data_names_the_line(tmp_path):
    f = tmp_path / "d.jsonl"
    good = {"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "ok"}]}
    f.write_text(json.dumps(good) + "\n\n" + json.dumps({"messages": 3}) + "\n")
    with pytest.raises(DemoFormatError, match=rf"{f}:3"):
        read_sft_data(f)
    f.write_text(json.dumps(good) + "\n")
    assert len(read_sft_data(f)) == 1


def test_split_counts_and_seeded_split():
    assert split_counts(10, [0.3, 0.5, 0.2]) == [3, 5, 2]
    assert split_counts(7, [0.3, 0.5, 0.2]) == [2, 4, 1]
    assert split_counts(2, [0.3, 0.5, 0.2]) == [0, 1, 1]
    assert split_counts(5, [0, 1, 0]) == [0, 5, 0]
    tasks = [SimpleNamespace(name=f"t{i:02d}") for i in range(20)]
    a = split_tasks(tasks, [0.3, 0.5, 0.2], seed=1)
    assert a == split_tasks(list(reversed(tasks)), [0.3, 0.5, 0.2], seed=1)  # by name, not by input order
    assert [len(p) for p in a] == [6, 10, 4]
    names = [t.name for p in a for t in p]
    assert sorted(names) == [t.name for t in tasks]  # disjoint and complete
    assert a != split_tasks(tasks, [0.3, 0.5, 0.2], seed=2)


def test_parse_split():
    assert parse_split(["0.3", "0.5", "0.2"]) == [0.3, 0.5, 0.2]
    for bad in (["a", "b", "c"], [0.5, 0.5], [-1, 1, 1], [0, 0, 0]):
        with pytest.raises(ConfigError, match="corpus.split"):
            parse_split(bad)


def test_split_round_trips_through_the_run_config(tmp_path):
    from conch.config import describe

    cfg = load_config(None, ["corpus.split=0.2,0.6,0.2"])
    (tmp_path / "c.toml").write_text(describe(cfg))
    assert parse_split(load_config(tmp_path / "c.toml").corpus.split) == [0.2, 0.6, 0.2]


def test_resume_says_what_changed_and_refuses_pinned_stages(tmp_path):
    old = Config()
    new = load_config(None, ["ppo.iterations=30", "corpus.train_tasks=/data/tasks"])
    assert config_changes(old, new) == [("corpus.train_tasks", "", "/data/tasks"), ("ppo.iterations", 16, 30)]
    # Nothing complete yet: both changes are allowed and reported.
    assert check_resume_changes(old, new, tmp_path) == ["corpus.train_tasks: '' -> '/data/tasks'",
                                                        "ppo.iterations: 16 -> 30"]
    (tmp_path / "corpus.done.json").write_text("{}")
    with pytest.raises(ConfigError, match="corpus.train_tasks cannot change on --resume: the corpus stage"):
        check_resume_changes(old, new, tmp_path)
    (tmp_path / "sft.done.json").write_text("{}")
    with pytest.raises(ConfigError, match="sft.lr cannot change"):
        check_resume_changes(old, load_config(None, ["sft.lr=0.1"]), tmp_path)
    assert check_resume_changes(old, load_config(None, ["ppo.lr=0.001"]), tmp_path) == ["ppo.lr: 1e-06 -> 0.001"]


def test_demonstrations_are_kept_only_when_they_pass(tmp_path, base_root):
    from conch.tasks.loader import load_tasks
    from conch.tasks.demos import demonstrate_all

    write_task(tmp_path, "word-apple", "apple")
    wrong = "#!/bin/bash\nmkdir -p /app/out\necho oak > /app/out/word-wrong.txt\n"  # passes 1 of 2 tests
    write_task(tmp_path, "word-wrong", "birch", solve=wrong)
    results = asyncio.run(demonstrate_all(load_tasks([tmp_path])))
    by = {r.task: r for r in results}
    good, bad = by["word-apple"], by["word-wrong"]
    assert good.error is None and good.commands == 4
    calls = [m["tool_calls"][0]["function"]["arguments"]["command"] for m in good.chat["messages"]
             if m.get("tool_calls")]
    assert calls[0] == "mkdir -p /app/out" and calls[2].startswith("cat > word-apple.txt <<EOF")
    tool_msgs = [m["content"] for m in good.chat["messages"] if m["role"] == "tool"]
    assert tool_msgs[-1] == "wrote word-apple.txt\n[exit code: 0]"  # observed in the sandbox, not made up
    assert bad.chat is None and "passed 1/2 tests" in bad.error


ATIF = {
    "schema_version": "ATIF-v1.4", "session_id": "s1", "agent": {"name": "terminus-2", "version": "1"},
    "steps": [
        {"step_id": 1, "source": "user", "message": "Make /app/out."},
        {"step_id": 2, "source": "agent", "message": "Creating it.",
         "tool_calls": [{"tool_call_id": "c1", "function_name": "bash_command",
                         "arguments": {"keystrokes": "mkdir -p /app/out\n"}}],
         "observation": {"results": [{"source_call_id": "c1", "content": ""}]}},
        {"step_id": 3, "source": "agent", "message": "Done."},
    ],
}


def test_sft_data_reads_atif_trajectories_and_folders(tmp_path):
    (tmp_path / "trial1").mkdir()
    (tmp_path / "trial1" / "trajectory.json").write_text(json.dumps(ATIF))
    good = {"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "ok"}]}
    (tmp_path / "more.jsonl").write_text(json.dumps(good) + "\n" + json.dumps(ATIF) + "\n")
    chats = read_sft_data(tmp_path)
    assert len(chats) == 3
    atif = chats[1]  # more.jsonl:2 sorts after more.jsonl:1, before trial1/
    roles = [m["role"] for m in atif["messages"]]
    assert roles == ["system", "user", "assistant", "tool", "assistant"]
    assert atif["messages"][2]["tool_calls"][0]["function"] == {"name": "bash",
                                                                "arguments": {"command": "mkdir -p /app/out"}}
    bad = dict(ATIF, steps=[ATIF["steps"][0], {"step_id": 2, "source": "agent", "message": "",
                                               "tool_calls": [{"tool_call_id": "w", "function_name": "web",
                                                               "arguments": {"q": 1}}]}])
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    with pytest.raises(DemoFormatError, match="bad.json: step 1: tool call 'web' is not a shell command"):
        read_sft_data(tmp_path)
    del bad["steps"][1]["tool_calls"][0]["tool_call_id"]  # harbor's schema requires it
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    with pytest.raises(DemoFormatError, match="bad.json: not a valid ATIF trajectory: .*tool_call_id"):
        read_sft_data(tmp_path)


def test_a_failed_corpus_stage_is_not_pinned_and_resume_can_fix_it(tmp_path):
    import subprocess
    import sys

    from own_tasks import write_malformed

    def conch(*args):
        return subprocess.run([sys.executable, "-m", "conch", *args], capture_output=True, text=True, timeout=120)

    a, b, run = tmp_path / "a", tmp_path / "b", tmp_path / "run"
    write_malformed(a, "only-broken")
    write_malformed(b, "also-broken")
    p = conch("train", "--out", str(run), f"corpus.train_tasks={a}")
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert "skipping malformed task only-broken" in p.stderr and f"no usable tasks in {a}" in p.stderr
    assert not (run / "corpus.done.json").exists()
    r = conch("train", "--resume", str(run), f"corpus.train_tasks={b}")
    assert f"resume changes corpus.train_tasks: '{a}' -> '{b}'" in r.stderr  # allowed: the stage never finished
    assert r.returncode == 2 and f"no usable tasks in {b}" in r.stderr
    assert f'train_tasks = "{b}"' in (run / "config.toml").read_text()


def test_user_corpus_decontaminates_before_the_split(tmp_path):
    from conch.rl.user_corpus import build_user_corpus

    tasks = tmp_path / "tasks"
    texts = {"apple": "Parse the nginx access log and report the ten most frequent client addresses.",
             "birch": "Compile the C project under /src with make and fix the missing header include.",
             "cedar": "Write a shell script that rotates the files in /var/spool/jobs, keeping the newest seven "
                      "archives compressed with gzip and deleting everything older than thirty days.",
             "delta": "Create a Python virtual environment and pin the versions listed in requirements.txt.",
             "ember": "Find every symbolic link under /opt that points to a missing file and remove it."}
    for w, text in texts.items():
        (write_task(tasks, f"word-{w}", w) / "instruction.md").write_text(text + "\n")
    ref = tmp_path / "bench" / "copied"
    ref.mkdir(parents=True)
    (ref / "instruction.md").write_text((tasks / "word-cedar" / "instruction.md").read_text())
    demos = tmp_path / "d.jsonl"
    demos.write_text(json.dumps({"messages": [{"role": "user", "content": "x"},
                                              {"role": "assistant", "content": "ok"}]}) + "\n")
    cfg = load_config(None, [f"corpus.train_tasks={tasks}", f"corpus.decontam_against={tmp_path / 'bench'}",
                             f"corpus.sft_data={demos}", "corpus.split=0.34,0.33,0.33"])
    lines: list[str] = []
    done = build_user_corpus(cfg, tmp_path / "run", lines.append)
    report = json.loads((tmp_path / "run" / "decontam.json").read_text())
    assert report["flagged"] == 1 and [t["task"] for t in report["tasks"] if t["flagged"]] == ["word-cedar"]
    used = sum(done["tasks"].values(), [])
    assert "word-cedar" not in used and len(used) == 4
    assert any("1 dropped: word-cedar" in line for line in lines)
    linked = {p.name for p in Path(done["rl"]).iterdir()}
    assert linked == set(done["tasks"]["rl"]) and all(p.is_symlink() for p in Path(done["rl"]).iterdir())
    assert Path(done["trajectories"]).read_text().count("\n") == 1


def test_two_folders_use_the_whole_training_folder_for_sft_and_ppo(tmp_path):
    from conch.rl.user_corpus import build_user_corpus

    train, held = tmp_path / "train", tmp_path / "held"
    for w in ("apple", "birch", "cedar"):
        write_task(train, f"word-{w}", w)
    write_task(held, "word-delta", "delta")
    demos = tmp_path / "d.jsonl"
    demos.write_text(json.dumps({"messages": [{"role": "user", "content": "x"},
                                              {"role": "assistant", "content": "ok"}]}) + "\n")
    cfg = load_config(None, [f"corpus.train_tasks={train}", f"corpus.eval_tasks={held}", f"corpus.sft_data={demos}"])
    done = build_user_corpus(cfg, tmp_path / "run", lambda m: None)
    assert done["tasks"] == {"sft": ["word-apple", "word-birch", "word-cedar"],
                             "rl": ["word-apple", "word-birch", "word-cedar"], "eval": ["word-delta"]}
    assert [p.resolve() for p in Path(done["eval"]).iterdir()] == [(held / "word-delta").resolve()]
