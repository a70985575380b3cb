#!/usr/bin/env bash
# GPU check of both engines, one run on one H200 in under ~8 minutes ($BUDGET_S, default 470 s;
# every stage has its own timeout and the Piper stage gets what is left, at most $PIPER_TIMEOUT).
#
# Orpheus: build the 3B model (random weights: honest timings, noise audio), capture CUDA
# graphs, verify graphs == eager, sweep 1 -> 256 concurrent streams, and report decode steps/s,
# tokens/s per stream, TTFB p50/p95 and max real-time streams (table on stdout, JSON in
# $OUT_DIR, rewritten after every level; timeouts 90 s smoke + 360 s bench, expected ~3 minutes).
#
# Piper: the streaming server with the Piper engine on CUDA (`serve --device cuda`: windows of
# all streams in one onnxruntime call), swept with `bench load`'s simulated agents at
# $PIPER_STREAMS levels (python -m bench.device_load). It prints "streams per GPU at
# p95 TTFB ≤ 150 ms: N" - the highest level that, with every lower one, had TTFB p95 ≤ the goal,
# 0 underruns, 0 refused, nothing failed - and what bounds it: the agents run on this machine's
# CPUs, in one Python process beside the server. JSON in $OUT_DIR after every level. Without a
# working CUDA provider of onnxruntime (pip install onnxruntime-gpu) it says so in one line and
# the script goes on.
#
#   bash scripts/gpu_check.sh                      # the GPU run (ENGINES=orpheus,piper)
#   ENGINES=piper bash scripts/gpu_check.sh        # only the Piper stage
#   DEVICE=cpu PRESET=tiny MAX_STREAMS=4 TOKENS=42 ENGINES=orpheus bash scripts/gpu_check.sh   # Orpheus' CPU path
#   DEVICE=cpu ENGINES=piper PIPER_STREAMS=1,2 PIPER_SECONDS=3 bash scripts/gpu_check.sh      # Piper's CPU path
#
# Extra arguments go to `bench engine` (e.g. --codec-right 1, --max-len 2048, --sweep 1,64,128).
# Orpheus needs torch (a CUDA build for DEVICE=cuda), snac, einops, safetensors, tokenizers;
# Piper needs onnxruntime-gpu for DEVICE=cuda. Nothing is downloaded here, as the GPU machine may
# have no network. Exit status: 0 when every stage that ran passed (a skipped Piper stage is not
# a failure), 1 when one failed (the others still ran).
set -euo pipefail
cd "$(dirname "$0")/.."

DEVICE=${DEVICE:-cuda}
ENGINES=${ENGINES:-orpheus,piper}
BUDGET_S=${BUDGET_S:-470}
PRESET=${PRESET:-3b}
MAX_STREAMS=${MAX_STREAMS:-256}
TOKENS=${TOKENS:-420}
SMOKE=${SMOKE:-1}  # first a tiny-model run on the same device: fails fast, before the 3B build
PIPER_DEVICE=${PIPER_DEVICE:-$DEVICE}
PIPER_STREAMS=${PIPER_STREAMS:-1,8,16,32,64,128}
PIPER_SECONDS=${PIPER_SECONDS:-10}
PIPER_GOAL_MS=${PIPER_GOAL_MS:-150}
PIPER_WARMUP_S=${PIPER_WARMUP_S:-5}  # unrecorded, at 4 streams: the GPU meets its first shapes
PIPER_TIMEOUT=${PIPER_TIMEOUT:-240}
PIPER_SERVER_ARGS=${PIPER_SERVER_ARGS:-}  # more `serve` arguments, e.g. "--capacity 2 --threads 8"
OUT_DIR=${OUT_DIR:-out/gpu_check}
PY=${PYTHON:-}
if [[ -z "$PY" ]]; then
  if [[ -x .venv/bin/python ]]; then PY=.venv/bin/python; else PY=python3; fi
fi
mkdir -p "$OUT_DIR"
export PYTHONUNBUFFERED=1
START=$(date +%s)
FAILED=()
wants() { [[ ",$ENGINES," == *",$1,"* ]]; }

echo "== environment"
"$PY" -c 'import sys; print(f"python {sys.version.split()[0]}")'
if [[ "$DEVICE" == cuda || "$PIPER_DEVICE" == cuda ]] && command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.max.sm --format=csv,noheader || true
fi

orpheus() {
  "$PY" - "$DEVICE" <<'PYEOF' || return 1
import importlib, sys
device = sys.argv[1]
missing = [m for m in ("torch", "snac", "einops", "safetensors", "tokenizers", "numpy") if importlib.util.find_spec(m) is None]
if missing:
    sys.exit(f"missing Python packages: {', '.join(missing)} - pip install 'streamvox[orpheus]' "
             "(keep the machine's CUDA torch: pip install --no-deps snac==1.2.1 einops)")
import torch
print(f"torch {torch.__version__}, cuda {torch.version.cuda}")
if device == "cuda":
    if not torch.cuda.is_available():
        sys.exit("DEVICE=cuda but torch sees no CUDA device (a CPU build of torch?)")
    p = torch.cuda.get_device_properties(0)
    print(f"GPU: {p.name}, {p.total_memory / 2**30:.0f} GiB, capability {p.major}.{p.minor}")
PYEOF
  if [[ "$SMOKE" == 1 && "$PRESET" != tiny ]]; then
    echo "== orpheus smoke: tiny model on $DEVICE"
    timeout 90 "$PY" -m tts_service.orpheus.bench --device "$DEVICE" --random-weights tiny \
      --sweep 1,8 --tokens 70 --max-len 512 --json "$OUT_DIR/bench_engine_tiny.json" || return 1
  fi
  echo "== orpheus bench: $PRESET on $DEVICE, up to $MAX_STREAMS streams"
  timeout 360 "$PY" -m tts_service.orpheus.bench --device "$DEVICE" --random-weights "$PRESET" \
    --max-streams "$MAX_STREAMS" --tokens "$TOKENS" --max-len 1024 \
    --json "$OUT_DIR/bench_engine_$PRESET.json" "$@" || return 1
  echo "orpheus results in $OUT_DIR/bench_engine_$PRESET.json"
}

piper() {
  local left=$(( BUDGET_S - ($(date +%s) - START) ))
  local limit=$(( left < PIPER_TIMEOUT ? left : PIPER_TIMEOUT ))
  echo "== piper: streaming server on $PIPER_DEVICE, levels $PIPER_STREAMS, goal TTFB p95 ≤ $PIPER_GOAL_MS ms"
  if (( limit < 60 )); then
    echo "piper on $PIPER_DEVICE: skipped - ${left} s left of the ${BUDGET_S} s budget (raise BUDGET_S or run ENGINES=piper)"
    return 0
  fi
  local extra=() a
  for a in $PIPER_SERVER_ARGS; do extra+=("--server-arg=$a"); done
  # The sweep starts no level it cannot finish by limit - 20 s (server stop, last JSON write);
  # on the timeout's SIGTERM it still prints the figure of the levels done.
  timeout -k 10 "$limit" "$PY" -m bench.device_load --device "$PIPER_DEVICE" \
    --streams "$PIPER_STREAMS" --seconds "$PIPER_SECONDS" --ttfb-goal-ms "$PIPER_GOAL_MS" \
    --warmup-s "$PIPER_WARMUP_S" --budget-s $(( limit - 20 )) \
    --json "$OUT_DIR/bench_load_piper_$PIPER_DEVICE.json" ${extra[@]+"${extra[@]}"}
}

if wants orpheus; then
  orpheus "$@" || FAILED+=("orpheus")
fi
if wants piper; then
  piper || FAILED+=("piper (status $?; the levels done are in $OUT_DIR/bench_load_piper_$PIPER_DEVICE.json)")
fi

echo "== done in $(( $(date +%s) - START )) s; results in $OUT_DIR"
if (( ${#FAILED[@]} )); then
  printf 'FAILED: %s\n' "${FAILED[@]}"
  exit 1
fi
