"""What the L2 flush before each timed call costs a kernel that writes a large output: the batch-32
dW GEMM (4096×4096 output from 32 rows) and a plain write of the same bytes.

    python3 -m benchmarks.probes.flush_cost [--db URL] [--reps 30] [--out DIR]

The suites flush L2 before every timed call by zeroing a 256 MB buffer (``flush.zero_()``). That
leaves L2 full of dirty lines, which a kernel that then writes tens of MB pays to write back to
HBM before its own lines fit. This times, after each of three preparations, the same calls:

- ``write_flush``: the suites' flush (zero 256 MB);
- ``read_flush``: read 256 MB instead (``flush.sum()``): L2 is as cold for the operands, but clean;
- ``none``: nothing between calls (operands and output stay in L2 where they fit).

The calls: ``zero_`` of the dW tensor (fp32 64 MB, bf16 32 MB: the write alone), cuBLAS's dW
(``dY.t() @ X``, what nn.Linear's backward runs) and, with ``--db``, gemmscape's stored fastest
grad_weight kernel for the problem through codegen.nn (``linear_grad_weight``). Median and range
of ``--reps`` CUDA-event-timed calls per cell. Writes OUT/flush-cost-<device>-<date>.json (card,
versions, command) and prints a table.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[1] / "results"
FLUSH_BYTES = 256 << 20
BATCH, FEATURES = 32, 4096
PREPARATIONS = ("write_flush", "read_flush", "none")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m benchmarks.probes.flush_cost", description=__doc__.split("\n\n")[0])
    ap.add_argument("--db", help="also time the store's fastest grad_weight kernel (codegen.nn)")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)

    import torch

    from codegen.versions import versions

    if not torch.cuda.is_available():
        print("flush_cost: no CUDA GPU visible to torch", file=sys.stderr)
        return 2
    torch.backends.cuda.matmul.allow_tf32 = False
    dev = torch.device("cuda")
    flush = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device=dev)
    prepare = {"write_flush": flush.zero_, "read_flush": lambda: flush.sum(), "none": lambda: None}
    kernels = None
    if args.db:
        from codegen.nn import kernels_from

        kernels = kernels_from(args.db)
    rows = []
    for name, tdtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        torch.manual_seed(0)
        dy = torch.randn(BATCH, FEATURES, device=dev, dtype=tdtype)
        x = torch.randn(BATCH, FEATURES, device=dev, dtype=tdtype)
        out = torch.empty(FEATURES, FEATURES, device=dev, dtype=tdtype)
        calls = {"zero_output": out.zero_, "cublas_dw": lambda dy=dy, x=x: dy.t() @ x}
        if kernels is not None:
            from codegen.nn import layer as nn

            def ours(dy=dy, x=x):
                return nn.linear_grad_weight(kernels, dy, x, True)

            ours()
            calls["gemmscape_dw"] = ours
        want = (dy.double().t() @ x.double())
        for label, call in calls.items():
            if label != "zero_output":
                got = call()
                got = got[0] if isinstance(got, tuple) else got
                rel = float((got.double() - want).norm() / want.norm())
            else:
                rel = None
            for prep in PREPARATIONS:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                times = []
                for _ in range(args.reps):
                    prepare[prep]()
                    start.record()
                    call()
                    end.record()
                    end.synchronize()
                    times.append(start.elapsed_time(end) * 1e3)
                rows.append({"dtype": name, "call": label, "preparation": prep, "median_us": statistics.median(times),
                             "min_us": min(times), "max_us": max(times), "reps": len(times), "rel_error": rel,
                             "bytes_written": out.numel() * out.element_size()})
                print(f"{name:5s} {label:13s} {prep:12s} {rows[-1]['median_us']:8.1f} us "
                      f"({min(times):.1f}-{max(times):.1f})" + (f"  err {rel:.1e}" if rel is not None else ""), flush=True)
        if kernels is not None:
            from codegen.problem import DType, Layout, linear_problems

            problem = linear_problems(BATCH, FEATURES, FEATURES, DType(name), True)[Layout.grad_weight]
            rows.append({"dtype": name, "call": "gemmscape_dw", "kernel": kernels.used(problem, dev)})
    props = torch.cuda.get_device_properties(0)
    stamp = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H%M%SZ")
    doc = {"suite": "flush_cost", "date": stamp, "device": props.name,
           "versions": {**versions(), "torch": torch.__version__},
           "command": "python3 -m benchmarks.probes.flush_cost " + " ".join(argv if argv is not None else sys.argv[1:]),
           "timing": {"reps": args.reps, "flush_bytes": FLUSH_BYTES, "batch": BATCH, "features": FEATURES},
           "rows": rows}
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"flush-cost-{props.name.replace(' ', '_')}-{stamp}.json"
    path.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
