"""The flags and entry points of `conch synth --from-seeds` (registered by conch/commands/synth.py).

Why checks before any work: a run can last hours, so everything a user can get wrong (a URL nothing answers
at, a model the server does not serve, a key variable that is unset, a seed folder without tasks, a missing
`--against`) is found first and reported as one line with exit 2, before the first candidate.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

LLM_FLAGS = ("llm", "model", "api_key_env", "against", "repairs", "max_candidates")


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("LLM synthesis from seed tasks (--from-seeds)")
    g.add_argument("--from-seeds", type=Path, metavar="DIR", help="seed tasks (any layout conch loads)")
    g.add_argument("--llm", metavar="URL", help="OpenAI-compatible endpoint, e.g. http://127.0.0.1:8000/v1")
    g.add_argument("--model", metavar="NAME", help="model name the endpoint serves")
    g.add_argument("--api-key-env", metavar="VAR", help="environment variable holding the API key (none by default)")
    g.add_argument("--against", type=Path, metavar="REF_DIR", help="benchmark tasks to decontaminate against "
                   "(required unless --no-decontam)")
    g.add_argument("--no-decontam", action="store_true", help="skip the decontamination gate (say it explicitly)")
    g.add_argument("--threshold", type=float, default=0.5, help="decontamination flag score (default 0.5)")
    g.add_argument("--dup-threshold", type=float, default=0.5,
                   help="near-duplicate score against seeds and accepted tasks (default 0.5)")
    g.add_argument("--repairs", type=int, default=0, help="repair rounds per candidate: a failing gate's message "
                   "goes back to the LLM (default 0)")
    g.add_argument("--llm-jobs", type=int, default=4, help="LLM calls at once (default 4); --jobs: sandbox checks")
    g.add_argument("--max-candidates", type=int, help="candidates tried at most (default 4 x --n)")
    g.add_argument("--resume", action="store_true", help="continue the run in --out: skip finished candidates")
    g.add_argument("--difficulty", choices=("easy", "medium", "hard"), help="asked of every task (default: varied)")
    g.add_argument("--temperature", type=float, default=0.7, help="sampling temperature (default 0.7)")
    g.add_argument("--max-tokens", type=int, default=4096, help="longest answer in tokens (default 4096)")
    g.add_argument("--retries", type=int, default=4, help="retries of a failed HTTP call, with backoff (default 4)")
    g.add_argument("--llm-timeout", type=float, default=600.0, help="seconds per LLM call (default 600)")
    g.add_argument("--network", choices=("never", "task"), default="never",
                   help="sandbox network for the checks, as in `conch check` (default never)")


def _client(args: argparse.Namespace):
    from conch.cli import UsageError
    from conch.tasks.llmsynth.client import ChatClient, ChatError, HTTPStatus

    key = None
    if args.api_key_env:
        key = os.environ.get(args.api_key_env)
        if not key:
            raise UsageError(f"--api-key-env {args.api_key_env}: that environment variable is unset or empty")
    client = ChatClient(args.llm, args.model, api_key=key, timeout=args.llm_timeout, retries=args.retries,
                        temperature=args.temperature, max_tokens=args.max_tokens)
    try:
        served = client.models()
    except HTTPStatus as exc:
        raise UsageError(f"--llm {args.llm}: the endpoint refused the key ({exc})") from None
    except ChatError as exc:
        raise UsageError(f"--llm {args.llm}: {exc}") from None
    if served and args.model not in served:
        from conch.cli import suggest

        raise UsageError(f"--model {args.model}: not served at {client.url} (it serves: {', '.join(served[:8])})"
                         f"{suggest(args.model, served)}")
    return client


def _check(args: argparse.Namespace) -> None:
    from conch.cli import UsageError

    if args.out is None:
        raise UsageError("--out DIR is required with --from-seeds")
    if not args.llm or not args.model:
        raise UsageError("--from-seeds needs --llm URL and --model NAME")
    if args.against is None and not args.no_decontam:
        raise UsageError("--against REF_DIR is required (the benchmark to stay disjoint from); pass --no-decontam "
                         "to skip decontamination explicitly")
    if args.against is not None and args.no_decontam:
        raise UsageError("--against and --no-decontam contradict each other; give one")
    if args.against is not None and not args.against.is_dir():
        raise UsageError(f"--against {args.against}: not a directory")
    if args.n < 1 or args.jobs < 1 or args.llm_jobs < 1 or args.repairs < 0 or args.retries < 0:
        raise UsageError("--n, --jobs and --llm-jobs must be at least 1; --repairs and --retries at least 0")
    if args.max_candidates is not None and args.max_candidates < 1:
        raise UsageError("--max-candidates must be at least 1")
    for name in ("threshold", "dup_threshold"):
        if not 0.0 < getattr(args, name) <= 1.0:
            raise UsageError(f"--{name.replace('_', '-')} must be in (0, 1]")


def run_llm(args: argparse.Namespace, sandbox: str) -> int:
    from conch.cli import UsageError
    from conch.tasks.llmsynth.ledger import stats_lines
    from conch.tasks.llmsynth.runner import Settings, SetupError, load_seeds, synthesize

    _check(args)
    try:
        load_seeds(args.from_seeds)  # before the network: a typo in a folder needs no server to be reported
    except SetupError as exc:
        raise UsageError(str(exc)) from None
    client = _client(args)
    settings = Settings(seeds_dir=args.from_seeds, out=args.out, client=client, n=args.n,
                        max_candidates=args.max_candidates or 4 * args.n, against=args.against,
                        threshold=args.threshold, dup_threshold=args.dup_threshold, repairs=args.repairs,
                        llm_jobs=args.llm_jobs, jobs=args.jobs, backend=sandbox, network=args.network,
                        resume=args.resume, seed=args.seed, difficulty=args.difficulty)
    try:
        st = synthesize(settings)
    except SetupError as exc:
        raise UsageError(str(exc)) from None
    for line in stats_lines(st, args.out):
        print(line, file=sys.stderr)
    if st["accepted"] < args.n:
        print(f"conch synth: {st['accepted']} of {args.n} tasks accepted after {st['candidates']} candidates "
              f"(see {args.out / 'synth.jsonl'}; --resume with a larger --max-candidates to go on)", file=sys.stderr)
        return 1
    return 0


def stats_llm(args: argparse.Namespace) -> int:
    from conch.tasks.llmsynth.ledger import Ledger, stats, stats_lines

    st = stats(Ledger(args.stats).records())
    if args.json:
        print(json.dumps(st, indent=2))
    else:
        print("\n".join(stats_lines(st, args.stats)))
    return 0


def stray_flags(args: argparse.Namespace) -> list[str]:
    """LLM-mode flags given without --from-seeds (a procedural run would silently ignore them)."""
    return [f"--{f.replace('_', '-')}" for f in LLM_FLAGS if getattr(args, f, None) not in (None, 0, False)]
