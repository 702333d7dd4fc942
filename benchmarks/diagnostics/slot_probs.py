"""How much the policy reads the slot of the starter families: p(right slot value | instruction).

Also prints p(exact command): the probability that one sample of the first tool call is exactly the task's
solution command. Most passing samples are exactly that command, so it tracks the pass rate at temperature 1
without sampling noise (a cheap, deterministic comparison of two checkpoints on the same tasks). And
p(mistake): the same for the family's mistake (`TaskDraft.mistake`, what `corpus.mistake_rate` of the
demonstrations show), regenerated from the task's seed.

For every starter task in TASKS, the task's own solution command is scored under the model with each candidate
slot value (the folder the instruction names) put in, and the probability of the right one is normalised over
the candidates. Each family draws its slot from 3 values, so about 0.33 means the policy guesses among them
without reading the instruction.

    python benchmarks/diagnostics/slot_probs.py RUNDIR/warm RUNDIR/corpus/eval
"""

from __future__ import annotations

import math
import re
import sys
import tomllib
from collections import defaultdict
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from conch.agent.rollout import system_prompt
from conch.agent.tito import ChatCodec
from conch.tasks.synth import draft_for, load_families
from conch.tasks.synth.families_basic import DIRS
from conch.tasks.synth.trajectories import BASH_TOOL

SLOTS = {  # family -> (pattern whose group 1 is the slot in the solution, candidates)
    "count-lines": (r"cat /app/(\w+)/", DIRS),
    "count-files": (r"ls /app/(\w+) ", DIRS),
    "copy-files": (r"cp /app/(\w+)/", DIRS),
    "remove-files": (r"rm -f /app/(\w+)/", DIRS),
    "make-dirs": (r"mkdir -p /app/(\w+)/", DIRS),
}


def main(model_dir: str, tasks_dir: str) -> None:
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    codec = ChatCodec(tok, tools=[BASH_TOOL])

    def score(instruction: str, command: str) -> float:
        msgs = [{"role": "system", "content": system_prompt()}, {"role": "user", "content": instruction}]
        prefix = codec.encode(codec.render(msgs, add_generation_prompt=True))
        call = {"type": "function", "function": {"name": "bash", "arguments": {"command": command}}}
        full = torch.tensor([codec.encode(codec.render(msgs + [{"role": "assistant", "content": "",
                                                                 "tool_calls": [call]}]))])
        with torch.no_grad():
            lp = torch.log_softmax(model(full).logits[0, :-1].float(), -1)
        n = len(prefix) - 1
        target = full[0, 1:]
        end = n + target[n:].tolist().index(codec.end_id) + 1  # the template's newline after <|im_end|> is not sampled
        return float(lp[n:end].gather(1, target[n:end, None]).sum())

    probs: dict[str, list[float]] = defaultdict(list)
    exact: dict[str, list[float]] = defaultdict(list)
    wrong: dict[str, list[float]] = defaultdict(list)
    families = load_families()
    for task in sorted(Path(tasks_dir).iterdir()):
        family = task.name.rsplit("-", 1)[0]
        if family not in SLOTS:
            continue
        pattern, candidates = SLOTS[family]
        solution = (task / "solution" / "solve.sh").read_text().strip().splitlines()[-1]
        match = re.search(pattern, solution)
        if match is None:
            continue
        instruction = (task / "instruction.md").read_text().strip()
        a, b = match.span(1)
        s = {c: score(instruction, solution[:a] + c + solution[b:]) for c in candidates}
        top = max(s.values())
        probs[family].append(math.exp(s[match.group(1)] - top) / sum(math.exp(v - top) for v in s.values()))
        exact[family].append(math.exp(s[match.group(1)]))
        seed = tomllib.loads((task / "task.toml").read_text())["metadata"]["seed"]
        mistake = draft_for(families[family], seed).mistake
        if mistake:
            wrong[family].append(math.exp(score(instruction, mistake[-1])))
    for family, ps in sorted(probs.items()):
        print(f"{family:14} p(right slot) mean {sum(ps) / len(ps):.2f}, p(exact command) mean "
              f"{sum(exact[family]) / len(ps):.2f}, p(mistake) mean "
              f"{sum(wrong[family]) / max(len(wrong[family]), 1):.2f} over {len(ps)} tasks")
    allx = [x for xs in exact.values() for x in xs]
    allw = [x for xs in wrong.values() for x in xs]
    print(f"{'all':14} p(exact command) mean {sum(allx) / max(len(allx), 1):.3f}, p(mistake) mean "
          f"{sum(allw) / max(len(allw), 1):.3f} over {len(allx)} tasks")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
