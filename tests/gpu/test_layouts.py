"""GPU tier: the linear layer's backward GEMMs (grad_input, grad_weight with db) are correct on
awkward shapes: every output NaN-poisoned before the run and checked against float64, the odd-shape
probe run with each; a plan that leaves an output unwritten is caught."""

from __future__ import annotations

import numpy as np
import pytest

import codegen.evaluate as evaluate
from codegen import sparse
from codegen.evaluate import Evaluator
from codegen.families.hopper import Spec as HopperSpec
from codegen.families.simt import Spec as SimtSpec
from codegen.families.tensorcore import Spec as TcSpec
from codegen.launch import LaunchPlan
from codegen.problem import DType, Layout, Problem, linear_problems

pytestmark = pytest.mark.gpu

GI, GW = Layout.grad_input, Layout.grad_weight
QUICK = {"reps_min": 2, "reps_max": 2, "target_ms": 1.0}
#: (batch, in, out) of a layer; each layout's GEMM takes its own M, N, K from linear_problems.
LAYERS = [(1, 1, 1), (32, 4096, 4096), (67, 45, 91), (1025, 1023, 1021)]

SIMT = [
    dict(bm=64, bn=64, bk=16, wm=32, wn=32, tm=4, tn=8, pad=4, vec=4, stages=2),  # register copies
    dict(bm=32, bn=64, bk=32, wm=16, wn=32, tm=2, tn=8, pad=4, vec=2, stages=1, split_k=4, reduce="two_pass"),
    dict(bm=64, bn=64, bk=32, wm=32, wn=32, tm=4, tn=8, pad=8, vec=4, stages=3, copy="async"),  # cp.async
    dict(bm=16, bn=16, bk=1, wm=4, wn=8, tm=1, tn=1, pad=0, vec=1, stages=0),  # straight from global memory
    dict(bm=32, bn=64, bk=16, wm=16, wn=32, tm=2, tn=8, pad=8, vec=4, stages=3, copy="async", split_k=4,
         reduce="cluster"),  # split-K in one thread-block cluster
]
FP32_ONLY = [dict(bm=32, bn=128, bk=32, wm=32, wn=32, tm=4, tn=8, pad=4, vec=4, stages=3, copy="async", split_k=4,
                  reduce="atomic")]
TC = [
    dict(),  # 128x128x32, 8 warps, staged epilogue
    dict(bm=64, bn=64, bk=32, wm=32, wn=32, epilogue="direct", smem="pad"),
    dict(bm=32, bn=16, bk=256, wm=16, wn=16, warps_k=4, stages=4, split_k=2, reduce="two_pass"),
    dict(mma="wmma", smem="pad", bm=64, bn=64, wm=32, wn=32),
]


def _cases():
    out = []
    for layout in (GI, GW):
        for bias in ((False,) if layout is GI else (False, True)):
            for dt, variants in ((DType.fp32, SIMT + FP32_ONLY), (DType.bf16, SIMT), (DType.fp16, SIMT[::2])):
                out += [SimtSpec(dtype=dt, bias=bias, layout=layout, **v) for v in variants]
            for dt, variants in ((DType.bf16, TC), (DType.fp16, TC[::3])):  # fp16: the default and wmma
                out += [TcSpec(dtype=dt, bias=bias, layout=layout, **v) for v in variants]
    return out


CASES = _cases()


@pytest.fixture(scope="module")
def evaluator():
    with Evaluator(baseline=False, timing=QUICK, timeout_s=120.0) as ev:
        yield ev


def test_every_case_is_a_valid_spec():
    assert len(CASES) >= 40
    for spec in CASES:
        assert not spec.check(), (spec.name, spec.check())


@pytest.mark.parametrize("spec", CASES, ids=lambda s: s.name)
def test_backward_gemms_are_correct(evaluator, spec):
    for batch, fin, fout in LAYERS:
        problem = linear_problems(batch, fin, fout, spec.dtype, spec.bias)[spec.layout]
        result, _ = evaluator.evaluate(spec, problem)
        if result["status"] == "invalid" and "k-tiles" in result["evidence"]:
            continue  # split-K finer than K: refused before compile, by design
        assert result["status"] == "ok", f"{spec.name} on {problem.key}: {result['evidence']}"
        assert result["rel_error"] is not None and result["rel_error"] < spec.dtype.rel_tol


#: Block-sparse W in grad_input (read as Wᵀ in BSR): (batch, in, out, density) of the layer.
SPARSE_LAYERS = [(67, 45, 91, 0.5), (32, 4096, 4096, 0.25), (1025, 1023, 1021, 0.5)]
SPARSE_GI = [
    SimtSpec(dtype=DType.fp32, layout=GI, block=32, bn=32, bk=16, bm=64, wm=32, wn=32, tm=4, tn=8),
    SimtSpec(dtype=DType.bf16, layout=GI, block=64, bn=64, bk=16, bm=64, wm=32, wn=64, tm=8, tn=8, copy="async",
             stages=3, pad=8),
    TcSpec(dtype=DType.bf16, layout=GI, block=32, bn=32, wn=32, bm=128, wm=64),
    TcSpec(dtype=DType.fp16, layout=GI, block=16, bn=16, bk=64, wn=16, bm=64, wm=32),
]


@pytest.mark.parametrize("spec", SPARSE_GI, ids=lambda s: s.name)
def test_sparse_grad_input_is_correct(evaluator, spec):
    for batch, fin, fout, density in SPARSE_LAYERS:
        pattern = sparse.Pattern.random(fout, fin, spec.block, density, seed=3)  # the layer's W [out, in]
        problem = sparse.problem_for(batch, pattern, spec.dtype, layout=GI)
        result, _ = evaluator.evaluate(spec, problem)
        assert result["status"] == "ok", f"{spec.name} on {problem.key}: {result['evidence']}"


#: Hopper's block-sparse grad_input walks Wᵀ's block rows and reads W's own blocks in place (blocks of 64): layers
#: whose out (K, dY's rows) is a multiple of 8, ragged in, an empty block column of W (an empty block row of Wᵀ),
#: and a large layer.
HOPPER_SPARSE_GI = [
    HopperSpec(layout=GI, block=64, bn=64, bm=256, stages=4),
    HopperSpec(layout=GI, block=64, bn=64, bm=128, consumers=1, stages=4, ctas=2, persistent=True, grouped=True),
    HopperSpec(layout=GI, block=64, bn=64, bm=128, stages=6, persistent=True, dtype=DType.fp16),
    HopperSpec(layout=GI, block=64, bn=64, bm=256, stages=5, group_m=1, persistent=True, grouped=True),
    HopperSpec(layout=GI, block=64, bn=64, bm=128, stages=8, persistent=True, a_regs=True),
    HopperSpec(layout=GI, block=64, bn=64, bm=512, stages=3, group_m=1, persistent=True, grouped=True),
]


def _hopper_gi_patterns(block: int) -> list[tuple[int, sparse.Pattern]]:
    empty_col = np.ones((4, 3), dtype=bool)
    empty_col[:, 1] = False  # W's second block column: Wᵀ's second block row is empty, its dX columns zeros
    return [(67, sparse.Pattern.random(136, 45, block, 0.5, seed=3)),
            (300, sparse.Pattern.from_mask(empty_col, 4 * block, 3 * block - 5, block)),
            (1025, sparse.Pattern.random(1016, 1023, block, 0.5, seed=4)),
            (256, sparse.Pattern.random(4096, 4096, block, 0.25, seed=5))]


@pytest.mark.parametrize("spec", HOPPER_SPARSE_GI, ids=lambda s: s.name)
def test_hopper_sparse_grad_input_is_correct(evaluator, spec):
    for batch, pattern in _hopper_gi_patterns(spec.block):
        problem = sparse.problem_for(batch, pattern, spec.dtype, layout=GI)
        assert not spec.check(problem), spec.check(problem)
        result, _ = evaluator.evaluate(spec, problem)
        assert result["status"] == "ok", f"{spec.name} on {problem.key}: {result['evidence']}"
        assert result["rel_error"] is not None and result["rel_error"] < spec.dtype.rel_tol


#: Hopper's backward kernels read k-outer operands in boxes along M or N: layers whose rows TMA can read
#: (in and out multiples of 8; the batch is free in grad_weight, where it is K), with M and N that end
#: inside a box, boxes wholly past N or M, a partial k-tile, one k-tile, and a large layer.
HOPPER_LAYERS = {GI: [(8, 8, 8), (67, 72, 136), (1025, 1032, 1016), (32, 4096, 4096)],
                 GW: [(1, 8, 8), (67, 72, 136), (1025, 1032, 1016), (32, 4096, 4096), (300, 200, 328)]}
HOPPER = [
    dict(),  # 128x256, two consumers
    dict(bm=128, bn=128, consumers=1, stages=5, persistent=True),
    dict(bm=64, bn=64, consumers=1, ctas=2),
    dict(bm=256, bn=128, consumers=2, stages=3, group_m=4),  # two m64 boxes per consumer
    dict(bm=128, bn=192, consumers=2, stages=4),
    dict(bm=64, bn=128, consumers=1, stages=6, split_k=4),  # split-K: partial sums, then the reduce pass
    dict(bm=128, bn=256, split_k=16),  # more splits than some layers' k-tiles: those write zeros
]
HOPPER_CASES = [HopperSpec(dtype=dt, bias=bias, layout=layout, **v)
                for layout in (GI, GW) for bias in ((False,) if layout is GI else (False, True))
                for dt, variants in ((DType.bf16, HOPPER), (DType.fp16, HOPPER[:2])) for v in variants]


@pytest.mark.parametrize("spec", HOPPER_CASES, ids=lambda s: s.name)
def test_hopper_backward_gemms_are_correct(evaluator, spec):
    assert not spec.check()
    for batch, fin, fout in HOPPER_LAYERS[spec.layout]:
        problem = linear_problems(batch, fin, fout, spec.dtype, spec.bias)[spec.layout]
        result, _ = evaluator.evaluate(spec, problem)
        assert result["status"] == "ok", f"{spec.name} on {problem.key}: {result['evidence']}"
        assert result["rel_error"] is not None and result["rel_error"] < spec.dtype.rel_tol


#: grad_input with X's (dY's) fragments through registers (``a_regs``; grad_weight's X is k-outer: refused).
HOPPER_A_REGS = [HopperSpec(dtype=dt, layout=GI, a_regs=True, **v)
                 for dt, variants in ((DType.bf16, HOPPER[:6]), (DType.fp16, HOPPER[:2])) for v in variants]


@pytest.mark.parametrize("spec", HOPPER_A_REGS, ids=lambda s: s.name)
def test_hopper_a_regs_grad_input_is_correct(evaluator, spec):
    assert not spec.check(), spec.check()
    for batch, fin, fout in HOPPER_LAYERS[GI]:
        problem = linear_problems(batch, fin, fout, spec.dtype, spec.bias)[GI]
        result, _ = evaluator.evaluate(spec, problem)
        assert result["status"] == "ok", f"{spec.name} on {problem.key}: {result['evidence']}"
        assert result["rel_error"] is not None and result["rel_error"] < spec.dtype.rel_tol


@pytest.mark.parametrize("drop", ["_db", "main"])
def test_an_unwritten_output_is_caught(evaluator, monkeypatch, drop):
    """A plan without the db kernel leaves db as NaN poison; one without the GEMM leaves dW (a split
    GEMM: with one split and staged tiles the main kernel writes db too)."""
    spec = SimtSpec(dtype=DType.fp32, bias=True, layout=GW, bm=64, bn=64, bk=16, wm=32, wn=32, tm=4, tn=8, split_k=2,
                    reduce="two_pass")
    real = evaluate.plan

    def planted(s, p) -> LaunchPlan:
        full = real(s, p)
        keep = tuple(x for x in full.launches if (x.symbol.endswith("_db")) != (drop == "_db"))
        return LaunchPlan(launches=keep, workspace_bytes=full.workspace_bytes, zero_output=full.zero_output)

    monkeypatch.setattr(evaluate, "plan", planted)
    result, _ = evaluator.evaluate(spec, Problem(256, 192, 96, DType.fp32, GW, bias=True))
    assert result["status"] == "nan_or_inf", result
    assert (" DB:" in result["evidence"]) == (drop == "_db") and (" DW:" in result["evidence"]) == (drop == "main")
