#!/usr/bin/env bash
# On a lent H100/H200, in one call (at most about 8 minutes): benchmarks.sparse_quality at its default sizes
# (6 layers, width 512, 40M tokens of pretraining, 6 block-sparse fine-tunes and one 2:4 of 6M tokens plus
# the dense control), the pruned layers on the families' built-in seeds; `--patterns 2:4` (or `block`)
# runs only those pruned copies, with the dense model pretrained in the same run. It prints its token
# rates and time estimates as it goes; --max-seconds (BUDGET) skips a fine-tune that would not fit, and
# the run is stopped (SIGINT: the JSON keeps what finished) at LIMIT. If the run fails otherwise (our kernels crashing the CUDA context, say),
# it runs again with every GEMM on torch (--kernels none), reusing the pretrained model, in the time left.
# The JSON (sparse-quality-<device>-<date>.json) and the log come back in $OUT; the dense checkpoint stays in /tmp.
# usage (device tool, carry .whl): [GEMMSCAPE_COMMIT=<hash>] [LIMIT=460] [BUDGET=420] \
#   bash benchmarks/device/sparse_quality.sh [more benchmarks.sparse_quality options, e.g. --pretrain-tokens 30M]
# e.g. only the 2:4 rows and the dense control, in about 2 minutes on an H100:
#   LIMIT=150 BUDGET=130 bash benchmarks/device/sparse_quality.sh --pretrain-tokens 30M --finetune-tokens 4M --patterns 2:4
set -uo pipefail
source "$(dirname "$0")/env.sh"
LIMIT=${LIMIT:-460}   # wall seconds for the benchmark, all attempts together
BUDGET=${BUDGET:-420} # its own budget (--max-seconds): fine-tunes that would not fit are skipped
CHECKPOINT=/tmp/sparse-quality-dense.pt
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"

attempt() {  # attempt NAME LIMIT_S BUDGET_S ARGS...
  local name=$1 limit=$2 budget=$3; shift 3
  SECONDS=0
  timeout -s INT --kill-after=20 "$limit" python3 -m benchmarks.sparse_quality --out "$OUT" --max-seconds "$budget" \
    --checkpoint "$CHECKPOINT" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  echo "== $name: rc=$rc in ${SECONDS} s (limit $limit s, budget $budget s)" | tee -a "$OUT/$name.log" "$OUT/steps.txt"
  grep -vE "runs torch's op instead" "$OUT/$name.log" | tail -70
  return $rc
}

START=$(date +%s)
attempt sparse-quality "$LIMIT" "$BUDGET" "$@"
rc=$?
left=$(( LIMIT - ($(date +%s) - START) ))
# 0: all ran; 3: a fine-tune skipped or cut short by the budget; 124/130: stopped at LIMIT; else a failure
if [ $rc -ne 0 ] && [ $rc -ne 3 ] && [ $rc -ne 124 ] && [ $rc -ne 130 ] && [ $left -gt 90 ]; then
  echo "the run failed (rc=$rc): again with every GEMM on torch, ${left} s left"
  attempt sparse-quality-torch "$left" $(( left - 30 )) "$@" --kernels none
fi
nvidia-smi --query-gpu=clocks.sm,temperature.gpu --format=csv,noheader
cat "$OUT/steps.txt"
ls -la "$OUT"/sparse-quality-*.json 2>/dev/null
