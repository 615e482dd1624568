"""The floor of the suites' timing under a small kernel: what a launch costs before it does any work.

Every suite times a call with CUDA events around it after zeroing a 256 MB buffer (the L2 flush,
``Engine.time_calls``). A kernel of a few microseconds of work then also pays its launch, the events,
and DRAM's latency for its first loads (L2 holds only the flush's zeros). This times, with that
same harness and gemmscape's own runtime (NVRTC, ``codegen.cuda``):

- ``empty``: one block of one thread that returns at once;
- ``chain N``: one thread following N dependent loads through a buffer the flush has evicted
  (each load's address is the previous load's value; the hops are 2 MiB apart, so each is a DRAM
  access on a page of its own): the latency of N round trips to DRAM;
- ``store rows``: a grid that writes a 32 × 4096 bf16 output in 16-byte stores (256 KB, the batch-32
  layer's Y) and reads nothing;
- cuBLAS (torch, when installed) on a 32 × 64 × 64 bf16 product, the smallest layer.

A block-sparse kernel at batch 32 reads its row pointers, then its column indices, then the blocks and
X's columns they name: three dependent rounds before its first multiply. Median and p20-p80 of
``--reps`` calls. Writes OUT/time_floor-<device>-<date>.json (the results format) and prints a table.

On the H200 (repo root, after ``source benchmarks/device/env.sh``), a few seconds:
    python3 -m benchmarks.probes.time_floor --out "$OUT"
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

SOURCE = r"""
extern "C" __global__ void empty() {}

extern "C" __global__ void chain(const unsigned long long* __restrict__ next, int hops, int* __restrict__ sink) {
    unsigned long long i = 0;
    for (int h = 0; h < hops; ++h) i = next[i];  // each address is the last load's value
    if (i == ~0ull) sink[0] = 1;  // keeps the loads; never taken
}

extern "C" __global__ void store_rows(uint4* __restrict__ y, int n16) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n16) y[i] = make_uint4(i, 0, 0, 0);
}
"""
HOP_BYTES = 2 << 20
HOPS = (1, 2, 3, 4)
Y_BYTES = 32 * 4096 * 2
REPS = 60


def _stats(times: list[float]) -> dict:
    t = sorted(x * 1e3 for x in times)  # µs
    return {"median_us": statistics.median(t), "p20_us": t[int(0.2 * (len(t) - 1))],
            "p80_us": t[int(0.8 * (len(t) - 1))], "reps": len(t)}


def measure(reps: int) -> tuple[str, list[dict]]:
    from codegen import cuda
    from codegen.compile import compile_source
    from codegen.engine import Engine

    engine = Engine(0)
    info, stream = engine.ctx.info, engine.stream
    module = cuda.Module(compile_source(SOURCE, "time_floor", info.sm).cubin)
    timing = {"reps_min": reps, "reps_max": reps, "target_ms": 0.0}
    records = []

    def timed(name: str, fn, **extra) -> None:
        r = {"call": name, **extra, **_stats(engine.time_calls(fn, **timing))}
        records.append(r)
        print(f"{name:28s} {r['median_us']:7.2f} µs  (p20 {r['p20_us']:.2f}, p80 {r['p80_us']:.2f})", flush=True)

    f = module.function("empty")
    timed("empty", lambda: cuda.launch(f, (1, 1, 1), (1, 1, 1), 0, stream, []))

    slots = max(HOPS) + 1
    stride = HOP_BYTES // 8
    host = np.zeros(slots * stride, dtype=np.uint64)
    host[np.arange(slots - 1) * stride] = np.arange(1, slots) * stride  # hop h holds the index of hop h + 1
    hops_buf, sink = cuda.Buffer(host.nbytes), cuda.Buffer(4)
    hops_buf.upload(host)
    f = module.function("chain")
    for n in HOPS:
        args = [ctypes.c_void_p(hops_buf.address), ctypes.c_int(n), ctypes.c_void_p(sink.address)]
        timed(f"chain {n}", lambda a=args: cuda.launch(f, (1, 1, 1), (1, 1, 1), 0, stream, a), hops=n)

    y = cuda.Buffer(Y_BYTES)
    f = module.function("store_rows")
    n16 = Y_BYTES // 16
    args = [ctypes.c_void_p(y.address), ctypes.c_int(n16)]
    timed("store rows 32x4096 bf16", lambda: cuda.launch(f, (-(-n16 // 256), 1, 1), (256, 1, 1), 0, stream, args),
          bytes=Y_BYTES)

    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None and torch.cuda.is_available():
        x = torch.rand(32, 64, device="cuda").to(torch.bfloat16)
        w = torch.rand(64, 64, device="cuda").to(torch.bfloat16)
        timed("cublas 32x64x64 bf16", lambda: torch.matmul(x, w.t()))
        torch.cuda.synchronize()
    for b in (hops_buf, sink, y):
        b.free()
    return info.name, records


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m benchmarks.probes.time_floor", description=__doc__.splitlines()[0])
    p.add_argument("--out", default=os.environ.get("OUT", "time-floor-out"), help="folder for the JSON file")
    p.add_argument("--reps", type=int, default=REPS, help="timed calls per row")
    args = p.parse_args(argv)
    if args.reps < 3:
        p.error("--reps must be at least 3")
    from codegen.versions import versions

    device, records = measure(args.reps)
    date = time.strftime("%Y-%m-%dT%H%M%SZ", time.gmtime())
    doc = {"suite": "time_floor", "date": date, "device": device, "versions": versions(),
           "command": "python3 -m benchmarks.probes.time_floor " + " ".join(argv if argv is not None else sys.argv[1:]),
           "timing": {"reps": args.reps, "flush": "zero 256 MB before each call (Engine.time_calls)"},
           "records": records}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"time_floor-{device.replace(' ', '_')}-{date}.json"
    path.write_text(json.dumps(doc, indent=1) + "\n")
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
