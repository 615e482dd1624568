#!/usr/bin/env bash
# On a lent H100/H200, in one call (about 7-8 minutes): 2:4 sparse W on the sparse24 kernels against dense
# cuBLAS and cuSPARSELt (torch's semi-structured tensor), measured in the same run (benchmarks/sparse24.py).
#  1. run: codegen search --sparsity 2:4 --budget BUDGET (6) per prefill shape (4096^3, 8192^3, 2048x14336x4096,
#     2048x4096x14336) and dtype (DTYPES: bf16 fp16), each into a store of its own, within T_SEARCH seconds
#     (260); the searches time one call with L2 flushed and measure both baselines on the same 2:4 W.
#  2. engine: Sparse24Linear's forward at M = 1, 16, 64 on 14336x4096 and 4096x14336 in engine timing on the
#     family's built-in seeds, against F.linear on the dense masked W and cuSPARSELt's F.linear, within T_ENGINE
#     seconds (130).
#  3. report: benchmarks/results-format JSON into $OUT (copy it to benchmarks/results/), and a table.
# A step cut short leaves what it measured: the report takes every search that ended and every engine record.
# usage (device tool, carry .whl): bash benchmarks/device/sparse24.sh
# env: BUDGET (6), DTYPES ("bf16 fp16"), T_SEARCH (260), T_ENGINE (130), GPU_TESTS=1 (first
#      tests/gpu/test_nn_sparse24.py, about half a minute more)
set -uo pipefail
source "$(dirname "$0")/env.sh"
read -r -a dtypes <<< "${DTYPES:-bf16 fp16}"
DIR=/tmp/sparse24
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv,noheader | tee "$OUT/gpu.txt"


if [ "${GPU_TESTS:-0}" = 1 ]; then
  step gpu-tests 120 python3 -m pytest tests/gpu/test_nn_sparse24.py -q -p no:cacheprovider -o addopts="" -rfE
fi
T_SEARCH=${T_SEARCH:-260}
step run $((T_SEARCH + 40)) python3 -m benchmarks.sparse24 run --dir "$DIR" --budget "${BUDGET:-6}" \
  --dtypes "${dtypes[@]}" --deadline-s "$T_SEARCH"
step engine "${T_ENGINE:-130}" python3 -m benchmarks.sparse24 engine --dir "$DIR" --dtypes "${dtypes[@]}"
step report 60 python3 -m benchmarks.sparse24 report --dir "$DIR" --out "$OUT"
cp "$DIR/steps.jsonl" "$DIR/engine.json" "$OUT/" 2>/dev/null
cat "$OUT/report.log"
