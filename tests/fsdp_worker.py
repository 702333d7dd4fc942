"""Run one PPO update under FSDP2 on `world` gloo ranks (spawned here); rank 0 saves the full parameters.

Used by tests/test_fsdp.py: `python tests/fsdp_worker.py CASE.pt OUT.pt WORLD PORT`.
"""

import sys

import torch
import torch.multiprocessing as mp


def run(rank: int, world: int, case_path: str, out_path: str, port: int) -> None:
    from conch.rl.distributed import full_state_dict, init_process_group, shard
    from conch.rl.update import ppo_update, prepare

    torch.set_num_threads(1)
    init_process_group(rank, world, port=port)
    case = torch.load(case_path, weights_only=False)
    policy, critic = case["policy"], case["critic"]
    shard(policy)
    shard(critic)
    opt_pi = torch.optim.AdamW(policy.parameters(), lr=1e-4, betas=(0.9, 0.95))
    opt_v = torch.optim.AdamW(critic.parameters(), lr=1e-3)
    a = case["args"]
    prepared, _ = prepare(policy, critic, case["trajs"], 0, a["replay"], "count", 1.0, 1.0, a["micro_batch"])
    stats = ppo_update(policy, critic, opt_pi, opt_v, prepared, 0, a["replay"], case["loss_cfg"], 1, a["micro_batch"],
               a["grad_accum"], 1.0, seed=3, dp=(rank, world))
    pol, cri = full_state_dict(policy), full_state_dict(critic)
    if rank == 0:
        torch.save({"policy": pol, "critic": cri, "stats": stats}, out_path)
    # No rank tears down gloo while another is still using it (rank 0 saving): CI saw rank 1 abort
    # ("terminate called without an active exception") when it destroyed the group first.
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    case, out, world, port = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    mp.spawn(run, args=(world, case, out, port), nprocs=world, join=True)
