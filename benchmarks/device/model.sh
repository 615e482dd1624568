#!/usr/bin/env bash
# On a lent H100/H200, in one call (about 8 minutes): LLaMA-3-8B-dims tuned, bundled with verdicts, and timed.
#  1. tune-model on benchmarks/model.py:llama3_8b_dims (2 decoder layers, vocab 32000, bf16) at 2048 tokens,
#     Hopper and tensor-core families, budget 8, into one store; --bundle writes it with each GEMM's verdict
#     against cuBLAS (cold single calls, as the search timed them).
#  2. tune-model on the decode shapes (benchmarks/model.py:llama3_8b_decode_layers: 14336x4096, 4096x14336,
#     6144x4096) at M = 1, 16, 64, forward only, into the same store and bundle: their forward kernels are
#     judged again in engine timing (codegen.nn.timing), which decides at M <= 128.
#  3. benchmarks.model (prefill and train step, nn.Linear against replace_linear with the bundle) and
#     benchmarks.engine (decode and prefill layers) against that bundle.
# Each step under its own time limit, its log in $OUT/<step>.log and its wall time printed; the JSON
# records, the bundle (tar.gz) and the store (gzipped) come back in $OUT; a short table last.
# usage (device tool, carry .whl): bash benchmarks/device/model.sh
# env: BUDGET (8), DECODE_FAMILIES ("tensorcore hopper"), T_PREFILL/T_DECODE/T_MODEL/T_ENGINE (step limits, s),
#      GPU_TESTS=1 (first tests/gpu/test_verdict.py, about half a minute more)
set -uo pipefail
source "$(dirname "$0")/env.sh"
DB="sqlite:///$OUT/model.db"
BUNDLE="$OUT/bundle"
BUDGET=${BUDGET:-8}
decode_families=()
for f in ${DECODE_FAMILIES:-tensorcore hopper}; do decode_families+=(--family "$f"); done
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c "import transformers, torch; print('transformers', transformers.__version__, 'torch', torch.__version__)" \
  || { echo "model.sh: transformers is not importable here"; exit 1; }

STEP_SHOW='^wrote|engine timing|^no engine|Traceback|Error'

if [ "${GPU_TESTS:-0}" = 1 ]; then
  step gpu-tests 120 python3 -m pytest tests/gpu/test_verdict.py -q -p no:cacheprovider -o addopts="" -rfE
  grep -E "passed|failed|error" "$OUT/gpu-tests.log" | tail -3
fi
step prefill-tune "${T_PREFILL:-220}" python3 -m codegen tune-model benchmarks/model.py:llama3_8b_dims --batch 2048 \
  --family hopper --family tensorcore --budget "$BUDGET" --db "$DB" --bundle "$BUNDLE" --quiet
step decode-tune "${T_DECODE:-120}" python3 -m codegen tune-model benchmarks/model.py:llama3_8b_decode_layers \
  --batch 1 16 64 --layout forward "${decode_families[@]}" --budget "$BUDGET" --db "$DB" --bundle "$BUNDLE" --quiet
if [ ! -f "$BUNDLE/index.json" ]; then  # both tunings cut short before writing: the store's kernels as they are
  step export 30 python3 -m codegen export --bundle "$BUNDLE" --db "$DB"
fi
step model "${T_MODEL:-90}" python3 -m benchmarks.model --bundle "$BUNDLE" --out "$OUT"
step engine "${T_ENGINE:-60}" python3 -m benchmarks.engine --bundle "$BUNDLE" --out "$OUT"

python3 -c "import sqlite3, sys; sqlite3.connect(sys.argv[1]).execute('pragma wal_checkpoint(TRUNCATE)')" "$OUT/model.db" 2>/dev/null
gzip -9f "$OUT/model.db"
tar -czf "$OUT/bundle.tar.gz" -C "$OUT" bundle && rm -rf "$BUNDLE"
nvidia-smi --query-gpu=clocks.sm,temperature.gpu --format=csv,noheader
cat "$OUT/steps.txt"
python3 - "$OUT" <<'PY'
import glob, json, sys
out = sys.argv[1]
for path in sorted(glob.glob(f"{out}/model-*.json")):
    doc = json.load(open(path))
    print(f"model ({doc['device']}), bundle verdicts {doc['bundle'].get('verdicts')}")
    for r in doc["records"]:
        o, c = r["ours"], r["ours"]["check"]
        ratio = r["ratio"]["dense"]
        print(f"  {r['problem']['phase']:8s} dense {r['baselines']['dense']['median_ms']:8.3f} ms  ours {o['median_ms']:8.3f} ms"
              f"  {ratio if ratio is None else round(ratio, 3)}x  GEMMs ours {len(o['gemms']['ours'])} torch "
              f"{len(o['gemms']['torch'])}  logits {'bit-identical' if c['bit_identical'] else 'max diff %.3g' % c['max_abs_diff']}")
for path in sorted(glob.glob(f"{out}/engine-*.json")):
    doc = json.load(open(path))
    print(f"engine timing ({doc['device']})")
    for r in doc["records"]:
        p, ratio = r["problem"], r["ratio"]["cublas"]
        ran = "ours" if r["ours"]["kernel"] else "torch"
        print(f"  {p['m']:5d}x{p['n']}x{p['k']}  ours {r['ours']['median_ms'] * 1e3:7.1f} us  cuBLAS "
              f"{r['baselines']['cublas']['median_ms'] * 1e3:7.1f} us  {ratio if ratio is None else round(ratio, 3)}x  ran {ran}")
PY
