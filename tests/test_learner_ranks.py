"""The learner over 2 gloo ranks (`cluster.learner_ranks = 2`, conch/rl/learner_group.py), as real processes.

- rank 0's learner (every call announced to a follower process) makes the one-process update;
- `conch train` end to end on 2 ranks started by torchrun writes DCP-sharded checkpoints that hold the
  published weights (and that a one-process learner reads);
- a follower that conch started itself, killed mid-run, stops the run with an error naming the rank (no
  hang), and `--resume` continues from the last complete iteration;
- a follower whose rank 0 died exits instead of waiting forever.
"""

from __future__ import annotations

import copy
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from test_train_e2e import TINY, conch

# Two micro-batches per optimizer step, so both ranks train on real data.
TWO_RANKS = [*TINY, "ppo.micro_batch=1", "ppo.grad_accum=2", "cluster.learner_ranks=2"]


@pytest.fixture(scope="module")
def home(base_root) -> None:
    return None


def _rows(run: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "stage" not in r]


def _sharded(ckpt: Path) -> dict:
    manifest = json.loads((ckpt / "manifest.json").read_text())
    assert manifest["sharded"]["world"] == 2, manifest
    assert (ckpt / "dcp" / "__0_0.distcp").exists() and (ckpt / "dcp" / "__1_0.distcp").exists()
    assert not (ckpt / "model").exists()  # no rank gathered the whole model to write the checkpoint
    return manifest


@pytest.mark.slow
def test_driver_learner_equals_one_process(tmp_path):
    """score -> update -> weights through a follower process equals the same calls on one process (R3 on)."""
    from test_fsdp import _trajs

    from conch.config import load_config
    from conch.model.init import cached_model
    from conch.model.loading import load_policy
    from conch.rl.learner import Learner
    from conch.rl.learner_group import make_learner

    cfg = load_config(None, ["ppo.micro_batch=1", "ppo.grad_accum=4", "ppo.kl_coef=0.01", "cluster.learner_ranks=2",
                             "cluster.learner_timeout=120", "ppo.lr=1e-4", "ppo.critic_lr=1e-3"])  # the tiny model's
    torch.manual_seed(0)
    model_dir = cached_model()
    loaded = load_policy(model_dir, dtype="float32")
    policy, tok = loaded.model, loaded.tokenizer
    with torch.no_grad():  # rank 0's weights differ from the folder's: the followers must take rank 0's
        for p in policy.parameters():
            p.add_(0.01 * torch.randn_like(p))
    trajs = _trajs(policy, 5)
    start = {k: v.clone() for k, v in policy.state_dict().items()}  # rank 0 shards `policy` in place

    one = Learner(cfg, copy.deepcopy(policy), tok, 0)
    want_stats = one.update(one.score(trajs), True, seed=3)
    want = one.weights()

    driver = make_learner(cfg, policy, tok, 0, model_dir, tmp_path)
    try:
        stats = driver.update(driver.score(trajs), True, seed=3)
        got = driver.weights()
    finally:
        driver.close()
    assert not torch.distributed.is_initialized()
    for key in ("train/grad_norm_policy", "train/grad_norm_critic", "train/policy_loss", "train/value_loss"):
        assert abs(stats[key] - want_stats[key]) <= 1e-4 * abs(want_stats[key]) + 1e-7, (key, stats, want_stats)
    moved = max(float((want[k] - start[k]).abs().max()) for k in want)
    assert moved > 5e-5
    # Adam's first step is about lr = 1e-4 per element whatever the gradient's size, so summation-order noise on
    # near-zero gradients shows up to ~1e-5; a follower on other data or other weights is off by 1e-4 to 1e-2.
    for name, w in want.items():
        assert torch.allclose(got[name], w, atol=3e-5, rtol=0), name


@pytest.mark.slow
def test_two_ranks_under_torchrun_write_sharded_checkpoints(tmp_path, home):
    """torchrun starts both ranks (as on a GPU node); rank 1 becomes a follower (the spawned ranks: below)."""
    run = tmp_path / "run"
    overrides = [o for o in TWO_RANKS if not o.startswith("cluster.learner_ranks")]
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                        "-m", "conch", "train", "--out", str(run), *overrides, "ppo.iterations=2"],
                       capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "rank 1 is pid" not in p.stderr  # torchrun's ranks, none started by conch
    assert p.stderr.count("saved sharded checkpoint") == 2 and "Traceback" not in p.stderr
    assert [r["iteration"] for r in _rows(run)] == [0, 1]
    assert all("train/policy_loss" in r and "train/grad_norm_critic" in r for r in _rows(run))
    assert json.loads((run / "summary.json").read_text())["eval_tasks"] >= 1
    assert _sharded(run / "checkpoints" / "iter-000001")["iteration"] == 1

    # The shards hold what rank 0 published whole, and a one-process learner reads them (DCP reshards).
    from conch.config import load_config
    from conch.model.loading import load_policy
    from conch.rl.learner import Learner

    cfg = load_config(run / "config.toml")
    warm = load_policy(run / "warm", dtype="float32")
    one = Learner(cfg, warm.model, warm.tokenizer, 0)
    assert one.load(run / "checkpoints" / "iter-000001") == 1
    final = load_policy(run / "final", dtype="float32", with_tokenizer=False).model.state_dict()
    for name, w in final.items():
        assert torch.equal(one.policy.state_dict()[name], w), name
    assert one.opt_pi.state and one.opt_v.state  # Adam moments came back too


@pytest.mark.slow
def test_killed_follower_stops_the_run_and_resume_continues(tmp_path, home):
    run = tmp_path / "run"
    p = subprocess.Popen([sys.executable, "-m", "conch", "train", "--out", str(run), *TWO_RANKS, "ppo.iterations=2"],
                         stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    watchdog = threading.Timer(600, p.kill)  # a hang fails the test instead of stalling it
    watchdog.start()
    err, pid, killed = [], None, False
    try:
        for line in p.stderr:
            err.append(line)
            if m := re.search(r"rank 1 is pid (\d+)", line):
                pid = int(m[1])
            if "saved sharded checkpoint" in line and pid and not killed:  # iteration 0 is safe on disk
                os.kill(pid, signal.SIGKILL)
                killed = True
        rc = p.wait()
    finally:
        watchdog.cancel()
    err_text = "".join(err)
    assert killed, err_text[-3000:]
    assert rc == 1, (rc, err_text[-3000:])
    assert "learner rank 1 of 2 was killed by signal 9 (SIGKILL)" in err_text, err_text[-3000:]
    assert f"--resume {run}" in err_text and "Traceback" not in err_text
    assert (run / "checkpoints" / "latest").read_text().strip() == "iter-000000"
    assert not (run / "summary.json").exists()

    p2 = conch("train", "--resume", str(run))
    assert p2.returncode == 0, p2.stderr[-3000:]
    assert "iter-000000 (iteration 0)" in p2.stderr and "critic warm-up" not in p2.stderr
    assert [r["iteration"] for r in _rows(run)] == [0, 1]
    _sharded(run / "checkpoints" / "iter-000001")
    assert (run / "summary.json").exists()


def test_learner_ranks_config_errors(tmp_path, monkeypatch):
    from conch.config import ConfigError, load_config
    from conch.rl.learner_group import check_ranks

    p = conch("train", "--out", str(tmp_path / "run"), "cluster.learner_ranks=0")
    assert p.returncode == 2 and "cluster.learner_ranks" in p.stderr, p.stderr
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "4")
    with pytest.raises(ConfigError, match="cluster.learner_ranks = 2, but torchrun started 4"):
        check_ranks(load_config(None, ["cluster.learner_ranks=2"]))
    check_ranks(load_config(None, ["cluster.learner_ranks=4"]))


def _exited(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/status").read_text().split("State:")[1].split()[0] in ("Z", "X")
    except (FileNotFoundError, IndexError):
        return True


def test_followers_exit_when_rank_0_dies(tmp_path):
    """A follower idle between calls (rank 0 rolling out) leaves when rank 0's store goes away: no orphan."""
    code = ("import os, sys\nfrom pathlib import Path\nfrom conch.config import load_config\n"
            "from conch.rl.learner_group import Group\n"
            "g = Group.start(load_config(None, ['cluster.learner_ranks=2']), Path(sys.argv[1]))\n"
            "print(g.procs[0].pid, flush=True)\nos._exit(3)\n")
    out, err = tmp_path / "out", tmp_path / "err"  # files, not pipes: the follower holds them open too
    with open(out, "w") as fo, open(err, "w") as fe:
        rc = subprocess.run([sys.executable, "-c", code, str(tmp_path)], stdout=fo, stderr=fe, timeout=300).returncode
    assert rc == 3, err.read_text()[-3000:]
    pid = int(out.read_text().split()[0])
    deadline = time.monotonic() + 120  # a generous bound on a busy machine; it exits within a second
    while not _exited(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    if not _exited(pid):
        os.kill(pid, signal.SIGKILL)
        pytest.fail(f"follower {pid} still running after rank 0 died")
