#!/usr/bin/env bash
# Run conch's benchmarks on one CUDA GPU, in under 8 minutes, and keep each result as JSON.
#
#   bash benchmarks/gpu.sh [OUT_DIR]        (default OUT_DIR: bench-gpu/)
#
# Needs a Python with a CUDA build of torch and transformers (PYTHON, default python3). conch itself runs
# from this checkout (PYTHONPATH), so nothing is installed. The sandbox benchmarks (rollout, mismatch) also
# need bubblewrap and the local base root (`conch images build-base --local`); they are skipped when those are
# missing. Each bench has its own time limit so that one slow bench cannot eat the others' time.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-bench-gpu}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1

if ! "$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)'; then
  echo "no CUDA device visible to $PY" >&2
  exit 1
fi
"$PY" -c 'import torch; print("torch", torch.__version__, "on", torch.cuda.get_device_name())' | tee "$OUT/device.txt"
git rev-parse --short HEAD 2>/dev/null >>"$OUT/device.txt" || true

bench() {  # bench NAME LIMIT_S ARGS...
  local name=$1 limit=$2; shift 2
  echo "== conch bench $name $* (limit ${limit}s)"
  local t0=$SECONDS
  if timeout "$limit" "$PY" -m conch bench "$name" --json "$@" >"$OUT/$name.json" 2>"$OUT/$name.log"; then
    echo "   ok in $((SECONDS - t0)) s -> $OUT/$name.json"
  else
    echo "   FAILED or timed out after $((SECONDS - t0)) s; last lines of $OUT/$name.log:"
    tail -n 5 "$OUT/$name.log"
  fi
}

bench engine 120 --device cuda --dtype bfloat16
bench horizon 90 --device cuda --dtype bfloat16
bench train 150 --device cuda --lengths 1024,4096,8192,16384,32768
if command -v bwrap >/dev/null && "$PY" -c 'from conch.sandbox.baseroot import base_ready; import sys; sys.exit(0 if base_ready() else 1)' 2>/dev/null; then
  bench rollout 60 --device cuda
  bench mismatch 60 --device cuda
else
  echo "== rollout, mismatch: skipped (need bubblewrap and the local base root: conch images build-base --local)"
fi
echo "results in $OUT/"
