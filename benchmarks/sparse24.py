"""2:4 sparse W on gemmscape's sparse24 kernels against dense cuBLAS and cuSPARSELt, in one run.

Two kinds of record, every one with both baselines measured beside ours in the same process:

- ``search`` (prefill-shaped, ``"timing": "cold_single"``): a real ``codegen search --sparsity 2:4
  --budget B`` per shape and dtype, each into a store file of its own (no warm start), as the search
  times a kernel (one call, L2 flushed); the summary's best with the baselines it measured on the same
  2:4 W: ``cublas`` (the W dense, its pruned half zero) and ``cusparselt`` (torch's semi-structured
  tensor). Resumable across device calls (benchmarks.steps).
- ``engine`` (decode-shaped, ``"timing": "engine"``): ``Sparse24Linear``'s forward at M rows on the
  sparse24 kernels (the family's built-in seeds, or ``--bundle``) in engine timing
  (codegen.nn.timing: copies of W past L2, many calls in a captured CUDA graph) against ``F.linear`` on
  each copy's dense masked W (cuBLAS), then cuSPARSELt's ``F.linear`` on the same masked W as a
  semi-structured tensor, captured alike against cuBLAS again (where torch cannot capture or take the
  shape, the record says why and has no cusparselt baseline).

    python3 -m benchmarks.sparse24 run --dir DIR [--budget 6] [--deadline-s 300]
    python3 -m benchmarks.sparse24 engine --dir DIR [--batches 1 16 64]
    python3 -m benchmarks.sparse24 report --dir DIR [--out benchmarks/results]

``report`` writes ``sparse24-<device>-<date>.json`` (DESIGN.md's format: problems with ``"sparsity":
"2:4", "density": 0.5``; ``ratio[name] = baseline / ours``, above 1: ours is faster).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from benchmarks.steps import Planned, load_steps, run_steps

RESULTS = Path(__file__).resolve().parent / "results"
#: Prefill-shaped GEMMs (MxNxK): square, and LLaMA-3-8B's MLP up (N 14336) and down (K 14336) at 2048 tokens.
SHAPES = ("4096x4096x4096", "8192x8192x8192", "2048x14336x4096", "2048x4096x14336")
#: Decode-shaped layers (NxK: out x in) and their batches, in engine timing.
LAYERS = ("14336x4096", "4096x14336")
BATCHES = (1, 16, 64)
DTYPES = ("bf16", "fp16")
ENGINE_FILE = "engine.json"


def _dims(text: str) -> tuple[int, ...]:
    return tuple(int(v) for v in text.split("x"))


def problem_dict(m: int, n: int, k: int, dtype: str, bias: bool = False) -> dict:
    return {"m": m, "n": n, "k": k, "dtype": dtype, "layout": "forward", "bias": bias, "density": 0.5,
            "block": None, "sparsity": "2:4"}


def search_args(shape: str, dtype: str, budget: int, db: Path, replay: Path | None = None) -> tuple:
    m, n, k = _dims(shape)
    args = ["-m", "codegen", "search", "--m", str(m), "--n", str(n), "--k", str(k), "--dtype", dtype,
            "--sparsity", "2:4", "--budget", str(budget), "--db", f"sqlite:///{db.resolve()}", "--no-warm-start",
            "--quiet", "--json"]
    return tuple(args + (["--replay", str(replay)] if replay else []))


def plan(args: argparse.Namespace) -> list[Planned]:
    return [Planned(f"{shape}-{dtype}", search_args(shape, dtype, args.budget, args.dir / f"{shape}-{dtype}.db"),
                    {"shape": shape, "dtype": dtype, "budget": args.budget})
            for dtype in args.dtypes for shape in args.shapes]


def ratios(ours_ms: float | None, baselines: dict) -> dict:
    """baseline / ours per named baseline that has a time (above 1: ours is faster)."""
    return {name: round(b["median_ms"] / ours_ms, 4) for name, b in baselines.items()
            if isinstance(b, dict) and b.get("median_ms") and ours_ms}


def search_records(steps: list[dict]) -> list[dict]:
    """One record per search that ended with a best kernel (the last run of each step)."""
    last = {s["step"]: s for s in steps}
    out = []
    for s in last.values():
        best = (s.get("summary") or {}).get("best") if s.get("rc") == 0 else None
        if not best:
            continue
        m, n, k = _dims(s["shape"])
        base = {name: {key: b.get(key) for key in ("median_ms", "p20_ms", "p80_ms")}
                for name, b in (best.get("baselines") or {}).items() if isinstance(b, dict)}
        ours = {key: best.get(key) for key in ("kernel", "family", "median_ms", "p20_ms", "p80_ms", "tflops", "gbps")}
        ours["search"] = {"sampler": s["summary"].get("sampler"), "budget": s.get("budget"),
                          "evaluated": s["summary"].get("evaluated"), "wall_s": s.get("wall_s")}
        rec = {"problem": problem_dict(m, n, k, s["dtype"]), "timing": "cold_single", "ours": ours,
               "baselines": base, "ratio": ratios(ours["median_ms"], base)}
        note = (best.get("baselines") or {}).get("note")
        if note:
            rec["note"] = note
        out.append(rec)
    return out


# ---- decode shapes in engine timing (a GPU and torch) ---------------------------------------------------------------
def cusparselt_in_engine(problem, copies: int, calls: int) -> tuple[list, list, float]:
    """cuSPARSELt's F.linear on a 2:4 W as torch's semi-structured tensor against F.linear on the same
    W dense, both captured and timed as engine timing does (codegen.nn.timing.time_in_graphs)."""
    import torch
    import torch.nn.functional as F
    from torch.sparse import SparseSemiStructuredTensor, to_sparse_semi_structured

    from codegen.nn.layer import Kernels
    from codegen.nn.timing import TORCH_DTYPES, sparse24_copies, time_in_graphs

    SparseSemiStructuredTensor._FORCE_CUTLASS = False
    dtype = getattr(torch, TORCH_DTYPES[problem.dtype.value])
    gen = torch.Generator(device="cuda").manual_seed(1)
    xs = [torch.randn(problem.m, problem.k, device="cuda", dtype=dtype, generator=gen) for _ in range(copies)]
    ws = [layer.dense_weight().detach() for layer in sparse24_copies(problem, Kernels(None), copies,
                                                                     [None] * copies, gen)]
    semi = [to_sparse_semi_structured(w) for w in ws]
    return time_in_graphs(lambda i: F.linear(xs[i], semi[i]), lambda i: F.linear(xs[i], ws[i]),
                          lambda i: xs[i].double() @ ws[i].double().T, copies, calls)


def engine_record(problem, kernels) -> dict:
    from codegen.nn.timing import engine_timing, stats

    t = engine_timing(problem, kernels)
    ours = {"kernel": t.ran, **stats(t.ours), "rel_error": t.rel_error}
    base = {"cublas": {k: v for k, v in stats(t.torch).items() if k in ("median_ms", "p20_ms", "p80_ms")}}
    rec = {"problem": problem_dict(problem.m, problem.n, problem.k, problem.dtype.value), "timing": "engine",
           "ours": ours, "baselines": base, "engine": t.engine}
    try:
        sp, dense, rel = cusparselt_in_engine(problem, t.engine["copies"], t.engine["calls_per_replay"])
        base["cusparselt"] = {**{k: v for k, v in stats(sp).items() if k in ("median_ms", "p20_ms", "p80_ms")},
                              "rel_error": rel, "cublas_again_ms": stats(dense)["median_ms"]}
    except Exception as e:  # torch cannot take the shape or capture it: said, no baseline
        rec["note"] = f"cusparselt: {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
    rec["ratio"] = {} if t.wrong else ratios(ours["median_ms"], base)
    rec["check"] = {"rel_error": t.rel_error, "ok": not t.wrong}
    return rec


def cmd_engine(args: argparse.Namespace) -> int:
    import torch

    from codegen.nn.bundle import SeedKernels
    from codegen.nn.layer import kernels_from
    from codegen.problem import DType, Problem

    kernels = kernels_from(args.bundle if args.bundle else SeedKernels())
    path = args.dir / ENGINE_FILE
    args.dir.mkdir(parents=True, exist_ok=True)
    done = json.loads(path.read_text()) if path.exists() else {"device": torch.cuda.get_device_name(), "records": []}
    seen = {(r["problem"]["m"], r["problem"]["n"], r["problem"]["k"], r["problem"]["dtype"]) for r in done["records"]}
    for dtype in args.dtypes:
        for layer in args.layers:
            n, k = _dims(layer)
            for m in args.batches:
                if (m, n, k, dtype) in seen:
                    continue
                problem = Problem(m, n, k, DType(dtype), sparsity="2:4", density=0.5)
                started = time.monotonic()
                rec = engine_record(problem, kernels)
                rec["wall_s"] = round(time.monotonic() - started, 1)
                done["records"].append(rec)
                path.write_text(json.dumps(done, indent=1) + "\n")  # each record kept as soon as it is measured
                print(line(rec), flush=True)
    done["kernels"] = getattr(kernels.source, "location", None)
    path.write_text(json.dumps(done, indent=1) + "\n")
    return 0


def line(r: dict) -> str:
    p, o, b = r["problem"], r["ours"], r["baselines"]

    def us(x):
        return f"{x['median_ms'] * 1e3:9.1f} us" if x and x.get("median_ms") else "        - us"
    ratio = r.get("ratio") or {}
    return (f"{p['m']}x{p['n']}x{p['k']} {p['dtype']} {r['timing']:11s} ours {us(o)} cuBLAS {us(b.get('cublas'))} "
            f"cuSPARSELt {us(b.get('cusparselt'))}  x cuBLAS {ratio.get('cublas')} x cuSPARSELt {ratio.get('cusparselt')}"
            f"  {str(o.get('kernel'))[:60]}")


def cmd_report(args: argparse.Namespace) -> int:
    steps = load_steps(args.dir)
    recs = search_records(steps)
    engine = json.loads((args.dir / ENGINE_FILE).read_text()) if (args.dir / ENGINE_FILE).exists() else {}
    recs += engine.get("records", [])
    if not recs:
        print(f"sparse24 report: nothing measured in {args.dir}", file=sys.stderr)
        return 1
    ended = [s for s in steps if s.get("summary")]
    device = engine.get("device") or ((ended[0]["summary"].get("device") or {}).get("name") if ended else None) \
        or "unknown"
    versions = {k: v for k, v in ((ended[0]["summary"].get("device") or {}) if ended else {}).items()
                if k in ("nvrtc", "driver")}
    started = min([s["started"] for s in steps] or [datetime.now(UTC).isoformat()])[:19]
    doc = {"suite": "sparse24", "date": started + "Z", "device": device, "versions": versions,
           "command": "python3 -m benchmarks.sparse24 run, engine, report (benchmarks/device/sparse24.sh)",
           "settings": {"budget": (steps[0].get("budget") if steps else None), "kernels_engine": engine.get("kernels"),
                        "stores": "one SQLite file per search, none warm-started"},
           "steps": [{k: s.get(k) for k in ("step", "rc", "started", "wall_s")} for s in steps],
           "records": recs}
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"sparse24-{device.replace(' ', '_')}-{started[:10]}T{started[11:19].replace(':', '')}Z.json"
    path.write_text(json.dumps(doc, indent=1) + "\n")
    for r in recs:
        print(line(r))
    print(f"wrote {path}")
    return 0


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("run", "engine", "report"):
        p = sub.add_parser(name)
        p.add_argument("--dir", type=Path, required=True, help="the stores, steps.jsonl and engine.json")
        p.add_argument("--dtypes", nargs="+", default=list(DTYPES), choices=DTYPES)
    run = sub.choices["run"]
    run.add_argument("--shapes", nargs="+", default=list(SHAPES), help="MxNxK of the searches")
    run.add_argument("--budget", type=int, default=6, help="trials per search")
    run.add_argument("--deadline-s", type=float, default=300.0)
    eng = sub.choices["engine"]
    eng.add_argument("--layers", nargs="+", default=list(LAYERS), help="NxK (out x in) of the decode layers")
    eng.add_argument("--batches", nargs="+", type=int, default=list(BATCHES))
    eng.add_argument("--bundle", help="a bundle of tuned kernels (default: the sparse24 family's built-in seeds)")
    sub.choices["report"].add_argument("--out", type=Path, default=RESULTS)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    if args.cmd == "run":
        return run_steps(args.dir, plan(args), args.deadline_s, "sparse24")
    return cmd_engine(args) if args.cmd == "engine" else cmd_report(args)


if __name__ == "__main__":
    sys.exit(main())
