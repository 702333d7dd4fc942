"""`synth.jsonl`: one JSON line per finished candidate, appended and fsynced as each ends.

Why append-only with one line per *finished* candidate: a crash loses at most the candidates in flight,
never an accepted task (its folder is renamed into place first, its line written right after, and a folder
found without its line is recovered on `--resume`); resuming is "skip every candidate id that has a line".
A line: id, seed, difficulty, skill, prompt_version, model, attempts (each: answer_sha256, every gate's
outcome and time), status (accepted | rejected | error), rejected_at (the last attempt's failing gate),
reason, accepted_path, seconds.
"""

from __future__ import annotations

import json
import os
from collections import Counter, defaultdict
from pathlib import Path

from conch.tasks.llmsynth.gates import GATES

NAME = "synth.jsonl"


class Ledger:
    def __init__(self, out: Path):
        self.path = Path(out) / NAME

    def records(self) -> list[dict]:
        """Every complete line (a line cut by a crash is ignored: its candidate runs again on resume)."""
        if not self.path.is_file():
            return []
        out = []
        for line in self.path.read_text(errors="replace").splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if isinstance(rec, dict) and "id" in rec:
                out.append(rec)
        return out

    def append(self, record: dict) -> None:
        data = (json.dumps(record, sort_keys=True) + "\n").encode()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            if os.fstat(fd).st_size and not _ends_with_newline(self.path):
                data = b"\n" + data  # a line cut by a crash stays a line of its own
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)


def _ends_with_newline(path: Path) -> bool:
    with open(path, "rb") as f:
        f.seek(-1, os.SEEK_END)
        return f.read(1) == b"\n"


def stats(records: list[dict]) -> dict:
    """Acceptance per gate (a funnel: candidates reaching each gate, and rejected there) and per seed."""
    reached: Counter = Counter()
    rejected: Counter = Counter()
    seeds: dict[str, Counter] = defaultdict(Counter)
    status: Counter = Counter()
    repaired = 0
    for rec in records:
        status[rec.get("status", "?")] += 1
        seeds[rec.get("seed", "?")][rec.get("status", "?")] += 1
        last = (rec.get("attempts") or [{}])[-1]
        for g in last.get("gates", []):
            reached[g["gate"]] += 1
            if not g["ok"]:
                rejected[g["gate"]] += 1
        if rec.get("status") == "accepted" and len(rec.get("attempts") or []) > 1:
            repaired += 1
    n = len(records)
    gates = {g: {"reached": reached[g], "rejected": rejected[g], "passed": reached[g] - rejected[g]}
             for g in GATES if reached[g] or g == "parse"}
    per_seed = {s: {"candidates": sum(c.values()), "accepted": c["accepted"],
                    "rate": round(c["accepted"] / max(1, sum(c.values())), 4)} for s, c in sorted(seeds.items())}
    return {"candidates": n, "accepted": status["accepted"], "rejected": status["rejected"],
            "errors": status["error"], "accepted_after_repair": repaired,
            "acceptance_rate": round(status["accepted"] / max(1, n), 4), "gates": gates, "seeds": per_seed}


def stats_lines(st: dict, where: Path) -> list[str]:
    lines = [f"{st['candidates']} candidate(s) in {where / NAME}: {st['accepted']} accepted "
             f"({st['acceptance_rate']:.0%}), {st['rejected']} rejected, {st['errors']} errors; "
             f"{st['accepted_after_repair']} accepted after a repair"]
    lines.append(f"  {'gate':<10} {'reached':>8} {'rejected':>9} {'passed':>7}")
    for g, c in st["gates"].items():
        lines.append(f"  {g:<10} {c['reached']:>8} {c['rejected']:>9} {c['passed']:>7}")
    lines.append(f"  {'seed':<30} {'candidates':>10} {'accepted':>9} {'rate':>6}")
    for s, c in st["seeds"].items():
        lines.append(f"  {s:<30} {c['candidates']:>10} {c['accepted']:>9} {c['rate']:>6.0%}")
    return lines
