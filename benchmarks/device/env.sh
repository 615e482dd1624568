# Sourced by the device scripts (and usable as `source benchmarks/device/env.sh` in a device command):
# the carried wheels (.whl) on the path, unbuffered output, a compile cache, and $OUT. The project's
# dependencies that the lent machine lacks must be among the wheels (`../shared/device/wheels.sh cmaes`
# fetches them: the script's own list lacks cmaes, which the default sampler imports); one missing
# stops here, at once, rather than as a failed search minutes into the call.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site:$PWD || exit 1
python3 - <<'PY' || exit 1
import importlib.util, sys
missing = [m for m in ("optuna", "cmaes", "sqlalchemy", "alembic", "colorlog") if importlib.util.find_spec(m) is None]
if missing:
    sys.exit(f"benchmarks/device/env.sh: not importable here: {', '.join(missing)}; carry their wheels in .whl "
             f"(../shared/device/wheels.sh {' '.join(missing)})")
PY
export PYTHONUNBUFFERED=1 GEMMSCAPE_CACHE=/tmp/gemmscape-cache
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"

# step NAME LIMIT_S COMMAND...: the command under a time limit (SIGINT first, so a search or tune-model
# writes what it stored; SIGKILL 20 s later), its output in $OUT/NAME.log, its exit status and wall time
# on a line of $OUT/steps.txt; then the log's lines matching STEP_SHOW (an extended regular expression,
# the last 8) or, without it, the log's last 4 lines.
step() {
  local name=$1 limit=$2; shift 2
  SECONDS=0
  timeout -s INT --kill-after=20 "$limit" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  echo "== $name: rc=$rc in ${SECONDS} s (limit $limit s)" | tee -a "$OUT/$name.log" "$OUT/steps.txt"
  if [ -n "${STEP_SHOW:-}" ]; then grep -E "$STEP_SHOW" "$OUT/$name.log" | tail -8; else tail -4 "$OUT/$name.log"; fi
}
