"""`conch synth --from-seeds`: LLM task synthesis through the gates, against stand-in and real LLM servers.

The capable LLM this pipeline is for cannot run here, so most tests use a stand-in: a small OpenAI-compatible
HTTP server on 127.0.0.1 that replays recorded answers, chosen by the candidate id the prompt names (so the
replay is deterministic whatever the concurrency). Every answer then goes through the real gates: the local
sandbox builds, runs the oracle and nop through conch.harness, decontamination scores it. One test runs
against a real vLLM server serving the tiny model (`vllm_server`; skipped where vLLM is not installed): the
tiny model cannot write tasks, so every candidate must be rejected with a recorded reason.
Network rule: every request goes to 127.0.0.1.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from conch.cli import main

sys.path.insert(0, str(Path(__file__).resolve().parent))
from own_tasks import write_task as write_seed  # noqa: E402

REFERENCE = Path(__file__).resolve().parents[2] / "shared" / "reference" / "terminal-bench-2"
needs_reference = pytest.mark.skipif(not REFERENCE.is_dir(), reason=f"{REFERENCE} not present (no ../shared)")
ROOT = Path(__file__).resolve().parents[1]

TEST_SH = """#!/bin/bash
mkdir -p /logs/verifier
cd /tests
pytest --ctrf /logs/verifier/ctrf.json /tests/test_outputs.py -rA
status=$?
if [ "$status" -eq 0 ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
exit "$status"
"""
TOML = 'version = "1.0"\n\n[verifier]\ntimeout_sec = 60.0\n\n[agent]\ntimeout_sec = 120.0\n'


def answer(files: dict[str, str], chatter: bool = True) -> str:
    """A recorded answer in the prompt's format (with the prose a real model puts around it)."""
    blocks = "\n".join(f'<file path="{p}">\n{c}</file>' for p, c in files.items())
    return ("Here is the task.\n\n" if chatter else "") + blocks + ("\nDone." if chatter else "")


def log_task(instruction: str | None = None, solve: str | None = None, tests: str | None = None) -> dict:
    """Good task A: count the 404s of an access log."""
    return {
        "task.toml": TOML,
        "instruction.md": instruction or "Count the requests in /app/data/access.log that returned HTTP status "
                                         "404 and write that number alone to /app/report/not_found.txt.\n",
        "environment/Dockerfile": "FROM debian:bookworm-slim\nWORKDIR /app\nRUN mkdir -p /app/data && printf "
                                  "'GET /a 200\\nGET /b 404\\nGET /c 404\\nGET /d 500\\n' > /app/data/access.log\n",
        "tests/test.sh": TEST_SH,
        "tests/test_outputs.py": tests or "import os\n\ndef test_report_exists():\n    assert os.path.isfile("
                                          "'/app/report/not_found.txt')\n\ndef test_count():\n    assert open("
                                          "'/app/report/not_found.txt').read().strip() == '2'\n",
        "solution/solve.sh": solve or "#!/bin/bash\nset -e\nmkdir -p /app/report\n"
                                      "grep -c ' 404$' /app/data/access.log > /app/report/not_found.txt\n",
    }


def csv_task(instruction: str | None = None) -> dict:
    """Good task B: sum a CSV column."""
    return {
        "instruction.md": instruction or "The spreadsheet export /app/sales.csv has a header row and an amount "
                                         "column. Put the sum of all amounts, as an integer, in /app/total.txt.\n",
        "environment/Dockerfile": "FROM debian:bookworm-slim\nWORKDIR /app\nRUN printf 'item,amount\\npen,3\\nbook,12\\nlamp,"
                                  "25\\n' > /app/sales.csv\n",
        "tests/test.sh": TEST_SH,
        "tests/test_outputs.py": "def test_total():\n    assert open('/app/total.txt').read().strip() == '40'\n\n"
                                 "def test_input_kept():\n    assert 'lamp' in open('/app/sales.csv').read()\n",
        "solution/solve.sh": "#!/bin/bash\nawk -F, 'NR>1 {s+=$2} END {print s}' /app/sales.csv > /app/total.txt\n",
    }


def rename_task() -> dict:
    """Good task C: rename file extensions."""
    return {
        "instruction.md": "Every photo under /app/photos has the extension .JPEG; rename each so that it ends in "
                          ".jpg, keeping the rest of its name unchanged.\n",
        "environment/Dockerfile": "FROM debian:bookworm-slim\nRUN mkdir -p /app/photos && touch /app/photos/cat.JPEG "
                                  "/app/photos/dog.JPEG\n",
        "tests/test.sh": TEST_SH,
        "tests/test_outputs.py": "import os\n\ndef test_renamed():\n    assert sorted(os.listdir('/app/photos')) == "
                                 "['cat.jpg', 'dog.jpg']\n\ndef test_two_files():\n    assert len(os.listdir("
                                 "'/app/photos')) == 2\n",
        "solution/solve.sh": "#!/bin/bash\ncd /app/photos\nfor f in *.JPEG; do mv \"$f\" \"${f%.JPEG}.jpg\"; done\n",
    }


def broken_oracle() -> dict:
    return log_task(solve="#!/bin/bash\nmkdir -p /app/report\necho 3 > /app/report/not_found.txt\n")


def nop_passes() -> dict:
    return log_task(tests="import os\n\ndef test_log_there():\n    assert os.path.isfile('/app/data/access.log')\n")


def seed_copy() -> dict:
    """Near-duplicate of the seed word-apple (tests/own_tasks.py): same tests, the instruction reworded."""
    seed = ROOT / "tests"
    from own_tasks import SOLVE_SH, TEST_PY
    from own_tasks import TEST_SH as SEED_TEST_SH

    assert seed.is_dir()
    return {"instruction.md": "Please create /app/out/word-apple.txt so that it holds just the single word apple.\n",
            "environment/Dockerfile": "FROM debian:bookworm-slim\nWORKDIR /app\n",
            "tests/test.sh": SEED_TEST_SH, "tests/test_outputs.py": TEST_PY.format(name="word-apple", word="apple"),
            "solution/solve.sh": SOLVE_SH.format(name="word-apple", word="apple"), "task.toml": TOML}


def giveaway() -> dict:
    return csv_task(instruction="Sum the amount column of /app/sales.csv into /app/total.txt by running exactly: "
                                "awk -F, 'NR>1 {s+=$2} END {print s}' /app/sales.csv > /app/total.txt\n")


class FakeLLM:
    """OpenAI-compatible stand-in: GET /v1/models, POST /v1/chat/completions answering from `script`,
    {candidate id: [first answer, repair answer, ...]}; `hold` ids wait until `release` is set."""

    def __init__(self, script: dict[str, list[str]], hold: tuple[str, ...] = ()):
        self.script, self.hold, self.release = script, hold, threading.Event()
        self.requests: list[tuple[str, int]] = []  # (candidate id, answers already in the conversation)
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _send(self, code: int, doc: dict) -> None:
                body = json.dumps(doc).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                try:
                    self.wfile.write(body)
                except BrokenPipeError:  # the client was killed while it waited (the crash test)
                    pass

            def do_GET(self):
                self._send(200, {"object": "list", "data": [{"id": "fake-task-writer", "object": "model"}]})

            def do_POST(self):
                doc = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                text = doc["messages"][1]["content"]
                cid = re.search(r"Candidate: (s\d{5})", text).group(1)
                turn = sum(1 for m in doc["messages"] if m["role"] == "assistant")
                outer.requests.append((cid, turn))
                if cid in outer.hold:
                    outer.release.wait(60)
                answers = outer.script.get(cid, ["I cannot help with that."])
                content = answers[min(turn, len(answers) - 1)]
                self._send(200, {"id": "x", "object": "chat.completion", "model": doc["model"],
                                 "choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                                              "finish_reason": "stop"}]})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def seeds(tmp_path) -> Path:
    root = tmp_path / "seeds"
    write_seed(root, "word-apple", "apple")
    return root


def synth_args(seeds: Path, out: Path, url: str, *extra: str) -> list[str]:
    return ["synth", "--from-seeds", str(seeds), "--llm", url, "--model", "fake-task-writer", "--out", str(out),
            "--sandbox", "local", "--retries", "0", *extra]


def ledger(out: Path) -> dict[str, dict]:
    recs = [json.loads(line) for line in (out / "synth.jsonl").read_text().splitlines() if line.strip()]
    return {r["id"]: r for r in recs}


def gates_of(rec: dict) -> list[str]:
    return [g["gate"] for g in rec["attempts"][-1]["gates"]]


# ------------------------------------------------------------------------------------------- no sandbox


def test_parse_rejects_unsafe_and_incomplete_answers():
    from conch.tasks.llmsynth.parse import ParseError, parse_answer

    files = parse_answer("```xml\n" + answer(log_task()) + "\n```")
    assert files["instruction.md"].startswith("Count the requests") and "task.toml" in files
    for bad, why in ((answer({**log_task(), "../escape.sh": "x"}), "stay inside"),
                     (answer({**log_task(), "/etc/passwd": "x"}), "stay inside"),
                     (answer({k: v for k, v in log_task().items() if k != "tests/test.sh"}), "missing tests/test.sh"),
                     ("Sure! Here is a task: count the 404s.", "no <file"), ("", "empty")):
        with pytest.raises(ParseError, match=why):
            parse_answer(bad)


def test_client_retries_transient_errors_with_backoff():
    from conch.tasks.llmsynth.client import ChatClient, HTTPStatus

    calls = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_POST(self):
            calls.append(self.path)
            self.rfile.read(int(self.headers["Content-Length"]))
            code = 503 if len(calls) < 3 else (400 if "bad" in self.headers.get("Authorization", "") else 200)
            body = json.dumps({"choices": [{"message": {"content": "hi"}}]}).encode()
            self.send_response(code)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        client = ChatClient(url, "m", retries=3, backoff=0.01, api_key="k")
        assert client.chat([{"role": "user", "content": "x"}]) == "hi"
        assert calls == ["/v1/chat/completions"] * 3
        with pytest.raises(HTTPStatus, match="HTTP 400"):  # not transient: no retry
            ChatClient(url, "m", retries=3, backoff=0.01, api_key="bad").chat([{"role": "user", "content": "x"}])
        assert len(calls) == 4
    finally:
        server.shutdown()
        server.server_close()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_bad_input_is_one_line_and_exit_2(tmp_path, seeds, capsys):
    fake = FakeLLM({})
    try:
        empty = tmp_path / "empty"
        empty.mkdir()
        cases = [
            (synth_args(seeds, tmp_path / "o1", f"http://127.0.0.1:{closed_port()}/v1", "--no-decontam"),
             "cannot reach"),
            (synth_args(empty, tmp_path / "o2", fake.url, "--no-decontam"), "no loadable tasks"),
            (synth_args(seeds, tmp_path / "o3", fake.url), "--against REF_DIR is required"),
            (synth_args(seeds, tmp_path / "o4", fake.url, "--no-decontam", "--model", "gpt-x"), "not served"),
            (synth_args(seeds, tmp_path / "o5", fake.url, "--no-decontam", "--api-key-env", "CONCH_NO_SUCH_VAR"),
             "unset or empty"),
            (["synth", "--out", str(tmp_path / "o6"), "--n", "1", "--llm", fake.url], "add --from-seeds"),
        ]
        for argv, expected in cases:
            assert main(argv) == 2, argv
            err = capsys.readouterr().err.strip().splitlines()
            assert len(err) == 1 and expected in err[0], (argv, err)
        assert not fake.requests  # nothing was asked of the model
    finally:
        fake.close()


# ------------------------------------------------------------------------------------------- real sandboxes


def test_each_gate_rejects_its_candidate_and_the_good_task_is_accepted(tmp_path, seeds, base_root, capsys):
    script = {"s00000": [answer(log_task())], "s00001": [answer(broken_oracle())], "s00002": [answer(nop_passes())],
              "s00003": [answer(seed_copy())], "s00004": ["Sure, here is a great task about logs! (no files)"],
              "s00005": [answer(giveaway())]}
    fake = FakeLLM(script)
    out = tmp_path / "out"
    try:
        rc = main(synth_args(seeds, out, fake.url, "--no-decontam", "--n", "5", "--max-candidates", "6",
                             "--jobs", "2", "--llm-jobs", "2"))
    finally:
        fake.close()
    assert rc == 1  # 1 of 5 wanted accepted: said, not a crash
    recs = ledger(out)
    assert sorted(recs) == [f"s0000{i}" for i in range(6)]
    expected = {"s00001": "oracle", "s00002": "nop", "s00003": "duplicate", "s00004": "parse", "s00005": "giveaway"}
    for cid, gate in expected.items():
        rec = recs[cid]
        assert rec["status"] == "rejected" and rec["rejected_at"] == gate and rec["reason"], rec
        assert gates_of(rec)[-1] == gate and rec["prompt_version"] == "v1"
    assert "passed 1/2" in recs["s00001"]["reason"] and "already passes" in recs["s00002"]["reason"]
    assert "seed:word-apple" in recs["s00003"]["reason"] and "gives the solution away" in recs["s00005"]["reason"]
    good = recs["s00000"]
    assert good["status"] == "accepted" and gates_of(good) == ["parse", "load", "build", "oracle", "nop",
                                                                "giveaway", "duplicate"]
    assert all(g["ok"] and g["seconds"] >= 0 for g in good["attempts"][0]["gates"])
    assert len(good["attempts"][0]["answer_sha256"]) == 64 and good["seed"] == "word-apple"
    accepted = Path(good["accepted_path"])
    assert accepted.parent == out and (accepted / "solution" / "solve.sh").stat().st_mode & 0o100
    from conch.tasks.loader import load_tasks

    assert [t.name for t in load_tasks([out])] == [accepted.name]  # only the accepted task is a task in OUT
    capsys.readouterr()
    assert main(["synth", "--stats", str(out), "--json"]) == 0
    st = json.loads(capsys.readouterr().out)
    assert st["candidates"] == 6 and st["accepted"] == 1 and st["gates"]["parse"]["rejected"] == 1
    assert st["gates"]["oracle"] == {"reached": 5, "rejected": 1, "passed": 4}
    assert st["seeds"]["word-apple"]["candidates"] == 6


@needs_reference
def test_a_copied_terminal_bench_instruction_is_caught_by_decontamination(tmp_path, seeds, base_root):
    tb2 = sorted(p for p in REFERENCE.iterdir() if (p / "instruction.md").is_file())[0]
    copied = log_task(instruction=(tb2 / "instruction.md").read_text())
    fake = FakeLLM({"s00000": [answer(copied)]})
    out = tmp_path / "out"
    try:
        rc = main(synth_args(seeds, out, fake.url, "--against", str(REFERENCE), "--n", "1", "--max-candidates", "1"))
    finally:
        fake.close()
    rec = ledger(out)["s00000"]
    assert rc == 1 and rec["status"] == "rejected" and rec["rejected_at"] == "decontam", rec
    assert tb2.name in rec["reason"] and "oracle" in gates_of(rec)  # it worked, and was still refused


def test_repair_round_and_resume_after_a_crash(tmp_path, seeds, base_root):
    """Run 1 is SIGKILLed while candidate s00001 waits on the LLM; the resumed run skips s00000 (accepted,
    never asked again), repairs s00001 from a failing oracle to accepted, rejects a near-duplicate of the task
    accepted before the crash, and accepts one more."""
    reworded = log_task(instruction="Write to /app/report/not_found.txt how many requests in /app/data/access.log "
                                    "got the status 404, and nothing else.\n")
    script = {"s00000": [answer(log_task())], "s00001": [answer(broken_oracle()), answer(csv_task())],
              "s00002": [answer(reworded)], "s00003": [answer(rename_task())]}
    fake = FakeLLM(script, hold=("s00001",))
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    argv = synth_args(seeds, out, fake.url, "--no-decontam", "--n", "3", "--max-candidates", "4", "--repairs", "1",
                      "--jobs", "1", "--llm-jobs", "1")
    try:
        proc = subprocess.Popen([sys.executable, "-m", "conch", *argv], env=env, cwd=ROOT, start_new_session=True,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 240
        while not ((out / "synth.jsonl").is_file() and "s00000" in (out / "synth.jsonl").read_text()):
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read().decode()[-2000:]
            time.sleep(0.2)
        assert ("s00001", 0) in fake.requests
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        proc.stderr.close()
        first = ledger(out)
        assert list(first) == ["s00000"] and first["s00000"]["status"] == "accepted"
        kept = Path(first["s00000"]["accepted_path"])
        before = {p: p.read_bytes() for p in kept.rglob("*") if p.is_file()}
        fake.hold = ()
        fake.release.set()
        time.sleep(0.5)  # the held request of the killed run ends
        n_before = len(fake.requests)
        assert main([*argv, "--resume"]) == 0
        asked = fake.requests[n_before:]
        assert main([*argv, "--resume"]) == 0  # nothing left: no new line, no request
        assert len(fake.requests) == n_before + len(asked)
    finally:
        fake.close()
    assert "s00000" not in {cid for cid, _ in asked}  # accepted work is never redone
    recs = ledger(out)
    assert sorted(recs) == ["s00000", "s00001", "s00002", "s00003"]
    assert {p: p.read_bytes() for p in kept.rglob("*") if p.is_file()} == before
    repaired = recs["s00001"]
    assert repaired["status"] == "accepted" and len(repaired["attempts"]) == 2, repaired
    assert gates_of({"attempts": repaired["attempts"][:1]})[-1] == "oracle" and ("s00001", 1) in asked
    assert recs["s00002"]["rejected_at"] == "duplicate" and kept.name in recs["s00002"]["reason"]
    assert recs["s00003"]["status"] == "accepted"
    assert sum(r["status"] == "accepted" for r in recs.values()) == 3


# ------------------------------------------------------------------------------------------- real vLLM


def test_tiny_model_on_real_vllm_every_candidate_rejected_with_a_reason(tmp_path, seeds, vllm_server, base_root):
    from conch.engine.vllm_server import SERVED_NAME

    out = tmp_path / "out"
    argv = ["synth", "--from-seeds", str(seeds), "--llm", f"{vllm_server.url}/v1", "--model", SERVED_NAME,
            "--out", str(out), "--sandbox", "local", "--no-decontam", "--n", "1", "--max-candidates", "3",
            "--repairs", "1", "--max-tokens", "64", "--llm-jobs", "2", "--llm-timeout", "300"]
    assert main(argv) == 1  # nothing accepted: said, no crash
    recs = ledger(out)
    assert sorted(recs) == ["s00000", "s00001", "s00002"]
    for rec in recs.values():
        assert rec["status"] in ("rejected", "error") and rec["rejected_at"] and rec["reason"], rec
        if rec["status"] == "rejected":
            assert len(rec["attempts"]) == 2 and all(len(a["answer_sha256"]) == 64 for a in rec["attempts"])
    assert main(["synth", "--stats", str(out)]) == 0
