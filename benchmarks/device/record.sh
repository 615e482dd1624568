#!/usr/bin/env bash
# On the lent H200: an exhaustive recording of one of a family's larger narrowings (search/spaces/*.py
# NARROWINGS), written as a replay file for CPU search-quality work, with its store (gzipped).
# usage (device tool, carry .whl): [RESUME=PARTIAL.json] bash benchmarks/device/record.sh FAMILY NARROWING M N K DTYPE
set -uo pipefail
source "$(dirname "$0")/env.sh"
family=$1 narrowing=$2 m=$3 n=$4 k=$5 dtype=$6
name="replay-${family}-${narrowing}-${m}x${n}x${k}-${dtype}"
SECONDS=0
timeout "${RECORD_TIMEOUT:-540}" python3 -m codegen sweep --family "$family" --space "$narrowing" --m "$m" --n "$n" \
  --k "$k" --dtype "$dtype" --max-seconds "${RECORD_SECONDS:-480}" ${RESUME:+--resume "$RESUME"} --db "sqlite:///$OUT/$name.db" --out "$OUT/$name.json" 2>&1 | tr '\r' '\n' | grep -v '^\s*$' | tail -3
echo "sweep wall: ${SECONDS} s"
python3 -c "import sqlite3, sys; sqlite3.connect(sys.argv[1]).execute('pragma wal_checkpoint(TRUNCATE)')" "$OUT/$name.db"
gzip -9 "$OUT/$name.json" "$OUT/$name.db"
