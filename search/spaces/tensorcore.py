"""Search space of the tensor-core family (codegen/families/tensorcore.py): one definition."""

from __future__ import annotations

from codegen.families.tensorcore import Spec
from codegen.problem import DType, Layout, Problem
from search.space import Space, split_choices, split_of, split_value

NAME = "tensorcore"


def space(dtype: DType = DType.bf16, block: int = 0, layout: Layout = Layout.forward) -> Space:
    """Everything the tensor-core template can express that is worth trying. With a block-sparse
    W (``block`` > 0) the block tile spans one block row or an equal part of it, so ``bn`` is a
    divisor of the block, and W needs no packing; a k-tile is part of a block or several whole
    blocks. Deep pipelines (6 and 8 stages) are for small tiles, whose k-tiles a few kept blocks
    of a block row can all have in flight at once. The backward
    layouts have no pack prepass. ``split`` is split-K with its reduction (atomics only for the
    fp32 output of tf32; ``search.space.split_choices``). The weight gradient of a block-sparse W
    (dW sampled at its kept blocks) tiles each kept block in parts (``bm`` and ``bn`` divide the
    block), runs them in the pattern's order over the whole batch: no ``group_m``, no ``split``."""
    dims = {
        "mma": ("mma", "wmma"),
        "bm": (16, 32, 64, 128, 256),
        "bn": (16, 32, 64, 128, 256),
        "bk": (16, 32, 64, 128, 256),
        "wm": (16, 32, 64),
        "wn": (16, 32, 64),
        "warps_k": (1, 2, 4, 8),
        "stages": (2, 3, 4, 5, 6, 8),
        "smem": ("swizzle", "pad"),
        "epilogue": ("direct", "smem"),
        "group_m": (1, 4, 8, 16),
        "split": split_choices((1, 2, 4, 8), ("atomic", "two_pass") if DType(dtype) is DType.tf32 else ("two_pass",)),
        "prepass": ("none", "pack"),
    }
    if block or Layout(layout) is not Layout.forward:
        del dims["prepass"]
    if block:
        dims["bn"] = tuple(v for v in dims["bn"] if block % v == 0)
        dims["wn"] = tuple(v for v in dims["wn"] if block % v == 0)
    if block and Layout(layout) is Layout.grad_weight:
        dims["bm"] = tuple(v for v in dims["bm"] if block % v == 0)
        dims["wm"] = tuple(v for v in dims["wm"] if block % v == 0)
        del dims["group_m"], dims["split"]
    return Space(NAME, dims)


#: A narrowing small enough to sweep exhaustively on a GPU in minutes.
RESTRICTED = dict(
    mma=("mma",), bm=(64, 128), bn=(128, 256), bk=(32, 64), wm=(64,), wn=(32, 64), warps_k=(1,), stages=(3, 4),
    smem=("swizzle",), epilogue=("direct",), group_m=(8,), split=("k1",), prepass=("none",),
)

#: Larger narrowings, recorded exhaustively on the H200 for harder replays: block and warp tiles,
#: slice-K warps, pipeline depth, epilogue, raster order and split-K of the mma.sync path.
NARROWINGS = {
    "large": dict(
        mma=("mma",), bm=(64, 128, 256), bn=(64, 128, 256), bk=(32, 64), wm=(32, 64), wn=(32, 64), warps_k=(1, 2),
        stages=(2, 3, 4, 5), smem=("swizzle",), epilogue=("direct", "smem"), group_m=(1, 8), split=("k1", "k2r"),
        prepass=("none",),
    ),
}

#: Known-good points: the best kernels of the searched H200 suite (2026-12-01,
#: benchmarks/results/tensorcore-NVIDIA_H200-2026-12-01T043328Z.json). A search tries them first;
#: those invalid for a problem cost nothing.
def _point(bm, bn, bk, wm, wn, warps_k, stages, epilogue, group_m=8, prepass="none") -> dict:
    return dict(mma="mma", bm=bm, bn=bn, bk=bk, wm=wm, wn=wn, warps_k=warps_k, stages=stages, smem="swizzle",
                epilogue=epilogue, group_m=group_m, split="k1", prepass=prepass)


SEEDS = [
    _point(128, 256, 32, 64, 64, 1, 3, "smem"),  # large bf16/fp16 layers: 8 warps of 64x64, 16-byte stores
    _point(128, 256, 32, 64, 64, 1, 4, "smem"),
    _point(128, 128, 32, 64, 64, 1, 3, "direct", prepass="pack"),  # K breaking 16-byte rows: pack first
    _point(32, 16, 256, 16, 16, 4, 4, "smem"),  # skinny (M <= 32): slice-K warps, narrow N tiles
    _point(16, 16, 256, 16, 16, 4, 5, "smem", group_m=4),  # GEMV
    _point(128, 128, 16, 64, 64, 1, 5, "direct", group_m=16, prepass="pack"),  # tf32: rounded once by the pack
]


#: Block-sparse W: the best kernels of the searched H200 sparsity suite (2026-12-01,
#: benchmarks/results/sparse-NVIDIA_H200-2026-12-01T062446Z.json and ...T064451Z.json), found with
#: bn = the block; their bn is None, which ``to_spec`` makes the problem's block (as it does a bn
#: that cannot part it).
SPARSE_SEEDS = [
    _point(128, None, 64, 64, 32, 1, 4, "smem"),  # block 64, density 0.25-0.5
    _point(128, None, 32, 32, 64, 1, 4, "smem"),  # block 64, density 0.1
    _point(256, None, 32, 64, 32, 1, 4, "smem", group_m=4),  # block 32
    _point(128, None, 32, 64, 32, 1, 4, "smem"),
    _point(128, None, 64, 32, 16, 1, 4, "smem"),  # block 16: four blocks per k-tile
    _point(128, None, 16, 32, 16, 1, 4, "smem"),
    _point(32, None, 64, 32, 32, 2, 4, "smem"),  # batch 32
    _point(32, None, 64, 16, 16, 2, 4, "smem", group_m=4),
    _point(32, None, 128, 16, 16, 4, 4, "smem"),
    dict(_point(32, None, 32, 16, 32, 1, 4, "smem", group_m=4), split="k4r"),
    # batch 32, block tiles over half a block of 64 (benchmarks/results/sparse-hand-NVIDIA_H200-2026-12-04T051744Z.json):
    _point(32, 32, 64, 16, 16, 1, 8, "direct"),  # blocks 32 and 64, density 0.05-0.1
    _point(32, 32, 128, 32, 16, 4, 4, "smem"),  # block 64, density 0.25-0.5
    _point(32, 32, 128, 32, 16, 4, 6, "smem"),  # block 32, density 0.25
]


#: dW sampled at a block-sparse W's kept blocks (layout grad_weight): tiles of a whole block or of an
#: equal part of one (bm or bn None: the problem's block, as is one that does not divide it), fed by
#: deep k-tiles of the batch. Not yet timed on a GPU: starting points, the ones a block refuses cost nothing.
SAMPLED_SEEDS = [
    _point(None, None, 32, 32, 32, 1, 4, "smem", group_m=1),  # blocks 32 and 64: 1 or 4 warps of 32x32
    _point(None, None, 64, 32, 32, 1, 3, "smem", group_m=1),
    _point(32, 32, 64, 16, 16, 1, 4, "smem", group_m=1),  # quarters of a block of 64, blocks of 32 whole
    _point(32, 32, 128, 16, 16, 4, 4, "smem", group_m=1),  # slice-K warps over a long batch
    _point(16, 16, 128, 16, 16, 2, 4, "smem", group_m=1),  # blocks of 16
    _point(None, None, 32, 64, 32, 1, 4, "direct", group_m=1),
]


def to_spec(point: dict, problem: Problem) -> Spec:
    """Map a point onto a spec for the problem. Choices a rule fixes are derived, not sampled:
    wmma takes a padded layout and a staged epilogue, slice-K a staged epilogue, and a backward
    layout no pack prepass; dW sampled at a block-sparse W's kept blocks tiles parts of a block (a
    bm or bn that is None or does not divide it becomes the block), in the pattern's order
    (group_m 1), with no split-K."""
    p = dict(point)
    if problem.block and problem.layout is Layout.grad_weight:
        for side in ("bm", "bn"):
            if p.get(side) is None or problem.block % p[side]:
                p[side] = problem.block
        p.update(group_m=1, split="k1")
    if problem.block:
        if p.get("bn") is None or problem.block % p["bn"]:  # no bn (the seeds), or one that cannot part the block
            p["bn"] = problem.block
        p.update(prepass="none", block=problem.block)
    if problem.layout is not Layout.forward:
        p["prepass"] = "none"  # no pack prepass in the backward layouts (not a dimension of their space)
    if p["mma"] == "wmma":
        p.update(smem="pad", epilogue="smem")
    if p["warps_k"] > 1:
        p["epilogue"] = "smem"
    p["split_k"], p["reduce"] = split_of(p.pop("split"))
    return Spec(dtype=problem.dtype, bias=problem.bias, layout=problem.layout, **p)


def point_of(spec: Spec) -> dict:
    """The point of the space that maps onto ``spec`` (inverse of to_spec)."""
    d = spec.to_dict()
    dims = space(spec.dtype, spec.block, spec.layout).dims
    point = {k: d[k] for k in dims if k != "split"}
    if "split" in dims:
        point["split"] = split_value(spec.split_k, spec.reduce)
    return point
