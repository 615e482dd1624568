"""Engine timing of LLaMA-3-8B's linear layers: gemmscape's forward and cuBLAS's, in one run.

The harness is codegen.nn.timing's (its docstring says how an engine runs a layer and how this times
it: distinct weights far past L2, called back to back in one captured CUDA graph, time per call;
ours and torch's op in alternating rounds, ours checked against float64 first). Ours is the layer's
forward with kernels from a bundle, a store, or the families' built-in seeds: where the bundle's
verdict says cuBLAS won, that is torch's op, as the layer runs it, unless ``--ours-everywhere``.
Each record says ``"timing": "engine"``.

    python3 -m benchmarks.engine [--bundle DIR | --db URL] [--ours-everywhere] [--shapes decode prefill] [--out DIR]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import sys
from pathlib import Path

from codegen.nn.timing import L2_FACTOR, MAX_COPIES, MIN_CALLS, MIN_COPIES, REPS, ROUNDS, calls_for, copies_for, stats

__all__ = ["BATCHES", "L2_FACTOR", "LAYERS", "MAX_COPIES", "MIN_CALLS", "MIN_COPIES", "calls_for", "copies_for",
           "main", "measure", "record", "shapes", "stats"]

RESULTS = Path(__file__).resolve().parent / "results"
#: LLaMA-3-8B's linear layers (N x K, out x in): MLP up/gate, MLP down, the fused QKV projection.
LAYERS = ((14336, 4096), (4096, 14336), (6144, 4096))
#: Rows per call: decode batches, and a prefill of 2048 tokens.
BATCHES = {"decode": (1, 16, 64), "prefill": (2048,)}


def shapes(phases: list[str], dtype: str = "bf16") -> list[dict]:
    """The problems timed, as DESIGN.md's problem records (forward, no bias, dense W)."""
    return [{"m": m, "n": n, "k": k, "dtype": dtype, "layout": "forward", "bias": False, "density": 1.0,
             "block": None} for phase in phases for m in BATCHES[phase] for n, k in LAYERS]


def record(problem: dict, ours: list[float], cublas: list[float], ran: str, rel_error: float, engine: dict) -> dict:
    """One DESIGN.md record of engine timing; a wrong result has no ratio. For a block-sparse W (a
    problem with a ``block``) ours moves its kept blocks and their block columns and does the kept
    blocks' flops (codegen.problem.Problem.min_bytes, .flops), cuBLAS the dense W's."""
    from codegen.problem import DType, Problem

    mine, theirs = stats(ours), stats(cublas)
    itemsize = DType(problem["dtype"]).itemsize
    moved = itemsize * (problem["n"] * problem["k"] + problem["m"] * (problem["k"] + problem["n"]))
    wrong = not rel_error <= DType(problem["dtype"]).rel_tol
    flops = 2.0 * problem["m"] * problem["n"] * problem["k"]
    dense_moved = moved
    if problem.get("block"):
        sparse = Problem.from_dict(problem)
        moved, flops = sparse.min_bytes, sparse.flops
    return {
        "problem": problem,
        "timing": "engine",
        "engine": engine,
        "ours": {"kernel": None if ran.startswith("torch") else ran, "ran": ran, **mine, "rel_error": rel_error,
                 "status": "wrong_result" if wrong else "ok",
                 "tflops": flops / (mine["median_ms"] * 1e-3) / 1e12, "gbps": moved / (mine["median_ms"] * 1e-3) / 1e9},
        "baselines": {"cublas": {**theirs, "gbps": dense_moved / (theirs["median_ms"] * 1e-3) / 1e9}},
        "ratio": {"cublas": None if wrong else theirs["median_ms"] / mine["median_ms"]},
    }


# ---- on the GPU -------------------------------------------------------------------------------------
def measure(problem: dict, kernels, l2_bytes: int, reps: int, rounds: int) -> dict:
    """Engine timing of ours and cuBLAS on one problem (codegen.nn.timing.engine_timing), as a record."""
    from codegen.nn.timing import engine_timing
    from codegen.problem import Problem

    got = engine_timing(Problem.from_dict(problem), kernels, l2_bytes=l2_bytes, reps=reps, rounds=rounds)
    return record(problem, got.ours, got.torch, got.ran, got.rel_error, got.engine)


def kernels_of(args: argparse.Namespace):
    from codegen.nn import kernels_from
    from codegen.nn.bundle import SeedKernels

    everywhere = getattr(args, "ours_everywhere", False)
    also = ", ours everywhere (cuBLAS's wins ignored)" if everywhere else ""
    if args.bundle:
        return kernels_from(args.bundle, ours_everywhere=everywhere), f"bundle {args.bundle}{also}"
    if args.db:
        return kernels_from(args.db, ours_everywhere=everywhere), f"store {args.db}{also}"
    return kernels_from(SeedKernels(), ours_everywhere=everywhere), f"the families' built-in seeds (untuned){also}"


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python3 -m benchmarks.engine", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    where = ap.add_mutually_exclusive_group()
    where.add_argument("--bundle", type=Path, help="kernels from this bundle (codegen export --bundle, tune-model)")
    where.add_argument("--db", help="kernels from this store URL (default: the families' built-in seeds)")
    ap.add_argument("--ours-everywhere", action="store_true",
                    help="run our kernel wherever one is found, also where the bundle's verdict says cuBLAS won")
    ap.add_argument("--shapes", nargs="+", choices=sorted(BATCHES), default=["decode", "prefill"])
    ap.add_argument("--dtype", choices=("bf16", "fp16"), default="bf16")
    ap.add_argument("--reps", type=int, default=REPS, help=f"timed replays of each graph (default {REPS})")
    ap.add_argument("--rounds", type=int, default=ROUNDS,
                    help=f"alternating rounds of ours and cuBLAS, each first in half of them (default {ROUNDS})")
    ap.add_argument("--out", type=Path, default=RESULTS, help="folder of the results JSON")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("benchmarks.engine: needs a CUDA GPU visible to torch", file=sys.stderr)
        return 2
    from codegen.compile import nvrtc_version
    from codegen.nn import timing as harness
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
               "timing": {"method": "engine", "note": harness.__doc__.split("\n\n")[1]}, "records": records}
        args.out.mkdir(parents=True, exist_ok=True)
        part = path.with_suffix(".part")
        part.write_text(json.dumps(doc, indent=1) + "\n")
        part.replace(path)  # written after each problem: nothing measured is lost to a crash
    print(f"wrote {path}")
    return 0 if all(r["ratio"]["cublas"] is not None for r in records) else 1


if __name__ == "__main__":
    raise SystemExit(main())
