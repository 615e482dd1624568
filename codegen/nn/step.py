"""A linear layer's kernels picked by their time inside the train step (``codegen pick-step``; needs torch).

A store ranks each GEMM's kernels by their time alone, after an L2 flush, and codegen.nn runs the
fastest (codegen.nn.bundle.pick_stored). Inside a train step, after the GEMM before it, a kernel can run
slower than alone, and by different amounts, so the order of two kernels alone need not be their order
in the step (benchmarks/NOTES.md, "2026-12-04 (tenth session)"; benchmarks/results/step-pick-*.json).
So this picks by the step:
starting from the store's own choice, for forward, grad_input and grad_weight in turn, each of the
GEMM's fastest stored kernels whose source fits today's plan (up to ``candidates``) replaces the
current one; the step (forward, then ``torch.autograd.grad`` for dX, dW and db) is captured in a CUDA
graph, replayed once into NaN-poisoned outputs that are checked against float64, and replayed
``reps`` times after an L2 flush; the lowest median stays. Then the store's choice and the step's
are timed side by side in alternating rounds. The result goes into a bundle (codegen.nn.bundle) that
codegen.nn loads. ``judge`` (``pick-step --verdict-step``) then judges each picked GEMM against torch's
op inside the same step (codegen.nn.verdict, timing ``train_step``): the step with that GEMM on ours
against the step with it on torch's op, the other two unchanged, in alternating rounds.
"""

from __future__ import annotations

import json
import statistics

from codegen.problem import DType, Layout, Problem, linear_problems

FLUSH_BYTES = 256 << 20
ORDER = (Layout.forward, Layout.grad_input, Layout.grad_weight)


def capture(fn):
    """A CUDA graph of ``fn`` (warmed up twice on a side stream first, as torch asks) and the outputs it
    writes on each replay."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph, out


def reference(x, weight, bias, dy) -> dict:
    """The layer's results in float64: y, and for the given dY also dX, dW and (with a bias) db."""
    x64, w64 = x.double(), weight.double()
    out = {"y": x64 @ w64.T + (bias.double() if bias is not None else 0)}
    if dy is not None:
        dy64 = dy.double()
        out.update(dx=dy64 @ w64, dw=dy64.T @ x64, **({"db": dy64.sum(0)} if bias is not None else {}))
    return out


def relative_error(exact, got) -> float:
    """Relative Frobenius error of ``got`` against the float64 ``exact`` (NaN stays NaN: a failure)."""
    return float((got.detach().double() - exact).norm() / exact.norm().clamp_min(1e-30))


def relative_errors(exact: dict, outputs) -> dict:
    """Each output's relative_error against its float64 ``exact``, by name."""
    return {name: relative_error(e, got) for (name, e), got in zip(exact.items(), outputs, strict=True)}


class Pinned:
    """A kernel source for codegen.nn that answers each problem with the kernel file pinned for it."""

    def __init__(self, files: dict, location: str = "pinned") -> None:
        self.files, self.location = files, location

    def find(self, problem: Problem, device: str):
        return self.files.get(problem.key) or f"no kernel pinned for {problem.key}"


def candidates(store, problem: Problem, device: str, limit: int) -> list[tuple[dict, object]]:
    """(trial row, KernelFile) of the fastest stored kernels of ``problem`` on ``device`` whose source
    fits today's plan, fastest alone first, at most ``limit``."""

    from codegen.export import ExportError, export_kernel
    from codegen.nn.bundle import CANDIDATES, KernelFile

    found = []
    rows = [r for r in store.best(problem, per_problem=max(CANDIDATES, limit)) if r["device"] == device]
    for row in sorted(rows, key=lambda r: (r["median_ms"], r["id"])):
        try:
            cu, js = export_kernel(store, row["kernel"], problem, arch=row["arch"], source_hash=row["source_hash"],
                                   device_id=row["device_id"])
        except ExportError:  # a source that no longer fits today's plan (SourceMismatch), or none to ship
            continue
        found.append((row, KernelFile(json.loads(js), cu, f"store {store.location}")))
        if len(found) == limit:
            break
    return found


class Step:
    """One layer's train step on the GPU (weights, X and dY fixed, seeded), timed with given kernels."""

    def __init__(self, batch: int, in_features: int, out_features: int, dtype: DType, bias: bool) -> None:
        import torch

        self.problems = linear_problems(batch, in_features, out_features, dtype, bias)
        self.dtype = dtype
        torch.manual_seed(0)
        dev = torch.device("cuda")
        tdtype = {DType.bf16: torch.bfloat16, DType.fp16: torch.float16, DType.fp32: torch.float32}[dtype]
        self.base = torch.nn.Linear(in_features, out_features, bias=bias, device=dev, dtype=tdtype)
        self.x = torch.randn(batch, in_features, device=dev, dtype=tdtype, requires_grad=True)
        self.dy = torch.randn(batch, out_features, device=dev, dtype=tdtype)
        self.params = [self.x, self.base.weight] + ([self.base.bias] if bias else [])
        self.flush = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device=dev)
        self.graphs: dict[tuple, tuple] = {}

    def prepare(self, files: dict) -> tuple[object | None, str]:
        """(graph, status) of the step with the kernel files ``files`` (problem key -> KernelFile): the
        graph is None unless every GEMM ran its pinned kernel and every output is within the dtype's bound."""
        import torch

        from codegen.nn.layer import Kernels, Linear

        key = tuple(sorted((k, f.manifest["name"]) for k, f in files.items()))
        if key in self.graphs:
            return self.graphs[key]
        kernels = Kernels(Pinned(files), ours_everywhere=True)  # the pinned kernels run, whatever any verdict
        layer = Linear.from_linear(self.base, kernels)

        def run():
            y = layer(self.x)
            return (y, *torch.autograd.grad(y, self.params, self.dy))

        graph, outputs = capture(run)
        with torch.no_grad():
            for t in outputs:
                t.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        ran = {p.key: kernels.used(p, self.x.device) for p in self.problems.values()}
        exact = reference(self.x.detach(), self.base.weight.detach(), self.base.bias, self.dy)
        rel = relative_errors(exact, outputs)
        if any(ran[k] != f.manifest["name"] for k, f in files.items()):
            got = None, "fallback: " + "; ".join(f"{k}: {v}" for k, v in ran.items())
        elif any(not e <= self.dtype.rel_tol for e in rel.values()):
            got = None, "wrong_result: " + ", ".join(f"{n} {e:.2e}" for n, e in rel.items())
        else:
            got = graph, "ok"
        self.graphs[key] = got
        return got

    def times(self, files: dict, reps: int) -> tuple[list[float], str]:
        """µs of ``reps`` replays of the step with ``files``, each after the L2 flush, between CUDA events
        (empty, with the reason, where the step cannot run with them)."""
        import torch

        graph, status = self.prepare(files)
        if graph is None:
            return [], status
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        out = []
        for _ in range(reps):
            self.flush.zero_()
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            out.append(start.elapsed_time(end) * 1e3)
        return out, status


def pick(store, step: Step, device: str, limit: int, reps: int, rounds: int = 5, progress=print) -> dict:
    """The kernels of ``step``'s three GEMMs chosen by the step's time (module docstring): a dict with
    ``chosen`` and ``store_pick`` (layout -> trial row), ``files`` (layout -> the chosen KernelFile), every ``trial`` timed, and ``final`` (the two
    choices' medians and ranges over ``rounds`` alternating rounds of ``reps`` replays). Raises
    ValueError where a GEMM has no stored kernel that fits, or the store's own choice cannot run."""
    from codegen.nn.bundle import pick_stored

    pool = {}
    for layout, problem in step.problems.items():
        pool[layout] = candidates(store, problem, device, limit)
        if not pool[layout]:
            raise ValueError(f"no stored kernel of {problem.key} measured on {device} fits today's launch plan "
                             f"(`codegen tune-linear` first, or re-measure with `codegen bench --kernel NAME`)")
    start = {}
    for layout, problem in step.problems.items():
        picked = pick_stored(store, problem, [dict(r) for r, _ in pool[layout]])
        start[layout] = next(i for i, (r, _) in enumerate(pool[layout]) if r["id"] == picked[0]["id"])

    def files(choice: dict) -> dict:
        return {step.problems[lay].key: pool[lay][i][1] for lay, i in choice.items()}

    def names(choice: dict) -> dict:
        return {lay.value: pool[lay][i][0]["kernel"] for lay, i in choice.items()}

    first, status = step.times(files(start), reps)
    if not first:
        raise ValueError(f"the store's own kernels do not run the step: {status}")
    current = statistics.median(first)
    trials = [{"choice": names(start), "median_us": current, "status": status, "note": "the store's own pick"}]
    progress(f"store's pick: step {current:.1f} us")
    choice = dict(start)
    for lay in ORDER:
        for i, (row, _) in enumerate(pool[lay]):
            if i == choice[lay]:
                continue
            trial = dict(choice, **{lay: i})
            times, status = step.times(files(trial), reps)
            med = statistics.median(times) if times else None
            trials.append({"choice": names(trial), "changed": lay.value, "alone_us": row["median_ms"] * 1e3,
                           "median_us": med, "min_us": min(times, default=None), "max_us": max(times, default=None),
                           "status": status})
            progress(f"  {lay.value:11s} {row['kernel']}: alone {row['median_ms'] * 1e3:.1f} us, step "
                     + (f"{med:.1f} us" if med is not None else status))
            if med is not None and med < current:
                choice[lay], current = i, med
    final = {"store_pick": [], "chosen": []}
    for _ in range(rounds):
        for label, ch in (("store_pick", start), ("chosen", choice)):
            final[label] += step.times(files(ch), reps)[0]
    return {
        "chosen": {lay: pool[lay][i][0] for lay, i in choice.items()},
        "files": {lay: pool[lay][i][1] for lay, i in choice.items()},
        "store_pick": {lay: pool[lay][i][0] for lay, i in start.items()},
        "trials": trials,
        "final": {label: {"median_us": statistics.median(t), "min_us": min(t), "max_us": max(t), "replays": len(t)}
                  for label, t in final.items()},
    }


def judge(step: Step, chosen: dict, reps: int, rounds: int = 5, margin: float | None = None) -> dict:
    """Each GEMM of ``step`` judged against torch's op inside the train step: ``chosen`` maps each layout
    to its KernelFile; per layout the step with all of ``chosen`` and the step with that GEMM on torch's
    op (its kernel left out: codegen.nn falls back) are timed in ``rounds`` alternating rounds of
    ``reps`` replays, and their medians judged (codegen.nn.verdict.judge, timing ``train_step``; the
    ratio is of the whole step's times, so the margin is on the noise of the step). Returns layout ->
    (verdict or None, status)."""
    from codegen.nn import verdict as verdicts

    files = {step.problems[lay].key: f for lay, f in chosen.items()}
    out = {}
    for lay, problem in step.problems.items():
        without = {k: f for k, f in files.items() if k != problem.key}
        times: dict[str, list[float]] = {"ours": [], "torch": []}
        status = "ok"
        for _ in range(rounds):
            for label, pinned in (("torch", without), ("ours", files)):
                got, why = step.times(pinned, max(1, reps // rounds))
                if not got:
                    status = f"{label}: {why}"
                times[label] += got
        if status != "ok" or not times["ours"] or not times["torch"]:
            out[lay] = (None, status)
            continue
        out[lay] = (verdicts.judge(statistics.median(times["ours"]) * 1e-3, statistics.median(times["torch"]) * 1e-3,
                                   "train_step", problem, margin=verdicts.MARGIN if margin is None else margin), "ok")
    return out
