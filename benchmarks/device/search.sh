#!/usr/bin/env bash
# On the lent H200: GPU tier, then the 200-trial searches whose wall time issue #3 asks for.
# usage (device tool, carry .whl): bash benchmarks/device/search.sh
set -uo pipefail
source "$(dirname "$0")/env.sh"
DB="sqlite:///$OUT/h200.db"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
timeout 300 python3 -m pytest tests/gpu -q -p no:cacheprovider 2>&1 | tee "$OUT/gpu-tests.log" | tail -15
for space in "" "--restricted"; do
  SECONDS=0
  timeout 400 python3 -m codegen search --m 4096 --n 4096 --k 4096 --budget 200 $space --db "$DB" --quiet --json \
    2>&1 | tee -a "$OUT/search.log" | tail -4
  echo "end-to-end wall: ${SECONDS} s (search $space)" | tee -a "$OUT/search.log"
done
