"""`conch bench mismatch`: the train/inference log-prob gap with and without TITO and R3, side by side.

Why: the recipe claims that training on the exact sampled ids (TITO) and replaying the sampler's expert choices
in the trainer (R3) together shrink the gap between the sampler's log-probs and the trainer's. This bench lets a
user check that claim on their own model in one command: one model, one task set, fixed seeds, the real agent
loop in real sandboxes, the sampler in bfloat16 (as inference engines run) and the trainer in float32.

What runs. `run_rollouts` collects trajectories of every task twice with the same seeds: once in `tito` mode and
once in `retokenize` mode (the naive loop: every turn re-renders and re-tokenizes the conversation and the
engine re-prefills it). A randomly initialised model never emits a tool call, so a turn without one runs
`--command` in its shell (`conch.bench.agents.FallbackLoop`); the turn's ids are still exactly what was sampled.
The trainer (`conch.rl.batch.policy_forward`, float32, one trajectory per forward) then scores them four ways:

| setting | trajectories | trainer's ids | routing in the trainer |
|---|---|---|---|
| neither | retokenize | the final conversation re-encoded | its own router |
| tito | tito | exactly the sampled ids | its own router |
| r3 | retokenize | the final conversation re-encoded | the sampler's recorded experts, where ids align |
| both | tito | exactly the sampled ids | the sampler's recorded experts |

Metrics (`conch.rl.mismatch`), over sampled tokens only: mean |trainer lp - sampler lp|, the k3 estimate of
KL(sampler || trainer), and routing disagreement = the fraction of (token, MoE layer) rows whose top-k expert
set in the trainer's forward differs from the sampler's record. The trainer's routing is read from the forward
itself (captured after any replay), so under R3 it is measured, not assumed. `own_routing_disagreement` is what
the trainer's router would have chosen by itself (the `mismatch/routing_disagreement` training logs): how much
R3 has to override.

How retokenize mode is compared (the sampled ids and the trainer's ids need not match). The recorder below
keeps, for each retokenize-mode turn, the prompt ids the engine was given, the sampled ids, their log-probs and
their routing rows. For turn k let S = prompt + sampled ids (what the sampler processed) and R the trainer's
re-encoded trajectory; p = the length of their common prefix.
- Aligned tokens: a sampled token at position i < p has the same id and exactly the same preceding ids in both,
  so it is compared token for token (log-prob and routing row).
- Realigned tail: the sampled tokens from the first difference to the end of the turn have no token-for-token
  counterpart. They are compared as one segment: delta = (sum of the trainer's log-probs over the turn's
  re-encoded tokens from max(p, turn start) to its end) - (sum of the sampler's log-probs over the tail's sampled
  tokens), i.e. the log-prob the trainer gives the turn's text against the one the sampler gave it. Each of the
  tail's n sampled tokens is counted once with trainer lp = sampler lp + delta / n. This spreads the segment's
  error evenly, so it is a lower bound of any token-level figure (|sum| <= sum of |.|, and k3 is convex). Their
  routing has no counterpart and is not counted.
- Inserted: the template's closing end-of-turn token of a turn that did not sample one (a length stop) is
  trained on in retokenize mode but was never sampled; it is not a sampled token and is only counted
  (`retokenize.inserted_tokens`).
- R3 in retokenize mode replays only where ids align: position i gets the routing row of the first turn whose
  S agrees with R up to and including i (as the sampler first processed it; later turns re-prefill the same
  ids with possibly different rows in bfloat16, which no single replay can match). Positions no turn aligns
  with keep the trainer's own routing.
TITO trajectories need none of this: every sampled id is in the trainer's sequence with its log-prob and
routing row, and the tito/both figures count all of them (`tokens`).

`aligned_only` repeats neither and r3 over the aligned tokens alone: the numeric part of retokenize mode's gap,
the same kind of quantity tito and both measure. `--sampler-dtype float32` takes the numeric part away (sampler
and trainer then differ only in kernels and batch shapes), which tells what is left of `both` after TITO and R3:
the bfloat16 arithmetic itself, which neither of them addresses.

Reading the figures: on a randomly initialised model almost every sampled turn is a non-canonical tokenization
of its text (the model never learned BPE's merges), so retokenize mode's gap is dominated by the realigned tails
and `neither` is far above `both`. A trained model samples canonical ids far more often; there the comparison
that matters is closer to `aligned_only.neither` against `both`.

Target (the issue): both <= 0.25 x neither, and routing disagreement 0 wherever R3 replays.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from conch.bench.engine import resolve_model
from conch.sandbox import BACKENDS
from conch.bench.mismatch_sampling import Collected, EngineCall, RecordingEngine, collect

__all__ = ["Collected", "EngineCall", "RecordingEngine", "SETTINGS", "bench", "collect", "forward", "run"]

SETTINGS = ("neither", "tito", "r3", "both")
TARGET_RATIO = 0.25
QUICK = {"max_tasks": 2, "n_per_task": 1, "turns": 2, "max_new_tokens": 12}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=None, help="HF checkpoint folder of an MoE model (default: conch's tiny "
                                                       "model, cached)")
    parser.add_argument("--tasks", default=None, help="task folder, searched recursively (default: the repository's "
                                                      "examples/tasks)")
    parser.add_argument("--max-tasks", type=int, default=0, help="use the first N tasks only (0: all)")
    parser.add_argument("--n-per-task", type=int, default=2, help="trajectories per task and mode (default 2)")
    parser.add_argument("--turns", type=int, default=6, help="assistant turns per trajectory at most (default 6)")
    parser.add_argument("--max-new-tokens", type=int, default=48, help="tokens sampled per turn at most (default 48)")
    parser.add_argument("--command", dest="fallback_command", default="ls -A",  # `command` is the CLI's own dest
                        help="the command a turn without a tool call runs (a random model never emits one); its "
                             "output should not change between runs (no times), so fixed seeds repeat the figures")
    parser.add_argument("--sampler-dtype", default="bfloat16", choices=("bfloat16", "float32"),
                        help="the engine's dtype (default bfloat16; float32 isolates what is not numeric)")
    parser.add_argument("--device", default="cpu", help="device of both engine and trainer (default cpu)")
    parser.add_argument("--sandbox", default="local", choices=BACKENDS)
    parser.add_argument("--concurrency", type=int, default=1,
                        help="trajectories in flight at once (default 1: the engine's batch composition changes "
                             "bfloat16 arithmetic, so with more the samples, and the figures, vary run to run)")
    parser.add_argument("--seed", type=int, default=0)
    from conch.engine.registry import add_engine_arguments

    add_engine_arguments(parser, device=False)
    parser.add_argument("--quick", action="store_true",
                        help="smoke-test sizes: " + ", ".join(f"{k}={v}" for k, v in QUICK.items()))


# ---------------------------------------------------------------- sampling: conch/bench/mismatch_sampling.py


# ---------------------------------------------------------------- scoring: the trainer's forward


@dataclass
class Tally:
    """Per-token trainer/sampler log-probs and per-row routing of one setting, concatenated at the end."""

    trainer: list = field(default_factory=list)
    sampler: list = field(default_factory=list)
    used: list = field(default_factory=list)  # the trainer's routing rows as applied [n, layers, k]
    own: list = field(default_factory=list)  # what its router chose by itself
    recorded: list = field(default_factory=list)  # the sampler's rows

    def metrics(self) -> tuple[dict[str, float], float, int]:
        import torch

        from conch.rl.mismatch import k3_kl, logprob_abs_diff, routing_disagreement

        tr = torch.cat(self.trainer) if self.trainer else torch.zeros(0)
        sa = torch.cat(self.sampler) if self.sampler else torch.zeros(0)
        ones = torch.ones_like(tr)
        out = {"logprob_abs_diff": float(logprob_abs_diff(tr, sa, ones)), "k3_kl": float(k3_kl(tr, sa, ones)),
               "routing_disagreement": 0.0}
        own_dis = 0.0
        if self.recorded:
            rec, used, own = torch.cat(self.recorded), torch.cat(self.used), torch.cat(self.own)
            out["routing_disagreement"] = float(routing_disagreement(used, rec))
            own_dis = float(routing_disagreement(own, rec))
        return out, own_dis, int(tr.numel())


def forward(model: Any, batch: Any, replay: Any) -> tuple[Any, Any, Any]:
    """Trainer log-probs [T], routing as applied [T, layers, k] and its own router's choice [T, layers, k].

    The trainer's path (`policy_forward`); with `replay` ([1, T, layers, k], -1 = unknown) the forward runs
    inside the same replay context `policy_forward(replay=True)` opens, entered here so the routing capture
    (registered after the replay hooks) sees the experts actually used."""
    import torch

    from conch.moe.routing import RoutingReplay
    from conch.rl.batch import policy_forward, replaying

    with ExitStack() as stack, torch.no_grad():
        state = stack.enter_context(replaying(model, RoutingReplay(replay))) if replay is not None else None
        lp, _ent, used = policy_forward(model, batch, replay=False)
        own = state.own_experts().long() if state is not None else used
    return lp[0].float().cpu(), used[0].cpu(), own[0].cpu()


def score_tito(model: Any, trajs: list, pad_id: int, tallies: dict[str, Tally]) -> None:
    from conch.rl.batch import collate

    for traj in trajs:
        batch = collate([traj], pad_id, with_experts=True)
        if batch.experts is None:
            raise RuntimeError(f"trajectory {traj.task}#{traj.sample} has no routing record")
        m = batch.mask[0] > 0
        rec = batch.experts[0][m]
        for name, replay in (("tito", None), ("both", batch.experts)):
            lp, used, own = forward(model, _to(batch, model), replay)
            t = tallies[name]
            t.trainer.append(lp[m])
            t.sampler.append(batch.sampler_logprobs[0][m])
            t.used.append(used[m])  # rows the sampler never routed (-1) are skipped by the metric
            t.own.append(own[m])
            t.recorded.append(rec)


def _to(batch: Any, model: Any) -> Any:
    from dataclasses import replace

    dev = next(model.parameters()).device
    return replace(batch, ids=batch.ids.to(dev), attn=batch.attn.to(dev),
                   experts=None if batch.experts is None else batch.experts.to(dev))


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


@dataclass
class Retok:
    """Counts of how the retokenize-mode comparison was made (see the module docstring)."""

    turns: int = 0
    differing_turns: int = 0  # turns with a realigned tail
    context_mismatch_turns: int = 0  # turns whose prompt is not a prefix of the trainer's ids
    aligned_tokens: int = 0
    realigned_tokens: int = 0
    inserted_tokens: int = 0
    unmatched_turns: int = 0  # turns with sampled tail but no span in the trainer's sequence


def score_retokenize(model: Any, items: list, pad_id: int, end_id: int, tallies: dict[str, Tally],
                     counts: Retok) -> None:
    import numpy as np
    import torch

    from conch.rl.batch import collate

    for traj, calls in items:
        if len(calls) != len(traj.turns):
            raise RuntimeError(f"{traj.task}#{traj.sample}: {len(calls)} engine calls recorded for "
                               f"{len(traj.turns)} turns")
        R = list(traj.tokens)
        T = len(R)
        batch = collate([traj], pad_id, with_experts=False)
        aligned: list[tuple[int, float, Any]] = []  # (position, sampler lp, sampler routing row)
        tails: list[tuple[list[int], list[float]]] = []  # (trainer positions, sampler lps of the tail)
        replay = None
        filled = 0
        trained = {i for i, m in enumerate(traj.mask) if m and i > 0}
        for turn, call in zip(traj.turns, calls):
            counts.turns += 1
            if turn.sampled_ids is not None and list(turn.sampled_ids) != call.token_ids:
                raise RuntimeError(f"{traj.task}#{traj.sample}: recorded engine call does not match the turn")
            S = call.prompt + call.token_ids
            rows = np.asarray(call.rows)
            if rows.shape[0] != len(S):
                raise RuntimeError(f"engine returned {rows.shape[0]} routing rows for {len(S)} processed ids")
            if replay is None:
                replay = np.full((T, *rows.shape[1:]), -1, dtype=np.int64)
            P, n = len(call.prompt), len(call.token_ids)
            p = _common_prefix(S, R)
            if p < P:
                counts.context_mismatch_turns += 1
            if p > filled:
                replay[filled:p] = rows[filled:p]
                filled = p
            for j in range(min(n, max(0, p - P))):
                aligned.append((P + j, call.logprobs[j], rows[P + j]))
                trained.discard(P + j)
            first_tail = max(0, p - P)
            if first_tail >= n:
                continue
            counts.differing_turns += 1
            if turn.start < 0:
                counts.unmatched_turns += 1
                continue
            end = turn.end
            if end > turn.start and R[end - 1] == end_id and call.token_ids[-1] != end_id:
                end -= 1  # the template's closing token of a length-stopped turn: inserted, not sampled
            positions = list(range(max(p, turn.start), end))
            tails.append((positions, call.logprobs[first_tail:]))
            trained.difference_update(positions)
        counts.inserted_tokens += len(trained)
        counts.aligned_tokens += len(aligned)
        counts.realigned_tokens += sum(len(s) for _, s in tails)
        experts = None if replay is None else torch.from_numpy(replay).unsqueeze(0)
        for name, rp in (("neither", None), ("r3", experts)):
            lp, used, own = forward(model, _to(batch, model), None if rp is None else rp.to(batch.ids.device))
            for t in (tallies[name], tallies[name + "_aligned"]):
                if not aligned:
                    break
                pos = torch.tensor([a[0] for a in aligned])
                t.trainer.append(lp[pos])
                t.sampler.append(torch.tensor([a[1] for a in aligned], dtype=torch.float32))
                t.recorded.append(torch.from_numpy(np.stack([a[2] for a in aligned]).astype(np.int64)))
                t.used.append(used[pos])
                t.own.append(own[pos])
            t = tallies[name]
            for positions, slps in tails:
                s = torch.tensor(slps, dtype=torch.float32)
                delta = float(lp[positions].sum()) - float(s.sum())
                t.sampler.append(s)
                t.trainer.append(s + delta / len(slps))


# ---------------------------------------------------------------- the command


def default_tasks() -> Path:
    from conch.cli import UsageError

    path = Path(__file__).resolve().parents[2] / "examples" / "tasks"
    if not path.is_dir():
        raise UsageError(f"no --tasks given and the repository's examples/tasks is not at {path}; pass --tasks DIR")
    return path


def load(args: argparse.Namespace) -> list:
    from conch.cli import UsageError
    from conch.tasks.loader import load_tasks
    from conch.tasks.model import TaskLoadError

    root = Path(args.tasks) if args.tasks else default_tasks()
    if not root.exists():
        raise UsageError(f"--tasks {root}: no such folder")
    tasks = []
    for t in load_tasks([root]):
        if isinstance(t, TaskLoadError):
            print(f"skipping task {t.name}: {t}", file=sys.stderr)
        else:
            tasks.append(t)
    tasks.sort(key=lambda t: t.name)
    if args.max_tasks:
        tasks = tasks[: args.max_tasks]
    if not tasks:
        raise UsageError(f"no loadable tasks under {root}")
    return tasks


def _ratio(a: dict, b: dict) -> float:
    return a["logprob_abs_diff"] / b["logprob_abs_diff"] if b["logprob_abs_diff"] > 0 else math.nan


def bench(args: argparse.Namespace) -> dict:
    from conch.cli import UsageError
    from conch.model.loading import load_policy
    from conch.moe.routing import moe_layer_count

    model_dir = resolve_model(args.model)
    trainer = load_policy(model_dir, dtype="float32", device=args.device, with_tokenizer=False).model
    if moe_layer_count(trainer) == 0:
        raise UsageError(f"{model_dir} has no MoE layers: R3 and routing disagreement need an MoE model")
    tasks = load(args)
    got = asyncio.run(collect(args, model_dir, tasks))
    pad_id, end_id = got.pad_id, got.end_id
    kept: dict[str, list] = {}
    dropped = 0
    for mode, items in got.modes.items():
        kept[mode] = [(t, c) for t, c in items if not t.error and t.num_sampled]
        dropped += len(items) - len(kept[mode])
        for t, _ in items:
            if t.error:
                print(f"dropping {mode} trajectory {t.task}#{t.sample}: {t.error}", file=sys.stderr)
    if not kept["tito"] or not kept["retokenize"]:
        raise RuntimeError("no usable trajectories in one of the modes (see the messages above)")
    tallies = {s: Tally() for s in (*SETTINGS, "neither_aligned", "r3_aligned")}
    counts = Retok()
    score_tito(trainer, [t for t, _ in kept["tito"]], pad_id, tallies)
    score_retokenize(trainer, kept["retokenize"], pad_id, end_id, tallies, counts)
    result: dict[str, Any] = {}
    own: dict[str, float] = {}
    tokens: dict[str, int] = {}
    for s in SETTINGS:
        result[s], own[s], tokens[s] = tallies[s].metrics()
    aligned_only = {s: tallies[s + "_aligned"].metrics()[0] for s in ("neither", "r3")}
    ratio = _ratio(result["both"], result["neither"])
    ratio_aligned = _ratio(result["both"], aligned_only["neither"])
    result.update({
        "tokens": tokens["tito"],
        "tokens_retokenize": tokens["neither"],
        "model": model_dir,
        "sampler_dtype": args.sampler_dtype, "engine": args.engine,
        "trainer_dtype": "float32",
        "trajectories": {m: len(kept[m]) for m in kept} | {"dropped": dropped},
        "seed": args.seed,
        "own_routing_disagreement": own,
        "retokenize": vars(counts),
        # retokenize mode over its aligned tokens only: the numeric part of its gap, without the realigned tails
        "aligned_only": aligned_only,
        "both_over_neither": round(ratio, 4) if math.isfinite(ratio) else None,
        "both_over_neither_aligned": round(ratio_aligned, 4) if math.isfinite(ratio_aligned) else None,
        "target": {"both_over_neither_max": TARGET_RATIO,
                   "met": bool(math.isfinite(ratio) and ratio <= TARGET_RATIO
                               and result["r3"]["routing_disagreement"] == 0.0
                               and result["both"]["routing_disagreement"] == 0.0)},
    })
    return result


def table(r: dict) -> str:
    w = 22
    lines = [f"model {r['model']}: sampler {r['sampler_dtype']}, trainer {r['trainer_dtype']}; trajectories "
             f"{r['trajectories']['tito']} tito + {r['trajectories']['retokenize']} retokenize (seed {r['seed']})",
             f"{'setting':<{w}}{'|dlogp| mean':>14}{'k3 KL':>12}{'routing dis.':>14}{'own router dis.':>17}"
             f"{'tokens':>9}"]
    rows = [(s, r[s], r["own_routing_disagreement"][s],
             r["tokens"] if s in ("tito", "both") else r["tokens_retokenize"]) for s in SETTINGS]
    c = r["retokenize"]
    rows += [(f"{s}, aligned only", r["aligned_only"][s], None, c["aligned_tokens"]) for s in ("neither", "r3")]
    for name, m, own, n in rows:
        own_text = f"{own:>17.4f}" if own is not None else f"{'':>17}"
        lines.append(f"{name:<{w}}{m['logprob_abs_diff']:>14.3e}{m['k3_kl']:>12.3e}{m['routing_disagreement']:>14.4f}"
                     f"{own_text}{n:>9}")
    lines.append(f"retokenize mode: {c['aligned_tokens']} sampled tokens aligned with the trainer's ids, "
                 f"{c['realigned_tokens']} in realigned tails ({c['differing_turns']} of {c['turns']} turns differ, "
                 f"{c['context_mismatch_turns']} with a differing prompt); {c['inserted_tokens']} inserted tokens "
                 f"trained on but never sampled")
    ratio, aligned = r["both_over_neither"], r["both_over_neither_aligned"]
    verdict = "met" if r["target"]["met"] else "missed"
    lines.append(f"both / neither = {ratio if ratio is not None else 'n/a'} (target <= {TARGET_RATIO}, routing "
                 f"disagreement 0 with R3): {verdict}; both / (neither, aligned only) = "
                 f"{aligned if aligned is not None else 'n/a'}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from conch.bench import settle_args
    from conch.cli import UsageError

    settle_args(args, QUICK, ("n_per_task", "turns", "max_new_tokens", "concurrency"))
    if args.max_tasks < 0:
        raise UsageError("--max-tasks must be 0 (all) or more")
    result = bench(args)
    print(json.dumps(result) if args.json else table(result))
    return 0
