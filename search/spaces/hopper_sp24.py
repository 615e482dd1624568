"""Search space of the Hopper 2:4 family (codegen/families/hopper_sp24.py): one definition."""

from __future__ import annotations

from codegen.families.hopper_sp24 import Spec
from codegen.problem import DType, Layout, Problem
from search.space import Space

NAME = "hopper_sp24"


def space(dtype: DType = DType.bf16, block: int = 0, layout: Layout = Layout.forward) -> Space:
    """Everything the Hopper 2:4 template can express that is worth trying, for a 2:4 W (the family
    computes no other), as the Hopper family's: block tiles (``bm`` X's rows, wgmma's N; ``bn`` W's
    rows, split over the consumer warpgroups in m64 blocks), the k-tile (``bk`` 64 or 128 dense columns:
    two or four sparse k-steps per ring stage), ring depth, consumers, persistent grid, raster order and
    the epilogue (Yᵀ stored from registers, or through shared memory as 16-byte pieces of Y's rows) and
    ``cluster`` (2: pairs of blocks along M, WC's box multicast by TMA to both).
    The pack prepass is not sampled: it is on exactly when K breaks TMA's 16-byte row pitch
    (``to_spec``); nor is the metadata path (``meta``: the ring, the family's default)."""
    if block:
        raise ValueError(f"the {NAME} family computes a 2:4 sparse W, not a block-sparse one; drop --block or "
                         f"choose another --family")
    if Layout(layout) is not Layout.forward:
        raise ValueError(f"the {NAME} family generates the forward layout only, not {Layout(layout).value}")
    dims = {
        "bm": (16, 32, 64, 128, 256),
        "bn": (64, 128, 192, 256),
        "bk": (64, 128),
        "stages": (2, 3, 4, 5, 6, 8),
        "consumers": (1, 2),
        "persistent": (False, True),
        "group_m": (1, 4, 8, 16),
        "epilogue": ("direct", "smem"),
        "cluster": (1, 2),
    }
    return Space(NAME, dims)


#: A narrowing small enough to sweep exhaustively on a GPU in minutes.
RESTRICTED = dict(bm=(64, 128, 256), bn=(128, 256), bk=(64, 128), stages=(3, 4, 5), consumers=(2,),
                  persistent=(False, True), group_m=(8,), epilogue=("direct", "smem"), cluster=(1, 2))


def _point(bm, bn, stages, consumers, persistent, group_m=8, bk=64, epilogue="direct", cluster=1) -> dict:
    return dict(bm=bm, bn=bn, bk=bk, stages=stages, consumers=consumers, persistent=persistent, group_m=group_m,
                epilogue=epilogue, cluster=cluster)


#: Starting points, each without spills under NVRTC 13.0 for sm_90a, fastest first as timed on an H100
#: (one call, L2 flushed; benchmarks/NOTES.md, "metadata ring" and "cluster pairs"): the large tile with the
#: epilogue through shared memory, persistent with a ring of five, as a cluster pair (WC's box multicast:
#: the best of a 6-trial search at 7 of 8 prefill shapes and dtypes, 0.128 ms at 4096^3 bf16) and alone (the
#: best of a 40-trial search without pairs: 0.132 ms), then not persistent with a ring of four, alone (0.140 ms)
#: and paired (the best of none of those searches); then without the shared-memory epilogue, persistent, with k-tiles of 128 (0.152-0.158 ms); then
#: narrower tiles and a batch of 16 to 64.
SEEDS = [
    _point(128, 256, 5, 2, True, epilogue="smem", cluster=2),
    _point(128, 256, 5, 2, True, epilogue="smem"),
    _point(128, 256, 4, 2, False, epilogue="smem"),
    _point(128, 256, 4, 2, False, epilogue="smem", cluster=2),
    _point(128, 256, 4, 2, False),
    _point(128, 256, 3, 2, True, bk=128),
    _point(128, 256, 4, 2, True),
    _point(128, 256, 3, 2, False, bk=128),
    _point(256, 128, 4, 2, True),
    _point(128, 128, 4, 2, True, bk=128),
    _point(128, 128, 5, 2, True),
    _point(128, 256, 2, 2, True, bk=128, epilogue="smem"),
    _point(64, 128, 6, 1, True, group_m=4),
    _point(16, 128, 6, 2, False, group_m=4),
]


def to_spec(point: dict, problem: Problem) -> Spec:
    """Map a point onto a spec for the problem: the pack prepass exactly when K is not a multiple of 8."""
    return Spec(dtype=problem.dtype, bias=problem.bias, prepass="pack" if problem.k % 8 else "none", **point)


def point_of(spec: Spec) -> dict:
    """The point of the space that maps onto ``spec`` (inverse of to_spec)."""
    d = spec.to_dict()
    return {k: d[k] for k in space(spec.dtype).dims}
