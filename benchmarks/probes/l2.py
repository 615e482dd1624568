"""How fast the multiprocessors read from L2 and from DRAM: the roof under a block-sparse W's kernel.

    python3 -m benchmarks.probes.l2 [--out DIR] [--mib 8 16 32 48 2048] [--blocks-per-sm 4 ...]
                                    [--loads 4] [--cg] [--reps 30]

A block-sparse tile of one block row loads, for every kept block, X's ``bm`` rows of that block's
columns: the whole of X passes from L2 to shared memory once per kept block of a block column, so
the kernel's time is bounded below by those bytes over L2's read bandwidth, however it is scheduled.
This measures that bandwidth with gemmscape's own runtime (NVRTC, ``codegen.cuda``): every thread of
a grid of ``--blocks-per-sm`` blocks of 512 threads per multiprocessor reads a buffer in 16-byte loads
(``--loads`` in flight per thread; ``ld.global``, or with ``--cg`` ``ld.global.cg``, cached in L2
only), grid-stride, each pass starting one block further on so that no thread rereads only its own
lines, about 4 GiB per launch (``4096 // MiB`` passes), folded into one word per thread so that no
load is dropped. The median of ``--reps`` launches (CUDA events, after 3 warm-up launches that leave
a buffer that fits in L2 there) gives bytes read per second; a buffer several times L2 gives DRAM's
rate for comparison. Writes the results format (``benchmarks/results/``) to OUT/l2-<device>-<date>.json
and prints a table.

The defaults are the measurement of ``l2_roof-NVIDIA_H200-2026-12-02T200815Z.json`` (made by this
module's earlier name, ``benchmarks.l2_roof``). ``l2-NVIDIA_H200-2026-12-02T033857Z.json`` was made by
``benchmarks.l2_bandwidth`` (removed; ``git show 92631da:benchmarks/l2_bandwidth.py``): one load per
thread in flight, ``ld.global.cg``, 8 / 16 / 24 MB and 4 GB, 1 / 2 / 4 / 8 blocks per multiprocessor,
about 512 MB per launch, a warm pass before each timed launch; the nearest here is
``--mib 8 16 24 4096 --blocks-per-sm 1 2 4 8 --loads 1 --cg --reps 20``.

On the H200 (repo root, after ``source benchmarks/device/env.sh``), a few seconds:
    python3 -m benchmarks.probes.l2 --out "$OUT"
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
        for (; i + (LOADS - 1) * stride < n; i += LOADS * stride) {  // LOADS loads in flight per thread
            int4 v[LOADS];
#pragma unroll
            for (int u = 0; u < LOADS; ++u)
                asm volatile("ld.global" CACHE ".v4.s32 {%0, %1, %2, %3}, [%4];\n"
                             : "=r"(v[u].x), "=r"(v[u].y), "=r"(v[u].z), "=r"(v[u].w) : "l"(buf + i + u * stride));
#pragma unroll
            for (int u = 0; u < LOADS; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
        }
        for (; i < n; i += stride) {
            int4 v;
            asm volatile("ld.global" CACHE ".v4.s32 {%0, %1, %2, %3}, [%4];\n"
                         : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(buf + i));
            acc ^= v.x ^ v.y ^ v.z ^ v.w;
        }
    }
    if (acc == 0x7fffffff) sink[0] = acc;  // keeps the loads; the buffer is zero, so never taken
}
"""
THREADS = 512
BLOCKS_PER_SM = 4
LOADS = 4
REPS = 30
WARMUP = 3


def source(loads: int, cg: bool) -> str:
    """The kernel with ``loads`` 16-byte loads in flight per thread, ``ld.global.cg`` or ``ld.global``."""
    return f'#define LOADS {loads}\n#define CACHE "{".cg" if cg else ""}"\n' + SOURCE


def measure(mibs: list[int], blocks_per_sm: list[int], loads: int, cg: bool, reps: int) -> tuple[dict, list[dict]]:
    """(the card, a record per buffer size and grid), each timed over ``reps`` launches."""
    from codegen import cuda
    from codegen.compile import compile_source

    ctx = cuda.Context(0)
    info = ctx.info
    func = cuda.Module(compile_source(source(loads, cg), "l2_read", info.sm).cubin).function("l2_read")
    sink = cuda.Buffer(4)
    records = []
    for mib in mibs:
        nbytes = mib << 20
        passes = max(1, 4096 // mib)  # about 4 GiB read per launch
        buf = cuda.Buffer(nbytes)
        buf.zero(ctx.stream)
        args = [ctypes.c_void_p(buf.address), ctypes.c_ulonglong(nbytes // 16), ctypes.c_int(passes),
                ctypes.c_void_p(sink.address)]
        for per_sm in blocks_per_sm:
            grid = (info.sms * per_sm, 1, 1)
            start, end = cuda.Event(), cuda.Event()
            times = []
            for rep in range(reps + WARMUP):
                start.record(ctx.stream)
                cuda.launch(func, grid, (THREADS, 1, 1), 0, ctx.stream, args)
                end.record(ctx.stream)
                ms = end.elapsed_ms(start)
                if rep >= WARMUP:
                    times.append(ms)
            t = sorted(times)
            read = nbytes * passes
            r = {"buffer_mib": mib, "passes": passes, "blocks_per_sm": per_sm, "bytes_read": read,
                 "median_ms": statistics.median(t), "p20_ms": t[int(0.2 * (len(t) - 1))],
                 "p80_ms": t[int(0.8 * (len(t) - 1))], "min_ms": t[0], "max_ms": t[-1], "reps": len(t),
                 "tb_per_s": read / (statistics.median(t) * 1e-3) / 1e12, "l2_bytes": info.l2_bytes,
                 "device": info.name}
            records.append(r)
            print(f"{mib:6d} MiB x {passes:4d} passes, {per_sm} blocks/SM: {r['median_ms']:8.3f} ms "
                  f"(p20 {r['p20_ms']:.3f}, p80 {r['p80_ms']:.3f})  {r['tb_per_s']:6.2f} TB/s "
                  f"(range {read / (t[-1] * 1e-3) / 1e12:.2f}-{read / (t[0] * 1e-3) / 1e12:.2f})", flush=True)
        buf.free()
    sink.free()
    card = {"name": info.name, "sm": info.sm, "sms": info.sms, "driver": info.driver, "l2_bytes": info.l2_bytes}
    return card, records


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m benchmarks.probes.l2", description=__doc__.splitlines()[0])
    p.add_argument("--out", default=os.environ.get("OUT", "l2-out"), help="folder for the JSON file")
    p.add_argument("--mib", nargs="+", type=int, default=[8, 16, 32, 48, 2048], help="buffer sizes (MiB)")
    p.add_argument("--blocks-per-sm", nargs="+", type=int, default=[BLOCKS_PER_SM],
                   help=f"grids to time, in blocks of {THREADS} threads per multiprocessor")
    p.add_argument("--loads", type=int, choices=(1, 2, 4, 8), default=LOADS, help="16-byte loads in flight per thread")
    p.add_argument("--cg", action="store_true", help="ld.global.cg (cached in L2 only) instead of ld.global")
    p.add_argument("--reps", type=int, default=REPS, help="timed launches per row")
    args = p.parse_args(argv)
    if min(args.mib) <= 0:
        p.error("--mib must be positive")
    if min(args.blocks_per_sm) <= 0:
        p.error("--blocks-per-sm must be positive")
    if args.reps < 1:
        p.error("--reps must be at least 1")
    from codegen.versions import versions

    card, records = measure(args.mib, args.blocks_per_sm, args.loads, args.cg, args.reps)
    date = time.strftime("%Y-%m-%dT%H%M%SZ", time.gmtime())
    device = card["name"]
    doc = {"suite": "l2", "date": date, "device": device, "card": card, "versions": versions(),
           "command": "python3 -m benchmarks.probes.l2 " + " ".join(argv if argv is not None else sys.argv[1:]),
           "method": f"ld.global{'.cg' if args.cg else ''} 16-byte reads, {args.loads} in flight per thread, "
                     f"grid-stride, {THREADS} threads per block; {WARMUP} warm-up launches; CUDA events; "
                     "rate = bytes x passes / median time",
           "timing": {"reps": args.reps, "warmup": WARMUP, "threads": THREADS, "blocks_per_sm": args.blocks_per_sm,
                      "loads": args.loads, "cache": "cg" if args.cg else "default"},
           "records": records}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"l2-{device.replace(' ', '_')}-{date}.json"
    path.write_text(json.dumps(doc, indent=1) + "\n")
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
