"""How fast the GPU's L2 feeds the multiprocessors: the roof under a block-sparse W's kernel.

A block-sparse tile of one block row loads, for every kept block, X's ``bm`` rows of that block's
columns: the whole of X passes from L2 to shared memory once per kept block of a block column, so
the kernel's time is bounded below by those bytes over L2's read bandwidth, however it is scheduled.
This measures that bandwidth with gemmscape's own runtime (NVRTC, ``codegen.cuda``): every thread of
a full grid reads a buffer that fits in L2 in 16-byte loads, about 4 GiB per launch, and the median
of repeated launches (CUDA events, after a warm-up that leaves the buffer in L2) gives bytes read per
second; a buffer several times L2 gives DRAM's rate for comparison. Writes the results format
(``benchmarks/results/``) to OUT/l2_roof-<device>-<date>.json.

On the H200 (repo root, after ``source benchmarks/device/env.sh``), a few seconds:
    python3 -m benchmarks.l2_roof --out "$OUT"
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

SOURCE = r"""
extern "C" __global__ void __launch_bounds__(512) l2_read(const int4* __restrict__ buf, unsigned long long n,
                                                          int passes, int* __restrict__ sink) {
    int acc = 0;
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (int p = 0; p < passes; ++p) {
        // each pass starts one block further on, so no thread rereads only its own lines
        const unsigned long long start = ((unsigned long long)blockIdx.x + p) % gridDim.x * blockDim.x + threadIdx.x;
        unsigned long long i = start;
        for (; i + 3 * stride < n; i += 4 * stride) {  // four loads in flight per thread
            int4 v[4];
#pragma unroll
            for (int u = 0; u < 4; ++u)
                asm volatile("ld.global.v4.s32 {%0, %1, %2, %3}, [%4];\n"
                             : "=r"(v[u].x), "=r"(v[u].y), "=r"(v[u].z), "=r"(v[u].w) : "l"(buf + i + u * stride));
#pragma unroll
            for (int u = 0; u < 4; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
        }
        for (; i < n; i += stride) {
            int4 v;
            asm volatile("ld.global.v4.s32 {%0, %1, %2, %3}, [%4];\n"
                         : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(buf + i));
            acc ^= v.x ^ v.y ^ v.z ^ v.w;
        }
    }
    if (acc == 0x7fffffff) sink[0] = acc;  // keeps the loads; the buffer is zero, so never taken
}
"""
THREADS = 512
BLOCKS_PER_SM = 4
REPS = 30


def measure(mib: int, passes: int) -> dict:
    from codegen import cuda
    from codegen.compile import compile_source

    ctx = cuda.Context(0)
    info = ctx.info
    module = cuda.Module(compile_source(SOURCE, "l2_read", info.sm).cubin)
    func = module.function("l2_read")
    nbytes = mib << 20
    buf, sink = cuda.Buffer(nbytes), cuda.Buffer(4)
    buf.zero(ctx.stream)
    grid = (info.sms * BLOCKS_PER_SM, 1, 1)
    args = [ctypes.c_void_p(buf.address), ctypes.c_ulonglong(nbytes // 16), ctypes.c_int(passes),
            ctypes.c_void_p(sink.address)]
    start, end = cuda.Event(), cuda.Event()
    times = []
    for rep in range(REPS + 3):
        start.record(ctx.stream)
        cuda.launch(func, grid, (THREADS, 1, 1), 0, ctx.stream, args)
        end.record(ctx.stream)
        ms = end.elapsed_ms(start)
        if rep >= 3:
            times.append(ms)
    buf.free()
    sink.free()
    t = sorted(times)
    read = nbytes * passes
    return {"buffer_mib": mib, "passes": passes, "bytes_read": read, "median_ms": statistics.median(t),
            "p20_ms": t[int(0.2 * (len(t) - 1))], "p80_ms": t[int(0.8 * (len(t) - 1))], "reps": len(t),
            "tb_per_s": read / (statistics.median(t) * 1e-3) / 1e12, "l2_bytes": info.l2_bytes,
            "device": info.name}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m benchmarks.l2_roof", description=__doc__.splitlines()[0])
    p.add_argument("--out", default=os.environ.get("OUT", "l2-roof-out"), help="folder for the JSON file")
    p.add_argument("--mib", nargs="+", type=int, default=[8, 16, 32, 48, 2048], help="buffer sizes (MiB)")
    args = p.parse_args(argv)
    if min(args.mib) <= 0:
        p.error("--mib must be positive")
    from codegen.versions import versions

    records = []
    for mib in args.mib:
        passes = max(1, 4096 // mib)  # about 4 GiB read per launch
        r = measure(mib, passes)
        records.append(r)
        print(f"{mib:6d} MiB x {passes:4d} passes: {r['median_ms']:8.3f} ms (p20 {r['p20_ms']:.3f}, "
              f"p80 {r['p80_ms']:.3f})  {r['tb_per_s']:6.2f} TB/s", flush=True)
    date = time.strftime("%Y-%m-%dT%H%M%SZ", time.gmtime())
    device = records[0]["device"]
    doc = {"suite": "l2_roof", "date": date, "device": device, "versions": versions(),
           "command": "python3 -m benchmarks.l2_roof " + " ".join(argv if argv is not None else sys.argv[1:]),
           "timing": {"reps": REPS, "warmup": 3, "threads": THREADS, "blocks_per_sm": BLOCKS_PER_SM}, "records": records}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"l2_roof-{device.replace(' ', '_')}-{date}.json"
    path.write_text(json.dumps(doc, indent=1) + "\n")
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
