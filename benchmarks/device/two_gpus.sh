#!/usr/bin/env bash
# On a lent two-GPU machine (kind nvidia-h100-x2, or nvidia-h200-x2), in one call (about 5-8 minutes): one
# study searched on both GPUs (benchmarks/two_gpus.py), each search into a store of its own, no warm start.
#  1. kill: codegen search --gpus 0,1 --budget BUDGET (compiling cold: it also fills the compile cache for the
#     phases after it, which search the same study); once a third of it is stored, SIGKILL to GPU 1's worker
#     process (gemmscape-gpu1); checked from the store: budget evaluated, no kernel twice, nothing stored before
#     the kill lost; the trials each worker (GPU) measured, from the search's --json "workers".
#  2. throughput: a warm-up search of the same study (two workers, scratch store: the candidates land in the
#     compile cache), then --gpus 0 and --gpus 0,1 timed on the same problem, family, sampler, seed and budget:
#     trials per second of each (steady and end to end), their ratio (target 1.7x), each one's time breakdown.
#  3. pair: two processes (CUDA_VISIBLE_DEVICES=0 and =1) on one study and one SQLite store file.
#  4. report: benchmarks/results-format JSON (suite two-gpus) into $OUT (copy it to benchmarks/results/).
# Each phase writes what it measured as soon as it has it; a phase cut short leaves that, and the report takes it.
# usage (device tool, carry .whl):
#   two GPUs:              bash benchmarks/device/two_gpus.sh                 (kind nvidia-h100-x2 or nvidia-h200-x2)
#   one GPU, to validate:  SHARE_GPU=1 bash benchmarks/device/two_gpus.sh     (any one-GPU kind: both workers and
#                          both processes on GPU 0; the record says mode one-gpu-shared, and its throughput ratio
#                          is not a two-GPU speedup)
# env: BUDGET (48), SHAPE (8192x8192x8192), DTYPE (bf16), FAMILY (hopper; empty: the search's default),
#      SAMPLER (random), PHASES ("kill throughput pair"), T_KILL (150), T_THROUGHPUT (220), T_PAIR (110):
#      seconds per phase,
#      WARM=0 (no warm-up search in the throughput phase: the kill phase, run first, compiled the same study)
set -uo pipefail
source "$(dirname "$0")/env.sh"
DIR=/tmp/two_gpus
mkdir -p "$DIR"
SHARE=(); [ "${SHARE_GPU:-0}" = 1 ] && SHARE=(--share-gpu)
WARM=(); [ "${WARM:-1}" = 0 ] && WARM=(--no-warm)
COMMON=(--dir "$DIR" "${SHARE[@]}" --budget "${BUDGET:-48}" --shape "${SHAPE:-8192x8192x8192}"
        --dtype "${DTYPE:-bf16}" --family "${FAMILY-hopper}" --sampler "${SAMPLER:-random}")
nvidia-smi --query-gpu=index,name,driver_version,clocks.sm,temperature.gpu --format=csv,noheader | tee "$OUT/steps.txt"

run_phase() {  # run_phase NAME LIMIT_S ARGS...: one phase under a limit (SIGINT: it writes what it has), then its JSON to $OUT
  local name=$1 limit=$2; shift 2
  SECONDS=0
  timeout -s INT --kill-after=30 "$limit" python3 -m benchmarks.two_gpus "$name" "$@" >> "$DIR/phases.log" 2>&1
  local rc=$?
  echo "== $name: rc=$rc in ${SECONDS} s (limit $limit s)" | tee -a "$OUT/steps.txt"
  tail -2 "$DIR/phases.log"
  cp "$DIR/$name.json" "$OUT/" 2>/dev/null
  cat "$DIR/phases.log" "$DIR/two_gpus.log" > "$OUT/two_gpus.log" 2>/dev/null
}

for phase in ${PHASES:-kill throughput pair}; do
  case $phase in
    kill) run_phase kill "${T_KILL:-150}" "${COMMON[@]}" --timeout-s $((${T_KILL:-150} - 20)) ;;
    throughput) run_phase throughput "${T_THROUGHPUT:-220}" "${COMMON[@]}" "${WARM[@]}" \
                  --timeout-s $((${T_THROUGHPUT:-220} - 20)) ;;
    pair) run_phase pair "${T_PAIR:-110}" "${COMMON[@]}" --timeout-s $((${T_PAIR:-110} - 20)) ;;
  esac
done
python3 -m benchmarks.two_gpus report --dir "$DIR" --out "$OUT" 2>&1 | tee -a "$OUT/steps.txt"
