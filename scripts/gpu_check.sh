#!/usr/bin/env bash
# GPU check of the Orpheus engine: build the 3B model (random weights: honest timings, noise
# audio), capture CUDA graphs, verify graphs == eager, sweep 1 -> 256 concurrent streams, and
# report decode steps/s, tokens/s per stream, TTFB p50/p95 and max real-time streams
# (table on stdout, JSON in $OUT_DIR, rewritten after every level). Budget: under 8 minutes on one
# H200 (timeouts: 90 s smoke + 360 s bench; expected ~3 minutes).
#
#   bash scripts/gpu_check.sh                      # the GPU run
#   DEVICE=cpu PRESET=tiny MAX_STREAMS=4 TOKENS=42 bash scripts/gpu_check.sh   # its CPU path
#
# Extra arguments go to `bench engine` (e.g. --codec-right 1, --max-len 2048, --sweep 1,64,128).
# Needs torch (a CUDA build for DEVICE=cuda), snac, einops, safetensors, tokenizers: nothing
# is downloaded here, as the GPU machine may have no network.
set -euo pipefail
cd "$(dirname "$0")/.."

DEVICE=${DEVICE:-cuda}
PRESET=${PRESET:-3b}
MAX_STREAMS=${MAX_STREAMS:-256}
TOKENS=${TOKENS:-420}
SMOKE=${SMOKE:-1}  # first a tiny-model run on the same device: fails fast, before the 3B build
OUT_DIR=${OUT_DIR:-out/gpu_check}
PY=${PYTHON:-}
if [[ -z "$PY" ]]; then
  if [[ -x .venv/bin/python ]]; then PY=.venv/bin/python; else PY=python3; fi
fi
mkdir -p "$OUT_DIR"

echo "== environment"
"$PY" - "$DEVICE" <<'PYEOF'
import importlib, sys
device = sys.argv[1]
missing = [m for m in ("torch", "snac", "einops", "safetensors", "tokenizers", "numpy") if importlib.util.find_spec(m) is None]
if missing:
    sys.exit(f"missing Python packages: {', '.join(missing)} - pip install 'streamvox[orpheus]' "
             "(keep the machine's CUDA torch: pip install --no-deps snac==1.2.1 einops)")
import torch
print(f"python {sys.version.split()[0]}, torch {torch.__version__}, cuda {torch.version.cuda}")
if device == "cuda":
    if not torch.cuda.is_available():
        sys.exit("DEVICE=cuda but torch sees no CUDA device (a CPU build of torch?)")
    p = torch.cuda.get_device_properties(0)
    print(f"GPU: {p.name}, {p.total_memory / 2**30:.0f} GiB, capability {p.major}.{p.minor}")
PYEOF
if [[ "$DEVICE" == cuda ]] && command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.max.sm --format=csv,noheader || true
fi

export PYTHONUNBUFFERED=1
START=$(date +%s)
if [[ "$SMOKE" == 1 && "$PRESET" != tiny ]]; then
  echo "== smoke: tiny model on $DEVICE"
  timeout 90 "$PY" -m tts_service.orpheus.bench --device "$DEVICE" --random-weights tiny \
    --sweep 1,8 --tokens 70 --max-len 512 --json "$OUT_DIR/bench_engine_tiny.json"
fi

echo "== bench: $PRESET on $DEVICE, up to $MAX_STREAMS streams"
timeout 360 "$PY" -m tts_service.orpheus.bench --device "$DEVICE" --random-weights "$PRESET" \
  --max-streams "$MAX_STREAMS" --tokens "$TOKENS" --max-len 1024 \
  --json "$OUT_DIR/bench_engine_$PRESET.json" "$@"

echo "== done in $(( $(date +%s) - START )) s; results in $OUT_DIR/bench_engine_$PRESET.json"
