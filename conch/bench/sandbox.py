"""`conch bench sandbox`: sandbox start time, persistent-shell round trip and one-shot spawn time per backend.

Why these numbers: an agent turn costs one shell round trip, a verifier run a few one-shot execs, and every
episode one start (cached image). A cold start is the first start of a task whose image is not built yet
(a one-step Dockerfile with a fresh RUN); a cached start is the same task again.

`measure(backend)` is the whole measurement for one backend, through the Sandbox protocol only, so each
backend is benchmarked by the same code.
"""

from __future__ import annotations

import argparse
import json
import secrets
import statistics
import sys
import tempfile
import time
from pathlib import Path

from conch.sandbox import registry


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sandbox", action="append", choices=registry.names(),
                        help="backend to measure (repeatable; default: local, plus docker when an engine answers)")
    parser.add_argument("--backend", action="append", choices=registry.names(), help=argparse.SUPPRESS)  # old --sandbox
    parser.add_argument("--roundtrips", type=int, default=200, help="shell round trips of `true` (default: 200)")
    parser.add_argument("--spawns", type=int, default=50, help="one-shot execs of `true` (default: 50)")
    parser.add_argument("--starts", type=int, default=5, help="cached starts to time (default: 5)")
    parser.add_argument("--sessions", type=int, default=0,
                        help="instead: hold N live sandboxes with a shell each; memory per session, start/stop "
                             "rates and a leak check (see conch/bench/sandbox_load.py)")
    parser.add_argument("--parallel", type=int, default=8, help="with --sessions: starts at once (default: 8)")


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def _cleanup(backend: str, nonce: str, spec=None) -> None:
    """Drop the image layers the cold start built (they are unique to this run)."""
    if backend == "docker" and spec is not None:
        from conch.sandbox.compose import environment_of
        from conch.sandbox.docker_images import remove_env_image

        remove_env_image(environment_of(spec.context_dir, spec.dockerfile, None), spec.name)
    if backend == "local":
        import shutil

        from conch.sandbox import paths

        layers = paths.layers_dir()
        for meta in layers.glob("*/meta.json") if layers.is_dir() else []:
            try:
                if nonce in meta.read_text():
                    shutil.rmtree(meta.parent, ignore_errors=True)
                    (layers / f"{meta.parent.name}.lock").unlink(missing_ok=True)
            except OSError:
                pass


async def _start_stop(backend: str, spec) -> float:
    from conch.sandbox import make_sandbox

    box = make_sandbox(backend, spec)
    t0 = time.perf_counter()
    await box.start()
    elapsed = time.perf_counter() - t0
    await box.stop()
    return elapsed * 1000


async def measure(backend: str, roundtrips: int = 200, spawns: int = 50, starts: int = 5) -> dict[str, float]:
    """Measure one backend; every figure comes from real starts, execs and shell commands."""
    from conch.sandbox import SandboxSpec, make_sandbox

    nonce = secrets.token_hex(8)
    with tempfile.TemporaryDirectory(prefix="conch-bench-") as tmp:
        ctx = Path(tmp)
        (ctx / "Dockerfile").write_text(f"FROM debian:bookworm-slim\nWORKDIR /app\nRUN echo {nonce} > /app/nonce\n")
        spec = SandboxSpec(name="bench", context_dir=ctx, dockerfile=ctx / "Dockerfile")
        try:
            cold = await _start_stop(backend, spec)
            cached = [await _start_stop(backend, spec) for _ in range(max(1, starts))]
            box = make_sandbox(backend, spec)
            await box.start()
            try:
                check = await box.exec("cat /app/nonce")
                if check.stdout.strip() != nonce:
                    raise RuntimeError(f"{backend}: the benchmark image is wrong: {check}")
                await box.exec("true")
                spawn = []
                for _ in range(max(1, spawns)):
                    t0 = time.perf_counter()
                    res = await box.exec("true")
                    spawn.append((time.perf_counter() - t0) * 1000)
                    if res.exit_code != 0:
                        raise RuntimeError(f"{backend}: exec true failed: {res}")
                shell = await box.shell()
                for _ in range(10):
                    await shell.run("true")
                rt = []
                for _ in range(max(1, roundtrips)):
                    t0 = time.perf_counter()
                    res = await shell.run("true")
                    rt.append((time.perf_counter() - t0) * 1000)
                    if res.exit_code != 0:
                        raise RuntimeError(f"{backend}: shell true failed: {res}")
                await shell.close()
            finally:
                await box.stop()
        finally:
            _cleanup(backend, nonce, spec)
    return {
        "start_ms_cached": round(statistics.median(cached), 2),
        "start_ms_cold": round(cold, 2),
        "roundtrip_ms_median": round(statistics.median(rt), 3),
        "roundtrip_ms_p99": round(_percentile(rt, 0.99), 3),
        "spawn_ms_median": round(statistics.median(spawn), 2),
    }


_LABELS = {
    "start_ms_cached": "start, image cached (ms, median)",
    "start_ms_cold": "start, image built first (ms)",
    "roundtrip_ms_median": "shell round trip `true` (ms, median)",
    "roundtrip_ms_p99": "shell round trip `true` (ms, p99)",
    "spawn_ms_median": "one-shot exec `true` (ms, median)",
}


def format_table(results: dict[str, dict[str, float]]) -> str:
    backends = list(results)
    rows = [["metric", *backends]] + [[label, *(f"{results[b][k]:g}" for b in backends)] for k, label in _LABELS.items()]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
                     for r in rows)


def run(args: argparse.Namespace) -> int:
    import asyncio

    from conch.cli import UsageError
    from conch.sandbox.base import SandboxError

    if min(args.roundtrips, args.spawns, args.starts) < 1:
        raise UsageError("--roundtrips, --spawns and --starts must be at least 1")
    if args.sessions < 0 or args.parallel < 1:
        raise UsageError("--sessions must be >= 0 and --parallel >= 1")
    results: dict[str, dict[str, float]] = {}
    if args.backend:
        print("conch: warning: `conch bench sandbox --backend` is deprecated; use --sandbox (as every other command "
              "does)", file=sys.stderr)
    backends = [*(args.sandbox or []), *(args.backend or [])]
    if not backends:  # both when an engine answers
        backends = registry.default_set(3.0, lambda m: print(f"conch bench sandbox: {m}", file=sys.stderr))
    if args.sessions:
        return _run_load(args, backends)
    for backend in backends:
        print(f"conch bench sandbox: measuring {backend}...", file=sys.stderr)
        try:
            results[backend] = asyncio.run(measure(backend, args.roundtrips, args.spawns, args.starts))
        except SandboxError as exc:
            print(f"conch bench sandbox: {backend}: {exc}", file=sys.stderr)
            return 1
    print(json.dumps(results) if args.json else format_table(results))
    return 0


def _run_load(args: argparse.Namespace, backends: list[str]) -> int:
    import asyncio

    from conch.bench.sandbox_load import load

    results = {}
    for backend in backends:
        print(f"conch bench sandbox: {args.sessions} live {backend} sessions...", file=sys.stderr)
        results[backend] = asyncio.run(load(backend, args.sessions, args.parallel))
    if args.json:
        print(json.dumps(results))
    else:
        for backend, r in results.items():
            print(f"{backend}: " + ", ".join(f"{k}={v}" for k, v in r.items() if k != "failures"))
    leaked = any(r["leaked"] for r in results.values())
    if leaked:
        print("conch bench sandbox: resources leaked: "
              + "; ".join(f"{b}: {r['leaked']}" for b, r in results.items() if r["leaked"]), file=sys.stderr)
    return 1 if leaked else 0
