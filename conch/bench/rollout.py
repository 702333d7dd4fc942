"""`conch bench rollout`: agent-loop throughput with C concurrent trajectories, against its two references.

Why: a rollout is C episodes sharing one engine. While some wait on their shell, the others should keep the
engine's batch full, so the loop should cost little over the engine alone (the issue's target: at least 90% of
the engine-only tokens/s at C = 32) and run far faster than trajectories one at a time.

What runs (all real: the tiny model in HFEngine with routing capture, local sandboxes with persistent shells,
the agent loop in TITO mode with its bookkeeping and drift checks; retokenize mode re-prefills every turn, so
its engine-only twin would be a different workload). A random model never emits a tool call, so every turn
runs the fallback command of `conch.bench.agents.FallbackLoop` (a real command, `--command`) in the
trajectory's shell; the turn's ids are still exactly what was sampled. Three measurements, each over the same model, turns and tokens per turn:

- rollout: C episodes at once (`run_loop`, one sandbox each), `--turns` turns of up to `--max-new-tokens`.
- engine only (the limit): C engine sessions replaying exactly what the rollout fed and sampled, turn by turn
  (the same prompt and observation ids, the same number of sampled ids per turn, the same seeds), with no
  sandbox, no parsing, no tokenization between turns. The same batch size, the same tokens.
- sequential: the first `--sequential` trajectories again, one at a time (same seeds, so the same work).

Sandboxes are started before the clock starts (their start time is reported apart; it is paid once per
episode, which lasts hundreds of turns in training). Rollout and engine-only runs alternate `--repeats` times
and the best of each is kept, so a burst of load from elsewhere on the machine hits both sides alike. Per-phase
engine counters (forward seconds, steps) show where the rest of the time goes: an engine busy fraction well
below the engine-only one means the loop left the batch idle (commands, tokenization, event-loop stalls); a
longer forward per step means the loop's own CPU work (tokenization, chat template, shell I/O, the sandboxes)
slowed the engine's steps down by competing for cores or the GIL.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

from conch.bench.engine import ServerCounters, add_common, engine_options, resolve_model

TARGET_RATIO = 0.90
INSTRUCTION = "Look around the machine: list the configuration files under /etc and report what you find."
QUICK = {"concurrency": 4, "turns": 3, "max_new_tokens": 8, "sequential": 2, "repeats": 1}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_common(parser)
    from conch.engine.registry import add_engine_arguments

    add_engine_arguments(parser, device=False)
    parser.add_argument("--concurrency", type=int, default=32, help="trajectories in flight at once (default 32)")
    parser.add_argument("--turns", type=int, default=8, help="turns per trajectory (default 8)")
    parser.add_argument("--max-new-tokens", type=int, default=32, help="tokens sampled per turn at most (default 32)")
    parser.add_argument("--sequential", type=int, default=4,
                        help="trajectories run one at a time for the sequential figure (default 4)")
    parser.add_argument("--repeats", type=int, default=2, help="alternating rollout / engine-only runs; best kept")
    parser.add_argument("--command", dest="fallback_command", default="ls -l /etc | head -n 12",
                        help="the command every turn runs (the fallback for a model that emits no tool call)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true",
                        help="smoke-test sizes: " + ", ".join(f"{k}={v}" for k, v in QUICK.items()))


@dataclass
class Phase:
    """One timed run: work done, wall seconds, and the engine's counters over it."""

    sessions: int
    sampled_tokens: int
    fed_tokens: int
    turns: int
    env_steps: int
    seconds: float
    forward_seconds: float
    engine_steps: int
    client_cpu_s: float = 0.0  # CPU seconds of this process (agent loop, tokenizer, HTTP client or HF engine)
    host_cpu_s: float = 0.0  # CPU seconds of the whole host: sandboxes and a vLLM server included

    def row(self) -> dict:
        s = self.seconds or float("nan")
        return {
            "sessions": self.sessions, "sampled_tokens": self.sampled_tokens, "fed_tokens": self.fed_tokens,
            "turns": self.turns, "env_steps": self.env_steps, "seconds": round(self.seconds, 4),
            "tokens_per_s": round(self.sampled_tokens / s, 2), "turns_per_s": round(self.turns / s, 2),
            "steps_per_s": round(self.env_steps / s, 2),
            "engine_busy": round(self.forward_seconds / s, 3),
            "tokens_per_step": round(self.sampled_tokens / max(1, self.engine_steps), 2),
            "forward_ms_per_step": round(1000 * self.forward_seconds / max(1, self.engine_steps), 2),
            "client_cpu_s": round(self.client_cpu_s, 2), "host_cpu_s": round(self.host_cpu_s, 2),
        }


def host_busy_seconds() -> float:
    """CPU seconds the host has spent busy (all cores, /proc/stat), or 0 where there is no /proc/stat."""
    try:
        with open("/proc/stat") as fh:
            fields = [int(x) for x in fh.readline().split()[1:]]
    except (OSError, ValueError):
        return 0.0
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


async def _timed(engine: Any, coro_factory: Callable[[], Awaitable[Any]]) -> tuple[Any, float, float, int, tuple]:
    """The coroutine's result, wall seconds, engine forward seconds and steps (a vLLM server's are not visible
    here: they read 0), and (client, host) CPU seconds over it: where the cores went."""
    f0, n0 = engine.stats.get("forward_seconds", 0.0), engine.stats.get("steps", 0)
    c0, h0 = time.process_time(), host_busy_seconds()
    t0 = time.perf_counter()
    out = await coro_factory()
    seconds = time.perf_counter() - t0
    cpu = (time.process_time() - c0, host_busy_seconds() - h0)
    return out, seconds, engine.stats.get("forward_seconds", 0.0) - f0, engine.stats.get("steps", 0) - n0, cpu


def _plan(traj: Any) -> list[tuple[list[int], int]]:
    """Per turn: the ids the loop fed the engine before sampling, and how many ids it sampled."""
    out, prev = [], 0
    for t in traj.turns:
        out.append((traj.tokens[prev:t.start], t.end - t.start))
        prev = t.end
    return out


def _seed(base: int, i: int) -> int:
    from conch.agent.executor import episode_seed

    return episode_seed(base, i)  # as the job executor seeds its i-th trajectory


async def _episodes(engine: Any, codec: Any, shells: list[Any], cfg: Any, seed: int, indices: list[int],
                    concurrent: bool, command: str) -> list[Any]:
    from conch.agent.episode import system_prompt
    from conch.agent.loop import run_loop
    from conch.agent.trajectory import StopReason, Trajectory
    from conch.bench.agents import fallback_loop

    async def one(i: int):
        traj = Trajectory(task="bench-rollout", sample=i, mode=cfg.mode)
        await run_loop(engine, codec, shells[i], system_prompt(), INSTRUCTION, cfg, traj, seed=_seed(seed, i),
                       agent_timeout=3600.0, loop=fallback_loop(command))
        if traj.stop_reason != StopReason.MAX_TURNS or traj.error:
            raise RuntimeError(f"trajectory {i} stopped early ({traj.stop_reason.value}): {traj.error}")
        return traj

    if concurrent:
        return list(await asyncio.gather(*(one(i) for i in indices)))
    return [await one(i) for i in indices]


async def _replay(engine: Any, plans: list[list[tuple[list[int], int]]], seed: int) -> None:
    """The engine alone: each session feeds and samples exactly what its trajectory did, turn after turn."""
    from conch.engine.base import SamplingParams

    async def one(i: int, plan: list[tuple[list[int], int]]) -> None:
        sid = await engine.open_session([])
        try:
            for turn, (fed, n) in enumerate(plan):
                params = SamplingParams(temperature=1.0, max_new_tokens=n, seed=_seed(seed, i) * 100_003 + turn)
                res = await engine.generate(sid, fed, params)
                if len(res.token_ids) != n:
                    raise RuntimeError(f"engine-only replay sampled {len(res.token_ids)} ids, expected {n}")
        finally:
            await engine.close_session(sid)

    await asyncio.gather(*(one(i, p) for i, p in enumerate(plans)))


def _traj_phase(trajs: list[Any], seconds: float, fwd: float, steps: int, cpu: tuple) -> Phase:
    return Phase(
        sessions=len(trajs), sampled_tokens=sum(t.num_sampled for t in trajs),
        fed_tokens=sum(len(fed) for t in trajs for fed, _ in _plan(t)), turns=sum(len(t.turns) for t in trajs),
        env_steps=sum(1 for t in trajs for turn in t.turns if turn.command is not None),
        seconds=seconds, forward_seconds=fwd, engine_steps=steps, client_cpu_s=cpu[0], host_cpu_s=cpu[1],
    )


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


async def _bench(args: argparse.Namespace) -> dict:
    from conch.agent.tito import ChatCodec
    from conch.bench.agents import bench_agent
    from conch.engine.registry import build_engine
    from conch.sandbox import SandboxSpec, make_sandbox
    from conch.tasks.synth.trajectories import BASH_TOOL

    c, n_seq = args.concurrency, min(args.sequential, args.concurrency)
    model = resolve_model(args.model)
    engine = build_engine(engine_options(args), model, max_batch=c)
    codec = ChatCodec(engine.tokenizer, tools=[BASH_TOOL])
    cfg = bench_agent(max_turns=args.turns, max_new_tokens=args.max_new_tokens, mode="tito")
    command = args.fallback_command
    sandboxes = [make_sandbox("local", SandboxSpec(name=f"bench-rollout-{i}")) for i in range(c)]
    try:
        t0 = time.perf_counter()
        await asyncio.gather(*(sb.start() for sb in sandboxes))
        shells = await asyncio.gather(*(sb.shell() for sb in sandboxes))
        start_seconds = time.perf_counter() - t0
        print(f"{c} sandboxes started in {start_seconds:.2f}s", file=sys.stderr)
        # Warm-up: every shell and engine session size once (allocators, first-call paths), off the clock.
        warm = bench_agent(max_turns=1, max_new_tokens=4, mode="tito")
        await _episodes(engine, codec, shells, warm, args.seed + 1, list(range(c)), True, command)

        counters = ServerCounters(engine)
        rollouts: list[Phase] = []
        engine_only: list[Phase] = []
        plans = None
        trajs = []
        for rep in range(max(1, args.repeats)):
            got, sec, fwd, steps, cpu = await _timed(
                engine, lambda: _episodes(engine, codec, shells, cfg, args.seed, list(range(c)), True, command))
            rollouts.append(_traj_phase(got, sec, fwd, steps, cpu))
            if plans is None:
                trajs, plans = got, [_plan(t) for t in got]
            print(f"rollout run {rep + 1}: {rollouts[-1].row()['tokens_per_s']:.1f} tokens/s", file=sys.stderr)
            _, sec, fwd, steps, cpu = await _timed(engine, lambda: _replay(engine, plans, args.seed))
            engine_only.append(Phase(
                sessions=c, sampled_tokens=sum(n for p in plans for _, n in p),
                fed_tokens=sum(len(f) for p in plans for f, _ in p), turns=sum(len(p) for p in plans), env_steps=0,
                seconds=sec, forward_seconds=fwd, engine_steps=steps, client_cpu_s=cpu[0], host_cpu_s=cpu[1]))
            print(f"engine-only run {rep + 1}: {engine_only[-1].row()['tokens_per_s']:.1f} tokens/s", file=sys.stderr)

        got, sec, fwd, steps, cpu = await _timed(
            engine, lambda: _episodes(engine, codec, shells, cfg, args.seed, list(range(n_seq)), False, command))
        sequential = _traj_phase(got, sec, fwd, steps, cpu)
        print(f"sequential: {sequential.row()['tokens_per_s']:.1f} tokens/s", file=sys.stderr)
        server = counters.delta()
    finally:
        for exc in await asyncio.gather(*(sb.stop() for sb in sandboxes), return_exceptions=True):
            if isinstance(exc, BaseException):  # report, the others are stopped all the same
                print(f"sandbox stop failed: {exc}", file=sys.stderr)
        await engine.aclose()

    best_r = min(rollouts, key=lambda p: p.seconds)
    best_e = min(engine_only, key=lambda p: p.seconds)
    r, e, s = best_r.row(), best_e.row(), sequential.row()
    turns = [t for tr in trajs for t in tr.turns]
    return {
        "model": model, "dtype": args.dtype, "device": args.device, "engine": args.engine, "mode": "tito",
        "concurrency": c, **({"server": server} if server else {}),
        "turns": args.turns, "max_new_tokens": args.max_new_tokens, "command": args.fallback_command,
        "repeats": max(1, args.repeats),
        "rollout": r, "engine_only": e, "sequential": s,
        "ratio_vs_engine": round(r["tokens_per_s"] / e["tokens_per_s"], 4),
        "speedup_vs_sequential": round(r["tokens_per_s"] / s["tokens_per_s"], 3),
        "target_ratio": TARGET_RATIO,
        "rollout_seconds_all": [round(p.seconds, 4) for p in rollouts],
        "engine_only_seconds_all": [round(p.seconds, 4) for p in engine_only],
        "sandbox_start_seconds": round(start_seconds, 3),
        "per_turn": {
            "env_seconds_mean": round(_mean([t.env_seconds for t in turns]), 5),
            "gen_seconds_mean": round(_mean([t.gen_seconds for t in turns]), 5),
            "sampled_tokens_mean": round(_mean([t.end - t.start for t in turns]), 2),
            "fed_tokens_mean": round(best_e.fed_tokens / max(1, best_e.turns), 2),
        },
    }


def _table(result: dict) -> str:
    cols = ("tokens_per_s", "steps_per_s", "turns_per_s", "seconds", "engine_busy", "tokens_per_step",
            "forward_ms_per_step")
    lines = [f"model {result['model']} ({result['dtype']}, {result['device']}), mode {result['mode']}; "
             f"{result['turns']} turns x <= {result['max_new_tokens']} tokens; command: {result['command']}",
             f"{'run':<22}" + "".join(f"{c:>20}" for c in cols)]
    for name, key in ((f"rollout (C={result['concurrency']})", "rollout"),
                      (f"engine only (C={result['concurrency']})", "engine_only"),
                      (f"sequential (x{result['sequential']['sessions']})", "sequential")):
        row = result[key]
        cells = ["-" if key == "engine_only" and c == "steps_per_s" else row[c] for c in cols]  # no env there
        lines.append(f"{name:<22}" + "".join(f"{x:>20}" for x in cells))
    ok = "meets" if result["ratio_vs_engine"] >= result["target_ratio"] else "below"
    pt = result["per_turn"]
    lines.append(f"rollout / engine only: {result['ratio_vs_engine']:.3f} ({ok} the target {result['target_ratio']}); "
                 f"rollout / sequential: {result['speedup_vs_sequential']:.2f}x")
    lines.append(f"per turn: {pt['sampled_tokens_mean']} sampled, {pt['fed_tokens_mean']} fed tokens, command "
                 f"{pt['env_seconds_mean'] * 1000:.1f} ms; {result['concurrency']} sandboxes started in "
                 f"{result['sandbox_start_seconds']:.2f}s (not in the figures)")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from conch.bench import settle_args

    settle_args(args, QUICK, ("concurrency", "turns", "max_new_tokens", "sequential", "repeats"))
    result = asyncio.run(_bench(args))
    print(json.dumps(result) if args.json else _table(result))
    return 0
