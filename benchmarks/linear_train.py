"""The whole linear layer on the GPU: nn.Linear against gemmscape's Linear (codegen.nn), in one run.

    python3 -m benchmarks.linear_train [--bundle DIR | --db URL] [--ours-everywhere] [--out DIR] [--reps N] [--no-bias]
                                       [--batches 32 4096] [--dtypes bf16 fp32] [--modes forward train] [--graphs]
                                       [--backward overlap serial]

For each batch (in = out = 4096, with bias as nn.Linear has by default, or --no-bias), dtype and mode: the
layer's ``forward`` alone (under no_grad), or ``train``, forward then backward with a given dY
(``torch.autograd.grad`` for dX, dW, db). Both layers share one weight and bias, and are timed in
alternating rounds, each call alone between CUDA events after an L2 flush: ``eager`` timing, which
counts the host's work before each launch (Python, autograd, codegen.nn's lookups). With ``--graphs``
each case is also timed as ``cuda_graph``: both layers' calls (train: forward + autograd.grad) captured
in a CUDA graph after a warm-up on a side stream, and the graph's replays timed the same way, so the
figure is the GPU's time without the host's launch cost; each record says which (``timing``). ``--backward``
times ours in training with both backward GEMMs on one stream (``serial``, codegen.nn's default) and/or dW
on a side stream beside dX (``overlap``); each train record's ``ours.backward`` says which. Kernels come from the
bundle or store given, else from the families' built-in seeds (codegen.bundle.SeedKernels: no
search; the Hopper family first for 16-bit layers of 256 rows or more). A GEMM with no kernel runs
torch's op (codegen.nn's fallback), and so does one whose verdict says cuBLAS won, unless --ours-everywhere;
each record says which GEMM ran what. Every output (y, dX, dW, db)
of both layers (for graphs: from a replay into outputs poisoned with NaN) is compared with float64 first; ours past the dtype's bound makes the record
`wrong_result` with no ratio. Writes ``linear-<device>-<UTC date-time>.json`` (format: DESIGN.md; layout ``forward`` or
``train``, baseline ``torch_linear``) to benchmarks/results/ or DIR. About 40 s on an H200 (eager;
--graphs adds the graph records, not yet timed on the device).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

from codegen.nn.step import capture, relative_error
from codegen.nn.step import reference as layer_reference

RESULTS = Path(__file__).resolve().parent / "results"
FEATURES = 4096
MODES = ("forward", "train")
TIMINGS = ("eager", "cuda_graph")
BACKWARDS = ("serial", "overlap")
DTYPES = ("bf16", "fp32")
BATCHES = (32, 4096)
FLUSH_BYTES = 256 << 20


@dataclass(frozen=True)
class Case:
    batch: int
    dtype: str
    mode: str
    features: int = FEATURES
    bias: bool = True

    @property
    def flops(self) -> float:
        """2·M·N·K for the forward GEMM; three GEMMs of that size in training."""
        return (3 if self.mode == "train" else 1) * 2.0 * self.batch * self.features * self.features

    def problem(self) -> dict:
        return {"m": self.batch, "n": self.features, "k": self.features, "dtype": self.dtype, "layout": self.mode,
                "bias": self.bias, "density": 1.0, "block": None}


def cases(batches, dtypes, modes, bias: bool = True) -> list[Case]:
    return [Case(b, d, m, bias=bias) for b in batches for d in dtypes for m in modes]


def stats(times: list[float]) -> dict:
    """Median, 20th and 80th percentiles and the range of ``times`` (ms)."""
    ordered = sorted(times)

    def pct(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * (len(ordered) - 1) + 0.5))]

    return {"median_ms": statistics.median(ordered), "p20_ms": pct(0.2), "p80_ms": pct(0.8),
            "min_ms": ordered[0], "max_ms": ordered[-1], "reps": len(ordered)}


def record(case: Case, ours: list[float], base: list[float], gemms: dict, rel_error: dict, selection: str,
           timing: str = "eager", backward: str | None = None) -> dict:
    """One DESIGN.md record: ours (which kernel ran each GEMM, and in training how the backward's
    two GEMMs shared the GPU: ``overlap`` or ``serial``), the torch_linear baseline, the ratio, and
    how the calls were timed (``eager`` calls or ``cuda_graph`` replays)."""
    mine, theirs = stats(ours), stats(base)
    named = [v for v in gemms.values() if v and not v.startswith("torch")]
    wrong = check(case, rel_error)
    return {
        "problem": case.problem(),
        "timing": timing,
        "ours": {"kernel": " + ".join(named) if named else None, "gemms": gemms, **mine,
                 "tflops": case.flops / (mine["median_ms"] * 1e-3) / 1e12, "rel_error": rel_error,
                 "status": f"wrong_result: {', '.join(wrong)}" if wrong else "ok",
                 "search": {"sampler": None, "selection": selection},
                 **({"backward": backward} if case.mode == "train" and backward else {})},
        "baselines": {"torch_linear": theirs},
        "ratio": {"torch_linear": None if wrong else theirs["median_ms"] / mine["median_ms"]},
    }


def table(records: list[dict]) -> str:
    lines = [f"{'batch':>6s} {'dtype':5s} {'mode':8s} {'timing':10s} {'backward':8s} {'nn.Linear us':>13s} "
             f"{'ours us':>9s} {'ratio':>6s}  gemms"]
    for r in records:
        p, o = r["problem"], r["ours"]
        gemms = ", ".join(f"{k}: {'torch' if str(v).startswith('torch') else 'gemmscape'}" for k, v in o["gemms"].items())
        lines.append(f"{p['m']:6d} {p['dtype']:5s} {p['layout']:8s} {r.get('timing', 'eager'):10s} {o.get('backward', '-'):8s} {r['baselines']['torch_linear']['median_ms'] * 1e3:13.1f} "
                     f"{o['median_ms'] * 1e3:9.1f} {r['ratio']['torch_linear'] or float('nan'):6.2f}  {gemms}"
                     + ("" if o.get("status", "ok") == "ok" else f"  {o['status'].upper()}"))
    return "\n".join(lines)


# ---- on the GPU -------------------------------------------------------------------------------------
def reference(case: Case, x, weight, bias, dy) -> dict:
    """The float64 results of the layer's GEMMs: y, and in training dX, dW (and db)."""
    return layer_reference(x, weight, bias, dy if case.mode == "train" else None)


def check(case: Case, rel: dict) -> list[str]:
    """Which of our outputs miss the dtype's bound against float64 (codegen.problem.DType.rel_tol)."""
    from codegen.problem import DType

    bound = DType(case.dtype).rel_tol
    return [name for name, e in rel.items() if not name.endswith("_torch_linear") and not e <= bound]


def measure(case: Case, kernels, reps: int, rounds: int = 5, timing: str = "eager"):
    """Time nn.Linear and gemmscape's Linear on ``case`` (alternating rounds), as eager calls or as
    replays of a CUDA graph of each (``timing``); their results' relative errors against float64
    (Frobenius; each output's status is judged in ``record``); which GEMM ran what."""
    import torch

    from codegen.nn import Linear
    from codegen.problem import Layout, linear_problems

    tdtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[case.dtype]
    torch.manual_seed(0)
    dev = torch.device("cuda")
    base = torch.nn.Linear(case.features, case.features, bias=case.bias, device=dev, dtype=tdtype)
    ours = Linear.from_linear(base, kernels)
    x = torch.randn(case.batch, case.features, device=dev, dtype=tdtype, requires_grad=case.mode == "train")
    dy = torch.randn(case.batch, case.features, device=dev, dtype=tdtype)
    params = [x, base.weight] + ([base.bias] if case.bias else [])
    flush = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device=dev)

    def run(layer):  # forward alone, or forward then backward
        if case.mode == "forward":
            with torch.no_grad():
                return (layer(x),)
        y = layer(x)
        return (y, *torch.autograd.grad(y, params, dy))

    layers = {"base": base, "ours": ours}
    if timing == "eager":
        outputs = {label: run(layer) for label, layer in layers.items()}  # warm-up, compiles and loads our kernels
        calls = {label: (lambda layer=layer: run(layer)) for label, layer in layers.items()}
    else:
        outputs, calls = {}, {}
        for label, layer in layers.items():
            graph, outputs[label] = capture(lambda layer=layer: run(layer))
            calls[label] = graph.replay
            with torch.no_grad():  # a replay must write every output: poison them first
                for t in outputs[label]:
                    t.fill_(float("nan"))
            graph.replay()
        torch.cuda.synchronize()
    exact = reference(case, x.detach(), base.weight.detach(), base.bias, dy)
    rel = {}
    for (name, e), b, a in zip(exact.items(), outputs["ours"], outputs["base"], strict=True):
        rel[name], rel[f"{name}_torch_linear"] = relative_error(e, b), relative_error(e, a)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = {"ours": [], "base": []}
    per_round = max(1, reps // rounds)
    for _ in range(rounds):
        for label in ("base", "ours"):
            for _ in range(per_round):
                flush.zero_()
                start.record()
                calls[label]()
                end.record()
                end.synchronize()
                times[label].append(start.elapsed_time(end))
    problems = linear_problems(case.batch, case.features, case.features, case.dtype, case.bias)
    layouts = [Layout.forward] if case.mode == "forward" else list(Layout)
    gemms = {layout.value: kernels.used(problems[layout], x.device) or "torch: not asked" for layout in layouts}
    return times["ours"], times["base"], gemms, rel


def device_info() -> dict:
    import torch

    from codegen.compile import nvrtc_version

    props = torch.cuda.get_device_properties(0)
    return {"name": props.name, "sm": f"sm_{props.major}{props.minor}", "torch": torch.__version__,
            "nvrtc": nvrtc_version()}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python3 -m benchmarks.linear_train", description=__doc__.split("\n\n")[0])
    src = p.add_mutually_exclusive_group()
    src.add_argument("--bundle", type=Path, help="kernels from this bundle (codegen export --bundle)")
    src.add_argument("--db", help="kernels from this store URL")
    p.add_argument("--ours-everywhere", action="store_true",
                   help="run our kernel wherever one is found, also where its verdict says cuBLAS won")
    p.add_argument("--out", type=Path, default=RESULTS, help="folder for the results JSON")
    p.add_argument("--reps", type=int, default=50, help="timed calls per layer and case")
    p.add_argument("--batches", type=int, nargs="+", default=list(BATCHES))
    p.add_argument("--dtypes", nargs="+", choices=DTYPES, default=list(DTYPES))
    p.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    p.add_argument("--bias", action=argparse.BooleanOptionalAction, default=True,
                   help="layers with a bias, as nn.Linear's default (--no-bias: without)")
    p.add_argument("--backward", nargs="+", choices=BACKWARDS, default=[BACKWARDS[0]],
                   help="train cases: ours with both backward GEMMs on one stream (serial, the layer's default) "
                        "and/or dW on a side stream beside dX (overlap), each timed and recorded")
    p.add_argument("--graphs", action="store_true",
                   help="also time each case as CUDA graph replays (GPU time without the host's launch cost); "
                        "records say `timing`: eager or cuda_graph")
    return p


def timings(args: argparse.Namespace) -> tuple[str, ...]:
    """How each case is timed: eager calls, and with --graphs CUDA graph replays too."""
    return TIMINGS if args.graphs else ("eager",)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)

    import torch

    from codegen.nn import kernels_from
    from codegen.nn.bundle import SeedKernels
    from codegen.versions import versions

    if not torch.cuda.is_available():
        print("linear_train: no CUDA GPU visible to torch", file=sys.stderr)
        return 2
    if args.bundle or args.db:
        kernels = kernels_from(args.bundle if args.bundle else args.db, ours_everywhere=args.ours_everywhere)
        selection = f"tuned: the fastest stored kernel per GEMM from {kernels.source.location}"
    else:
        kernels = kernels_from(SeedKernels(), ours_everywhere=args.ours_everywhere)
        selection = "hand-picked: a built-in seed per GEMM (codegen.bundle.SeedKernels), no search"
    if args.ours_everywhere:
        selection += "; ours everywhere (cuBLAS's wins ignored)"
    info = device_info()
    stamp = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H%M%SZ")
    records = []
    for case in cases(args.batches, args.dtypes, args.modes, args.bias):
        for timing in timings(args):
            for backward in (args.backward if case.mode == "train" else [None]):
                kernels.overlap_backward = backward == "overlap"
                ours, base, gemms, rel = measure(case, kernels, args.reps, timing=timing)
                records.append(record(case, ours, base, gemms, rel, selection, timing, backward))
                print(table(records[-1:]).splitlines()[1], flush=True)
    doc = {"suite": "linear", "date": stamp, "device": info["name"],
           "versions": {**versions(), "sm": info["sm"], "torch": info["torch"], "nvrtc": info["nvrtc"]},
           "command": "python3 -m benchmarks.linear_train " + " ".join(argv if argv is not None else sys.argv[1:]),
           "timing": {"reps": args.reps, "rounds": 5, "l2_flush_bytes": FLUSH_BYTES,
                      "kinds": list(timings(args)),
                      "note": "CUDA events around each call (train: forward + autograd.grad), alternating rounds; "
                              "a record's `timing`: eager calls, or cuda_graph replays of the same calls captured"},
           "records": records}
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"linear-{info['name'].replace(' ', '_')}-{stamp}.json"
    path.write_text(json.dumps(doc, indent=1) + "\n")
    print(table(records))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
