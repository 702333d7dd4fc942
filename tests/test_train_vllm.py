"""End to end: `conch train engine.backend=vllm` on a minute-sized config, sampling with the real vLLM server of
the session (`vllm_server`, attached by engine.url), replaying its routes in the trainer (R3) and syncing the
updated weights back into it. The server's weights are restored afterwards for the other tests."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

from test_train_e2e import TINY


def test_train_with_vllm_engine(tmp_path, vllm_server, base_root):
    run = tmp_path / "run"
    try:
        p = subprocess.run([sys.executable, "-m", "conch", "train", "--preset", "demo", "--out", str(run), "--json",
                            *TINY, f"model.path={vllm_server.model}", "engine.backend=vllm",
                            f"engine.url={vllm_server.url}", "ppo.routing_replay=true"],
                           capture_output=True, text=True, timeout=900)
    finally:
        restore(vllm_server)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "weight sync:" in p.stderr
    rows = [r for line in (run / "metrics.jsonl").read_text().splitlines() if "iteration" in (r := json.loads(line))]
    assert rows and rows[0]["sync/bytes"] > 1e6 and rows[0]["time/sync_s"] > 0
    # float32 sampler (vLLM) and float32 trainer: the trainer's router agrees with every replayed vLLM route,
    # and the log-probs vLLM reported are the trainer's own up to float noise
    assert rows[0]["mismatch/routing_disagreement"] == 0.0
    assert rows[0]["mismatch/logprob_abs_diff"] < 1e-4
    summary = json.loads(p.stdout.strip().splitlines()[-1])
    assert set(summary["pass_rate"]) == {"init", "warm", "final"}


def restore(server) -> None:
    from conch.engine.registry import EngineOptions, build_engine
    from conch.engine.weight_sync import sync_for
    from conch.model.loading import load_policy

    async def go():
        eng = build_engine(EngineOptions(backend="vllm", url=server.url), server.model)
        try:
            sync_for(eng).push(load_policy(server.model, dtype="float32").model)
        finally:
            await eng.aclose()
    asyncio.run(go())
