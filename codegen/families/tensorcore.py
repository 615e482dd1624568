"""Tensor-core family: warp-level matrix instructions fed by a cp.async multi-stage pipeline.

Two ways to drive the tensor cores, a spec dimension: ``mma="mma"`` issues PTX ``mma.sync``
(m16n8k16 for bf16/fp16, m16n8k8 for tf32) with operands read from shared memory by
``ldmatrix``; ``mma="wmma"`` uses the ``nvcuda::wmma`` API (16x16x16, 16x16x8 for tf32), the
seed article's form. Both accumulate in fp32. X and W tiles travel global -> shared with 16-byte
``cp.async`` into ``stages`` buffers, k-contiguous, laid out with an XOR swizzle of 16-byte
chunks or a 16-byte row pad (so ``ldmatrix`` reads are free of bank conflicts). Warps split the
block tile ``warps_m x warps_n`` ways and, with ``warps_k`` > 1, also split each k-tile (slice-K,
reduced through shared memory). ``split_k`` splits K over the grid (atomic for fp32 outputs, or
two passes through an fp32 workspace). ``prepass="pack"`` first copies X and W into the workspace
with rows padded to 16 bytes, so shapes whose K breaks 16-byte row alignment still run the fast
pipeline. ``block`` > 0 makes W block-sparse (BSR, ``block x block`` blocks, see codegen.sparse):
a block tile spans one block row or an equal part of it (``bn`` divides ``block``: more blocks
for a few block rows, as at batch 32), its k-tiles run over that row's kept blocks only, and
``split_k`` splits those blocks. In the weight gradient of a block-sparse W (dW = dYᵀ·X sampled at
the kept blocks) the grid runs over the kept blocks, each block tile an equal part of one (``bm``
and ``bn`` divide the block), the batch its whole k range, and the tile is stored into W's BSR
values. The epilogue adds the bias in fp32, converts, and stores either straight from the
accumulators (pairs of elements) or staged through shared memory as 16-byte rows.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import ClassVar

from codegen.launch import (
    DB_COLS,
    DB_ROWS,
    LAYOUT_SLOTS,
    MAIN_ARGS,
    PACK_THREADS,
    SPARSE_ARGS,
    KernelLaunch,
    LaunchPlan,
    bsr_args,
    db_launch,
    db_rule,
    layout_args,
    pack_launch,
    pack_rule,
    packed_k,
    reduce_launch,
    reduce_rule,
    sampled_blocks,
    workspace_bytes,
)
from codegen.problem import DType, Layout, Problem
from codegen.spec import (
    LAYOUT_SUFFIX,
    DeviceLimits,
    SpecData,
    arch_rules,
    dtype_rules,
    field_rules,
    layout_comment,
    layout_rules,
    problem_rules,
    resource_rules,
    rows_aligned,
    sampled_rules,
    sparse_rules,
)

NAME = "tensorcore"
DTYPES = (DType.bf16, DType.fp16, DType.tf32)
#: Place among the families that fit a problem, fastest first (search.fit).
RANK = 1
MMAS = ("mma", "wmma")
LAYOUTS = ("swizzle", "pad")
EPILOGUES = ("direct", "smem")
REDUCES = ("none", "atomic", "two_pass")
#: The mark of each reduction in a kernel name (after k<splits>).
REDUCE_MARK = {"none": "", "atomic": "a", "two_pass": "r"}
PREPASSES = ("none", "pack")
C_PAD = 8  # floats of padding per row of the staged fp32 output tile (conflict-free pair stores)


@dataclass(frozen=True)
class Spec(SpecData):
    """One tensor-core GEMM variant; its generated ``name`` is its identity.

    The defaults (8 warps of 64x32) keep register headroom: about 170 registers and no spills
    under NVRTC 13.0 and 13.5. The fastest kernels the H200 search found (the space's SEEDS) use
    64x64 warp tiles at the 255-register limit, where a few bytes of spill come and go with the
    compiler version and with details such as the bias."""

    dtype: DType = DType.bf16
    bias: bool = False
    mma: str = field(default="mma", metadata={"choices": MMAS, "help": "mma.sync + ldmatrix, or the wmma API"})
    bm: int = field(default=128, metadata={"help": "block tile rows (M)"})
    bn: int = field(default=128, metadata={"help": "block tile columns (N)"})
    bk: int = field(default=32, metadata={"help": "k-tile depth"})
    wm: int = field(default=64, metadata={"help": "warp tile rows"})
    wn: int = field(default=32, metadata={"help": "warp tile columns"})
    warps_k: int = field(default=1, metadata={"help": "warps splitting each k-tile (slice-K)"})
    stages: int = field(default=4, metadata={"help": "cp.async pipeline depth (2-16)"})
    smem: str = field(default="swizzle", metadata={"choices": LAYOUTS, "help": "shared tile layout"})
    epilogue: str = field(default="smem", metadata={"choices": EPILOGUES, "help": "output stores"})
    group_m: int = field(default=8, metadata={"help": "block rows grouped for L2 reuse"})
    split_k: int = field(default=1, metadata={"help": "K split over the grid"})
    reduce: str = field(default="none", metadata={"choices": REDUCES, "help": "split-K reduction"})
    prepass: str = field(default="none", metadata={"choices": PREPASSES, "help": "pack rows to 16 bytes first"})
    block: int = field(default=0, metadata={"help": "W block-sparse in block x block blocks (BSR); 0: dense W"})
    layout: Layout = field(default=Layout.forward, metadata={"help": "which GEMM of the linear layer"})

    family: ClassVar[str] = NAME

    # ---- identity -------------------------------------------------------------------------
    @property
    def name(self) -> str:
        red = REDUCE_MARK.get(self.reduce, "?")
        return (
            f"tc_{self.dtype.value}_{'bias' if self.bias else 'nobias'}_{self.mma}"
            f"_{self.bm}x{self.bn}x{self.bk}_w{self.wm}x{self.wn}x{self.warps_k}"
            f"_s{self.stages}{'x' if self.smem == 'swizzle' else 'p'}_e{self.epilogue[0]}"
            f"_g{self.group_m}_k{self.split_k}{red}{'_pk' if self.prepass == 'pack' else ''}"
            f"{f'_bsr{self.block}' if self.block else ''}{LAYOUT_SUFFIX[self.layout]}"
        )

    _NAME = re.compile(
        r"tc_(?P<dtype>bf16|fp16|tf32)_(?P<bias>bias|nobias)_(?P<mma>mma|wmma)"
        r"_(?P<bm>\d+)x(?P<bn>\d+)x(?P<bk>\d+)_w(?P<wm>\d+)x(?P<wn>\d+)x(?P<warps_k>\d+)"
        r"_s(?P<stages>\d+)(?P<smem>[xp])_e(?P<epilogue>[ds])_g(?P<group_m>\d+)_k(?P<split_k>\d+)(?P<reduce>[ar]?)"
        r"(?P<prepass>(_pk)?)(?:_bsr(?P<block>\d+))?(?:_(?P<layout>gi|gw))?"
    )

    _MARKS = {"mma": {m: m for m in MMAS}, "smem": {"x": "swizzle", "p": "pad"},
              "epilogue": {"d": "direct", "s": "smem"}, "reduce": {m: r for r, m in REDUCE_MARK.items()}, "prepass": {"": "none", "_pk": "pack"}}

    # ---- derived geometry -----------------------------------------------------------------
    @property
    def sampled(self) -> bool:
        """The weight gradient of a block-sparse W: dW at its kept blocks only, as its BSR values."""
        return bool(self.block) and self.layout is Layout.grad_weight

    @property
    def elem(self) -> int:
        return self.dtype.itemsize

    @property
    def chunk_elems(self) -> int:
        """Elements in one 16-byte chunk (the unit of cp.async and of an ldmatrix row)."""
        return 16 // self.elem

    @property
    def k_step(self) -> int:
        """k per instruction: 16 for 16-bit inputs, 8 for tf32 (two chunks either way)."""
        return 32 // self.elem

    @property
    def chunks(self) -> int:
        """16-byte chunks in one k-tile row."""
        return self.bk * self.elem // 16

    @property
    def inst_n(self) -> int:
        """Columns of one instruction tile: 8 for mma.sync, 16 for wmma."""
        return 8 if self.mma == "mma" else 16

    @property
    def warps_m(self) -> int:
        return self.bm // self.wm

    @property
    def warps_n(self) -> int:
        return self.bn // self.wn

    @property
    def warps(self) -> int:
        return self.warps_m * self.warps_n * self.warps_k

    @property
    def threads(self) -> int:
        return 32 * self.warps

    @property
    def row_stride(self) -> int:
        """Shared-memory row stride of a k-tile, in elements (a 16-byte pad, or none when swizzled)."""
        return self.bk + (self.chunk_elems if self.smem == "pad" else 0)

    def outer_stride(self, rows: int) -> int:
        """Shared row stride of a k-outer operand's tile [bk][rows], in elements: rows (+ a 16-byte pad)."""
        return rows + (self.chunk_elems if self.smem == "pad" else 0)

    @property
    def a_tile(self) -> int:
        """Elements of one stage's X tile: [bm][row_stride], or [bk][outer_stride(bm)] k-outer."""
        return self.bk * self.outer_stride(self.bm) if self.a_t else self.bm * self.row_stride

    @property
    def w_tile(self) -> int:
        return self.bk * self.outer_stride(self.bn) if self.w_t else self.bn * self.row_stride

    @property
    def staged(self) -> bool:
        """Whether accumulators pass through a shared fp32 tile (wmma, slice-K or a staged epilogue)."""
        return self.mma == "wmma" or self.warps_k > 1 or self.epilogue == "smem"

    @property
    def c_stride(self) -> int:
        return self.bn + C_PAD

    @property
    def pipeline_bytes(self) -> int:
        return self.stages * (self.a_tile + self.w_tile) * self.elem

    @property
    def smem_bytes(self) -> int:
        staged = self.bm * self.c_stride * 4 if self.staged else 0
        return max(self.pipeline_bytes, staged)

    @property
    def regs_estimate(self) -> int:
        acc = self.wm * self.wn // 32
        frags = 2 * ((self.wm // 16) * 4 + (self.wn // 8) * 2)
        return acc + frags + 40

    # ---- validity ---------------------------------------------------------------------------
    def check(self, problem: Problem | None = None, limits: DeviceLimits | None = None) -> list[str]:
        """Why this point is invalid (empty when it is valid). Costs no compile."""
        limits = limits or DeviceLimits()
        why = field_rules(self, positive=("bm", "bn", "bk", "wm", "wn", "warps_k", "stages", "group_m", "split_k"),
                          choices=(("mma", MMAS), ("smem", LAYOUTS), ("epilogue", EPILOGUES), ("reduce", REDUCES),
                                   ("prepass", PREPASSES)))
        why += dtype_rules(self, DTYPES, " (fp32 on tensor cores is the tf32 problem dtype)")
        if why:
            return why
        why += arch_rules(self, limits, 80, "mma.sync bf16/tf32, cp.async")
        if self.wm % 16 or self.wn % 16:
            why.append(f"warp tile {self.wm}x{self.wn}: both sides must be multiples of 16")
        if self.bm % self.wm or self.bn % self.wn:
            why.append(f"warp tile {self.wm}x{self.wn} does not divide block tile {self.bm}x{self.bn}")
        if self.chunks < 2 or self.chunks & (self.chunks - 1):
            why.append(f"bk {self.bk} must make a power-of-two number (>= 2) of 16-byte chunks per row")
        elif (self.bk // self.k_step) % self.warps_k:
            why.append(f"warps_k {self.warps_k} must divide the {self.bk // self.k_step} k-steps of a {self.bk} k-tile")
        if not 2 <= self.stages <= 16:
            why.append(f"stages must be 2 to 16, got {self.stages}")
        if self.mma == "wmma":
            if self.smem != "pad":
                why.append("wmma loads need a plain row stride: smem must be 'pad'")
            if self.epilogue != "smem":
                why.append("wmma accumulators are opaque: the epilogue must be 'smem'")
        if self.warps_k > 1 and self.epilogue != "smem":
            why.append("slice-K (warps_k > 1) reduces through shared memory: the epilogue must be 'smem'")
        if (self.split_k == 1) != (self.reduce == "none"):
            why.append("reduce is 'none' exactly when split_k is 1")
        elif self.reduce == "atomic" and self.dtype is not DType.tf32:
            why.append("atomic split-K needs an fp32 output (tf32); use two_pass for 16-bit outputs")
        why += layout_rules(self.layout, self.bias)
        if self.layout is not Layout.forward:
            if self.dtype is DType.tf32:
                why.append(f"the {self.layout.value} layout is generated for bf16 and fp16 (its k-outer operands are "
                           f"read by ldmatrix.trans, which moves 16-bit elements), not tf32")
            if self.prepass != "none":
                why.append(f"the {self.layout.value} layout has no pack prepass: prepass must be 'none'")
            for side, rows, outer in (("bm", self.bm, self.a_t), ("bn", self.bn, self.w_t)):
                chunks = rows // self.chunk_elems
                if outer and (rows % self.chunk_elems or chunks & (chunks - 1)):
                    why.append(f"a k-outer operand's tile rows are 16-byte chunks along {side}: {side} {rows} must make "
                               f"a power-of-two number of them")
        if self.sampled:
            why += sampled_rules(self.block, self.bm, self.bn, self.split_k, self.group_m)
        elif self.block:
            why += sparse_rules(self.block, self.bn, self.bk, blocks_per_tile=True, part_rows=True)
        if self.block:
            if self.prepass != "none":
                why.append("a block-sparse W is read in its blocks: prepass must be 'none'")
        if why:
            return why
        return resource_rules(self, limits) + problem_rules(self, problem, k_tile=self.bk)


# ---- template values and launch plan --------------------------------------------------------
WMMA_TYPE = {DType.bf16: "__nv_bfloat16", DType.fp16: "half", DType.tf32: "wmma::precision::tf32"}
MMA_PTX = {
    DType.bf16: "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32",
    DType.fp16: "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32",
    DType.tf32: "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32",
}
PAIR_TYPE = {DType.bf16: "__nv_bfloat162", DType.fp16: "__half2", DType.tf32: "float2"}


def _shift(chunks: int) -> int:
    """Swizzle shift of a tile with ``chunks`` 16-byte chunks per row: log2 of rows per 128-byte line."""
    return max(1, 8 // max(chunks, 1)).bit_length() - 1


def template_values(spec: Spec) -> dict:
    """Every number the template uses, computed here once."""
    values = spec.to_dict()
    rows_per_line = max(1, 8 // spec.chunks)  # rows sharing one 128-byte line of banks
    values.update(
        name=spec.name,
        chunk_elems=spec.chunk_elems,
        chunks=spec.chunks,
        k_step=spec.k_step,
        warps_m=spec.warps_m,
        warps_n=spec.warps_n,
        threads=spec.threads,
        frag_m=spec.wm // 16,
        frag_n=spec.wn // spec.inst_n,
        k_steps_per_warp=spec.bk // spec.k_step // spec.warps_k,
        row_stride=spec.row_stride,
        stage_elems=spec.a_tile + spec.w_tile,
        w_offset=spec.a_tile,
        a_chunks=spec.bm * spec.chunks,
        w_chunks=spec.bn * spec.chunks,
        a_iters=-(-spec.bm * spec.chunks // spec.threads),
        w_iters=-(-spec.bn * spec.chunks // spec.threads),
        swizzle_shift=rows_per_line.bit_length() - 1,
        swizzle_mask=min(spec.chunks, 8) - 1,
        # the backward layouts: k-outer operands' tiles [bk][rows] (chunks along the rows), their
        # strides, chunks per k row, swizzles; the bias is db (a kernel of its own), never added to dW
        a_t=spec.a_t, w_t=spec.w_t,
        sat=spec.outer_stride(spec.bm), swt=spec.outer_stride(spec.bn),
        cha=spec.bm // spec.chunk_elems, chw=spec.bn // spec.chunk_elems,
        a_shift=_shift(spec.bm // spec.chunk_elems), a_mask=min(spec.bm // spec.chunk_elems, 8) - 1,
        w_shift=_shift(spec.bn // spec.chunk_elems), w_mask=min(spec.bn // spec.chunk_elems, 8) - 1,
        bias=spec.bias and spec.layout is Layout.forward, db=spec.bias and spec.layout is Layout.grad_weight,
        db_cols=DB_COLS, db_rows=DB_ROWS, comment=layout_comment(spec.layout, spec.block),
        align_cond=rows_aligned(spec.layout, spec.block, "CE"),  # 16-byte cp.async is safe
        staged=spec.staged,
        c_stride=spec.c_stride,
        out_vec=16 // spec.elem,
        out_vecs_per_row=spec.bn // (16 // spec.elem),
        mma_ptx=MMA_PTX[spec.dtype],
        wmma_type=WMMA_TYPE[spec.dtype],
        pair_type=PAIR_TYPE[spec.dtype],
        pack_threads=PACK_THREADS,
        subs=max(1, spec.block // spec.bk) if spec.block else 0,  # k-tiles per block
        bpt=max(1, spec.bk // spec.block) if spec.block else 0,  # blocks per k-tile
        # dW sampled at the kept blocks: each kept block's tiles, PARTS_N of them along n
        sampled=spec.sampled, parts_n=spec.block // spec.bn if spec.sampled else 0,
        tiles=(spec.block // spec.bm) * (spec.block // spec.bn) if spec.sampled else 0,
        # tf32 inputs are rounded where they are read: once by the pack prepass, else per fragment
        round_in_loop=spec.dtype is DType.tf32 and spec.prepass != "pack",
    )
    return values


def sampled_defaults(block: int) -> dict:
    """The variant of dW sampled at a block-sparse W's kept blocks that options left unset take: a
    tile per block in four warps (one for a block of 16): 146 registers, no spills, under NVRTC 13.0
    and 13.5 at a block of 64."""
    side = max(16, block // 2)
    return dict(bm=block, bn=block, wm=side, wn=side, group_m=1)


def _partials_bytes(spec: Spec, problem: Problem) -> int:
    """Two-pass split-K partial sums, first in the workspace, rounded up to 16 bytes."""
    if spec.reduce != "two_pass":
        return 0
    return -(-workspace_bytes(spec.split_k, problem) // 16) * 16


def plan(spec: Spec, problem: Problem) -> LaunchPlan:
    grid_m = -(-problem.m // spec.bm)
    grid_n = -(-problem.n // spec.bn)
    if spec.sampled:  # one block per tile of each kept block
        grid_m, grid_n = sampled_blocks(problem, spec.bm, spec.bn), 1
    launches = []
    workspace = _partials_bytes(spec, problem)
    if spec.prepass == "pack":
        launches.append(pack_launch(spec.name, spec.chunk_elems, problem))
        workspace += (problem.m + problem.n) * packed_k(spec.chunk_elems, problem.k) * spec.elem
    launches.append(KernelLaunch(symbol=spec.name, grid=(grid_m * grid_n, spec.split_k, 1), block=(spec.threads, 1, 1),
                                 smem=spec.smem_bytes, args=layout_args(SPARSE_ARGS if spec.block else MAIN_ARGS,
                                                                        spec.layout, sparse=bool(spec.block))))
    if spec.reduce == "two_pass":
        launches.append(reduce_launch(spec.name, spec.split_k, problem))
    if spec.bias and spec.layout is Layout.grad_weight:
        launches.append(db_launch(spec.name, problem))
    return LaunchPlan(launches=tuple(launches), workspace_bytes=workspace, zero_output=spec.reduce == "atomic")


def headers(spec: Spec) -> list[str]:
    """Toolkit headers the source includes beyond the element type's (export manifests list them)."""
    return ["mma.h"] if spec.mma == "wmma" else []


def grid_rule(spec: Spec) -> str:
    """How to launch this variant on any M, N, K, in words (export manifests carry it)."""
    partials = f"ceil16(4*{spec.split_k}*M*N)" if spec.reduce == "two_pass" else "0"
    parts = []
    if spec.prepass == "pack":
        parts.append(pack_rule(spec.name, spec.chunk_elems, spec.elem, partials))
    tiles = (f"max(1, nnzb) * {(spec.block // spec.bm) * (spec.block // spec.bn)} (nnzb: W's kept blocks, one block per "
             f"{spec.bm}x{spec.bn} tile of each)" if spec.sampled else f"ceil(M/{spec.bm}) * ceil(N/{spec.bn})")
    parts.append(f"{spec.name}: grid = ({tiles}, {spec.split_k}, 1), "
                 f"block = ({spec.threads}, 1, 1), dynamic shared memory {spec.smem_bytes} B")
    if spec.block:
        parts.append(bsr_args(spec.layout, spec.block))
    if spec.reduce == "two_pass":
        parts.append("then " + reduce_rule(spec.name, spec.split_k) + " (rounded up to 16 bytes)")
    if spec.reduce == "atomic":
        parts.append("Y must be zeroed before the launch (split-K partial sums are added atomically)")
    if spec.layout is not Layout.forward:
        slots = layout_args(LAYOUT_SLOTS[Layout.forward], spec.layout, sparse=bool(spec.block))
        parts.append(f"arguments Y, X, W are {', '.join(slots)} ({layout_comment(spec.layout, spec.block)}), B is null")
    if spec.bias and spec.layout is Layout.grad_weight:
        parts.append("then " + db_rule(spec.name))
    return "; ".join(parts)
