#!/usr/bin/env bash
# Run every `conch bench` and keep each result as JSON (plus its log) in one folder.
#
#   bash benchmarks/run.sh cpu [OUT_DIR]   this machine's CPU (default OUT_DIR: bench-cpu/)
#   bash benchmarks/run.sh gpu [OUT_DIR]   one CUDA GPU, in under 8 minutes (default OUT_DIR: bench-gpu/)
#
# PYTHON (default: .venv/bin/python when present, else python3) must have torch and transformers; conch runs
# from this checkout (PYTHONPATH), so on a GPU machine whose Python already has a CUDA torch nothing needs
# installing. The sandbox benchmarks (sandbox, rollout, mismatch) need bubblewrap and the local base root
# (`conch images build-base --local`) and are skipped without them. Every bench has its own time limit, so one
# slow bench cannot eat the others' time.
set -uo pipefail
cd "$(dirname "$0")/.."
TARGET=${1:-cpu}
OUT=${2:-bench-$TARGET}
if [ -x .venv/bin/python ]; then PY=${PYTHON:-.venv/bin/python}; else PY=${PYTHON:-python3}; fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
mkdir -p "$OUT"

case $TARGET in
  cpu) DEV=(--device cpu) ;;
  gpu) DEV=(--device cuda)
       "$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' \
         || { echo "no CUDA device visible to $PY" >&2; exit 1; } ;;
  *) echo "usage: bash benchmarks/run.sh cpu|gpu [OUT_DIR]" >&2; exit 2 ;;
esac
{ date -u +%Y-%m-%dT%H:%M:%SZ; git rev-parse --short HEAD 2>/dev/null
  "$PY" -c 'import torch, platform; print("torch", torch.__version__, "|", torch.cuda.get_device_name() if torch.cuda.is_available() else platform.processor() or "cpu", "|", torch.get_num_threads(), "threads")'
} | tee "$OUT/machine.txt"

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

sandboxes=0
if command -v bwrap >/dev/null && "$PY" -c 'from conch.sandbox.baseroot import base_ready; import sys; sys.exit(0 if base_ready() else 1)' 2>/dev/null; then
  sandboxes=1
fi
if [ "$TARGET" = cpu ]; then
  [ $sandboxes = 1 ] && bench sandbox 300 --backend local
  bench engine 600 "${DEV[@]}" --horizon-turns ""  # the conversation runs in bench horizon, three times
  bench horizon 600 "${DEV[@]}" --no-reuse-budget 120
  bench train 600 "${DEV[@]}"
else
  bench engine 120 "${DEV[@]}" --dtype bfloat16 --horizon-turns ""
  bench horizon 90 "${DEV[@]}" --dtype bfloat16 --repeats 1 --no-reuse-budget 20
  bench train 150 "${DEV[@]}" --lengths 1024,4096,8192,16384,32768
fi
if [ $sandboxes = 1 ]; then
  bench rollout "$([ "$TARGET" = cpu ] && echo 600 || echo 60)" "${DEV[@]}"
  bench mismatch "$([ "$TARGET" = cpu ] && echo 600 || echo 60)" "${DEV[@]}"
else
  echo "== sandbox, rollout, mismatch: skipped (need bubblewrap and the local base root: conch images build-base --local)"
fi
echo "results in $OUT/"
