#!/usr/bin/env bash
# On a lent H100/H200, in one call (about 6-8 minutes): LLaMA-3-8B dims with its MLP pruned to block-sparse W
# (densities 0.25 and 0.1, blocks of 64) against its dense twin on cuBLAS (benchmarks/sparse_model.py).
#
# MODE=seeds (default): no tuning.
#  1. benchmarks.sparse_model, every phase (PHASES="decode prefill" and so on: those only): decode at batch 1
#     and 16 on a static KV cache of 1024 positions in a CUDA graph and prefill of 2048 tokens, both of the
#     decoder layers alone (model.model on precomputed embeddings: no embedding, no LM head; the final hidden
#     states compared), each with its non-GEMM part timed beside it (the same step with the decoder layers'
#     linear layers stubbed to zeros: the records' non_gemm, with the dense step's GEMM share); one pruned
#     layer's train step; the sparse GEMMs in engine timing at M = 1, 16, 64; on the families' built-in seeds
#     (BUNDLE=DIR: that bundle's kernels instead).
#  2. where the engine phase ran: the engine phase again on the direct family's seeds first (--seeds direct
#     tensorcore), the family made for block-sparse W at small batches, which the default seeds do not take.
# MODE=tune: pruned layers tuned on their patterns, then timed with the bundle (by default layer 0's MLP up and
# down projections at decode batches, timed in engine timing).
#  1. codegen prune benchmarks/model.py:llama3_8b_dims (the benchmark's own weights and patterns) at each density
#     of DENSITIES (0.25 0.1), the layers TUNE_LAYERS matches (layers\.0\.mlp\.(up|down)_proj; "mlp": all).
#  2. codegen tune-model --pruned FILE on those layers' GEMMs of TUNE_LAYOUTS (forward) at M = TUNE_BATCHES
#     (1 16; 2048 is the prefill's and the train step's), families TUNE_FAMILIES (direct tensorcore; add hopper
#     for 2048 rows), budget BUDGET (20) per GEMM and family, into one store and bundle; forward GEMMs of at
#     most 128 rows are judged again in engine timing, against dense cuBLAS.
#     With train in TIME_PHASES, TRAIN_LAYER's (model.layers.0.mlp.up_proj) grad_input and grad_weight GEMMs at
#     2048 rows are tuned as well.
#  3. benchmarks.sparse_model --phases TIME_PHASES (engine) --bundle: the tuned kernels against dense cuBLAS. The
#     engine phase needs only the tuned layers; decode, prefill and train want every pruned GEMM they run in
#     the bundle (TUNE_LAYERS=mlp; else the rest run the built-in seeds, and the records say which ran what).
# Each step under its own time limit, its log in $OUT/<step>.log and its wall time printed; the JSON records
# (and in MODE=tune the bundle, tar.gz, and the store, gzipped) come back in $OUT; a short table last.
# usage (device tool, carry .whl): bash benchmarks/device/sparse_model.sh
# env: MODE (seeds|tune), BUNDLE (a bundle folder for MODE=seeds), PHASES (MODE=seeds: "decode prefill train
#      engine"; e.g. PHASES="decode prefill", about 2-3 minutes), BUDGET (20), TUNE_BATCHES ("1 16"),
#      TUNE_FAMILIES ("direct tensorcore"), TUNE_LAYERS, TUNE_LAYOUTS ("forward"), DENSITIES ("0.25 0.1"),
#      TIME_PHASES ("engine"), TRAIN_LAYER, T_MODEL/T_DIRECT/T_PRUNE/T_TUNE/T_ENGINE (step limits, s),
#      GPU_TESTS=1 (first tests/gpu/test_sparse_engine.py, about half a minute more)
set -uo pipefail
source "$(dirname "$0")/env.sh"
MODE=${MODE:-seeds}
TRAIN_LAYER=${TRAIN_LAYER:-model.layers.0.mlp.up_proj}
read -r -a phases <<< "${PHASES:-decode prefill train engine}"
BUDGET=${BUDGET:-20}
read -r -a tune_batches <<< "${TUNE_BATCHES:-1 16}"
tune_families=()
for f in ${TUNE_FAMILIES:-direct tensorcore}; do tune_families+=(--family "$f"); done
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c "import transformers, torch; print('transformers', transformers.__version__, 'torch', torch.__version__)" \
  || { echo "sparse_model.sh: transformers is not importable here"; exit 1; }

STEP_SHOW='^wrote|engine timing|^decode|capture failed|Traceback|Error'

if [ "${GPU_TESTS:-0}" = 1 ]; then
  step gpu-tests 120 python3 -m pytest tests/gpu/test_sparse_engine.py -q -p no:cacheprovider -o addopts="" -rfE
  grep -E "passed|failed|error" "$OUT/gpu-tests.log" | tail -3
fi

if [ "$MODE" = tune ]; then
  DB="sqlite:///$OUT/sparse.db"
  LAYERS=${TUNE_LAYERS:-'layers\.0\.mlp\.(up|down)_proj'}
  read -r -a densities <<< "${DENSITIES:-0.25 0.1}"
  read -r -a time_phases <<< "${TIME_PHASES:-engine}"
  layouts=(); for l in ${TUNE_LAYOUTS:-forward}; do layouts+=(--layout "$l"); done
  engine_batches=(); for b in "${tune_batches[@]}"; do [ "$b" -le 128 ] && engine_batches+=("$b"); done
  for d in "${densities[@]}"; do
    step "prune-$d" "${T_PRUNE:-60}" python3 -m codegen prune benchmarks/model.py:llama3_8b_dims --density "$d" \
      --block 64 --layers "$LAYERS" --out "/tmp/pruned-d$d.safetensors"
  done
  for d in "${densities[@]}"; do
    step "tune-$d" "${T_TUNE:-170}" python3 -m codegen tune-model benchmarks/model.py:llama3_8b_dims \
      --pruned "/tmp/pruned-d$d.safetensors" --layers "$LAYERS" --batch "${tune_batches[@]}" "${layouts[@]}" \
      "${tune_families[@]}" --budget "$BUDGET" --db "$DB" --bundle "$OUT/bundle" --quiet
  done
  if [[ " ${time_phases[*]} " == *" train "* ]]; then  # the train phase's layer: its backward GEMMs as well
    for d in "${densities[@]}"; do
      step "tune-train-$d" "${T_TUNE:-170}" python3 -m codegen tune-model benchmarks/model.py:llama3_8b_dims \
        --pruned "/tmp/pruned-d$d.safetensors" --layers "${TRAIN_LAYER//./\\.}\$" --batch 2048 \
        --layout grad_input --layout grad_weight "${tune_families[@]}" --budget "$BUDGET" --db "$DB" \
        --bundle "$OUT/bundle" --quiet
    done
  fi
  [ -f "$OUT/bundle/index.json" ] || step export 30 python3 -m codegen export --bundle "$OUT/bundle" --db "$DB"
  step timed "${T_ENGINE:-120}" python3 -m benchmarks.sparse_model --phases "${time_phases[@]}" --bundle "$OUT/bundle" \
    --train-layer "$TRAIN_LAYER" \
    --densities "${densities[@]}" ${engine_batches[0]:+--engine-batches "${engine_batches[@]}"} --out "$OUT"
  rm -f /tmp/pruned-d*.safetensors
  python3 -c "import sqlite3, sys; sqlite3.connect(sys.argv[1]).execute('pragma wal_checkpoint(TRUNCATE)')" \
    "$OUT/sparse.db" 2>/dev/null
  gzip -9f "$OUT/sparse.db"
  [ -d "$OUT/bundle" ] && tar -czf "$OUT/bundle.tar.gz" -C "$OUT" bundle && rm -rf "$OUT/bundle"
else
  step sparse-model "${T_MODEL:-330}" python3 -m benchmarks.sparse_model ${BUNDLE:+--bundle "$BUNDLE"} \
    --phases "${phases[@]}" --out "$OUT"
  if [ -z "${BUNDLE:-}" ] && [[ " ${phases[*]} " == *" engine "* ]]; then
    step engine-direct "${T_DIRECT:-120}" python3 -m benchmarks.sparse_model --phases engine --seeds direct tensorcore \
      --out "$OUT"
  fi
fi

nvidia-smi --query-gpu=clocks.sm,temperature.gpu --format=csv,noheader
cat "$OUT/steps.txt"
python3 - "$OUT" <<'PY'
import glob, json, sys
for path in sorted(glob.glob(f"{sys.argv[1]}/sparse_model-*.json")):
    doc = json.load(open(path))
    print(f"{path.rsplit('/', 1)[1]} ({doc['device']}), kernels {doc['kernels'].get('location')} "
          f"seeds {doc['kernels'].get('seeds')}")
    for r in doc["records"]:
        p, o, ratio = r["problem"], r["ours"], next(iter(r["ratio"].values()))
        base = next(iter(r["baselines"].values()))
        what = f"{p['m']}x{p['n']}x{p['k']}" if "m" in p else f"{p['phase']} {p['batch']}x{p['tokens']}"
        ran = o.get("ran") or f"ours {len(o['gemms']['ours'])} torch {len(o['gemms']['torch'])}"
        checks = o.get("check", {})
        worst = max((c.get("rel_error", 0.0) for c in checks.values()), default=o.get("rel_error"))
        rest = r.get("non_gemm")
        tail = f"  non-GEMM {rest['median_ms'] * 1e3:.1f} us (GEMM share of dense {rest['gemm_share_dense']:.0%})" if rest else ""
        print(f"  d{p['density']:<5g} {what:22s} ours {o['median_ms'] * 1e3:9.1f} us  dense {base['median_ms'] * 1e3:9.1f}"
              f" us  {'WRONG' if ratio is None else f'{ratio:.2f}x':>6s}  {r['timing']:6s} rel.err {worst:.1e}  {ran[:70]}{tail}")
PY
