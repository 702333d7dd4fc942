"""Atomic checkpoints: round trip, exact resume, crashes mid-save (exception and SIGKILL), corruption, pruning."""

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from conch.rl.checkpoint import (CheckpointError, latest_complete, list_checkpoints, load_checkpoint,
                                 save_checkpoint)

REPO = Path(__file__).resolve().parents[1]


def tiny_model(seed: int = 0):
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    cfg = Qwen3MoeConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                         num_key_value_heads=1, head_dim=16, moe_intermediate_size=16, intermediate_size=32,
                         num_experts=4, num_experts_per_tok=2, max_position_embeddings=64, tie_word_embeddings=False)
    torch.manual_seed(seed)
    return Qwen3MoeForCausalLM(cfg)


def tiny_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"w{i}": i for i in range(63)}
    vocab["[UNK]"] = 63
    tk = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="[UNK]")


def make_opt(model):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0 / (1 + step))
    return opt, sched


def train_steps(model, opt, sched, n: int) -> None:
    model.train()
    for _ in range(n):
        ids = torch.randint(0, 64, (2, 8))  # drawn from the global RNG: resume must restore it
        loss = model(input_ids=ids, labels=ids).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()


def test_resume_is_exact(tmp_path):
    torch.manual_seed(123)
    ref = tiny_model()
    opt, sched = make_opt(ref)
    train_steps(ref, opt, sched, 4)

    torch.manual_seed(123)
    a = tiny_model()
    opt_a, sched_a = make_opt(a)
    train_steps(a, opt_a, sched_a, 2)
    path = save_checkpoint(tmp_path, 2, a, tokenizer=tiny_tokenizer(), optimizer=opt_a, scheduler=sched_a,
                           extra={"seen_tasks": ["x", "y"], "best": 1.5})
    torch.rand(100)  # disturb the RNG: the load must restore it

    b = tiny_model(seed=99)  # different initial weights
    opt_b, sched_b = make_opt(b)
    info = load_checkpoint(latest_complete(tmp_path), model=b, optimizer=opt_b, scheduler=sched_b)
    assert info.path == path and info.iteration == 2
    assert info.extra == {"seen_tasks": ["x", "y"], "best": 1.5}
    assert sched_b.last_epoch == 2 and opt_b.state_dict()["state"]
    train_steps(b, opt_b, sched_b, 2)
    for (name, p_ref), p_b in zip(ref.named_parameters(), b.parameters()):
        assert torch.equal(p_ref, p_b), name

    # The model folder is a plain HF checkpoint.
    from transformers import AutoModelForCausalLM, AutoTokenizer

    hf = AutoModelForCausalLM.from_pretrained(str(info.model_dir), local_files_only=True)
    assert type(hf).__name__ == "Qwen3MoeForCausalLM"
    assert AutoTokenizer.from_pretrained(str(info.model_dir), local_files_only=True).convert_tokens_to_ids("w5") == 5
    assert (tmp_path / "checkpoints" / "latest").read_text().strip() == "iter-000002"


@pytest.mark.parametrize("stage", ["model", "state", "manifest"])
def test_exception_mid_save_keeps_previous(tmp_path, stage):
    model = tiny_model()
    opt, sched = make_opt(model)
    first = save_checkpoint(tmp_path, 1, model, optimizer=opt)

    def crash(s, where):
        if s == stage:
            raise KeyboardInterrupt(f"simulated crash at {s}")

    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(tmp_path, 2, model, optimizer=opt, on_stage=crash)
    assert latest_complete(tmp_path) == first
    assert (tmp_path / "checkpoints" / "latest").read_text().strip() == "iter-000001"
    assert not [p for p in (tmp_path / "checkpoints").iterdir() if p.name.startswith(".tmp")]
    assert load_checkpoint(first, optimizer=make_opt(tiny_model())[0]).iteration == 1


def test_crash_after_publish_before_pointer(tmp_path):
    model = tiny_model()
    save_checkpoint(tmp_path, 1, model)

    def crash(s, where):
        if s == "published":
            raise RuntimeError("died before updating latest")

    with pytest.raises(RuntimeError):
        save_checkpoint(tmp_path, 2, model, on_stage=crash)
    # The published folder is complete (its manifest was written before the rename), so it wins.
    assert latest_complete(tmp_path).name == "iter-000002"
    assert (tmp_path / "checkpoints" / "latest").read_text().strip() == "iter-000001"


CHILD = textwrap.dedent("""
    import sys, time, torch
    sys.path.insert(0, {tests!r})
    from test_checkpoint import tiny_model, make_opt, train_steps
    from conch.rl.checkpoint import save_checkpoint
    run = sys.argv[1]
    model = tiny_model()
    opt, sched = make_opt(model)
    train_steps(model, opt, sched, 1)
    save_checkpoint(run, 1, model, optimizer=opt, scheduler=sched)
    train_steps(model, opt, sched, 1)
    def hang(stage, where):
        if stage == {stage!r}:
            print("READY", flush=True)
            time.sleep(600)
    save_checkpoint(run, 2, model, optimizer=opt, scheduler=sched, on_stage=hang)
""")


@pytest.mark.parametrize("stage", ["model", "manifest"])
def test_sigkill_mid_save_keeps_previous(tmp_path, stage):
    script = tmp_path / "child.py"
    script.write_text(CHILD.format(tests=str(REPO / "tests"), stage=stage))
    run = tmp_path / "run"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen([sys.executable, str(script), str(run)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)
    try:
        line = proc.stdout.readline()
        assert line.strip() == "READY", proc.stderr.read()
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    root = run / "checkpoints"
    debris = [p for p in root.iterdir() if p.name.startswith(".tmp-iter-000002")]
    assert debris, "the killed save should have left its temp dir behind"
    assert latest_complete(run).name == "iter-000001"
    model = tiny_model(seed=5)
    opt, sched = make_opt(model)
    info = load_checkpoint(latest_complete(run), model=model, optimizer=opt, scheduler=sched)
    assert info.iteration == 1 and sched.last_epoch == 1
    # The next save removes the dead process's debris.
    save_checkpoint(run, 2, model, optimizer=opt, scheduler=sched)
    assert not [p for p in root.iterdir() if p.name.startswith(".tmp")]
    assert latest_complete(run).name == "iter-000002"


def test_corrupt_checkpoint_is_skipped(tmp_path):
    model = tiny_model()
    save_checkpoint(tmp_path, 1, model)
    second = save_checkpoint(tmp_path, 2, model)
    weights = second / "model" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])  # truncated
    assert latest_complete(tmp_path).name == "iter-000001"
    with pytest.raises(CheckpointError, match="model.safetensors"):
        load_checkpoint(second)
    (tmp_path / "checkpoints" / "iter-000001" / "manifest.json").write_text("{not json")
    assert latest_complete(tmp_path) is None


def test_keep_last_n_and_milestones(tmp_path):
    model = torch.nn.Linear(3, 2)  # plain module: stored as a state dict
    for it in range(1, 8):
        save_checkpoint(tmp_path, it, model, keep=2, keep_every=3)
    assert [it for it, _ in list_checkpoints(tmp_path)] == [3, 6, 7]
    with pytest.raises(FileExistsError):
        save_checkpoint(tmp_path, 7, model)
    other = torch.nn.Linear(3, 2)
    with torch.no_grad():
        other.weight.add_(1.0)
    save_checkpoint(tmp_path, 7, other, overwrite=True, keep=2, keep_every=3)
    fresh = torch.nn.Linear(3, 2)
    load_checkpoint(latest_complete(tmp_path), model=fresh)
    assert torch.equal(fresh.weight, other.weight)
    with pytest.raises(CheckpointError, match="no optimizer"):
        load_checkpoint(latest_complete(tmp_path), optimizer=torch.optim.SGD(fresh.parameters(), lr=0.1))


class Critic(torch.nn.Module):
    """Shaped like conch's value model: an HF backbone plus a scalar head, no save_pretrained of its own."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        self.backbone = tiny_model(seed).model
        self.head = torch.nn.Linear(32, 1)

    def forward(self, ids):
        return self.head(self.backbone(input_ids=ids).last_hidden_state).squeeze(-1)


def test_aux_model_and_named_optimizers(tmp_path):
    policy, critic = tiny_model(0), Critic(1)
    opts = {"policy": torch.optim.AdamW(policy.parameters(), lr=1e-3),
            "critic": torch.optim.AdamW(critic.parameters(), lr=1e-3)}
    ids = torch.randint(0, 64, (2, 8))
    (policy(input_ids=ids, labels=ids).loss + critic(ids).pow(2).mean()).backward()
    for o in opts.values():
        o.step()
    path = save_checkpoint(tmp_path, 5, policy, optimizer=opts, aux_models={"critic": critic})
    assert (path / "aux" / "critic" / "state_dict.pt").is_file()

    critic2 = Critic(7)
    opts2 = {"policy": torch.optim.AdamW(tiny_model(3).parameters(), lr=1e-3),
             "critic": torch.optim.AdamW(critic2.parameters(), lr=1e-3)}
    load_checkpoint(path, optimizer=opts2, aux_models={"critic": critic2})
    for p, q in zip(critic.parameters(), critic2.parameters()):
        assert torch.equal(p, q)
    saved = opts["critic"].state_dict()["state"][0]["exp_avg"]
    assert torch.equal(opts2["critic"].state_dict()["state"][0]["exp_avg"], saved)
    with pytest.raises(CheckpointError, match="pass a dict"):
        load_checkpoint(path, optimizer=opts2["policy"])
    with pytest.raises(CheckpointError, match="no aux model 'ref'"):
        load_checkpoint(path, aux_models={"ref": critic2})
    with pytest.raises(CheckpointError, match=r"no optimizer state saved for \['ema'\]"):
        load_checkpoint(path, optimizer={"ema": opts2["policy"]})


def test_publish_model_replaces_the_folder_whole(tmp_path):
    import torch

    from conch.rl.checkpoint import publish_model

    out = tmp_path / "final"
    publish_model(torch.nn.Linear(2, 2), None, out)
    (out / "stale.txt").write_text("from the old model\n")
    model = torch.nn.Linear(2, 3)
    publish_model(model, None, out)
    assert sorted(p.name for p in out.iterdir()) == ["state_dict.pt"]  # nothing of the old folder survives
    assert torch.load(out / "state_dict.pt")["weight"].shape == (3, 2)
    assert [p.name for p in tmp_path.iterdir()] == ["final"]  # no temporaries left beside it
