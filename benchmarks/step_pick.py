"""Pick a linear layer's kernels by their time inside the train step, and write them as a bundle.

    python3 -m benchmarks.step_pick --db URL --bundle DIR [--batch 32] [--features 4096] [--dtype fp32]
                                    [--candidates 6] [--reps 30] [--out DIR]

A store ranks each GEMM's kernels by their time alone (after an L2 flush), and codegen.nn runs the
fastest (codegen.bundle.pick_stored). Inside a train step a kernel can run slower than alone, and not
by the same amount for every kernel: on the H200 (2026-12-04) a grad_input kernel of 40.4 µs alone
took 50.0 in the step where one of 41.4 alone took 43.7-45.3. This picks by the step itself: starting
from the store's choice, for forward, grad_input and grad_weight in turn, each of the GEMM's fastest
stored kernels (up to ``--candidates`` whose stored source fits today's launch plan) replaces the
current one, the step (forward + ``torch.autograd.grad`` for dX, dW, db, captured in a CUDA graph as
``benchmarks.linear_train`` does) is replayed ``--reps`` times after the L2 flush, and the candidate
with the lowest median step stays (every candidate's outputs are checked against float64 first; one
that misses the dtype's bound is not kept). The chosen kernels go into a bundle (``codegen export
--bundle`` layout) for ``linear_train --bundle`` or ``codegen.nn`` to load; every timed step is
written to ``step-pick-<device>-<UTC date-time>.json``. A selection, not a benchmark record: the
figures to quote come from ``linear_train --bundle DIR``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import sys
from pathlib import Path

from benchmarks.linear_train import FLUSH_BYTES, RESULTS, Case, capture, check, reference

LAYOUTS = ("forward", "grad_input", "grad_weight")


class Pinned:
    """A kernel source for codegen.nn that answers each problem with the kernel file pinned for it."""

    def __init__(self, files: dict, location: str) -> None:
        self.files, self.location = files, location

    def find(self, problem, device: str):
        return self.files.get(problem.key) or f"no kernel pinned for {problem.key}"


def candidates(store, problem, device: str, limit: int) -> list[tuple[dict, object]]:
    """(trial row, KernelFile) of the fastest stored kernels of ``problem`` on ``device`` whose source
    fits today's plan, fastest first, at most ``limit``."""
    from codegen.bundle import CANDIDATES, KernelFile
    from codegen.export import ExportError, export_kernel

    found = []
    rows = [r for r in store.best(problem, per_problem=max(CANDIDATES, limit)) if r["device"] == device]
    for row in sorted(rows, key=lambda r: (r["median_ms"], r["id"])):
        try:
            cu, js = export_kernel(store, row["kernel"], problem, arch=row["arch"], source_hash=row["source_hash"],
                                   device_id=row["device_id"])
        except ExportError:  # a source that no longer fits (SourceMismatch) or cannot be shipped
            continue
        found.append((row, KernelFile(json.loads(js), cu, f"store {store.location}")))
        if len(found) == limit:
            break
    return found


def prepare(case: Case, files: dict, tensors: dict):
    """(graph, status) of the train step with the kernels in ``files``, captured in a CUDA graph and
    replayed once into NaN-poisoned outputs that are then checked against float64 (graph None unless
    every GEMM ran its pinned kernel and every output is within the dtype's bound)."""
    import torch

    from codegen.nn import Kernels, Linear
    from codegen.problem import linear_problems

    kernels = Kernels(Pinned(files, "pinned"))
    layer = Linear.from_linear(tensors["base"], kernels)
    x, dy, params = tensors["x"], tensors["dy"], tensors["params"]

    def run():
        y = layer(x)
        return (y, *torch.autograd.grad(y, params, dy))

    graph, outputs = capture(run)
    with torch.no_grad():
        for t in outputs:
            t.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    problems = linear_problems(case.batch, case.features, case.features, case.dtype, case.bias)
    ran = {p.key: kernels.used(p, x.device) for p in problems.values()}
    if any(ran[key] != f.manifest["name"] for key, f in files.items()):
        return None, "fallback: " + "; ".join(f"{k}: {v}" for k, v in ran.items())
    exact = reference(case, x.detach(), tensors["base"].weight.detach(), tensors["base"].bias, dy)
    rel = {name: float((got.double() - e).norm() / e.norm().clamp_min(1e-30))
           for (name, e), got in zip(exact.items(), outputs, strict=True)}
    if check(case, rel):
        return None, f"wrong_result: {rel}"
    return graph, "ok"


def replay_times(graph, reps: int, flush) -> list[float]:
    """µs of ``reps`` replays of ``graph``, each after the L2 flush, between CUDA events."""
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(reps):
        flush.zero_()
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return times


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m benchmarks.step_pick", description=__doc__.splitlines()[0])
    ap.add_argument("--db", required=True, help="store URL with the layer's tuned kernels")
    ap.add_argument("--bundle", type=Path, required=True, help="folder to write the chosen kernels to")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--features", type=int, default=4096, help="in = out features")
    ap.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32")
    ap.add_argument("--candidates", type=int, default=6, help="stored kernels tried per GEMM, fastest alone first")
    ap.add_argument("--reps", type=int, default=30, help="timed replays per step")
    ap.add_argument("--out", type=Path, default=RESULTS, help="folder for the JSON of every timed step")
    args = ap.parse_args(argv)

    import torch

    from codegen.bundle import pick_stored, write_bundle
    from codegen.problem import linear_problems
    from codegen.versions import versions
    from store import Store

    if not torch.cuda.is_available():
        print("step_pick: no CUDA GPU visible to torch", file=sys.stderr)
        return 2
    store = Store(args.db, read_only=True)
    device = torch.cuda.get_device_name()
    case = Case(args.batch, args.dtype, "train", features=args.features)
    problems = linear_problems(case.batch, case.features, case.features, case.dtype, case.bias)
    pool = {}
    for layout, problem in problems.items():
        pool[layout.value] = candidates(store, problem, device, args.candidates)
        if not pool[layout.value]:
            print(f"step_pick: no stored kernel of {problem.key} on {device} fits today's plan", file=sys.stderr)
            return 1
    # start from what the store's lookup runs (pick_stored), so the first step timed is codegen.nn's own
    start = {}
    for layout, problem in problems.items():
        rows = [r for r, _ in pool[layout.value]]
        picked = pick_stored(store, problem, [dict(r) for r in rows])
        start[layout.value] = next(i for i, (r, _) in enumerate(pool[layout.value]) if r["id"] == picked[0]["id"])
    torch.manual_seed(0)
    dev = torch.device("cuda")
    tdtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[case.dtype]
    base = torch.nn.Linear(case.features, case.features, bias=True, device=dev, dtype=tdtype)
    x = torch.randn(case.batch, case.features, device=dev, dtype=tdtype, requires_grad=True)
    tensors = {"base": base, "x": x, "dy": torch.randn(case.batch, case.features, device=dev, dtype=tdtype),
               "params": [x, base.weight, base.bias], "flush": torch.empty(FLUSH_BYTES, dtype=torch.uint8, device=dev)}

    problems_by_layout = {layout.value: p for layout, p in problems.items()}
    graphs: dict[tuple, tuple] = {}

    def timed(choice: dict) -> tuple[float, list[float], str]:
        """(median µs, the replays' µs, status) of the step with ``choice`` (GEMM -> index into pool)."""
        key = tuple(choice[lay] for lay in LAYOUTS)
        if key not in graphs:
            graphs[key] = prepare(case, {problems_by_layout[lay].key: pool[lay][i][1] for lay, i in choice.items()},
                                  tensors)
        graph, status = graphs[key]
        if graph is None:
            return float("inf"), [], status
        times = replay_times(graph, args.reps, tensors["flush"])
        return statistics.median(times), times, status

    def names(choice: dict) -> dict:
        return {lay: pool[lay][i][0]["kernel"] for lay, i in choice.items()}

    choice, steps = dict(start), []
    current, times, status = timed(choice)
    steps.append({"choice": names(choice), "median_us": current, "status": status, "note": "the store's own pick"})
    print(f"store's pick: {current:.1f} us ({status})", flush=True)
    for lay in LAYOUTS:
        best = choice[lay]
        for i, (row, _) in enumerate(pool[lay]):
            if i == choice[lay]:
                continue
            trial = dict(choice, **{lay: i})
            med, times, status = timed(trial)
            steps.append({"choice": names(trial), "median_us": med, "min_us": min(times, default=None),
                          "max_us": max(times, default=None), "status": status, "alone_us": row["median_ms"] * 1e3})
            print(f"  {lay:11s} {row['kernel']}: alone {row['median_ms'] * 1e3:.1f} us, step {med:.1f} us ({status})",
                  flush=True)
            if med < current:
                best, current = i, med
        choice[lay] = best
    # the store's pick and the step's, side by side in alternating rounds, as the verdict
    final = {"store": [], "step": []}
    for _ in range(5):
        for label, ch in (("store", start), ("step", choice)):
            final[label] += timed(ch)[1]
    if not all(final.values()):
        print(f"step_pick: a choice did not run: {steps[0]['status']}", file=sys.stderr)
        return 1
    summary = {label: {"median_us": statistics.median(t), "min_us": min(t), "max_us": max(t)} for label, t in final.items()}
    chosen = {lay: pool[lay][i][0] for lay, i in choice.items()}
    print(f"store's pick {summary['store']['median_us']:.1f} us, step's pick {summary['step']['median_us']:.1f} us: "
          + ", ".join(f"{lay} {r['kernel']}" for lay, r in chosen.items()))

    by_key = {problems_by_layout[lay].key: row for lay, row in chosen.items()}

    def choose(st, problem, rows):  # the step's choice for the layer's GEMMs, the store's pick for any other
        row = by_key.get(problem.key)
        if row is None or row["device"] != rows[0]["device"]:
            return pick_stored(st, problem, rows)
        from codegen.export import export_kernel

        return (row, *export_kernel(st, row["kernel"], problem, arch=row["arch"], source_hash=row["source_hash"],
                                    device_id=row["device_id"]))

    write_bundle(store, args.bundle, choose=choose)
    stamp = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H%M%SZ")
    doc = {"suite": "step_pick", "date": stamp, "device": device,
           "versions": {**versions(), "torch": torch.__version__},
           "command": "python3 -m benchmarks.step_pick " + " ".join(argv if argv is not None else sys.argv[1:]),
           "case": {"batch": case.batch, "features": case.features, "dtype": case.dtype, "bias": True},
           "timing": {"reps": args.reps, "l2_flush_bytes": FLUSH_BYTES,
                      "note": "median of CUDA-event-timed graph replays of forward + autograd.grad, L2 flushed before each"},
           "steps": steps, "final": summary, "chosen": {lay: r["kernel"] for lay, r in chosen.items()},
           "store_pick": names(start)}
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"step-pick-{device.replace(' ', '_')}-{stamp}.json"
    path.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {path} and the bundle {args.bundle}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
