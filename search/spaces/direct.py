"""Search space of the direct family (codegen/families/direct.py): one definition."""

from __future__ import annotations

from codegen.families.direct import Spec
from codegen.problem import DType, Layout, Problem
from search.space import Space

NAME = "direct"


def space(dtype: DType = DType.bf16, block: int = 0, layout: Layout = Layout.forward) -> Space:
    """Everything the direct template can express that is worth trying, for a W block-sparse in
    ``block``-sized blocks (the family has no dense variant): ``bn`` divides the block."""
    if not block:
        raise ValueError(f"the {NAME} family is generated for a block-sparse W only; give --block (with "
                         f"--density or --weights) or choose another --family")
    dims = {
        "bm": (16, 32, 64),
        "bn": tuple(v for v in (8, 16, 32, 64) if block % v == 0),
        "warps": (1, 2, 4, 8, 16),
        "depth": (1, 2),
    }
    return Space(NAME, dims)


#: A narrowing small enough to sweep exhaustively on a GPU in seconds.
RESTRICTED = dict(bm=(32,), bn=(16, 32), warps=(4, 8), depth=(1, 2))


#: Known-good points: the family's fastest at batch 32 on the H200 (searches of 40 and 120 trials, whose
#: logs git keeps at 92631da:benchmarks/results/device-2026-12-04c/, and the hand suite
#: benchmarks/results/sparse-hand-NVIDIA_H200-2026-12-04T051744Z.json); the family has no dense variant.
SEEDS: list[dict] = []
SPARSE_SEEDS = [
    dict(bm=16, bn=16, warps=8, depth=2),  # block 64, density 0.1
    dict(bm=16, bn=16, warps=8, depth=1),  # block 32, density 0.1; block 16, density 0.25
    dict(bm=32, bn=16, warps=16, depth=2),  # block 16, density 0.25-0.5
    dict(bm=32, bn=8, warps=8, depth=1),  # block 16, density 0.1
    dict(bm=32, bn=16, warps=8, depth=1),  # blocks 32 and 64
]


def to_spec(point: dict, problem: Problem) -> Spec:
    """Map a point onto a spec for the problem; the block is the problem's."""
    return Spec(dtype=problem.dtype, bias=problem.bias, block=problem.block, **point)


def point_of(spec: Spec) -> dict:
    """The point of the space that maps onto ``spec`` (inverse of to_spec)."""
    d = spec.to_dict()
    return {k: d[k] for k in ("bm", "bn", "warps", "depth")}
