# Sourced by the device scripts (and usable as `source benchmarks/device_env.sh` in a device command):
# the carried wheels (.whl) on the path, unbuffered output, a compile cache, and $OUT.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site:$PWD || exit 1
export PYTHONUNBUFFERED=1 GEMMSCAPE_CACHE=/tmp/gemmscape-cache
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
