"""Search space of the tensor-core family (codegen/families/tensorcore.py): one definition."""

from __future__ import annotations

from codegen.families.tensorcore import Spec
from codegen.problem import DType, Problem
from search.space import Space

NAME = "tensorcore"


def space(dtype: DType = DType.bf16) -> Space:
    """Everything the tensor-core template can express that is worth trying."""
    return Space(
        NAME,
        {
            "mma": ("mma", "wmma"),
            "bm": (16, 32, 64, 128, 256),
            "bn": (16, 32, 64, 128, 256),
            "bk": (16, 32, 64, 128, 256),
            "wm": (16, 32, 64),
            "wn": (16, 32, 64),
            "warps_k": (1, 2, 4, 8),
            "stages": (2, 3, 4, 5),
            "smem": ("swizzle", "pad"),
            "epilogue": ("direct", "smem"),
            "group_m": (1, 4, 8, 16),
            "split_k": (1, 2, 4, 8),
            "reduce": ("atomic", "two_pass"),
            "prepass": ("none", "pack"),
        },
    )


#: A narrowing small enough to sweep exhaustively on a GPU in minutes.
RESTRICTED = dict(
    mma=("mma",), bm=(64, 128), bn=(128, 256), bk=(32, 64), wm=(64,), wn=(32, 64), warps_k=(1,), stages=(3, 4),
    smem=("swizzle",), epilogue=("direct",), group_m=(8,), split_k=(1,), reduce=("two_pass",), prepass=("none",),
)

#: Known-good points (H200, 2026-12-01, hand-picked candidates timed against cuBLAS): a search tries
#: them first; those invalid for a problem cost nothing.
SEEDS = [
    # large square layers: 4 warps of 64x64, two blocks per SM
    dict(mma="mma", bm=128, bn=128, bk=32, wm=64, wn=64, warps_k=1, stages=4, smem="swizzle", epilogue="direct",
         group_m=8, split_k=1, reduce="two_pass", prepass="none"),
    dict(mma="mma", bm=128, bn=256, bk=64, wm=64, wn=64, warps_k=1, stages=3, smem="swizzle", epilogue="direct",
         group_m=8, split_k=1, reduce="two_pass", prepass="none"),
    # K breaking 16-byte rows: pack first
    dict(mma="mma", bm=128, bn=256, bk=64, wm=64, wn=64, warps_k=1, stages=3, smem="swizzle", epilogue="direct",
         group_m=8, split_k=1, reduce="two_pass", prepass="pack"),
    # skinny layers (M <= 32) and GEMV: slice-K warps, narrow N tiles, deep pipelines
    dict(mma="mma", bm=32, bn=16, bk=128, wm=32, wn=16, warps_k=4, stages=5, smem="swizzle", epilogue="smem",
         group_m=8, split_k=1, reduce="two_pass", prepass="none"),
    dict(mma="mma", bm=16, bn=16, bk=128, wm=16, wn=16, warps_k=4, stages=5, smem="swizzle", epilogue="smem",
         group_m=8, split_k=1, reduce="two_pass", prepass="none"),
    dict(mma="mma", bm=32, bn=64, bk=64, wm=32, wn=32, warps_k=1, stages=4, smem="swizzle", epilogue="direct",
         group_m=8, split_k=4, reduce="two_pass", prepass="none"),
    # tf32
    dict(mma="mma", bm=128, bn=128, bk=16, wm=64, wn=64, warps_k=1, stages=4, smem="swizzle", epilogue="direct",
         group_m=8, split_k=1, reduce="atomic", prepass="none"),
]


def to_spec(point: dict, problem: Problem) -> Spec:
    """Map a point onto a spec for the problem. Choices a rule fixes are derived, not sampled:
    wmma takes a padded layout and a staged epilogue, slice-K a staged epilogue, a 16-bit output
    a two-pass split-K, and no split-K no reduction."""
    p = dict(point)
    if p["mma"] == "wmma":
        p.update(smem="pad", epilogue="smem")
    if p["warps_k"] > 1:
        p["epilogue"] = "smem"
    if p["split_k"] == 1:
        p["reduce"] = "none"
    elif problem.dtype is not DType.tf32:
        p["reduce"] = "two_pass"
    return Spec(dtype=problem.dtype, bias=problem.bias, **p)


def point_of(spec: Spec) -> dict:
    """The point of the space that maps onto ``spec`` (inverse of to_spec)."""
    d = spec.to_dict()
    point = {k: d[k] for k in space().dims}
    point["reduce"] = spec.reduce if spec.split_k > 1 else "two_pass"
    return point
