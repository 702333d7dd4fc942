"""Diagnostic: the demo's SFT warm start on a fixed corpus and initial model, with whichever conch is on PYTHONPATH.

Why: to tell a code change from rounding noise, run SFT from two commits (or with something else run first in
the process) on the same files and compare the validation curves. `PROBE_NATIVE=1` loads the engine's compiled
attention kernels first; `PROBE_ENGINE=1` samples once with the in-process HF engine first, as `conch train`
does when it evaluates the initial model.

    python sft_probe.py RUN_DIR --build            # corpus + initial model into RUN_DIR, then exit
    python sft_probe.py RUN_DIR --steps 60 [key=value ...]
"""

import argparse
import asyncio
import json
import os
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("run", type=Path)
    ap.add_argument("--build", action="store_true")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("overrides", nargs="*")
    a = ap.parse_args()

    from conch.config import load_config
    from conch.rl import stages

    cfg = load_config(None, [f"sft.steps={a.steps}", *a.overrides])
    if a.build:
        a.run.mkdir(parents=True, exist_ok=True)
        corpus = stages.build_corpus(cfg, a.run)
        print("built", stages.init_or_load_model(cfg, a.run, corpus))
        return

    import torch

    from conch.agent.tito import ChatCodec
    from conch.model.loading import load_policy
    from conch.rl.train import warm_start_sft
    from conch.tasks.synth.trajectories import BASH_TOOL

    torch.manual_seed(cfg.run.seed)
    loaded = load_policy(a.run / "init", dtype=cfg.model.trainer_dtype)
    codec = ChatCodec(loaded.tokenizer, tools=[BASH_TOOL])
    pad = loaded.tokenizer.pad_token_id if loaded.tokenizer.pad_token_id is not None else codec.end_id
    if os.environ.get("PROBE_NATIVE"):
        from conch.engine.native import native_attention

        print("native kernels:", native_attention(torch.float32, torch.device("cpu"), 2)[1] or "loaded")
    if os.environ.get("PROBE_ENGINE"):
        from conch.engine.base import SamplingParams
        from conch.engine.hf import HFEngine

        engine = HFEngine(loaded.model, tokenizer=loaded.tokenizer)

        async def once() -> None:
            sid = await engine.open_session([1, 2, 3])
            await engine.generate(sid, [], SamplingParams(max_new_tokens=4))

        asyncio.run(once())
    t0 = time.time()
    rep = warm_start_sft(cfg, loaded.model, codec, a.run / "corpus" / "expert.jsonl", pad)
    print(json.dumps({"steps": rep["steps"], "best_val": rep["best_val"], "val_curve": rep["val_curve"],
                      "seconds": round(time.time() - t0, 1)}))


if __name__ == "__main__":
    main()
