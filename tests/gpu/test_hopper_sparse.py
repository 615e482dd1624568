"""GPU tier for the Hopper family's block-sparse W (sm_90 only): every variant kind (blocks 16, 32,
64; bf16 and fp16; bias; one or two consumer warpgroups; a plain grid, a persistent grid with
balanced ranges, two blocks per multiprocessor) validated through the project's evaluation path
(float64 reference with the masked dense W, NaN-poisoned output, the odd probe with an empty block
row) on awkward patterns: ragged N and K, empty block rows, an all-zero W, a fully dense W, M = 1,
rows of very different weight, and 4096^3 at density 0.1. About 30 s with ``-n 4`` on an H200."""

from __future__ import annotations

import numpy as np
import pytest

from codegen import sparse
from codegen.evaluate import Evaluator
from codegen.families.hopper import Spec
from codegen.problem import DType
from tests.gpu.test_hopper import _compute_cap

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(_compute_cap() != "9.0", reason="the hopper family needs an sm_90 GPU")]

QUICK = {"reps_min": 3, "reps_max": 3, "target_ms": 1.0}


def _patterns(block: int) -> list[tuple[int, sparse.Pattern]]:
    """(m, pattern), K always a multiple of 8 (16-byte rows of X, which TMA needs)."""
    b = block
    rows_empty = sparse.Pattern.random(5 * b, 7 * b, b, 0.6, seed=3).mask()
    rows_empty[[0, 2, 4]] = False
    skew = np.zeros((24, 6), dtype=bool)  # rows of very different weight: full, empty, one block
    skew[:4] = True
    skew[10, 2] = skew[17, 5] = True
    found = [
        (256, sparse.Pattern.random(8 * b, 6 * b, b, 0.3, seed=1)),
        (67, sparse.Pattern.random(3 * b + 5, 5 * b + 8, b, 0.4, seed=2)),  # ragged N and K
        (64, sparse.Pattern.random(2 * b, 2 * b, b, 0.0)),  # an all-zero W: zeros (+ bias)
        (130, sparse.Pattern.random(3 * b - 1, 4 * b + 8, b, 1.0)),  # every block kept
        (96, sparse.Pattern.from_mask(rows_empty, 5 * b, 7 * b, b)),  # empty block rows
        (1, sparse.Pattern.random(4 * b, 9 * b, b, 0.5, seed=4)),  # M = 1
        (1000, sparse.Pattern.from_mask(skew, 24 * b, 6 * b, b)),
    ]
    if b == 64:
        found.append((67, sparse.Pattern.random(200, 136, 64, 0.5, seed=6)))  # 4 x 3 blocks, both edges partial
    return found


VARIANTS = [
    Spec(block=64, bn=64, bm=128, stages=8, persistent=True),
    Spec(block=64, bn=64, bm=256, stages=4, bias=True),
    Spec(block=64, bn=64, bm=128, stages=4, ctas=2, dtype=DType.fp16, bias=True),
    Spec(block=64, bn=64, bm=128, consumers=1, stages=6, persistent=True, dtype=DType.fp16),
    Spec(block=32, bn=32, bm=128, stages=12, persistent=True, bias=True),
    Spec(block=32, bn=32, bm=128, consumers=1, stages=4, ctas=2, dtype=DType.fp16),
    Spec(block=32, bn=32, bm=256, stages=8, group_m=1),
    Spec(block=16, bn=16, bm=128, stages=16, persistent=True, dtype=DType.fp16, bias=True),
    Spec(block=16, bn=16, bm=64, consumers=1, stages=3),
    Spec(block=16, bn=16, bm=128, stages=4, ctas=2, bias=True),
    Spec(block=64, bn=64, bm=128, stages=4, ctas=2, persistent=True, bias=True),  # two balanced ranges per SM
    Spec(block=32, bn=32, bm=128, consumers=1, stages=6, ctas=2, persistent=True, dtype=DType.fp16),
    Spec(block=64, bn=64, bm=128, stages=4, ctas=2, persistent=True, grouped=True, bias=True),  # grouped order
    Spec(block=16, bn=16, bm=64, consumers=1, stages=8, persistent=True, grouped=True, group_m=4),
    # swapped operands (W's block as wgmma's A, X's rows as its N)
    Spec(block=64, bn=64, bm=128, consumers=1, stages=4, ctas=2, persistent=True, grouped=True, bias=True, swap=True),
    Spec(block=64, bn=64, bm=256, stages=4, dtype=DType.fp16, swap=True),
    Spec(block=64, bn=64, bm=256, consumers=1, stages=4, bias=True, swap=True),
    Spec(block=64, bn=64, bm=32, consumers=1, stages=8, swap=True),
]


@pytest.fixture(scope="module")
def evaluator():
    with Evaluator(baseline=False, timing=QUICK, timeout_s=120.0) as ev:
        yield ev


def _assert_ok(evaluator, spec: Spec, m: int, pattern: sparse.Pattern) -> dict:
    problem = sparse.problem_for(m, pattern, spec.dtype, spec.bias)
    result, _ = evaluator.evaluate(spec, problem)
    assert result["status"] == "ok", f"{spec.name} on {problem.key} (density {pattern.density:.2f}): {result['evidence']}"
    assert result["rel_error"] <= spec.dtype.rel_tol
    return result


@pytest.mark.parametrize("spec", VARIANTS, ids=[s.name for s in VARIANTS])
def test_sparse_kernel_is_correct_on_every_pattern(evaluator, spec):
    assert not spec.check(), spec.check()
    for m, pattern in _patterns(spec.block):
        _assert_ok(evaluator, spec, m, pattern)


#: A fragments through registers (blocks 64 and 32; a block of 16 is one k-step, refused).
A_REGS = [
    Spec(block=64, bn=64, bm=128, stages=8, persistent=True, a_regs=True),
    Spec(block=64, bn=64, bm=256, stages=4, bias=True, a_regs=True),
    Spec(block=64, bn=64, bm=128, stages=4, ctas=2, dtype=DType.fp16, bias=True, a_regs=True),
    Spec(block=64, bn=64, bm=128, consumers=1, stages=6, persistent=True, dtype=DType.fp16, a_regs=True),
    Spec(block=32, bn=32, bm=128, stages=12, persistent=True, bias=True, a_regs=True),
    Spec(block=32, bn=32, bm=128, consumers=1, stages=4, ctas=2, dtype=DType.fp16, a_regs=True),
    Spec(block=32, bn=32, bm=256, stages=8, group_m=1, a_regs=True),
]


@pytest.mark.parametrize("spec", A_REGS, ids=[s.name for s in A_REGS])
def test_a_regs_sparse_kernel_is_correct_on_every_pattern(evaluator, spec):
    assert not spec.check(), spec.check()
    for m, pattern in _patterns(spec.block):
        _assert_ok(evaluator, spec, m, pattern)


#: 512-row tiles (X's tile loaded as two boxes of 256 rows): batches that end in the first box (the second is
#: not loaded), inside the second, past one tile, and a large layer.
TALL = [
    Spec(block=64, bn=64, bm=512, stages=3, persistent=True, grouped=True, group_m=1),
    Spec(block=64, bn=64, bm=512, stages=3, persistent=True, grouped=True, bias=True, swap=True),
    Spec(block=64, bn=64, bm=512, stages=3, dtype=DType.fp16, bias=True),
    Spec(block=32, bn=32, bm=512, stages=4, persistent=True, dtype=DType.fp16),
]


@pytest.mark.parametrize("spec", TALL, ids=[s.name for s in TALL])
def test_512_row_tiles_are_correct(evaluator, spec):
    assert not spec.check(), spec.check()
    b = spec.block
    for m, pattern in [*_patterns(b)[:2], (300, sparse.Pattern.random(5 * b, 6 * b + 8, b, 0.5, seed=6)),
                       (1025, sparse.Pattern.random(3 * b + 5, 4 * b, b, 0.4, seed=7)),
                       (2048, sparse.Pattern.random(4096, 4096, b, 0.25, seed=8))]:
        _assert_ok(evaluator, spec, m, pattern)


@pytest.mark.parametrize("spec", [VARIANTS[0], VARIANTS[2], VARIANTS[4]], ids=lambda s: s.name)
def test_a_large_layer_at_density_a_tenth(evaluator, spec):
    pattern = sparse.Pattern.random(4096, 4096, spec.block, 0.1, seed=11)
    _assert_ok(evaluator, spec, 4096 if spec.block == 64 else 32, pattern)


def test_k_that_breaks_16_byte_rows_is_refused_with_the_reason(evaluator):
    spec = VARIANTS[0]
    problem = sparse.problem_for(67, sparse.Pattern.random(128, 91, 64, 0.5), spec.dtype)
    result, _ = evaluator.evaluate(spec, problem)
    assert result["status"] == "invalid" and "K=91" in result["evidence"] and "tensorcore" in result["evidence"]
