"""End to end: a minute-sized `conch train`, then `conch report`, rendered by headless Chromium (Debian's
`chromium`); assertions on the page as the browser built it (plotly's own copy of each curve's data, the
opened trajectory's transcript and per-test results, no console errors). Then `conch report` on a rollout file:
the episodes are replayed by `ScriptedEngine` from the run's expert trajectories (the tiny model barely emits
tool calls after a few SFT steps); sandboxes, verifier and report are real. Screenshots are saved to
test-artifacts/ (CONCH_ARTIFACTS overrides) for a person to look at."""

from __future__ import annotations

import asyncio
import gzip
import json
import os
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

from test_train_e2e import TINY

REPO = Path(__file__).resolve().parents[1]
ARTIFACTS = Path(os.environ.get("CONCH_ARTIFACTS", REPO / "test-artifacts"))


def conch(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "conch", *args], capture_output=True, text=True, timeout=900)


def chromium_path() -> str:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        if os.environ.get("CI") == "true":
            pytest.fail("CI=true but chromium is not installed (apt-get install chromium)")
        pytest.skip("chromium not installed (apt-get install chromium)")
    return exe


def browse(page: Path, fragment: str, tmp: Path, screenshot: Path | None = None) -> tuple[str, list[str]]:
    """(DOM after the page's scripts ran, console messages) of `page#fragment`; optionally a screenshot."""
    base = [chromium_path(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
            "--window-size=1400,3400", "--virtual-time-budget=10000", "--enable-logging=stderr", "--v=0",
            f"--user-data-dir={tmp / 'chromium-profile'}"]
    url = page.resolve().as_uri() + fragment
    p = subprocess.run([*base, "--dump-dom", url], capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stderr[-2000:]
    console = [line for line in p.stderr.splitlines() if ":CONSOLE" in line]
    if screenshot is not None:
        screenshot.parent.mkdir(parents=True, exist_ok=True)
        s = subprocess.run([*base, f"--screenshot={screenshot}", url], capture_output=True, text=True, timeout=180)
        assert s.returncode == 0 and screenshot.stat().st_size > 10_000, s.stderr[-2000:]
    return p.stdout, console


class Elements(HTMLParser):
    """Attributes and text of every element with an id."""

    def __init__(self) -> None:
        super().__init__()
        self.attrs: dict[str, dict[str, str]] = {}
        self.text: dict[str, str] = {}
        self._open: list[tuple[str, str | None]] = []

    def handle_starttag(self, tag, attrs):
        d = dict(attrs)
        if d.get("id"):
            self.attrs[d["id"]] = d
            self.text.setdefault(d["id"], "")
        if tag not in ("br", "img", "input", "meta", "link", "hr", "path", "rect", "line", "circle"):
            self._open.append((tag, d.get("id")))

    def handle_endtag(self, tag):
        while self._open:
            t, _ = self._open.pop()
            if t == tag:
                break

    def handle_data(self, data):
        for _, i in self._open:
            if i:
                self.text[i] += data


def parse(dom: str) -> Elements:
    e = Elements()
    e.feed(dom)
    return e


def plotted(e: Elements, panel: str) -> dict[str, list]:
    return {t["name"]: t["y"] for t in json.loads(e.attrs[f"curve-{panel}"]["data-plotted"])}


def close(a: list, b: list) -> bool:
    return len(a) == len(b) and all((x is None and y is None) or abs(x - y) <= 1e-9 * max(1, abs(y))
                                    for x, y in zip(a, b))


@pytest.fixture(scope="module")
def run(tmp_path_factory, base_root) -> Path:
    run = tmp_path_factory.mktemp("report") / "run"
    p = conch("train", "--out", str(run), *TINY, "ppo.iterations=2", "ppo.eval_every=1", "run.keep_rollouts=3")
    assert p.returncode == 0, p.stderr[-3000:]
    return run


def test_train_then_report_renders(run, tmp_path):
    p = conch("report", str(run))
    assert p.returncode == 0, p.stderr[-3000:]
    page = run / "report.html"
    assert p.stdout.strip() == str(page)
    html = page.read_text()
    assert "<script src" not in html and "<link" not in html  # self-contained: every script and style inline
    assert {f.name for f in (run / "plots").iterdir()} >= {"sft-loss.png", "ppo-reward.png", "mismatch.png",
                                                            "eval-families.png"}

    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    ppo = [r for r in rows if "stage" not in r]
    sft = [r for r in rows if r.get("stage") == "sft"]
    assert [r["iteration"] for r in ppo] == [0, 1]
    assert [r["step"] for r in sft] == list(range(1, 5))
    assert {r["stage"] for r in rows if "stage" in r} == {"sft", "critic", "eval"}
    assert all(r["time/trajectory_write_s"] >= 0 for r in ppo)

    kept = [json.loads(line) for f in sorted((run / "trajectories").iterdir()) for line in gzip.open(f, "rt")]
    by_name = {(r["stage"], r["name"]) for r in kept}
    assert {("eval", "init"), ("eval", "warm"), ("eval", "iter1"), ("eval", "final"), ("ppo", "ppo")} <= by_name
    assert sum(1 for r in kept if r["stage"] == "ppo" and r["iteration"] == 0) == 3  # run.keep_rollouts
    assert all(r["trainer_lp"] is not None for r in kept if r["stage"] == "ppo")

    # Open the last kept eval trajectory that has per-test results.
    from conch.report.store import read_records

    records = list(read_records(run))
    i = max(k for k, r in enumerate(records) if r["stage"] == "eval" and r["tests"])
    dom, console = browse(page, f"#traj={i}&top", tmp_path, screenshot=ARTIFACTS / "report-run.png")
    e = parse(dom)
    assert console == [] and e.text.get("js-errors", "") == "", (console, e.text.get("js-errors"))
    assert 'data-ready="1"' in dom

    assert close(plotted(e, "sft-loss")["train"], [r["sft/loss"] for r in sft])
    assert close(plotted(e, "ppo-reward")["reward/mean"], [r["reward/mean"] for r in ppo])
    assert close(plotted(e, "mismatch")["mismatch/logprob_abs_diff"], [r["mismatch/logprob_abs_diff"] for r in ppo])
    evals = {n: json.loads((run / "evals" / f"{n}.json").read_text())["pass_rate"] for n in ("init", "warm", "iter1", "final")}
    assert close(plotted(e, "eval-families")["all"], [evals[n] for n in ("init", "warm", "iter1", "final")])
    assert dom.count('class="plot js-plotly-plot"') >= 10  # plotly drew every panel
    assert "main-svg" in e.attrs.get("curve-ppo-kl", {}).get("class", "") or dom.count("main-svg") >= 10

    r = records[i]
    assert r["task"] in e.text["traj-title"]
    for t in r["tests"]:
        assert t["name"] in e.text["traj-tests"]
    instruction = next(m["content"] for m in r["messages"] if m["role"] == "user")
    assert instruction.split("\n")[0][:40] in e.text["traj-transcript"]
    summary = json.loads((run / "summary.json").read_text())
    assert f"{summary['pass_rate']['final']:.3f}" in e.text["summary-table"]
    assert e.text["task-table"].count("-") >= 1


def _scripted_rollouts(run: Path, out: Path) -> list[str]:
    """Replay the run's expert commands with ScriptedEngine through the real rollout stack, into `out`."""
    from transformers import AutoTokenizer

    from conch.agent.rollout import run_rollouts
    from conch.agent.scripted import ScriptedEngine, tool_call_text
    from conch.agent.tito import ChatCodec
    from conch.config import AgentLoopConfig
    from conch.rl.stages import load_task_list
    from conch.tasks.synth.trajectories import BASH_TOOL

    tok = AutoTokenizer.from_pretrained(run / "init")
    codec = ChatCodec(tok, tools=[BASH_TOOL])
    chats = [json.loads(line) for line in (run / "corpus" / "expert.jsonl").read_text().splitlines()]
    chats = [c for c in chats if "mistake" not in c][:2]
    tasks = {t.name: t for t in load_task_list(run / "corpus" / "train")}
    commands = [[c["function"]["arguments"]["command"] for m in chat["messages"] for c in m.get("tool_calls", [])]
                for chat in chats]
    plan = {chat["task"]: cmds for chat, cmds in zip(chats, commands)}

    def policy(turn: int, history) -> list[int]:
        text = tok.decode(list(history))
        cmds = next(v for k, v in plan.items() if tasks[k].instruction.strip()[:60] in text)
        if turn < len(cmds):
            return codec.encode(tool_call_text(cmds[turn])) + [codec.end_id]
        return codec.encode("Done.") + [codec.end_id]

    engine = ScriptedEngine(policy)
    asyncio.run(run_rollouts(engine, codec, [tasks[c["task"]] for c in chats], 1, AgentLoopConfig(max_turns=6, max_context=32768, max_new_tokens=256, obs_token_budget=512,
                                                        command_timeout=60.0),
                             concurrency=2, out=out))
    return [cmd for cmds in commands for cmd in cmds]


def test_report_opens_a_rollout_file(run, tmp_path):
    out = tmp_path / "rollouts.jsonl"
    commands = _scripted_rollouts(run, out)
    p = conch("report", str(out), "--tokenizer", str(run / "init" / "tokenizer.json"))
    assert p.returncode == 0, p.stderr[-3000:]
    page = tmp_path / "rollouts.html"
    from conch.report.store import read_records

    records = list(read_records(out))
    assert len(records) == 2 and all(r["stage"] == "rollout" for r in records)
    solved = [k for k, r in enumerate(records) if r["solved"]]
    assert solved, [(r["n_passed"], r["n_total"], r["verifier_error"]) for r in records]
    dom, console = browse(page, f"#traj={solved[0]}", tmp_path, screenshot=ARTIFACTS / "report-rollouts.png")
    e = parse(dom)
    assert console == [] and e.text.get("js-errors", "") == ""
    r = records[solved[0]]
    transcript = e.text["traj-transcript"]
    for s in r["steps"]:
        if s["command"]:
            assert f"$ {s['command']}" in transcript and f"[exit {s['exit_code']}" in transcript
    assert any(c in transcript for c in commands)
    assert e.text["traj-tests"].count("✓") == r["n_total"] == len(r["tests"])
    assert "token view" in dom and "rollouts" in e.text["task-table"]
