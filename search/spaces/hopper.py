"""Search space of the Hopper family (codegen/families/hopper.py): one definition."""

from __future__ import annotations

from codegen.families.hopper import Spec
from codegen.problem import DType, Layout, Problem
from search.space import Space

NAME = "hopper"


def space(dtype: DType = DType.bf16, block: int = 0, layout: Layout = Layout.forward) -> Space:
    """Everything the Hopper template can express that is worth trying. The k-tile is fixed (one
    128-byte swizzle span), and the pack prepass is not sampled: it is on exactly when the
    problem's K breaks TMA's 16-byte row pitch (``to_spec``). A dense W may be shared by a pair of
    blocks (``cluster`` 2: a thread-block cluster along M, W's tile multicast by TMA), and its K split
    over the grid (``split_k``, for layers of few output tiles; two passes through an fp32 workspace). With a
    block-sparse W (``block`` > 0) the block tile spans one block row and the k-tile is one block,
    so ``bn`` is the block (not sampled); the smaller stages allow deeper rings, and two blocks may
    share a multiprocessor (``ctas``), for rows that hold only a few kept blocks; its grid is one
    dimension, ``grid`` (plain, persistent over balanced ``ranges``, or persistent in ``grouped``
    order), since grouped order is a way of being persistent (``Spec.check`` refuses it otherwise); with
    blocks of 64, ``swap`` puts W's block on wgmma's M side and the tile's X rows on its N side (wgmma N
    is ``bm / consumers`` instead of the block), for the forward layout. The backward layouts
    (dense W) load their k-outer operands in boxes of 64 columns, so ``bn`` is a multiple of 64, and
    have no cluster pairs. dW sampled at a block-sparse W's kept blocks (grad_weight, blocks of 64) has tiles
    of one block row (``bm`` the block) holding ``bn / block`` of its kept blocks per consumer warpgroup (one or
    two, sharing the row's dY), on a persistent grid (``ctas`` per multiprocessor) walking the tiles row by row:
    ``bn``, ``stages``, ``ctas`` and ``consumers`` are its dimensions. The spec's ``a_regs`` (X's fragments
    through registers) is not a dimension: it is right on the H200 but timed within noise of its shared-memory
    twin on every probe shape (benchmarks/NOTES.md, 2026-12-02), so a search would spend half its trials on no
    difference."""
    dims = {
        "bm": (64, 128, 256),
        "bn": (64, 96, 128, 160, 192, 224, 256),
        "stages": (2, 3, 4, 5, 6),
        "consumers": (1, 2),
        "persistent": (False, True),
        "group_m": (1, 4, 8, 16),
        "cluster": (1, 2),
        "split_k": (1, 2, 4, 8, 16),
    }
    if block and Layout(layout) is Layout.grad_weight:  # dW sampled at the kept blocks
        return Space(NAME, {"bn": (64, 128, 192, 256), "stages": (2, 3, 4, 5, 6, 8), "ctas": (1, 2),
                            "consumers": (1, 2)})
    if Layout(layout) is not Layout.forward:
        dims["bn"] = (64, 128, 192, 256)
        del dims["cluster"]
    if block:
        for name in ("bn", "cluster", "split_k", "persistent"):  # a backward layout has dropped cluster already
            dims.pop(name, None)
        dims["bm"] = (64, 128, 256, 512)  # 512: X's tile as two boxes, for two consumers of 256 rows
        dims["grid"] = GRIDS
        dims["stages"] = (3, 4, 5, 6, 8, 10, 12)
        dims["ctas"] = (1, 2)
        if block == 64 and Layout(layout) is Layout.forward:
            dims["swap"] = (False, True)
    return Space(NAME, dims)


#: A narrowing small enough to sweep exhaustively on a GPU in minutes.
RESTRICTED = dict(bm=(128, 256), bn=(128, 256), stages=(3, 4, 5), consumers=(2,), persistent=(False, True),
                  group_m=(8,), cluster=(1, 2), split_k=(1,))


def _point(bm, bn, stages, consumers, persistent, group_m=8, cluster=1, split_k=1) -> dict:
    return dict(bm=bm, bn=bn, stages=stages, consumers=consumers, persistent=persistent, group_m=group_m,
                cluster=cluster, split_k=split_k)


#: Plausible good points for large 16-bit layers (two consumer warpgroups of 64 x 256, or of 128 x 128),
#: a persistent variant of each, the cluster pair (W's tile multicast to two blocks), and smaller tiles
#: with split-K for layers with few output tiles (batch 32-128 at N 4096 fills few of the multiprocessors).
#: Each was measured on the H200: benchmarks/results/hopper-NVIDIA_H200-2026-12-02T*.json and
#: docs/families.md. Backward layers start from these too.
SEEDS = [
    _point(128, 256, 4, 2, False),
    _point(128, 256, 4, 2, True),
    _point(128, 256, 4, 2, False, cluster=2),
    _point(256, 128, 4, 2, True),
    _point(128, 128, 5, 2, True),
    _point(128, 128, 6, 1, True),
    _point(64, 128, 6, 1, True, group_m=4),
    _point(64, 128, 6, 1, False, group_m=4, split_k=4),
    _point(64, 256, 4, 1, False, group_m=4, split_k=8),
]


#: A block-sparse W's grid: one block per tile, a persistent grid over balanced ranges of tiles, or
#: a persistent grid striding over the tiles in group_m order.
GRIDS = ("plain", "ranges", "grouped")


def _sparse_point(bm, stages, consumers, grid, ctas=1, group_m=8, swap=False) -> dict:
    return dict(bm=bm, stages=stages, consumers=consumers, grid=grid, group_m=group_m, ctas=ctas, swap=swap)


#: Block-sparse W, in the order the H200 probe ranked them over two random patterns (bf16 4096^3 at
#: densities 0.05-0.5 and 32x4096x4096 at 0.1, block 64;
#: benchmarks/results/hopper_sparse-NVIDIA_H200-2026-12-02T201948Z.json): 256 rows of two consumers in
#: grouped order with group_m 1 (every tile in flight on one m-tile of X) for density 0.1; 128 rows of one
#: consumer, two blocks per multiprocessor, for the sparsest W; the swapped 256-row tile for density 0.5;
#: the 64-row tiles at batch 32, unswapped or swapped with a deep ring. Second and third, the 512-row tiles
#: (two consumers of 256 rows, three stages), plain and swapped: per kept block they read X's 64 KB box and
#: the 8 KB block for 4 MFLOP, against 40 KB per 2 MFLOP at 256 rows, for the many-row GEMMs of prefill and
#: training, which L2's bandwidth limits. ``sparse_seeds`` leaves out the swapped ones for blocks other than 64.
SPARSE_SEEDS = [
    _sparse_point(256, 5, 2, "grouped", group_m=1),
    _sparse_point(512, 3, 2, "grouped", group_m=1),
    _sparse_point(512, 3, 2, "grouped", group_m=1, swap=True),
    _sparse_point(128, 4, 1, "grouped", ctas=2),
    _sparse_point(256, 4, 2, "grouped", swap=True),
    _sparse_point(128, 4, 2, "grouped", ctas=2),
    _sparse_point(64, 8, 1, "plain"),
    _sparse_point(64, 12, 1, "plain", swap=True),
    _sparse_point(256, 4, 2, "plain"),
    _sparse_point(128, 4, 1, "plain", ctas=2),
]


#: dW sampled at a block-sparse W's kept blocks: four, three, two or one kept blocks of a row per consumer
#: warpgroup, one or two consumers (two share dY's box: one box of dY per k-tile for up to 8 of X), one or two
#: blocks per multiprocessor. The first six in the order two budget-6 searches of 14336x4096x2048 bf16 at
#: density 0.25 on an H100 ranked them (178.7, 179.0-179.8, 183.0-184.0, 188.1-188.4, 191.2-191.5 and
#: 199.4-201.0 us, cold single calls; benchmarks/NOTES.md, "2026-12-06, sixth session").
SAMPLED_SEEDS = [
    dict(bn=192, stages=3, ctas=2, consumers=1),
    dict(bn=256, stages=3, ctas=1, consumers=2),
    dict(bn=256, stages=4, ctas=1, consumers=1),
    dict(bn=192, stages=4, ctas=1, consumers=2),
    dict(bn=128, stages=3, ctas=2, consumers=1),
    dict(bn=128, stages=6, ctas=1, consumers=1),
    dict(bn=64, stages=6, ctas=2, consumers=1),
]


def sparse_seeds(block: int) -> list[dict]:
    """SPARSE_SEEDS that the block allows (swap needs blocks of 64)."""
    return [p for p in SPARSE_SEEDS if block == 64 or not p["swap"]]


def to_spec(point: dict, problem: Problem) -> Spec:
    """Map a point onto a spec for the problem: the pack prepass exactly when K breaks 16-byte rows
    (dense W only); with a block-sparse W, ``bn`` is the block."""
    if problem.block and problem.layout is Layout.grad_weight:  # one block row per tile, persistent
        point = {"consumers": 1, **point}  # points recorded before consumers was a dimension had one
        return Spec(dtype=problem.dtype, bias=problem.bias, bm=problem.block, block=problem.block, layout=problem.layout,
                    persistent=True, group_m=1, **point)
    if problem.block:
        point = dict(point)
        grid = point.pop("grid", None)
        if grid is not None:
            point.update(persistent=grid != "plain", grouped=grid == "grouped")
        return Spec(dtype=problem.dtype, bias=problem.bias, bn=problem.block, block=problem.block,
                    layout=problem.layout, **point)
    pack = problem.layout is Layout.forward and problem.k * problem.dtype.itemsize % 16 != 0
    return Spec(dtype=problem.dtype, bias=problem.bias, prepass="pack" if pack else "none", layout=problem.layout,
                **point)


def point_of(spec: Spec) -> dict:
    """The point of the space that maps onto ``spec`` (inverse of to_spec)."""
    d = spec.to_dict()
    d["grid"] = ("grouped" if spec.grouped else "ranges") if spec.persistent else "plain"
    return {k: d[k] for k in space(spec.dtype, spec.block, spec.layout).dims}
