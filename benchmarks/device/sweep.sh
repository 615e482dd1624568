#!/usr/bin/env bash
# On the lent H200: record the exhaustive sweep of the restricted SIMT space at 4096^3 fp32 (the replay
# recording the CPU tests and README use), then a skinny-shape search for comparison with cuBLAS.
# usage (device tool, carry .whl): bash benchmarks/device/sweep.sh [pytest args...]
set -uo pipefail
source "$(dirname "$0")/env.sh"
DB="sqlite:///$OUT/h200-sweep.db"
if [ $# -gt 0 ]; then timeout 200 python3 -m pytest -q -p no:cacheprovider "$@" 2>&1 | tail -5; fi
SECONDS=0
timeout 420 python3 -m codegen sweep --m 4096 --n 4096 --k 4096 --db "$DB" --out "$OUT/replay-simt-4096x4096x4096-fp32.json" 2>&1 | tr '\r' '\n' | tail -2
echo "sweep wall: ${SECONDS} s"
