"""`conch model init`: create conch's own randomly initialised Qwen3-MoE policy model and tokenizer.

The result is a normal HF checkpoint folder (safetensors + config + tokenizer files + chat template) that every
other command accepts wherever it takes a model path.
"""

from __future__ import annotations

import argparse
import json
import sys


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("model", help="create a policy model (one action so far: init)", description=__doc__)
    msub = p.add_subparsers(dest="model_command", metavar="ACTION", required=True)
    ip = msub.add_parser("init", help="create a randomly initialised Qwen3-MoE model with its tokenizer",
                         description="Create a randomly initialised Qwen3-MoE model (HF format) with a BPE "
                                     "tokenizer trained offline. Deterministic given --seed.")
    ip.add_argument("--out", required=True, help="output folder (created; must be empty or absent)")
    ip.add_argument("--size", default="tiny", choices=("tiny", "small"), help="model size (default tiny)")
    ip.add_argument("--tokenizer-corpus", nargs="*", default=[], metavar="PATH",
                    help="extra files/folders for tokenizer training (text, JSON, JSONL)")
    ip.add_argument("--vocab-size", type=int, default=None, help="tokenizer vocabulary size (default 4096)")
    ip.add_argument("--seed", type=int, default=0, help="initialisation seed (default 0)")
    ip.add_argument("--force", action="store_true", help="write into a non-empty folder")
    ip.set_defaults(func=run_init)


def run_init(args: argparse.Namespace) -> int:
    from pathlib import Path

    from conch.cli import UsageError

    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} exists and is not a folder")
    if out.is_dir() and any(out.iterdir()) and not args.force:
        raise UsageError(f"--out {out} is not empty (use --force to write into it)")
    corpus = [Path(c) for c in args.tokenizer_corpus]
    missing = [str(c) for c in corpus if not c.exists()]
    if missing:
        raise UsageError(f"--tokenizer-corpus path(s) not found: {', '.join(missing)}")
    from conch.model.init import init_model

    report = init_model(out, size=args.size, seed=args.seed, tokenizer_corpus=corpus, vocab_size=args.vocab_size)
    print(json.dumps(report.__dict__))
    print(f"wrote {report.size} model ({report.parameters / 1e6:.2f}M parameters, {report.num_experts} experts, "
          f"top-{report.top_k}, {report.moe_layers} MoE layers) to {out}", file=sys.stderr)
    return 0
