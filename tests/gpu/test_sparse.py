"""GPU tier: block-sparse W (BSR) kernels of every family are correct on awkward patterns and shapes,
and the sparse baselines are timed beside them."""

from __future__ import annotations

import numpy as np
import pytest

from codegen import sparse
from codegen.evaluate import Evaluator
from codegen.families.direct import Spec as DrSpec
from codegen.families.simt import Spec as SimtSpec
from codegen.families.tensorcore import Spec as TcSpec
from codegen.problem import DType

pytestmark = pytest.mark.gpu

QUICK = {"reps_min": 3, "reps_max": 3, "target_ms": 1.0}


def _patterns(block: int) -> list[tuple[int, sparse.Pattern]]:
    """(m, pattern): multiples of the block, ragged edges, all-zero, fully dense, empty rows, M = 1."""
    rows_empty = sparse.Pattern.random(5 * block, 7 * block, block, 0.6, seed=3).mask()
    rows_empty[[0, 2, 4]] = False
    return [
        (256, sparse.Pattern.random(8 * block, 6 * block, block, 0.3, seed=1)),
        (67, sparse.Pattern.random(3 * block + 5, 5 * block + 3, block, 0.4, seed=2)),
        (64, sparse.Pattern.random(2 * block, 2 * block, block, 0.0)),
        (130, sparse.Pattern.random(3 * block - 1, 4 * block + 9, block, 1.0)),
        (96, sparse.Pattern.from_mask(rows_empty, 5 * block, 7 * block, block)),
        (1, sparse.Pattern.random(4 * block, 9 * block, block, 0.5, seed=4)),
    ]


TC = dict(bm=128, bn=64, bk=32, wm=64, wn=32, stages=4, epilogue="smem", block=64)
VARIANTS = [
    TcSpec(dtype=DType.bf16, **TC),
    TcSpec(dtype=DType.bf16, bias=True, **dict(TC, epilogue="direct", split_k=2, reduce="two_pass")),
    TcSpec(dtype=DType.fp16, bias=True, bm=64, bn=32, bk=32, wm=32, wn=32, stages=3, epilogue="direct", block=32),
    TcSpec(dtype=DType.bf16, bm=64, bn=16, bk=16, wm=32, wn=16, stages=4, block=16),
    TcSpec(dtype=DType.tf32, bias=True, bm=64, bn=32, bk=32, wm=32, wn=32, stages=3, split_k=3, reduce="atomic",
           block=32),
    TcSpec(dtype=DType.bf16, bm=128, bn=16, bk=64, wm=32, wn=16, stages=3, block=16),  # 4 blocks per k-tile
    TcSpec(dtype=DType.fp16, bias=True, bm=64, bn=32, bk=128, wm=32, wn=32, stages=3, epilogue="direct", split_k=2,
           reduce="two_pass", block=32),
    TcSpec(dtype=DType.tf32, bm=64, bn=16, bk=32, wm=32, wn=16, stages=3, block=16),
    TcSpec(dtype=DType.bf16, mma="wmma", smem="pad", epilogue="smem", bm=64, bn=32, bk=32, wm=32, wn=32, block=32),
    # block tiles over part of a block row's rows (bn < block), deep pipelines
    TcSpec(dtype=DType.bf16, bias=True, bm=32, bn=32, bk=64, wm=16, wn=16, stages=8, epilogue="direct", block=64),
    TcSpec(dtype=DType.bf16, bm=32, bn=16, bk=64, wm=32, wn=16, warps_k=2, stages=6, epilogue="smem", block=64),
    TcSpec(dtype=DType.fp16, bm=64, bn=16, bk=64, wm=32, wn=16, stages=3, block=32),  # 2 blocks per k-tile
    TcSpec(dtype=DType.tf32, bm=32, bn=16, bk=32, wm=16, wn=16, stages=5, split_k=2, reduce="atomic", block=32),
    # the direct family: fragments straight from memory, warps sharing out a block row's blocks
    DrSpec(dtype=DType.bf16, bm=32, bn=32, warps=8, depth=1, block=64),
    DrSpec(dtype=DType.bf16, bias=True, bm=32, bn=16, warps=4, depth=2, block=64),
    DrSpec(dtype=DType.fp16, bias=True, bm=16, bn=8, warps=2, depth=2, block=16),
    DrSpec(dtype=DType.bf16, bm=64, bn=32, warps=1, depth=1, block=32),  # one warp: stores from the accumulators
    DrSpec(dtype=DType.fp16, bm=48, bn=32, warps=16, depth=1, block=32),
    SimtSpec(dtype=DType.fp32, bm=128, bn=64, bk=16, wm=32, wn=32, tm=8, tn=4, block=64),
    SimtSpec(dtype=DType.fp32, bias=True, bm=64, bn=16, bk=16, wm=32, wn=16, tm=4, tn=4, stages=1, block=16),
    SimtSpec(dtype=DType.bf16, bias=True, bm=64, bn=32, bk=32, wm=32, wn=32, tm=4, tn=8, vec=8, pad=8, stages=3,
             copy="async", split_k=2, reduce="two_pass", block=32),
    SimtSpec(dtype=DType.fp32, bm=128, bn=64, bk=16, wm=32, wn=32, tm=4, tn=8, stages=3, copy="async", split_k=4,
             reduce="atomic", block=64),
    SimtSpec(dtype=DType.bf16, bias=True, bm=32, bn=32, bk=16, wm=16, wn=16, tm=2, tn=4, pad=8, stages=3,
             copy="async", split_k=4, reduce="cluster", block=32),
]


@pytest.fixture(scope="module")
def evaluator():
    with Evaluator(baseline=False, timing=QUICK, timeout_s=120.0) as ev:
        yield ev


@pytest.mark.parametrize("spec", VARIANTS, ids=[s.name for s in VARIANTS])
def test_sparse_kernel_is_correct_on_every_pattern(evaluator, spec):
    assert not spec.check(), spec.check()
    for m, pattern in _patterns(spec.block):
        problem = sparse.problem_for(m, pattern, spec.dtype, spec.bias)
        result, _ = evaluator.evaluate(spec, problem)
        if result["status"] == "invalid" and "k-tiles" in result["evidence"]:
            continue
        assert result["status"] == "ok", f"{spec.name} on {problem.key}: {result['evidence']}"


def test_a_dense_kernel_is_refused_for_a_sparse_problem_and_back(evaluator):
    problem = sparse.problem_for(64, sparse.Pattern.random(128, 128, 32, 0.5), DType.bf16)
    dense = TcSpec(dtype=DType.bf16)
    result, _ = evaluator.evaluate(dense, problem)
    assert result["status"] == "invalid" and "block" in result["evidence"]


def test_sparse_baselines_are_timed_in_the_same_run():
    pytest.importorskip("torch")
    pattern = sparse.Pattern.random(1024, 1024, 64, 0.25, seed=5)
    problem = sparse.problem_for(512, pattern, DType.bf16)
    with Evaluator(baseline=True, timing=QUICK, timeout_s=300.0) as ev:
        result, _ = ev.evaluate(TcSpec(dtype=DType.bf16, **TC), problem)
    assert result["status"] == "ok", result["evidence"]
    assert {"cublas", "torch_bsr"} <= set(result["baselines"]), result["baselines"]
    assert set(result["ratio"]) == set(result["baselines"])
    assert all(np.isfinite(v) and v > 0 for v in result["ratio"].values())
