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
# With a vLLM environment (VLLM_PYTHON, default .venv-vllm/bin/python; `make install-vllm` on CPU, plain
# `pip install vllm` on a GPU) the rollout, horizon and mismatch benches also run with `--engine vllm` (a server
# launched per bench on 127.0.0.1), into NAME-vllm.json.
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

bench() {  # bench NAME LIMIT_S ARGS...   (FILE=name-suffix in the environment: another output name)
  local name=$1 limit=$2; shift 2
  local file=${FILE:-$name}
  echo "== conch bench $name $* (limit ${limit}s)"
  local t0=$SECONDS
  if timeout "$limit" "$PY" -m conch bench "$name" --json "$@" >"$OUT/$file.json" 2>"$OUT/$file.log"; then
    echo "   ok in $((SECONDS - t0)) s -> $OUT/$file.json"
  else
    echo "   FAILED or timed out after $((SECONDS - t0)) s; last lines of $OUT/$file.log:"
    tail -n 5 "$OUT/$file.log"
  fi
}
VLLM_PY=${VLLM_PYTHON:-.venv-vllm/bin/python}
vllm=0
[ -x "$VLLM_PY" ] && "$VLLM_PY" -c 'import vllm' 2>/dev/null && vllm=1

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
if [ $vllm = 1 ]; then
  V=(--engine vllm --engine-python "$VLLM_PY")
  if [ "$TARGET" = cpu ]; then
    FILE=horizon-vllm bench horizon 600 "${V[@]}" --repeats 1 --no-reuse-budget 60
    [ $sandboxes = 1 ] && FILE=rollout-vllm bench rollout 600 "${V[@]}" --quick
    [ $sandboxes = 1 ] && FILE=mismatch-vllm bench mismatch 600 "${V[@]}" --quick --sampler-dtype float32
  else  # the plain vllm package on the GPU (no conch plugin), bfloat16 as served in practice
    FILE=horizon-vllm bench horizon 300 "${V[@]}" --device cuda --dtype bfloat16 --repeats 1 --no-reuse-budget 20
    [ $sandboxes = 1 ] && FILE=rollout-vllm bench rollout 300 "${V[@]}" --device cuda --dtype bfloat16
    [ $sandboxes = 1 ] && FILE=mismatch-vllm bench mismatch 300 "${V[@]}" --device cuda
  fi
else
  echo "== vLLM benches: skipped (no vLLM at $VLLM_PY; make install-vllm, or VLLM_PYTHON=...)"
fi
echo "results in $OUT/"
