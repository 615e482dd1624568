"""Where the train step's GPU time goes: the kernels of one graph-replayed step, ours and nn.Linear's.

    python3 -m benchmarks.probes.train_profile [--db URL] [--batch 32] [--features 4096] [--dtype fp32] [--replays 5]

The layer of ``benchmarks.linear_train`` (in = out = ``--features``, with bias; kernels from the store,
else the built-in seeds): forward, then ``torch.autograd.grad`` for dX, dW and db, captured in a CUDA
graph for gemmscape's Linear and for nn.Linear. Each graph is replayed ``--replays`` times after the
256 MB L2 flush under torch.profiler; for the last replay, every kernel is printed in launch order
with its duration and the idle gap before it, as the profiler's CUDA activity records them (their
sum is the step's busy time; ``linear_train --graphs`` gives the event-timed step). A diagnostic
printed to stdout, not a benchmark record: ratios come from ``linear_train``.
"""

from __future__ import annotations

import argparse
import sys


def profile_step(graph, flush, replays: int) -> list[tuple[str, float, float]]:
    """(kernel, gap before it in µs, duration in µs) of the last of ``replays`` flushed replays."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            flush.zero_()
            graph.replay()
        torch.cuda.synchronize()
    events = sorted((e for e in prof.events() if e.device_type.name == "CUDA"), key=lambda e: e.time_range.start)
    # the flush is the long fill (256 MB, tens of µs); a step may zero small outputs of its own
    last = [i for i, e in enumerate(events) if "fill" in e.name.lower() and e.time_range.elapsed_us() > 20]
    step = events[last[-1] + 1:] if last else events  # what follows the last flush
    rows, end = [], None
    for e in step:
        gap = 0.0 if end is None else e.time_range.start - end
        rows.append((e.name, gap, e.time_range.elapsed_us()))
        end = e.time_range.end
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", help="store URL with the tuned kernels (default: the built-in seeds)")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--features", type=int, default=4096)
    ap.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32")
    ap.add_argument("--replays", type=int, default=5)
    args = ap.parse_args(argv)

    import torch

    from benchmarks.linear_train import FLUSH_BYTES
    from codegen.nn import Linear, kernels_from
    from codegen.nn.bundle import SeedKernels
    from codegen.nn.step import capture

    if not torch.cuda.is_available():
        print("train_profile: no CUDA device", file=sys.stderr)
        return 2
    torch.backends.cuda.matmul.allow_tf32 = False
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    dev = torch.device("cuda")
    kernels = kernels_from(args.db) if args.db else SeedKernels()
    torch.manual_seed(0)
    base = torch.nn.Linear(args.features, args.features, bias=True, device=dev, dtype=dtype)
    ours = Linear.from_linear(base, kernels)
    x = torch.randn(args.batch, args.features, device=dev, dtype=dtype, requires_grad=True)
    dy = torch.randn(args.batch, args.features, device=dev, dtype=dtype)
    params = [x, base.weight, base.bias]
    flush = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device=dev)

    def step(layer):
        y = layer(x)
        return (y, *torch.autograd.grad(y, params, dy))

    print(f"train step {args.batch}x{args.features}->{args.features} {args.dtype} +bias, graph replay, "
          f"{torch.cuda.get_device_name()}")
    for label, layer in (("gemmscape", ours), ("nn.Linear", base)):
        graph, _ = capture(lambda layer=layer: step(layer))
        rows = profile_step(graph, flush, args.replays)
        busy, gaps = sum(r[2] for r in rows), sum(r[1] for r in rows)
        print(f"== {label}: {len(rows)} kernels, {busy:.1f} us busy + {gaps:.1f} us between them = {busy + gaps:.1f} us")
        for name, gap, dur in rows:
            print(f"   gap {gap:6.2f}  {dur:7.2f} us  {name[:100]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
