"""Search space of the sparse24 family (codegen/families/sparse24.py): one definition."""

from __future__ import annotations

from codegen.families.sparse24 import Spec
from codegen.problem import DType, Layout, Problem
from search.space import Space, split_choices, split_of, split_value

NAME = "sparse24"


def space(dtype: DType = DType.bf16, block: int = 0, layout: Layout = Layout.forward) -> Space:
    """Everything the sparse24 template can express that is worth trying, for a 2:4 W (the family
    computes no other): block and warp tiles (``bm``, ``wm`` over X's rows, ``bn``, ``wn`` over W's),
    k-tiles of one to eight instructions' depth, pipeline depth, shared layout, epilogue, raster
    order and split-K (two passes: the outputs are 16-bit)."""
    if block:
        raise ValueError(f"the {NAME} family computes a 2:4 sparse W, not a block-sparse one; drop --block or "
                         f"choose another --family")
    dims = {
        "bm": (16, 32, 64, 128, 256),
        "bn": (16, 32, 64, 128, 256),
        "bk": (32, 64, 128, 256),
        "wm": (8, 16, 32, 64),
        "wn": (16, 32, 64),
        "stages": (2, 3, 4, 5, 6, 8),
        "smem": ("swizzle", "pad"),
        "epilogue": ("direct", "smem"),
        "group_m": (1, 4, 8, 16),
        "split": split_choices((1, 2, 4, 8), ("two_pass",)),
    }
    return Space(NAME, dims)


#: A narrowing small enough to sweep exhaustively on a GPU in minutes.
RESTRICTED = dict(bm=(64, 128), bn=(64, 128), bk=(64, 128), wm=(32, 64), wn=(32, 64), stages=(3, 4),
                  smem=("swizzle",), epilogue=("smem",), group_m=(8,), split=("k1",))


def _point(bm, bn, bk, wm, wn, stages, epilogue="smem", group_m=8, split="k1") -> dict:
    return dict(bm=bm, bn=bn, bk=bk, wm=wm, wn=wn, stages=stages, smem="swizzle", epilogue=epilogue,
                group_m=group_m, split=split)


#: Starting points, each without spills under NVRTC 13.0: a large layer, batches of about 64 (unsplit,
#: and split over K for a layer too narrow to fill the card), the default, a shallow k-tile, batches
#: of 32 and fewer (the last split over K). A search tries them first; those invalid for a problem cost
#: nothing. At M = 64 in engine timing on an H100 (benchmarks/NOTES.md, "2:4 decode at M = 64"), the
#: 64x64 tiles took 31.5 us on 14336x4096 unsplit and 37.4 us on 4096x14336 split in four, against
#: 32.3 and 82.7 us for 64x128 unsplit (dense cuBLAS: 42 and 46 us).
SEEDS = [
    _point(128, 128, 64, 64, 32, 3),
    _point(64, 64, 64, 32, 32, 4),
    _point(64, 64, 64, 32, 32, 4, split="k4r"),
    _point(64, 128, 64, 32, 32, 4),
    _point(64, 128, 32, 32, 64, 4),
    _point(32, 64, 128, 16, 32, 4),
    _point(16, 64, 128, 8, 32, 4, group_m=4),
    _point(16, 32, 128, 16, 16, 4, split="k4r"),
]


def to_spec(point: dict, problem: Problem) -> Spec:
    """Map a point onto a spec for the problem (split-K with its reduction from ``split``)."""
    p = dict(point)
    p["split_k"], p["reduce"] = split_of(p.pop("split"))
    return Spec(dtype=problem.dtype, bias=problem.bias, **p)


def point_of(spec: Spec) -> dict:
    """The point of the space that maps onto ``spec`` (inverse of to_spec)."""
    d = spec.to_dict()
    point = {k: d[k] for k in space(spec.dtype).dims if k != "split"}
    point["split"] = split_value(spec.split_k, spec.reduce)
    return point
