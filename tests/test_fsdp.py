"""The FSDP2 learner on 2 gloo ranks makes exactly the one-process update (R3 replay on).

Real torch.distributed (gloo, 127.0.0.1) and real `fully_shard`; the batch is tiny-model trajectories whose
recorded experts differ from the trainer's own choice on some rows, so replay changes the result.
"""

from __future__ import annotations

import copy
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conch.agent.trajectory import Trajectory
from conch.rl.batch import collate, policy_forward
from conch.rl.critic import ValueModel
from conch.rl.losses import LossConfig
from conch.rl.update import ppo_update, prepare

REPO = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _trajs(policy, n: int) -> list[Trajectory]:
    g = torch.Generator().manual_seed(7)
    out = []
    for i in range(n):
        L = 24 + 6 * i
        ids = torch.randint(10, 4000, (L,), generator=g).tolist()
        mask = [0] * 10 + [1] * (L - 10)
        t = Trajectory(task=f"t{i % 2}", sample=i, tokens=ids, mask=mask, logprobs=[0.0] * L,
                       n_passed=i % 3, n_total=3)
        with torch.no_grad():
            lp, _, own = policy_forward(policy, collate([t], 0, with_experts=False), replay=False)
        t.logprobs = [float(x) if m else 0.0 for x, m in zip(lp[0].tolist(), mask)]
        experts = own[0].clone()
        experts[::3] = experts[::3].flip(-1).roll(1, dims=-1)  # a third of the rows disagree with the router
        t.routed_experts = experts.to(torch.uint8).numpy()
        out.append(t)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("n_trajs", [6, 5])  # 5: the last step has one micro-batch, rank 1 runs a zero-weighted one
def test_fsdp2_two_ranks_equal_one_process(tmp_path, n_trajs):
    from conch.model.init import cached_model
    from conch.model.loading import load_policy

    torch.manual_seed(0)
    policy = load_policy(cached_model(), dtype="float32", with_tokenizer=False).model
    critic = ValueModel.from_policy(policy)
    trajs = _trajs(policy, n_trajs)
    args = {"replay": True, "micro_batch": 1, "grad_accum": 4}
    loss_cfg = LossConfig()
    case = tmp_path / "case.pt"
    torch.save({"policy": policy, "critic": critic, "trajs": trajs, "args": args, "loss_cfg": loss_cfg}, case)

    ref_pi, ref_v = copy.deepcopy(policy), copy.deepcopy(critic)
    opt_pi = torch.optim.AdamW(ref_pi.parameters(), lr=1e-4, betas=(0.9, 0.95))  # the demo preset's ppo.lr
    opt_v = torch.optim.AdamW(ref_v.parameters(), lr=1e-3)
    prepared, _ = prepare(ref_pi, ref_v, trajs, 0, True, "count", 1.0, 1.0, 1)
    stats = ppo_update(ref_pi, ref_v, opt_pi, opt_v, prepared, 0, True, loss_cfg, 1, 1, 4, 1.0, seed=3)

    out = tmp_path / "out.pt"
    proc = subprocess.run([sys.executable, str(REPO / "tests/fsdp_worker.py"), str(case), str(out), "2",
                           str(_free_port())], cwd=REPO, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = torch.load(out, weights_only=False)
    for key in ("train/grad_norm_policy", "train/grad_norm_critic"):  # Adam hides a gradient scale error; this not
        assert abs(got["stats"][key] - stats[key]) <= 1e-4 * stats[key], (key, got["stats"][key], stats[key])
    moved = 0.0
    for name, want in ref_pi.state_dict().items():
        assert torch.allclose(got["policy"][name], want, atol=1e-5, rtol=0), name
        moved = max(moved, float((want - policy.state_dict()[name]).abs().max()))
    for name, want in ref_v.state_dict().items():
        assert torch.allclose(got["critic"][name], want, atol=1e-5, rtol=0), name
    assert moved > 5e-5  # the update did move the weights
