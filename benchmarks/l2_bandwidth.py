"""How fast the multiprocessors can read from L2 and from HBM: the ceiling a block-sparse GEMM meets.

    python3 -m benchmarks.l2_bandwidth [--out DIR] [--reps 20]

A block-sparse W's kernel reads X's k-columns once per kept block of each block row, so X crosses
L2 about ``density * N / block_rows`` times; with one block row per block tile that traffic, not
the tensor cores, sets its speed (benchmarks/NOTES.md). This measures the rate it can have: one
kernel, compiled with gemmscape's NVRTC, where every thread reads 16-byte words with ``ld.global.cg``
(cached in L2 only) in a grid-stride loop over a buffer, folding them into one word per thread
that is stored (so no read is dropped). A buffer of 8, 16 or 24 MB stays in the 60 MB L2 across passes
(the first pass, from HBM, is not timed: each repetition reads it ``passes`` times after a warm
pass); 4 GB streams from HBM. Time by CUDA events, median and range over ``--reps``, grids of 1, 2,
4 and 8 blocks of 512 threads per multiprocessor. Writes OUT/l2-<device>-<date>.json (the results
format of benchmarks/NOTES.md: card, versions, command) and prints a table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

SOURCE = r"""
extern "C" __global__ void __launch_bounds__(512) read_words(const uint4* __restrict__ src, unsigned long long words,
                                                           int passes, unsigned* __restrict__ sink) {
    unsigned acc = 0;
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (int p = 0; p < passes; ++p)
        for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < words; i += stride) {
            uint4 v;
            asm volatile("ld.global.cg.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                         : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(src + i));
            acc ^= v.x ^ v.y ^ v.z ^ v.w;
        }
    sink[(size_t)blockIdx.x * blockDim.x + threadIdx.x] = acc;
}
"""
THREADS = 512
#: (label, bytes, passes per timed launch)
BUFFERS = [("L2 8 MB", 8 << 20, 64), ("L2 16 MB", 16 << 20, 32), ("L2 24 MB", 24 << 20, 24), ("HBM 4 GB", 4 << 30, 1)]
BLOCKS_PER_SM = (1, 2, 4, 8)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args(argv)

    import ctypes

    from codegen import cuda
    from codegen.compile import compile_source
    from codegen.versions import versions

    ctx = cuda.Context(0)
    info = ctx.info
    module = cuda.Module(compile_source(SOURCE, "l2_bandwidth", info.sm, use_cache=False).cubin)
    func = module.function("read_words")
    sink = cuda.Buffer(4 * THREADS * info.sms * max(BLOCKS_PER_SM))
    rows = []
    for label, nbytes, passes in BUFFERS:
        buf = cuda.Buffer(nbytes)
        buf.zero(ctx.stream)
        for per_sm in BLOCKS_PER_SM:
            grid = (info.sms * per_sm, 1, 1)
            warm = [ctypes.c_void_p(buf.address), ctypes.c_ulonglong(nbytes // 16), ctypes.c_int(1),
                    ctypes.c_void_p(sink.address)]
            timed = [*warm[:2], ctypes.c_int(passes), warm[3]]
            times = []
            for _ in range(args.reps):
                cuda.launch(func, grid, (THREADS, 1, 1), 0, ctx.stream, warm)  # the buffer (if it fits) now in L2
                start, end = cuda.Event(), cuda.Event()
                start.record(ctx.stream)
                cuda.launch(func, grid, (THREADS, 1, 1), 0, ctx.stream, timed)
                end.record(ctx.stream)
                times.append(end.elapsed_ms(start))
            rates = sorted(nbytes * passes / (t * 1e-3) / 1e12 for t in times)
            row = {"buffer": label, "bytes": nbytes, "passes": passes, "blocks_per_sm": per_sm,
                   "median_tbps": statistics.median(rates), "min_tbps": rates[0], "max_tbps": rates[-1],
                   "median_ms": statistics.median(times), "reps": len(times)}
            rows.append(row)
            print(f"{label:10s} {per_sm} blocks/SM: {row['median_tbps']:6.2f} TB/s "
                  f"(range {rates[0]:.2f}-{rates[-1]:.2f}, {len(times)} reps)", flush=True)
        buf.free()
    stamp = time.strftime("%Y-%m-%dT%H%M%SZ", time.gmtime())
    doc = {"suite": "l2_bandwidth", "date": stamp, "device": {"name": info.name, "sm": info.sm, "sms": info.sms,
                                                              "driver": info.driver, "l2_bytes": info.l2_bytes},
           "versions": versions(), "command": "python3 -m benchmarks.l2_bandwidth " + " ".join(argv or sys.argv[1:]),
           "method": "ld.global.cg 16-byte reads, grid-stride, 512 threads per block; L2 buffers warmed by one pass "
                     "before each timed launch; CUDA events; rate = bytes x passes / time",
           "records": rows}
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"l2-{info.name.replace(' ', '_')}-{stamp}.json"
    path.write_text(json.dumps(doc, indent=1))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
