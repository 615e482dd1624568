"""The SIMT family's search space: everything templates/simt.cu.j2 can express worth trying.

Two rules are built into the dimensions rather than left to ``Spec.check``: the pipeline depth
allowed depends on the copy mode (register copies 1 or 2 stages, cp.async 2 to 4), so ``pipeline``
is one dimension over the allowed pairs, spelled as in kernel names (``s2``: 2 stages through
registers, ``s3c``: 3 stages of cp.async); and a reduction exists only with split-K, and atomics
only for an fp32 output, so ``split`` is one dimension (``search.space.split_choices``).
"""

from __future__ import annotations

from codegen.families.simt import Spec
from codegen.problem import DType, Layout, Problem
from search.space import Space, split_choices, split_of, split_value

NAME = "simt"
#: Copy mode and stages, the pairs ``Spec.check`` allows (stages 0, no shared memory, is not searched).
PIPELINES = ("s1", "s2", "s2c", "s3c", "s4c")
#: Split-K reductions: atomics need an fp32 output (indexed by ``dtype is fp32``); a cluster reduce
#: (sm_90+, at most 8 splits) is told apart by ``Spec.check``; ``last`` (the last split to finish a
#: tile sums it) works for every dtype.
REDUCES = {False: ("two_pass", "cluster", "last"), True: ("atomic", "two_pass", "cluster", "last")}


def pipeline_value(stages: int, copy: str) -> str:
    """The ``pipeline`` choice of ``stages`` stages copied by ``copy`` (``reg`` or ``async``)."""
    return f"s{stages}{'c' if copy == 'async' else ''}"


def pipeline_of(value: str) -> tuple[int, str]:
    """(stages, copy) of a ``pipeline`` choice (the inverse of ``pipeline_value``)."""
    copy = "async" if value.endswith("c") else "reg"
    digits = value[1:-1] if copy == "async" else value[1:]
    if not value.startswith("s") or not digits.isdigit():
        raise ValueError(f"{value!r} is not a pipeline choice (s<stages>, then c for cp.async)")
    return int(digits), copy



def space(dtype: DType = DType.fp32, block: int = 0, layout: Layout = Layout.forward) -> Space:
    """With a block-sparse W (``block`` > 0) the block tile spans one block row, so ``bn`` is the
    block (not sampled), k-tiles divide the block, and tiles go through shared memory. The backward
    layouts take the same dimensions (their k-outer operands are loaded in runs along bm or bn,
    which ``Spec.check`` asks ``vec`` to divide), but for the weight gradient of a block-sparse W
    (dW sampled at its kept blocks): its block tiles are parts of a block (``bm`` and ``bn`` divide
    it), run in the pattern's order over the whole batch (no ``group_m``, no ``split``)."""
    dims = {
        "bm": (1, 2, 4, 8, 16, 32, 64, 128, 256),
        "bn": (32, 64, 128, 256),
        "bk": (8, 16, 32, 64, 128),
        "tm": (1, 2, 4, 8),
        "tn": (1, 2, 4, 8),
        "lanes_m": (1, 2, 4, 8, 16, 32),  # lanes along m in a warp; 32 / lanes_m along n
        "pad": (0, 4, 8),
        "vec": (1, 2, 4) if dtype is DType.fp32 else (1, 2, 4, 8),
        "pipeline": PIPELINES,
        "group_m": (1, 4, 8),
        "split": split_choices((1, 2, 4, 8, 16, 32), REDUCES[DType(dtype) is DType.fp32]),
    }
    if block and Layout(layout) is Layout.grad_weight:
        dims["bm"] = tuple(v for v in dims["bm"] if v >= 16 and block % v == 0)
        dims["bn"] = tuple(v for v in (16, 32, 64) if block % v == 0)
        del dims["group_m"], dims["split"]
    elif block:
        del dims["bn"]
        dims["bk"] = tuple(v for v in dims["bk"] if block % v == 0)
    return Space(NAME, dims)


#: A narrowing small enough to sweep exhaustively on a GPU in minutes (replay recordings use it).
RESTRICTED = dict(
    bm=(64, 128, 256), bn=(64, 128), bk=(8, 16, 32), tm=(4, 8), tn=(4, 8), lanes_m=(2, 4, 8),
    pad=(0, 4), vec=(4,), pipeline=("s2",), group_m=(1, 8), split=("k1",),
)

#: Larger narrowings, recorded exhaustively on the H200 for harder replays: the dimensions that
#: matter for a skinny layer (copy mode, stages, split-K and its reduction) with the tiles around
#: the good region for M = 32 (bm <= 32).
NARROWINGS = {
    "skinny": dict(
        bm=(16, 32), bn=(64, 128, 256), bk=(16, 32), tm=(2, 4), tn=(4, 8), lanes_m=(2, 4, 8), pad=(4,), vec=(4,),
        pipeline=("s2", "s2c", "s3c", "s4c"), group_m=(1,), split=split_choices((1, 4, 8, 16), ("atomic", "two_pass")),
    ),
}

#: Known-good points (measured on the H200, see benchmarks/NOTES.md): the square tile and the
#: skinny cp.async tile with split-K.
SEEDS: list[dict] = [
    dict(bm=128, bn=128, bk=16, tm=8, tn=8, lanes_m=4, pad=4, vec=4, pipeline="s2", group_m=8, split="k1"),
    dict(bm=32, bn=128, bk=32, tm=4, tn=8, lanes_m=4, pad=4, vec=4, pipeline="s3c", group_m=1, split="k8a"),
]


def _sparse(bm, bk, tm, tn, lanes_m, stages, copy, split_k=1) -> dict:
    return dict(bm=bm, bn=64, bk=bk, tm=tm, tn=tn, lanes_m=lanes_m, pad=4, vec=4, pipeline=pipeline_value(stages, copy),
                group_m=1, split=split_value(split_k, "atomic"))


#: Block-sparse W: the best kernels of the searched H200 sparsity suite (fp32, 2026-12-01,
#: benchmarks/results/sparse-NVIDIA_H200-2026-12-01T063544Z.json); ``bn`` is the problem's block.
SPARSE_SEEDS: list[dict] = [
    _sparse(128, 16, 8, 8, 4, 2, "reg"),  # block 64
    _sparse(64, 16, 8, 8, 4, 2, "async"),
    _sparse(128, 16, 8, 4, 8, 3, "async"),  # blocks 16 and 32
    _sparse(128, 16, 8, 4, 4, 2, "reg"),
    _sparse(32, 32, 4, 4, 4, 3, "async", split_k=4),  # batch 32
    _sparse(32, 16, 4, 2, 8, 2, "reg", split_k=8),
]


def _sampled(bm, bn, bk, tm, tn, lanes_m, stages, copy) -> dict:
    return dict(bm=bm, bn=bn, bk=bk, tm=tm, tn=tn, lanes_m=lanes_m, pad=4, vec=4, pipeline=pipeline_value(stages, copy),
                group_m=1, split="k1")


#: dW sampled at a block-sparse W's kept blocks (layout grad_weight): tiles of a whole block or of an
#: equal part of one (bm or bn None: the problem's block, as is one that does not divide it). Not yet
#: timed on a GPU: starting points, the ones a block refuses cost nothing.
SAMPLED_SEEDS: list[dict] = [
    _sampled(None, None, 16, 8, 8, 4, 2, "reg"),  # block 64: 2 warps of 32x64
    _sampled(None, None, 16, 8, 8, 4, 3, "async"),
    _sampled(32, 32, 16, 4, 4, 4, 3, "async"),  # blocks 32, quarters of 64
    _sampled(32, 32, 32, 4, 4, 4, 2, "reg"),
    _sampled(16, 16, 16, 2, 4, 8, 2, "reg"),  # blocks 16
]


def to_spec(point: dict, problem: Problem) -> Spec:
    """Map a point of the space onto a spec for the problem (may be an invalid spec). dW sampled at
    a block-sparse W's kept blocks tiles parts of a block (a bm or bn that is None or does not
    divide it becomes the block), in the pattern's order (group_m 1), with no split-K."""
    p = dict(point)
    if problem.block and problem.layout is Layout.grad_weight:
        for side in ("bm", "bn"):
            if p.get(side) is None or problem.block % p[side]:
                p[side] = problem.block
        p.update(group_m=1, split="k1", block=problem.block)
    elif problem.block:
        p.update(bn=problem.block, block=problem.block)
    lanes_m = p.pop("lanes_m")
    p["stages"], p["copy"] = pipeline_of(p.pop("pipeline"))
    p["split_k"], p["reduce"] = split_of(p.pop("split"))
    return Spec(dtype=problem.dtype, bias=problem.bias, layout=problem.layout, wm=lanes_m * p["tm"], wn=(32 // lanes_m) * p["tn"], **p)


def point_of(spec: Spec) -> dict:
    """The point of the space that maps onto ``spec`` (inverse of to_spec)."""
    d = spec.to_dict()
    dims = space(spec.dtype, spec.block, spec.layout).dims
    point = {k: d[k] for k in ("bm", "bn", "bk", "tm", "tn", "pad", "vec", "group_m") if k in dims}
    point["lanes_m"] = spec.wm // spec.tm
    point["pipeline"] = pipeline_value(spec.stages, spec.copy)
    if "split" in dims:
        point["split"] = split_value(spec.split_k, spec.reduce)
    return point
