"""The trajectories a run keeps: one gzip-compressed JSONL file per evaluation and per PPO iteration, under
RUNDIR/trajectories/ (`eval-init.jsonl.gz`, `eval-iter4.jsonl.gz`, `ppo-iter0003.jsonl.gz`, ...).

Why: an RL run on terminal agents is debugged by reading episodes. A record holds what a reader (and
`conch report`) needs: the conversation, per-turn command / exit code / timing, the token ids with their mask
(1 = sampled, 0 = inserted by conch), the sampler's and (for PPO rollouts) the trainer's log-probs, the routing
the sampler chose, the token-layer pairs where the trainer's router disagreed, reward, per-test verifier
outcomes, stop reason and errors.

Bounded: a record never exceeds a few MB whatever the episode length. Token arrays stop at MAX_TOKENS, each
message at MAX_MESSAGE_CHARS, routing is kept only while it fits ROUTING_CAP bytes (sampled rows first), and
disagreements at MAX_DISAGREEMENTS pairs; every cut is noted in the record's `cut` field. Log-probs are rounded
to 1e-3 nats. Measured sizes are in docs/readme/28-report.md.

Records are plain JSON (schema `conch.trajectory/1`); `read_records` also opens the raw trajectory JSONL that
`conch rollout --out` and `conch eval --out` write, converting each line on the fly.
"""

from __future__ import annotations

import gzip
import json
import random
import re
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

SCHEMA = "conch.trajectory/1"
TRAJ_DIR = "trajectories"
MAX_TOKENS = 65_536
MAX_MESSAGE_CHARS = 16_000
ROUTING_CAP = 1 << 20  # bytes of raw expert ids
MAX_DISAGREEMENTS = 20_000

_FAMILY = re.compile(r"^(.*)-[0-9a-f]{10}$")


def family_of(task: str) -> str:
    """The synthetic family of a task name (`<family>-<10 hex>`); the name itself for other tasks."""
    m = _FAMILY.match(task)
    return m.group(1) if m else task


def _lp(xs: Sequence[float]) -> list[float]:
    return [round(float(x), 3) for x in xs]


def _steps(traj: Any) -> list[dict[str, Any]]:
    """One entry per assistant turn: what it ran, what came back (k-th assistant message = k-th turn)."""
    out: list[dict[str, Any]] = []
    msgs = traj.messages
    k = 0
    for i, m in enumerate(msgs):
        if m.get("role") != "assistant":
            continue
        turn = traj.turns[k] if k < len(traj.turns) else None
        k += 1
        j, outputs = i + 1, []
        while j < len(msgs) and msgs[j].get("role") == "tool":
            outputs.append(str(msgs[j].get("content", "")))
            j += 1
        out.append({
            "text": str(m.get("content") or ""),
            "command": turn.command if turn else None,
            "exit_code": turn.exit_code if turn else None,
            "timed_out": bool(turn.timed_out) if turn else False,
            "parse_error": turn.parse_error if turn else None,
            "finish": turn.finish_reason if turn else None,
            "gen_s": round(turn.gen_seconds, 3) if turn else None,
            "env_s": round(turn.env_seconds, 3) if turn else None,
            "span": [turn.start, turn.end] if turn else None,
            "output": "\n".join(outputs),
        })
    return out


def _routing(traj: Any, cut: list[str]) -> dict | None:
    """The sampler's expert ids, compact (base64 of uint8/int16), sampled rows only when the whole is too big."""
    import numpy as np

    from conch.agent.trajectory import encode_routing

    arr = traj.routed_experts
    if arr is None:
        return None
    arr = np.asarray(arr)[:MAX_TOKENS]
    small = arr.astype(np.uint8 if arr.max(initial=0) < 255 else np.int16)  # -1 (never routed) wraps to 255
    if small.nbytes <= ROUTING_CAP:
        return {"rows": "all", **encode_routing(small)}
    idx = np.flatnonzero(np.asarray(traj.mask[: len(arr)]) == 1)
    if small[idx].nbytes <= ROUTING_CAP:
        cut.append(f"routing kept for the {len(idx)} sampled tokens only")
        return {"rows": "sampled", **encode_routing(small[idx])}
    cut.append(f"routing omitted ({small.nbytes} bytes > {ROUTING_CAP})")
    return None


def _messages(messages: list[dict], cut: list[str]) -> list[dict]:
    out = []
    for m in messages:
        c = m.get("content")
        if isinstance(c, str) and len(c) > MAX_MESSAGE_CHARS:
            half = MAX_MESSAGE_CHARS // 2
            m = {**m, "content": c[:half] + f"\n[... {len(c) - 2 * half} characters cut ...]\n" + c[-half:]}
            cut.append("a long message")
        out.append(m)
    return out


def make_record(traj: Any, stage: str, name: str, iteration: int | None = None,
                trainer_lp: Sequence[float] | None = None, disagreements: Sequence[Sequence[int]] | None = None
                ) -> dict[str, Any]:
    """A JSON-ready record of one finished trajectory. `stage`: "eval", "ppo" or "rollout"; `name`: the
    evaluation ("init", "warm", "iter4", "final", "heldout_final"), "ppo", or the rollout file's name."""
    cut: list[str] = []
    n = len(traj.tokens)
    if n > MAX_TOKENS:
        cut.append(f"token arrays cut at {MAX_TOKENS} of {n}")
    dis = [list(map(int, p)) for p in (disagreements or [])[:MAX_DISAGREEMENTS]]
    if disagreements is not None and len(disagreements) > MAX_DISAGREEMENTS:
        cut.append(f"{len(disagreements) - MAX_DISAGREEMENTS} routing disagreements not kept")
    tests = [{"name": t["name"], "status": t["status"]} for t in getattr(traj, "tests", None) or []]
    return {
        "schema": SCHEMA, "stage": stage, "name": name, "iteration": iteration,
        "task": traj.task, "family": family_of(traj.task), "sample": traj.sample,
        "reward": traj.reward, "n_passed": traj.n_passed, "n_total": traj.n_total,
        "solved": bool(traj.n_total and traj.n_passed == traj.n_total and not traj.verifier_error),
        "tests": tests, "stop_reason": getattr(traj.stop_reason, "value", traj.stop_reason),
        "error": traj.error, "verifier_error": traj.verifier_error,
        "verifier_fault": getattr(traj, "verifier_fault", None), "tampered": getattr(traj, "tampered", None),
        "timings": {k: round(v, 3) for k, v in traj.timings.items()},
        "drift": dict(traj.drift), "progress": [list(p) for p in traj.progress], "mode": traj.mode,
        "messages": _messages(traj.messages, cut), "steps": _steps(traj),
        "tokens": list(traj.tokens[:MAX_TOKENS]), "mask": list(traj.mask[:MAX_TOKENS]),
        "sampler_lp": _lp(traj.logprobs[:MAX_TOKENS]),
        "trainer_lp": _lp(trainer_lp[:MAX_TOKENS]) if trainer_lp is not None else None,
        "routing": _routing(traj, cut), "routing_disagreements": dis, "cut": cut,
    }


class TrajectoryStore:
    """Writes records under RUNDIR/trajectories/ and accounts for the time it spends (`seconds`), so the run
    can report what keeping trajectories costs."""

    def __init__(self, run_dir: Path) -> None:
        self.dir = Path(run_dir) / TRAJ_DIR
        self.seconds = 0.0
        self.records = 0

    @contextmanager
    def writer(self, stem: str, stage: str, name: str, iteration: int | None = None
               ) -> Iterator[Callable[[Any], None]]:
        """`with store.writer("eval-init", "eval", "init") as keep:` then `keep(traj)` per finished trajectory
        (an `on_done` callback). The file is rewritten, so a resumed run that repeats a stage does not
        duplicate it."""
        self.dir.mkdir(parents=True, exist_ok=True)
        fh = gzip.open(self.dir / f"{stem}.jsonl.gz", "wt", compresslevel=5)

        def keep(traj: Any, **extra: Any) -> None:
            t0 = time.perf_counter()
            fh.write(json.dumps(make_record(traj, stage, name, iteration, **extra)) + "\n")
            self.records += 1
            self.seconds += time.perf_counter() - t0

        try:
            yield keep
        finally:
            fh.close()

    def keep_ppo(self, iteration: int, prepared: Sequence[Any], keep: int, seed: int = 0,
                 excluded: Sequence[Any] = ()) -> float:
        """Write `keep` rollouts of a PPO iteration (-1: all), sampled at random, with the trainer's log-probs
        and routing disagreements from `prepared` (`rl.update.Prepared`). Trajectories excluded from training
        (sandbox or verifier errors) are kept too when the sample reaches them: they are the ones to read.
        Returns the seconds spent."""
        before = self.seconds
        items: list[tuple[Any, Any]] = [(p.traj, p) for p in prepared] + [(t, None) for t in excluded]
        if keep >= 0 and len(items) > keep:
            items = random.Random(seed).sample(items, keep)
        if not items:
            return 0.0
        with self.writer(f"ppo-iter{iteration:04d}", "ppo", "ppo", iteration) as write:
            for traj, p in items:
                lp = p.old_lp.tolist() if p is not None else None
                dis = getattr(p, "route_diff", None)
                write(traj, trainer_lp=lp, disagreements=dis.tolist() if dis is not None else None)
        return self.seconds - before


def _open_text(path: Path):
    return gzip.open(path, "rt") if path.suffix == ".gz" else open(path)


def read_records(path: Path) -> Iterator[dict[str, Any]]:
    """Every record of a run folder (its trajectories/ files), a kept-trajectory file, or a rollout file of raw
    trajectories (`conch rollout --out`, `conch eval --out`). A torn last line is skipped."""
    from conch.agent.trajectory import Trajectory

    path = Path(path)
    # In the order they were written (init, warm, critic, iterations, final); names break ties.
    files = (sorted((path / TRAJ_DIR).glob("*.jsonl*"), key=lambda f: (f.stat().st_mtime, f.name))
             if path.is_dir() else [path])
    for f in files:
        with _open_text(f) as fh:
            for line in fh:
                if not line.strip():
                    continue
                try:
                    d = json.loads(line)
                except ValueError:
                    continue
                if d.get("schema") == SCHEMA:
                    yield d
                elif "tokens" in d and "task" in d:
                    name = f.name.split(".")[0]
                    yield make_record(Trajectory.from_json(d), "rollout", name)


def routing_disagreements(own: Any, recorded: Any, mask: Any) -> Any:
    """[N, 2] (token, layer) pairs of sampled tokens whose top-k expert *set* differs between the trainer's own
    router (`own`, [T, layers, k]) and the sampler's record (`recorded`); rows holding a -1 are not compared."""
    import torch

    a = torch.sort(own.long(), dim=-1).values
    b = torch.sort(recorded.to(own.device).long(), dim=-1).values
    valid = (a >= 0).all(-1) & (b >= 0).all(-1) & (mask.to(own.device) != 0).unsqueeze(-1)
    return torch.nonzero((a != b).any(-1) & valid).cpu()
