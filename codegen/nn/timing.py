"""Engine timing: a linear layer's forward timed the way an inference engine runs it (needs torch and a GPU).

An engine calls each layer once per step, with a different weight each time, inside a captured CUDA
graph: every call reads its W cold from HBM and no launch waits on the host. Timing one call with
L2 flushed (the search's cold single call) makes a skinny GEMM look slow, cuBLAS's most of all (a
fixed cost per isolated launch), so small batches are judged here instead. For one problem it makes
``copies`` distinct weights (and inputs and outputs), together at least ``L2_FACTOR`` times the L2
cache, captures one graph that calls the layer's forward ``calls`` times over them in turn, and
replays it: time per call = replay time ÷ calls. Ours (``codegen.nn``'s forward with the given
``Kernels``: where its verdict says cuBLAS won and ``ours_everywhere`` is off, that is torch's op,
as the layer runs it) and torch's ``F.linear`` (cuBLAS) are captured alike and timed in alternating
rounds. Before timing, every copy's output of ours is checked against float64 (poisoned with NaN
first, then written by a replay of the graph).

A block-sparse W is timed the same way: ``copies`` ``BlockSparseLinear`` layers on the problem's pattern
(distinct values; their kept blocks together at least ``L2_FACTOR`` L2 caches), each called under
no_grad as the layer runs in inference, against ``F.linear`` on each copy's dense W (dense cuBLAS, the
baseline a block-sparse kernel must beat). A 2:4 W (``sparsity="2:4"``) is timed alike: ``copies``
``Sparse24Linear`` layers (random W pruned to 2:4 by magnitude) against ``F.linear`` on each copy's
dense masked W. ``time_in_graphs`` is the harness itself, for any pair of forward calls over copies
(benchmarks/sparse24.py times cuSPARSELt's semi-structured W with it too).

``engine_timing`` gives the times; ``engine_verdict`` judges one tuned kernel against cuBLAS this way
(codegen.nn.verdict, timing ``engine``), as ``codegen tune-model --bundle`` does for the forward GEMMs
of at most ``codegen.nn.verdict.ENGINE_MAX_M`` rows. benchmarks/engine.py times LLaMA-3-8B's layers
with it.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass

from codegen.nn import verdict as verdicts
from codegen.problem import DType, Layout, Problem

__all__ = ["L2_FACTOR", "MAX_COPIES", "MIN_CALLS", "MIN_COPIES", "EngineJudged", "EngineTiming", "calls_for",
           "copies_for", "engine_candidates", "engine_timing", "engine_verdict", "judge_in_engine_timing",
           "sparse24_copies", "sparse_copies", "stats", "time_in_graphs"]

#: The weights of one replay are at least this many times the L2 cache.
L2_FACTOR = 4
#: Copies at least and at most, and calls per replay at least.
MIN_COPIES, MAX_COPIES, MIN_CALLS = 4, 64, 24
#: Timed replays of each graph, and the alternating rounds they are split into, unless asked otherwise:
#: one replay of each per round, so a drift of the clocks under sustained load falls on both alike.
REPS, ROUNDS = 48, 48


def copies_for(weight_bytes: int, l2_bytes: int) -> int:
    """Distinct weights so that together they are at least ``L2_FACTOR`` L2 caches."""
    return max(MIN_COPIES, min(MAX_COPIES, math.ceil(L2_FACTOR * l2_bytes / weight_bytes)))


def calls_for(copies: int) -> int:
    """Calls per replay: whole rounds over the copies, at least ``MIN_CALLS``."""
    return copies * math.ceil(MIN_CALLS / copies)


def stats(times_ms: list[float]) -> dict:
    """Median, p20, p80 and range of repeated times (ms), as the benchmarks record them."""
    ordered = sorted(times_ms)

    def pct(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * (len(ordered) - 1) + 0.5))]

    return {"median_ms": statistics.median(ordered), "p20_ms": pct(0.2), "p80_ms": pct(0.8), "min_ms": ordered[0],
            "max_ms": ordered[-1], "reps": len(ordered)}


@dataclass
class EngineTiming:
    """What ``engine_timing`` measured: per-call ms of each replay of ours and of torch's op, what ran
    ours (a kernel name or "torch: <reason>"), the worst relative error of ours over the copies, and
    the harness's settings (copies, calls per replay, bytes)."""

    ours: list[float]
    torch: list[float]
    ran: str
    rel_error: float
    engine: dict
    dtype: DType = DType.bf16

    @property
    def wrong(self) -> bool:
        """Ours missed the dtype's bound against float64 (codegen.problem.DType.rel_tol)."""
        return not self.rel_error <= self.dtype.rel_tol


TORCH_DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}


def engine_timing(problem: Problem, kernels, *, l2_bytes: int | None = None, reps: int = REPS,
                  rounds: int = ROUNDS) -> EngineTiming:
    """Engine timing of ``problem`` (a forward GEMM) with ``kernels`` (a codegen.nn ``Kernels``) and
    with torch's op on the current GPU (see the module docstring). A block-sparse W (its pattern
    registered in this process: codegen.sparse.lookup) runs as ``codegen.nn.sparse.BlockSparseLinear``
    layers, one per copy, against ``F.linear`` on each copy's dense W (the same values, zeros outside
    the kept blocks): dense cuBLAS, as a bundle's verdicts take it."""
    import torch
    import torch.nn.functional as F

    from codegen.nn.layer import linear_forward

    if problem.layout is not Layout.forward:
        raise ValueError(f"engine timing runs the layer's forward, not {problem.key}")
    if problem.dtype.value not in TORCH_DTYPES:
        raise ValueError(f"engine timing runs torch's op: no {problem.dtype.value} there")
    dtype = getattr(torch, TORCH_DTYPES[problem.dtype.value])
    if l2_bytes is None:
        l2_bytes = torch.cuda.get_device_properties(torch.cuda.current_device()).L2_cache_size
    m, n, k = problem.m, problem.n, problem.k
    # The bytes of one weight copy as ours reads it: W, a block-sparse W's kept blocks and block columns,
    # or a 2:4 W's kept halves and their metadata.
    weight_bytes = (problem.nnzb * problem.block ** 2 * dtype.itemsize + 4 * problem.nnzb if problem.sparse
                    else sparse24_bytes(n, k, dtype.itemsize) if problem.structured else n * k * dtype.itemsize)
    copies = copies_for(weight_bytes, l2_bytes)
    calls = calls_for(copies)
    gen = torch.Generator(device="cuda").manual_seed(0)
    xs = [torch.randn(m, k, device="cuda", dtype=dtype, generator=gen) for _ in range(copies)]
    bs = [torch.randn(n, device="cuda", dtype=dtype, generator=gen) if problem.bias else None for _ in range(copies)]
    if problem.sparse or problem.structured:
        made = sparse24_copies if problem.structured else sparse_copies
        layers = made(problem, kernels, copies, bs, gen)
        ws = [layer.dense_weight().detach() for layer in layers]

        def ours_call(i):
            with torch.no_grad():
                return layers[i](xs[i])
    else:
        ws = [torch.randn(n, k, device="cuda", dtype=dtype, generator=gen) * k ** -0.5 for _ in range(copies)]

        def ours_call(i):
            return linear_forward(kernels, xs[i], ws[i], bs[i])

    def exact(i):
        y = xs[i].double() @ ws[i].double().T
        return y + bs[i].double() if bs[i] is not None else y

    ours, theirs, rel = time_in_graphs(ours_call, lambda i: F.linear(xs[i], ws[i], bs[i]), exact, copies, calls,
                                       reps=reps, rounds=rounds)
    ran = kernels.used(problem, xs[0].device) or "torch: not asked"
    engine = {"copies": copies, "calls_per_replay": calls, "weight_bytes": weight_bytes, "l2_bytes": l2_bytes,
              "replays": len(ours)}
    if problem.sparse or problem.structured:
        engine["dense_weight_bytes"] = n * k * dtype.itemsize  # what cuBLAS reads per call
    return EngineTiming(ours, theirs, ran, rel, engine, problem.dtype)


def sparse_copies(problem: Problem, kernels, copies: int, biases: list, gen) -> list:
    """``copies`` BlockSparseLinear layers on ``problem``'s pattern (random values, ``biases`` theirs),
    on the GPU, all finding their kernels in ``kernels``: what engine timing calls for a block-sparse W."""
    import torch

    from codegen import sparse
    from codegen.nn.sparse import BlockSparseLinear

    pattern = sparse.lookup(problem)
    dtype = getattr(torch, TORCH_DTYPES[problem.dtype.value])
    layers = []
    for i in range(copies):
        blocks = torch.randn(pattern.nnzb, pattern.block, pattern.block, device="cuda", dtype=dtype,
                             generator=gen) * problem.k ** -0.5
        layers.append(BlockSparseLinear.from_blocks(pattern.k, pattern.n, pattern, blocks, biases[i], kernels=kernels,
                                                    dtype=dtype, device="cuda").eval())
    return layers


def sparse24_bytes(n: int, k: int, itemsize: int) -> int:
    """The bytes a 2:4 W [n, k] is read as: its kept halves [n, KP/2] and their metadata (4 bits a group)."""
    from codegen.sparse24 import padded_k

    kp = padded_k(k)
    return n * kp // 2 * itemsize + -(-n // 16) * 16 * kp // 8


def sparse24_copies(problem: Problem, kernels, copies: int, biases: list, gen) -> list:
    """``copies`` Sparse24Linear layers of ``problem``'s shape (the first a random W pruned to 2:4 by
    magnitude, the others its pattern with values of their own, each its own metadata; ``biases``
    theirs) on the GPU, all finding their kernels in ``kernels``: what engine timing calls for a 2:4 W."""
    import copy

    import torch

    from codegen.nn.semisparse import Sparse24Linear

    dtype = getattr(torch, TORCH_DTYPES[problem.dtype.value])
    scale = problem.k ** -0.5
    w = torch.randn(problem.n, problem.k, device="cuda", dtype=dtype, generator=gen) * scale
    first = Sparse24Linear.from_dense(w, biases[0], kernels=kernels).eval()
    layers = [first]
    for i in range(1, copies):
        layer = copy.deepcopy(first)
        with torch.no_grad():
            fresh = torch.randn(layer.values.shape, device="cuda", dtype=dtype, generator=gen) * scale
            layer.values.copy_(layer._gather(layer._dense(fresh)))  # K's padding stays zero
            if biases[i] is not None:
                layer.bias = torch.nn.Parameter(biases[i], requires_grad=False)
        layers.append(layer)
    return layers


def time_in_graphs(ours: Callable[[int], object], theirs: Callable[[int], object], exact: Callable[[int], object],
                   copies: int, calls: int, *, reps: int = REPS, rounds: int = ROUNDS) -> tuple[list, list, float]:
    """The engine harness itself: ``ours(i)`` and ``theirs(i)`` (a forward on copy ``i``'s weight,
    returning its output) each called ``calls`` times over the ``copies`` in turn inside one captured
    CUDA graph; every copy's output of ours checked against ``exact(i)`` (float64) after a replay that
    must overwrite NaN; then both graphs replayed in ``rounds`` alternating rounds (each first in half of
    them). Returns (ms per call of each replay of ours, the same of theirs, ours' worst relative error)."""
    import torch

    from codegen.nn.step import capture, relative_error

    def run(fn):
        return lambda: [fn(i % copies) for i in range(calls)]

    run(ours)()  # loads (compiles) our kernels outside the capture, and allocates their tile counters
    graphs = {}
    for label, fn in (("ours", run(ours)), ("torch", run(theirs))):
        graph, outputs = capture(fn)
        for y in outputs:
            y.fill_(float("nan"))  # a replay must write every output
        graph.replay()
        graphs[label] = (graph, outputs)
    torch.cuda.synchronize()
    rel = max(relative_error(exact(i), graphs["ours"][1][i]) for i in range(copies))
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times: dict[str, list[float]] = {"ours": [], "torch": []}
    for graph, _ in graphs.values():
        graph.replay()  # warm
    for r in range(rounds):
        for label in (("torch", "ours") if r % 2 == 0 else ("ours", "torch")):  # each goes first in half the rounds
            graph = graphs[label][0]
            for _ in range(max(1, reps // rounds)):
                start.record()
                graph.replay()
                end.record()
                end.synchronize()
                times[label].append(start.elapsed_time(end) / calls)
    return times["ours"], times["torch"], rel


def engine_verdict(problem: Problem, file, *, reps: int = REPS, rounds: int = ROUNDS,
                   margin: float = verdicts.MARGIN) -> tuple[verdicts.Verdict | None, str, EngineTiming | None]:
    """(verdict, status, timing) of the tuned kernel ``file`` (a codegen.nn.bundle.KernelFile) for
    ``problem`` against torch's op in engine timing; the verdict is None where ours did not run
    (status: why), and a wrong result of ours is a verdict for cuBLAS."""
    from codegen.nn.layer import Kernels
    from codegen.nn.step import Pinned

    kernels = Kernels(Pinned({problem.key: file}), ours_everywhere=True)
    timing = engine_timing(problem, kernels, reps=reps, rounds=rounds)
    if timing.ran != file.manifest["name"]:
        return None, f"ours did not run: {timing.ran}", timing
    mine, theirs = stats(timing.ours)["median_ms"], stats(timing.torch)["median_ms"]
    refused = f"wrong result (relative error {timing.rel_error:.2e})" if timing.wrong else ""
    return verdicts.judge(mine, theirs, "engine", problem, margin=margin, refused=refused), "ok", timing


# ---- a bundle's forward GEMMs of few rows judged in engine timing --------------------------------------------------------
@dataclass
class EngineJudged:
    """One bundle entry re-judged in engine timing: its problem and kernel, the verdict (None where
    ours did not run) and the harness's status."""

    problem: Problem
    kernel: str
    verdict: object | None
    status: str


def engine_candidates(bundle, device: str, *, again: bool = False) -> list[Problem]:
    """The problems of ``bundle`` that engine timing judges on ``device``: forward GEMMs of at most
    ``codegen.nn.verdict.ENGINE_MAX_M`` rows whose kernel was measured on that device (not replayed
    from a recording), and (unless ``again``) whose entry has no engine verdict yet."""
    found = []
    for e in bundle.entries:
        problem = Problem.from_dict(e["problem"])
        if problem.layout is not Layout.forward or problem.m > verdicts.ENGINE_MAX_M or e["device"] != device:
            continue
        if e.get("recorded") or (not again and "engine" in (e.get("verdicts") or {})):
            continue
        if bundle.entry(problem, device) is e and problem not in found:
            found.append(problem)
    return found


def judge_in_engine_timing(bundle, *, again: bool = False, margin: float | None = None,
                           say: Callable[[str], None] = print) -> list[EngineJudged]:
    """Re-judge each of ``bundle``'s ``engine_candidates`` on this GPU against torch's op in engine
    timing (``engine_verdict``), record each verdict in the bundle (timing ``engine``, which then
    decides) and save its index after each. One line per problem through ``say``."""
    import torch

    device = torch.cuda.get_device_name()
    out = []
    for problem in engine_candidates(bundle, device, again=again):
        file = bundle.find(problem, device)
        if isinstance(file, str):
            out.append(EngineJudged(problem, "", None, file))
            say(f"engine timing {problem.key}: {file}")
            continue
        try:
            verdict, status, _ = engine_verdict(problem, file, margin=verdicts.MARGIN if margin is None else margin)
        except Exception as e:  # a kernel that cannot run in the harness keeps its cold_single verdict
            verdict, status = None, f"{type(e).__name__}: {e}"
        name = file.manifest["name"]
        out.append(EngineJudged(problem, name, verdict, status))
        if verdict is not None:
            bundle.set_verdict(problem, device, verdict)
            bundle.save()  # each verdict kept as soon as it is measured (a run cut short loses none)
            say(f"engine timing {problem.key}: ours {verdict.ours_ms * 1e3:.1f} us, cuBLAS "
                f"{verdict.cublas_ms * 1e3:.1f} us: {verdict.describe()}")
        else:
            say(f"engine timing {problem.key}: no verdict ({status}); the cold_single one stands")
    return out
