"""The gates a synthesized task goes through, in order; each gives an `Outcome` for the ledger.

    parse -> load -> build -> oracle -> nop -> giveaway -> decontam -> duplicate

Why this order: a rejection at a later gate says the earlier ones held (a task flagged by decontamination
did work), so the ledger's per-gate counts read as a funnel. The sandbox gates call the public harness
(`run_task`, `CheckResult`) exactly as `conch check` does; decontamination and near-duplicates both use
conch.tasks.decontam's scoring (one scorer: the duplicate gate treats the seeds and the accepted tasks as its
reference set).
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from pathlib import Path

GATES = ("parse", "load", "build", "oracle", "nop", "giveaway", "decontam", "duplicate")
GIVEAWAY_MIN_CHARS = 24  # a solution line this long found verbatim in the instruction gives the solution away
_TRIVIAL = re.compile(r"^(#|set\s+-|cd\s|mkdir\s+-p\s|echo\s|fi$|done$|then$|else$|do$|exit\b|\}|\{|EOF$)")


@dataclass
class Outcome:
    gate: str
    ok: bool
    message: str
    seconds: float

    def to_json(self) -> dict:
        return {"gate": self.gate, "ok": self.ok, "message": self.message, "seconds": round(self.seconds, 3)}


def timed(gate: str, fn, *args) -> Outcome:
    t0 = time.monotonic()
    try:
        ok, message = fn(*args)
    except Exception as exc:  # a gate that crashes rejects the candidate; it never stops the run
        ok, message = False, f"{type(exc).__name__}: {exc}"
    return Outcome(gate, ok, message, time.monotonic() - t0)


def load_gate(folder: Path):
    """(Task or None, Outcome): the folder loads as a conch task."""
    from conch.tasks.loader import load_task
    from conch.tasks.model import Task

    t0 = time.monotonic()
    task = load_task(folder)
    if not isinstance(task, Task):
        return None, Outcome("load", False, str(task), time.monotonic() - t0)
    if task.solution_script is None and not task.solution_commands:
        return None, Outcome("load", False, "no solution/solve.sh", time.monotonic() - t0)
    return task, Outcome("load", True, "", time.monotonic() - t0)


async def build_gate(task, backend: str, network: str) -> Outcome:
    """The task's environment builds and starts on `backend` (then is stopped)."""
    from conch.sandbox import make_sandbox
    from conch.sandbox.network import granted

    t0 = time.monotonic()
    sandbox = None
    try:
        sandbox = make_sandbox(backend, task.sandbox_spec(), registries=granted(network, task.allow_internet))
        await sandbox.start()
        return Outcome("build", True, "", time.monotonic() - t0)
    except Exception as exc:
        return Outcome("build", False, f"{type(exc).__name__}: {exc}"[:2000], time.monotonic() - t0)
    finally:
        if sandbox is not None:
            try:
                await sandbox.stop()
            except Exception:
                pass


def _tail(result) -> str:
    """The end of the verifier's output: what a repair prompt needs to see."""
    log = result.verify.log if result.verify is not None and result.verify.log else ""
    return f"\nverifier output (end):\n{log[-1500:]}" if log else ""


async def oracle_gate(task, backend: str, network: str) -> tuple[Outcome, int]:
    """(Outcome, tests passed): the reference solution passes every test (and the reward, if any, is 1)."""
    from conch.harness import run_task

    r = await run_task(task, "oracle", backend, network)
    if r.error:
        return Outcome("oracle", False, f"oracle run errored: {r.error}{_tail(r)}"[:3000], r.seconds), 0
    if r.n_total == 0:
        return Outcome("oracle", False, "the verifier reported no tests", r.seconds), 0
    if r.n_passed < r.n_total or (r.reward is not None and r.reward < 1):
        return Outcome("oracle", False, f"oracle passed {r.n_passed}/{r.n_total} tests (reward {r.reward}); "
                       f"the solution must pass every test{_tail(r)}"[:3000], r.seconds), r.n_passed
    return Outcome("oracle", True, f"{r.n_passed}/{r.n_total}", r.seconds), r.n_passed


async def nop_gate(task, backend: str, network: str, oracle_passed: int) -> Outcome:
    """Doing nothing fails at least one test: count_over_nop (oracle passed - nop passed) > 0."""
    from conch.harness import run_task

    r = await run_task(task, "nop", backend, network)
    if r.error:
        return Outcome("nop", False, f"nop run errored: {r.error}"[:2000], r.seconds)
    if oracle_passed - r.n_passed <= 0:
        return Outcome("nop", False, f"the do-nothing agent already passes {r.n_passed}/{r.n_total} tests: the "
                       "tests must check what the solution changes", r.seconds)
    return Outcome("nop", True, f"nop {r.n_passed}/{r.n_total}", r.seconds)


def _norm(line: str) -> str:
    return " ".join(line.split())


def distinctive_lines(solution: str) -> list[str]:
    """The solution's command lines that would give it away if the instruction held them: long, not comments,
    not boilerplate (set -e, cd, mkdir -p, echo, shell keywords)."""
    out = []
    for raw in solution.splitlines():
        line = _norm(raw)
        if len(line) >= GIVEAWAY_MIN_CHARS and not _TRIVIAL.match(line):
            out.append(line)
    return out


def giveaway_gate(task) -> tuple[bool, str]:
    """The instruction does not contain the solution's distinctive commands verbatim."""
    if task.solution_script is not None:
        solution = task.solution_script.read_text(errors="replace")
    else:
        solution = "\n".join(task.solution_commands or ())
    instruction = _norm(task.instruction)
    found = [line for line in distinctive_lines(solution) if line in instruction]
    if found:
        return False, f"the instruction gives the solution away: it holds {len(found)} of the solution's " \
                      f"commands verbatim, e.g. {found[0][:120]!r}"
    return True, ""


class Decontam:
    """`--against`'s reference, indexed once; `check` scores one candidate as `conch decontam` would."""

    def __init__(self, against: Path, threshold: float):
        from conch.tasks.decontam import Reference, load_docs

        refs = load_docs(against, reference=True)
        if not refs:
            raise ValueError(f"{against}: no reference instructions found (instruction.md or task.yaml)")
        self.ref, self.threshold = Reference(refs), threshold

    def check(self, task) -> tuple[bool, str]:
        from conch.tasks.decontam import make_doc, score_docs

        doc = make_doc(task.name, Path(task.path), task.instruction, reference=False,
                       with_files=bool(self.ref.file_index))
        m = score_docs([doc], self.ref, self.threshold)[0]
        if m.flagged:
            return False, f"flagged by decontamination: score {m.score:.3f} >= {self.threshold} against " \
                          f"{m.nearest} ({m.why.get('signal')})"
        return True, f"score {m.score:.3f} (nearest {m.nearest})"


class Corpus:
    """The seeds and the accepted tasks, as decontamination references: a candidate scoring at or above the
    threshold against one of them is a near-duplicate. The index is rebuilt only after an acceptance."""

    def __init__(self, folders: list[tuple[str, Path, str]], threshold: float):
        self.entries = list(folders)  # (name, folder, instruction)
        self.threshold = threshold
        self._ref = None

    def add(self, name: str, folder: Path, instruction: str) -> None:
        self.entries.append((name, folder, instruction))
        self._ref = None

    def check(self, task) -> tuple[bool, str]:
        from conch.tasks.decontam import Reference, make_doc, score_docs

        if not self.entries:
            return True, "nothing to compare with"
        if self._ref is None:
            self._ref = Reference([make_doc(n, f, text, reference=True) for n, f, text in self.entries])
        doc = make_doc(task.name, Path(task.path), task.instruction, reference=False,
                       with_files=bool(self._ref.file_index))
        m = score_docs([doc], self._ref, self.threshold)[0]
        if m.flagged:
            return False, f"near-duplicate of {m.nearest}: score {m.score:.3f} >= {self.threshold} ({m.why.get('signal')})"
        return True, f"score {m.score:.3f} (nearest {m.nearest})"
