"""Engine timing: linear layers timed the way an inference engine runs them.

An engine calls each layer once per step, with a different weight each time, inside a captured CUDA
graph: every call reads its W cold from HBM and no launch waits on the host. Timing one call with
L2 flushed makes a skinny GEMM look slow (a fixed cost per isolated launch), so claims for small
batches come from this harness instead. For each shape it makes ``copies`` distinct weights (and
inputs and outputs), together at least ``L2_FACTOR`` times the L2 cache, captures one graph that
calls the layer ``calls`` times over them in turn, and replays it: time per call = replay time ÷
calls. gemmscape's forward (``codegen.nn``: a bundle, a store, or the families' built-in seeds;
where the bundle says cuBLAS won, torch's op, as the layer runs it) and cuBLAS (``F.linear``) are
timed in alternating rounds in one run. Each record says ``"timing": "engine"``.

Before timing, every copy's output of ours is checked against float64 (its output poisoned with
NaN first, then written by a replay of the graph).

    python3 -m benchmarks.engine [--bundle DIR | --db URL] [--shapes decode prefill] [--out DIR]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import re
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
#: LLaMA-3-8B's linear layers (N x K, out x in): MLP up/gate, MLP down, the fused QKV projection.
LAYERS = ((14336, 4096), (4096, 14336), (6144, 4096))
#: Rows per call: decode batches, and a prefill of 2048 tokens.
BATCHES = {"decode": (1, 16, 64), "prefill": (2048,)}
#: The weights of one replay are at least this many times the L2 cache.
L2_FACTOR = 4
#: Copies at least and at most, and calls per replay at least.
MIN_COPIES, MAX_COPIES, MIN_CALLS = 4, 64, 24


def copies_for(weight_bytes: int, l2_bytes: int) -> int:
    """Distinct weights so that together they are at least ``L2_FACTOR`` L2 caches."""
    return max(MIN_COPIES, min(MAX_COPIES, math.ceil(L2_FACTOR * l2_bytes / weight_bytes)))


def calls_for(copies: int) -> int:
    """Calls per replay: whole rounds over the copies, at least ``MIN_CALLS``."""
    return copies * math.ceil(MIN_CALLS / copies)


def shapes(phases: list[str], dtype: str = "bf16") -> list[dict]:
    """The problems timed, as DESIGN.md's problem records (forward, no bias, dense W)."""
    return [{"m": m, "n": n, "k": k, "dtype": dtype, "layout": "forward", "bias": False, "density": 1.0,
             "block": None} for phase in phases for m in BATCHES[phase] for n, k in LAYERS]


def stats(per_call_ms: list[float]) -> dict:
    """Median, p20, p80 and range of the per-call times (ms) of the replays."""
    ordered = sorted(per_call_ms)

    def pct(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * (len(ordered) - 1) + 0.5))]

    return {"median_ms": pct(0.5), "p20_ms": pct(0.2), "p80_ms": pct(0.8), "min_ms": ordered[0],
            "max_ms": ordered[-1], "reps": len(ordered)}


def record(problem: dict, ours: list[float], cublas: list[float], ran: str, rel_error: float, engine: dict) -> dict:
    """One DESIGN.md record of engine timing; a wrong result has no ratio."""
    from codegen.problem import DType

    mine, theirs = stats(ours), stats(cublas)
    itemsize = DType(problem["dtype"]).itemsize
    moved = itemsize * (problem["n"] * problem["k"] + problem["m"] * (problem["k"] + problem["n"]))
    wrong = not rel_error <= DType(problem["dtype"]).rel_tol
    flops = 2.0 * problem["m"] * problem["n"] * problem["k"]
    return {
        "problem": problem,
        "timing": "engine",
        "engine": engine,
        "ours": {"kernel": None if ran.startswith("torch") else ran, "ran": ran, **mine, "rel_error": rel_error,
                 "status": "wrong_result" if wrong else "ok",
                 "tflops": flops / (mine["median_ms"] * 1e-3) / 1e12, "gbps": moved / (mine["median_ms"] * 1e-3) / 1e9},
        "baselines": {"cublas": {**theirs, "gbps": moved / (theirs["median_ms"] * 1e-3) / 1e9}},
        "ratio": {"cublas": None if wrong else theirs["median_ms"] / mine["median_ms"]},
    }


# ---- on the GPU -------------------------------------------------------------------------------------
def measure(problem: dict, kernels, l2_bytes: int, reps: int, rounds: int) -> dict:
    """Engine timing of ours and cuBLAS on one problem (see the module)."""
    import torch
    import torch.nn.functional as F

    from codegen.nn.layer import linear_forward
    from codegen.nn.step import capture, relative_error
    from codegen.problem import Problem

    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[problem["dtype"]]
    m, n, k = problem["m"], problem["n"], problem["k"]
    copies = copies_for(n * k * dtype.itemsize, l2_bytes)
    calls = calls_for(copies)
    gen = torch.Generator(device="cuda").manual_seed(0)
    ws = [torch.randn(n, k, device="cuda", dtype=dtype, generator=gen) * k ** -0.5 for _ in range(copies)]
    xs = [torch.randn(m, k, device="cuda", dtype=dtype, generator=gen) for _ in range(copies)]

    def ours():
        return [linear_forward(kernels, xs[i % copies], ws[i % copies], None) for i in range(calls)]

    def theirs():
        return [F.linear(xs[i % copies], ws[i % copies]) for i in range(calls)]

    graphs = {}
    for label, fn in (("ours", ours), ("cublas", theirs)):
        graph, outputs = capture(fn)
        for y in outputs:
            y.fill_(float("nan"))  # a replay must write every output
        graph.replay()
        graphs[label] = (graph, outputs)
    torch.cuda.synchronize()
    rel = max(relative_error(xs[i].double() @ ws[i].double().T, graphs["ours"][1][i]) for i in range(copies))
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times: dict[str, list[float]] = {"ours": [], "cublas": []}
    for _ in range(rounds):
        for label in ("cublas", "ours"):
            graph = graphs[label][0]
            graph.replay()  # warm
            for _ in range(max(1, reps // rounds)):
                start.record()
                graph.replay()
                end.record()
                end.synchronize()
                times[label].append(start.elapsed_time(end) / calls)
    ran = kernels.used(Problem.from_dict(problem), xs[0].device) or "torch: not asked"
    engine = {"copies": copies, "calls_per_replay": calls, "weight_bytes": n * k * dtype.itemsize,
              "l2_bytes": l2_bytes, "replays": len(times["ours"])}
    return record(problem, times["ours"], times["cublas"], ran, rel, engine)


def kernels_of(args: argparse.Namespace):
    from codegen.nn import kernels_from
    from codegen.nn.bundle import SeedKernels

    if args.bundle:
        return kernels_from(args.bundle), f"bundle {args.bundle}"
    if args.db:
        return kernels_from(args.db), f"store {args.db}"
    return kernels_from(SeedKernels()), "the families' built-in seeds (untuned)"


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python3 -m benchmarks.engine", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    where = ap.add_mutually_exclusive_group()
    where.add_argument("--bundle", type=Path, help="kernels from this bundle (codegen export --bundle, tune-model)")
    where.add_argument("--db", help="kernels from this store URL (default: the families' built-in seeds)")
    ap.add_argument("--shapes", nargs="+", choices=sorted(BATCHES), default=["decode", "prefill"])
    ap.add_argument("--dtype", choices=("bf16", "fp16"), default="bf16")
    ap.add_argument("--reps", type=int, default=50, help="timed replays of each graph (default 50)")
    ap.add_argument("--rounds", type=int, default=5, help="alternating rounds of ours and cuBLAS (default 5)")
    ap.add_argument("--out", type=Path, default=RESULTS, help="folder of the results JSON")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("benchmarks.engine: needs a CUDA GPU visible to torch", file=sys.stderr)
        return 2
    from codegen.compile import nvrtc_version
    from codegen.versions import versions

    props = torch.cuda.get_device_properties(0)
    kernels, selection = kernels_of(args)
    stamp = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    path = args.out / f"engine-{re.sub(r'[^A-Za-z0-9]+', '_', props.name)}-{stamp.replace(':', '')}.json"
    records = []
    for problem in shapes(args.shapes, args.dtype):
        r = measure(problem, kernels, props.L2_cache_size, args.reps, args.rounds)
        r["ours"]["selection"] = selection
        records.append(r)
        ratio = r["ratio"]["cublas"]
        print(f"{problem['m']:5d}x{problem['n']}x{problem['k']}  ours {r['ours']['median_ms'] * 1e3:7.1f} us  "
              f"cuBLAS {r['baselines']['cublas']['median_ms'] * 1e3:7.1f} us  "
              f"{'WRONG' if ratio is None else f'{ratio:.3f}x'}  {r['ours']['ran']}", flush=True)
        doc = {"suite": "engine", "date": stamp, "device": props.name,
               "versions": {**versions(), "nvrtc": nvrtc_version(), "torch": torch.__version__,
                            "sm": f"sm_{props.major}{props.minor}"},
               "command": "python3 -m benchmarks.engine " + " ".join(sys.argv[1:] if argv is None else argv),
               "timing": {"method": "engine", "note": __doc__.split("\n\n")[1]}, "records": records}
        args.out.mkdir(parents=True, exist_ok=True)
        part = path.with_suffix(".part")
        part.write_text(json.dumps(doc, indent=1) + "\n")
        part.replace(path)  # written after each problem: nothing measured is lost to a crash
    print(f"wrote {path}")
    return 0 if all(r["ratio"]["cublas"] is not None for r in records) else 1


if __name__ == "__main__":
    raise SystemExit(main())
