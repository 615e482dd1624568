#!/usr/bin/env bash
# On the lent H200: several steps in one device call, each under its own time limit, each logged to
# $OUT/<name>.log, so one step that runs long or fails costs only itself.
# usage (device tool, carry .whl): bash benchmarks/device/steps.sh NAME:SECONDS:COMMAND [...]
set -uo pipefail
source "$(dirname "$0")/env.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv,noheader | tee "$OUT/gpu.txt"
for step in "$@"; do
  name=${step%%:*}; rest=${step#*:}; limit=${rest%%:*}; cmd=${rest#*:}
  SECONDS=0
  timeout --kill-after=5 "$limit" bash -c "$cmd" > "$OUT/$name.log" 2>&1
  rc=$?
  echo "== $name: rc=$rc in ${SECONDS} s (limit $limit s)" | tee -a "$OUT/$name.log"
  grep -E "passed|failed|error|FAILED|ERROR" "$OUT/$name.log" | tail -6
done
nvidia-smi --query-gpu=clocks.sm,temperature.gpu --format=csv,noheader
