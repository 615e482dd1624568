#!/usr/bin/env bash
# On the lent H200: the GPU tier, then the tensor-core suite searched (benchmarks/run.py).
# usage (device tool, carry .whl): bash benchmarks/device/tensorcore.sh tier|suite [BUDGET] [PROBLEM_KEY ...]
set -uo pipefail
source "$(dirname "$0")/env.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
what=${1:-tier}; shift || true
if [ "$what" = tier ]; then
  SECONDS=0
  timeout "${TIER_TIMEOUT:-420}" python3 -m pytest tests/gpu -q -p no:cacheprovider -o addopts="" -rfE "$@" 2>&1 \
    | tee "$OUT/gpu-tests.log" | tail -40
  echo "GPU tier wall: ${SECONDS} s"
else
  budget=${1:-60}; shift || true
  problems=()
  [ $# -gt 0 ] && problems=(--problems "$@")
  timeout "${SUITE_TIMEOUT:-540}" python3 -m benchmarks.run --suite tensorcore --search "$budget" --out "$OUT" \
    "${problems[@]}" 2>&1 | tee "$OUT/suite.log" | grep -v "^\s*$" | tail -30
  gzip -9 "$OUT/tensorcore.db"  # the store comes back compressed (16 MiB limit per file)
fi
nvidia-smi --query-gpu=clocks.sm,temperature.gpu --format=csv,noheader
