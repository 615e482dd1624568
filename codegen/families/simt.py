"""SIMT family: CUDA-core GEMM with register blocking, fp32 accumulation.

The spec (identity, validity, geometry), the values ``templates/simt.cu.j2`` needs, and how a
variant is launched.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

from codegen.launch import (
    COUNTER_ARG,
    DB_COLS,
    DB_ROWS,
    LAYOUT_SLOTS,
    MAIN_ARGS,
    SPARSE_ARGS,
    KernelLaunch,
    LaunchPlan,
    bsr_args,
    db_launch,
    db_rule,
    layout_args,
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
    field_rules,
    layout_comment,
    layout_rules,
    problem_rules,
    reg_rules,
    rows_aligned,
    sampled_rules,
    smem_rules,
    sparse_rules,
    thread_rules,
)

NAME = "simt"
#: Problem dtypes the family computes (tf32 is a tensor-core mode).
DTYPES = (DType.fp32, DType.fp16, DType.bf16)
#: Place among the families that fit a problem, fastest first (search.fit).
RANK = 3
#: Dtypes a search takes this family for unless asked (16-bit problems go to the tensor cores).
DEFAULT_DTYPES = (DType.fp32,)
REDUCES = ("none", "atomic", "two_pass", "cluster", "last")
#: The mark of each reduction in a kernel name (after k<splits>).
REDUCE_MARK = {"none": "", "atomic": "a", "two_pass": "r", "cluster": "d", "last": "l"}
#: The most blocks of a portable thread-block cluster (a cluster split-K has one block per split).
MAX_CLUSTER = 8
COPIES = ("reg", "async")

#: Register type for a global load of the given number of bytes (all accepted by __ldg).
LOAD_TYPE = {2: "unsigned short", 4: "unsigned int", 8: "uint2", 16: "uint4"}
#: Register type for a shared-memory fragment read of 1, 2 or 4 floats.
FRAG_TYPE = {1: "float", 2: "float2", 4: "float4"}


def _help(text: str) -> dict:
    return {"help": text}


def _width(side: int) -> int:
    """The widest vector (4, 2 or 1 elements) that divides a thread tile's side."""
    return 4 if side % 4 == 0 else (2 if side % 2 == 0 else 1)


@dataclass(frozen=True)
class Spec(SpecData):
    """CUDA-core GEMM: block tile, warp tile, thread tile (register blocking) and staging.

    ``stages`` = 0 reads both operands straight from global memory (the naive kernel);
    1 stages tiles through shared memory; 2 double-buffers shared memory with a register
    prefetch of the next tile. With ``copy="reg"`` tiles travel through registers and are
    stored k-major ("transposed") so the inner loop reads ``tm``/``tn`` fragments with vector
    loads; lanes own strided 4-wide chunks of the warp tile. With ``copy="async"`` tiles go
    global -> shared with ``cp.async`` (sm_80+) into ``stages`` (2-4) buffers kept in the input
    type; the inner loop reads 4-wide k fragments of a k-contiguous tile, whose lanes own rows strided
    by the lane count (conflict-free with ``pad``), and of a tile stored k-outer (the backward
    layouts) one vector of a lane's consecutive rows per k, as the register path does. Lanes of a
    warp form a ``(wm/tm) × (wn/tn)`` grid.

    ``split_k`` > 1 splits K over the grid's y dimension; ``reduce`` says how the splits meet:
    ``atomic`` adds into a zeroed fp32 Y, ``two_pass`` writes fp32 partial tiles to a workspace that
    a second kernel sums, and ``cluster`` (sm_90+, at most 8 splits) launches the splits of a tile as
    one thread-block cluster: each leaves its partial tile in its shared memory and reduces one
    slice of the tile from every split's shared memory (no workspace, no second kernel, Y not
    zeroed), and ``last`` writes partial tiles to the workspace as two_pass does and counts each
    split in at a per-tile counter; the split counted last sums the tile and resets its counter (no
    second kernel; the counters are zero before the first launch and stay so). A grad_weight
    kernel with bias and one split sums db from its staged tiles of dY in the blocks of the first
    block column (``fused_db``); otherwise db is a kernel of its own.

    In the weight gradient of a block-sparse W (``sampled``: dW = dYᵀ·X at the kept blocks only)
    the grid runs over the kept blocks, each block tile an equal part of one (``bm`` and ``bn``
    divide the block), over the whole batch, and stores into W's BSR values; db is its own kernel.
    """

    dtype: DType = DType.fp32
    bias: bool = False
    bm: int = field(default=128, metadata=_help("block tile rows (of M)"))
    bn: int = field(default=128, metadata=_help("block tile columns (of N)"))
    bk: int = field(default=8, metadata=_help("block tile depth (of K) per step"))
    wm: int = field(default=32, metadata=_help("warp tile rows"))
    wn: int = field(default=64, metadata=_help("warp tile columns"))
    tm: int = field(default=8, metadata=_help("thread tile rows (1, 2 or a multiple of 4)"))
    tn: int = field(default=8, metadata=_help("thread tile columns (1, 2 or a multiple of 4)"))
    pad: int = field(default=4, metadata=_help("shared-memory row padding, elements"))
    vec: int = field(default=4, metadata=_help("global load width, elements"))
    stages: int = field(default=2, metadata=_help("0 (no shared memory), 1-2 with reg copies, 2-4 with async"))
    copy: str = field(default="reg", metadata={"choices": COPIES,
                                               "help": "global to shared through registers, or cp.async (sm_80+)"})
    group_m: int = field(default=1, metadata=_help("block rows grouped for L2 reuse"))
    split_k: int = field(default=1, metadata=_help("blocks sharing one output tile along K"))
    reduce: str = field(default="none", metadata={"choices": REDUCES,
                                                  "help": "split-K reduction: none (split_k 1), atomic, two_pass, "
                                                          "cluster (the splits of a tile are one thread-block cluster, "
                                                          "reduced through distributed shared memory, sm_90+), "
                                                          "last (the last split to finish a tile sums it)"})
    block: int = field(default=0, metadata=_help("W block-sparse in block x block blocks (BSR); 0: dense W"))
    layout: Layout = field(default=Layout.forward, metadata=_help("which GEMM of the linear layer"))

    family = NAME

    # ---- identity -------------------------------------------------------------------------
    @property
    def name(self) -> str:
        red = REDUCE_MARK[self.reduce]
        return (
            f"simt_{self.dtype.value}_{'bias' if self.bias else 'nobias'}"
            f"_{self.bm}x{self.bn}x{self.bk}_w{self.wm}x{self.wn}_t{self.tm}x{self.tn}"
            f"_p{self.pad}_v{self.vec}_s{self.stages}{'c' if self.copy == 'async' else ''}"
            f"_g{self.group_m}_k{self.split_k}{red}{f'_bsr{self.block}' if self.block else ''}"
            f"{LAYOUT_SUFFIX[self.layout]}"
        )

    _NAME = re.compile(
        r"simt_(?P<dtype>fp32|tf32|fp16|bf16)_(?P<bias>bias|nobias)_(?P<bm>\d+)x(?P<bn>\d+)x(?P<bk>\d+)"
        r"_w(?P<wm>\d+)x(?P<wn>\d+)_t(?P<tm>\d+)x(?P<tn>\d+)_p(?P<pad>\d+)_v(?P<vec>\d+)"
        r"_s(?P<stages>\d+)(?P<copy>c?)_g(?P<group_m>\d+)_k(?P<split_k>\d+)(?P<reduce>[ardl]?)"
        r"(?:_bsr(?P<block>\d+))?(?:_(?P<layout>gi|gw))?"
    )

    _MARKS = {"reduce": {m: r for r, m in REDUCE_MARK.items()}, "copy": {"": "reg", "c": "async"}}
    _TITLE = "SIMT"

    # ---- derived geometry -----------------------------------------------------------------
    @property
    def sampled(self) -> bool:
        """The weight gradient of a block-sparse W: dW at its kept blocks only, as its BSR values."""
        return bool(self.block) and self.layout is Layout.grad_weight

    def _async_tile(self, rows: int, outer: bool) -> int:
        """Elements of one async stage of an operand tile: [rows][bk + pad] k-contiguous, or
        [bk][rows + pad] for an operand stored k-outer (cp.async runs along its rows)."""
        return self.bk * (rows + self.pad) if outer else rows * (self.bk + self.pad)

    @property
    def lanes_m(self) -> int:
        return self.wm // self.tm

    @property
    def lanes_n(self) -> int:
        return self.wn // self.tn

    @property
    def warps_m(self) -> int:
        return self.bm // self.wm

    @property
    def warps_n(self) -> int:
        return self.bn // self.wn

    @property
    def threads(self) -> int:
        return self.warps_m * self.warps_n * 32

    @property
    def rm(self) -> int:
        """Consecutive rows a lane owns: its fragment width along m (1, 2 or 4). The async path
        reads a k-contiguous tile in k fragments, so there a lane owns single rows."""
        return 1 if self.copy == "async" and not self.a_t else _width(self.tm)

    @property
    def rn(self) -> int:
        return 1 if self.copy == "async" and not self.w_t else _width(self.tn)

    @property
    def kv(self) -> int:
        """k values per shared-memory fragment read on the async path (16 or 8 bytes)."""
        return 4

    @property
    def a_vecs(self) -> int:
        """Global vector loads of one X tile (per k-step)."""
        return self.bm * self.bk // max(self.vec, 1)

    @property
    def w_vecs(self) -> int:
        return self.bn * self.bk // max(self.vec, 1)

    @property
    def a_loads(self) -> int:
        """Global vector loads of the X tile per thread per k-step."""
        return -(-self.bm * self.bk // self.vec // max(self.threads, 1))

    @property
    def w_loads(self) -> int:
        return -(-self.bn * self.bk // self.vec // max(self.threads, 1))

    @property
    def fused_db(self) -> bool:
        """grad_weight's bias gradient is summed by the main kernel (from its staged tiles of dY, in
        the blocks of the first block column) rather than by a kernel of its own: one split, staged."""
        return (self.bias and self.layout is Layout.grad_weight and self.split_k == 1 and self.stages > 0
                and not self.block)

    @property
    def smem_bytes(self) -> int:
        # a cluster split-K leaves each split's fp32 partial tile in shared memory after the pipeline
        partials = 4 * self.bm * self.bn if self.reduce == "cluster" else 0
        if self.stages == 0:
            return partials
        if self.copy == "async":
            return max(partials, self.dtype.itemsize * self.stages * (self._async_tile(self.bm, self.a_t)
                                                                      + self._async_tile(self.bn, self.w_t)))
        return max(partials, 4 * self.stages * self.bk * ((self.bm + self.pad) + (self.bn + self.pad)))

    @property
    def regs_estimate(self) -> int:
        if self.copy == "async":
            # fragments of two k-steps live, and an address per unrolled tile load
            return self.tm * self.tn + 2 * self.kv * (self.tm + self.tn) + 2 * (self.a_loads + self.w_loads) + 32
        staged = (self.a_loads + self.w_loads) * self.vec if self.stages == 2 else 0
        return self.tm * self.tn + self.tm + self.tn + staged + 28

    # ---- validity ---------------------------------------------------------------------------
    def check(self, problem: Problem | None = None, limits: DeviceLimits | None = None) -> list[str]:
        """Why this point is invalid (empty when it is valid). Costs no compile."""
        limits = limits or DeviceLimits()
        why = field_rules(self, positive=("bm", "bn", "bk", "wm", "wn", "tm", "tn", "vec", "group_m", "split_k"))
        if self.pad < 0:
            why.append("pad must be >= 0")
        if self.dtype not in DTYPES:
            why.append(f"the SIMT family computes fp32, fp16 or bf16, not {self.dtype.value}")
        if why:
            return why
        if self.copy not in COPIES:
            why.append(f"copy must be one of {COPIES}")
        elif self.copy == "reg" and self.stages not in (0, 1, 2):
            why.append(f"stages must be 0, 1 or 2 with register copies, got {self.stages}")
        elif self.copy == "async" and self.stages not in (2, 3, 4):
            why.append(f"stages must be 2, 3 or 4 with async copies, got {self.stages}")
        if self.bm % self.wm or self.bn % self.wn:
            why.append(f"warp tile {self.wm}x{self.wn} does not divide block tile {self.bm}x{self.bn}")
        if self.wm % self.tm or self.wn % self.tn:
            why.append(f"thread tile {self.tm}x{self.tn} does not divide warp tile {self.wm}x{self.wn}")
        elif self.lanes_m * self.lanes_n != 32:
            why.append(
                f"warp tile {self.wm}x{self.wn} / thread tile {self.tm}x{self.tn} gives "
                f"{self.lanes_m * self.lanes_n} lanes, a warp has 32"
            )
        if any((side not in (1, 2) and side % 4) or side > 16 for side in (self.tm, self.tn)):
            why.append("thread tile sides must be 1, 2 or a multiple of 4 up to 16")
        if why:
            return why
        why += layout_rules(self.layout, self.bias)
        if self.sampled:
            why += sampled_rules(self.block, self.bm, self.bn, self.split_k, self.group_m)
        elif self.block:
            why += sparse_rules(self.block, self.bn, self.bk)
            if self.stages == 0:
                why.append("a block-sparse W is staged through shared memory: stages must be >= 1")
        why += thread_rules(self, limits) + self._load_rules(limits) + reg_rules(self, limits) + self._reduce_rules(limits)
        return why + problem_rules(self, problem, k_tile=self.bk)

    def _load_rules(self, limits: DeviceLimits) -> list[str]:
        """What the global loads and the shared-memory tiles they fill must be."""
        why: list[str] = []
        max_vec = 4 if self.dtype is DType.fp32 else 8
        if self.vec not in (1, 2, 4, 8) or self.vec > max_vec:
            why.append(f"vec must be a power of two up to {max_vec} for {self.dtype.value}")
        if self.stages == 0:
            if (self.bk, self.pad, self.vec) != (1, 0, 1):
                why.append("stages=0 (no shared memory) takes bk=1, pad=0, vec=1")
        else:
            if self.bk % self.vec:
                why.append(f"vec {self.vec} does not divide bk {self.bk}")
            for side, rows, outer in (("bm", self.bm, self.a_t), ("bn", self.bn, self.w_t)):
                if outer and rows % self.vec:  # a k-outer operand is loaded in runs along its rows
                    why.append(f"vec {self.vec} does not divide {side} {rows} (the {self.layout.value} layout loads "
                               f"that operand in runs along {side})")
                if outer and self.copy == "async" and (rows + self.pad) * self.dtype.itemsize % 16:
                    why.append(f"async tiles of a k-outer operand need ({side} + pad) * {self.dtype.itemsize} B a "
                               f"multiple of 16")
            if self.copy == "async":
                row_bytes = (self.bk + self.pad) * self.dtype.itemsize
                if self.vec * self.dtype.itemsize not in (4, 8, 16):
                    why.append("async copies move 4, 8 or 16 bytes: vec * element size must be one of them")
                if row_bytes % 16 or self.bk % self.kv:
                    why.append(f"async tiles need (bk + pad) * {self.dtype.itemsize} B a multiple of 16 "
                               f"and bk a multiple of {self.kv}")
                if limits.sm < 80:
                    why.append("async copies (cp.async) need sm_80 or newer")
            elif (self.bm + self.pad) % self.rm or (self.bn + self.pad) % self.rn:
                why.append(f"pad {self.pad} breaks the {self.rm}/{self.rn}-wide fragment alignment")
            why += smem_rules(self, limits)
        return why

    def _reduce_rules(self, limits: DeviceLimits) -> list[str]:
        """What each split-K reduction needs."""
        why: list[str] = []
        if self.reduce not in REDUCES:
            why.append(f"reduce must be one of {REDUCES}")
        elif (self.split_k == 1) != (self.reduce == "none"):
            why.append("reduce is 'none' exactly when split_k is 1")
        elif self.reduce == "atomic" and self.dtype is not DType.fp32:
            why.append("atomic split-K reduction needs fp32 output")
        elif self.reduce == "last" and self.bn % 4:
            why.append("a split-K summed by its last split reads four columns of a row at a time: bn must be a multiple of 4")
        elif self.reduce == "cluster":
            if limits.sm < 90:
                why.append("a cluster split-K (thread-block clusters, distributed shared memory) needs sm_90 or newer")
            if self.bn % 4 or self.bm * self.bn % (4 * self.split_k):
                why.append("a cluster split-K reduces four elements of a row at a time: bn and bm * bn / split_k "
                           "must be multiples of 4")
            if self.split_k > MAX_CLUSTER:
                why.append(f"a cluster split-K has one block per split: split_k must be <= {MAX_CLUSTER}")
            why += smem_rules(self, limits)
        return why


# ---- template values ------------------------------------------------------------------------------
def template_values(spec: Spec) -> dict:
    """Every number templates/simt.cu.j2 uses, derived here once (the template only spells CUDA)."""
    size = spec.dtype.itemsize
    values = spec.to_dict()
    values.update(
        rm=spec.rm, rn=spec.rn, lanes_m=spec.lanes_m, lanes_n=spec.lanes_n, warps_n=spec.warps_n,
        threads=spec.threads,
        m_step=spec.lanes_m * spec.rm,  # rows between the fragments a lane owns
        n_step=spec.lanes_n * spec.rn,
        m_frags=spec.tm // spec.rm, n_frags=spec.tn // spec.rn,
        a_vecs=spec.a_vecs, w_vecs=spec.w_vecs, k_vecs=spec.bk // spec.vec,  # vector loads per tile, per tile row
        a_loads=spec.a_loads, w_loads=spec.w_loads,  # per thread, rounded up
        a_uneven=spec.a_vecs % spec.threads != 0, w_uneven=spec.w_vecs % spec.threads != 0,
        vec_bytes=spec.vec * size,
        vload_t=LOAD_TYPE.get(spec.vec * size, "unsigned int"),
        frag_m_t=FRAG_TYPE[spec.rm], frag_n_t=FRAG_TYPE[spec.rn],
        kv=spec.kv, frag_k_t=LOAD_TYPE[spec.kv * size],
        frag_at_t=LOAD_TYPE[spec.rm * size], frag_wt_t=LOAD_TYPE[spec.rn * size],  # k-outer rows, one k
        cp_bytes=spec.vec * size, cp_cache="cg" if spec.vec * size == 16 else "ca",
        subs=spec.block // spec.bk if spec.block else 0,
        # W's blocks read in BSR (forward, grad_input); or dW sampled at them, each kept block's tiles,
        # PARTS_N of them along n
        bsr=bool(spec.block) and not spec.sampled, sampled=spec.sampled,
        parts_n=spec.block // spec.bn if spec.sampled else 0,
        tiles=(spec.block // spec.bm) * (spec.block // spec.bn) if spec.sampled else 0,
        # the backward layouts: an operand stored k-outer is loaded in VEC-wide runs along its rows,
        # `runs` to a k row of the tile; the bias is db (a kernel of its own), never added to dW
        a_t=spec.a_t, w_t=spec.w_t, a_runs=spec.bm // spec.vec, w_runs=spec.bn // spec.vec,
        bias=spec.bias and spec.layout is Layout.forward, fused_db=spec.fused_db,
        db=spec.bias and spec.layout is Layout.grad_weight and not spec.fused_db,
        db_per=-(-spec.bm // spec.threads), slice=spec.bm * spec.bn // spec.split_k,  # fused db; cluster split-K
        db_cols=DB_COLS, db_rows=DB_ROWS, comment=layout_comment(spec.layout, spec.block),
        # every row of both operands VEC-aligned (a BSR W's blocks always are)
        vec_cond="(" + rows_aligned(spec.layout, spec.block, "VEC") + ")",
    )  # fmt: skip
    if spec.copy == "async":
        sk = spec.bk + spec.pad  # k-contiguous rows, in elements of the input type
        a_stage, w_stage = spec._async_tile(spec.bm, spec.a_t), spec._async_tile(spec.bn, spec.w_t)
        values.update(
            sk=sk, a_stage=a_stage, w_stage=w_stage, w_offset=spec.stages * a_stage,
            a_row_step=spec.lanes_m * sk, w_row_step=spec.lanes_n * sk,  # between a lane's k-contiguous rows
            sat=spec.bm + spec.pad, swt=spec.bn + spec.pad,  # row strides of k-outer tiles
            prefetch=spec.stages - 1, wait_groups=spec.stages - 2,
        )  # fmt: skip
    else:
        sa, sw = spec.bm + spec.pad, spec.bn + spec.pad  # k-major rows, in floats
        values.update(
            sa=sa, sw=sw, a_stage=spec.bk * sa, w_stage=spec.bk * sw, w_offset=spec.stages * spec.bk * sa,
        )  # fmt: skip
    return values


def sampled_defaults(block: int) -> dict:
    """The variant of dW sampled at a block-sparse W's kept blocks that options left unset take: a
    tile per block, one warp per 32 x 64 of it (blocks of 64) or the whole block in one warp."""
    lanes = {64: {}, 32: dict(wm=16, wn=32, tm=4, tn=4), 16: dict(wm=16, wn=16, tm=2, tn=4)}.get(block, {})
    return dict(bm=block, bn=block, group_m=1, **lanes)


# ---- launch -----------------------------------------------------------------------------------------
def plan(spec: Spec, problem: Problem) -> LaunchPlan:
    grid_m = -(-problem.m // spec.bm)
    grid_n = -(-problem.n // spec.bn)
    if spec.sampled:  # one block per tile of each kept block
        grid_m, grid_n = sampled_blocks(problem, spec.bm, spec.bn), 1
    main = KernelLaunch(
        symbol=spec.name,
        grid=(grid_m * grid_n, spec.split_k, 1),
        block=(spec.threads, 1, 1),
        smem=spec.smem_bytes,
        args=layout_args(SPARSE_ARGS if spec.block else MAIN_ARGS, spec.layout, sparse=bool(spec.block)),
    )
    if spec.reduce == "cluster":
        main = replace(main, cluster=(1, spec.split_k, 1))
    if spec.fused_db:
        main = replace(main, args=tuple("DB" if a == "B" else a for a in main.args))
    if spec.reduce == "last":
        at = main.args.index("WS") + 1
        main = replace(main, args=(*main.args[:at], COUNTER_ARG, *main.args[at:]))
    launches = [main]
    if spec.reduce == "two_pass":
        launches.append(reduce_launch(spec.name, spec.split_k, problem))
    if spec.bias and spec.layout is Layout.grad_weight and not spec.fused_db:
        launches.append(db_launch(spec.name, problem))
    partials = spec.reduce in ("two_pass", "last")
    return LaunchPlan(launches=tuple(launches), zero_output=spec.reduce == "atomic",
                      workspace_bytes=workspace_bytes(spec.split_k, problem) if partials else 0,
                      counters=grid_m * grid_n if spec.reduce == "last" else 0)


def grid_rule(spec: Spec) -> str:
    """How to launch this variant on any M, N, K, in words (export manifests carry it)."""
    tiles = (f"max(1, nnzb) * {(spec.block // spec.bm) * (spec.block // spec.bn)} (nnzb: W's kept blocks, one block per "
             f"{spec.bm}x{spec.bn} tile of each)" if spec.sampled else f"ceil(M/{spec.bm}) * ceil(N/{spec.bn})")
    rule = f"{spec.name}: grid = ({tiles}, {spec.split_k}, 1), block = ({spec.threads}, 1, 1)"
    if spec.block:
        rule += "; " + bsr_args(spec.layout, spec.block)
    if spec.reduce == "two_pass":
        rule += "; then " + reduce_rule(spec.name, spec.split_k)
    if spec.reduce == "last":
        rule += (f"; workspace WS = 4*{spec.split_k}*M*N bytes; CT = ceil(M/{spec.bm}) * ceil(N/{spec.bn}) int32 tile "
                 f"counters, zero before the first launch and left zero by every launch (keep them between launches; "
                 f"two launches in flight at once need their own): the last split of a tile to finish sums it")
    if spec.reduce == "atomic":
        rule += "; Y must be zeroed before the launch (split-K partial sums are added atomically)"
    if spec.reduce == "cluster":
        rule += (f"; a thread-block cluster launch of cluster dimension (1, {spec.split_k}, 1) (cuLaunchKernelEx): "
                 f"the splits of a tile reduce through distributed shared memory, no workspace")
    if spec.layout is not Layout.forward:
        slots = layout_args(LAYOUT_SLOTS[Layout.forward], spec.layout, sparse=bool(spec.block))
        rule += f"; arguments Y, X, W are {', '.join(slots)} ({layout_comment(spec.layout, spec.block)}), " + (
            "B is DB (db[M] = sum over the K rows of DY, written by the blocks of the first block column)"
            if spec.fused_db else "B is null")
    if spec.bias and spec.layout is Layout.grad_weight and not spec.fused_db:
        rule += "; then " + db_rule(spec.name)
    return rule
