"""Sparse24 family: a 2:4 structured-sparse W on sparse tensor cores (``mma.sp.sync`` m16n8k32).

The tensor-core family's pipeline for a W that keeps two of every four elements along K
(codegen.sparse24): the sparse operand of ``mma.sp`` is its A side, so the kernel computes Yᵀ
tile by tile, W's rows on the instruction's M side (16 per instruction) and X's rows on its N
side (8 per instruction), each instruction 32 deep in K. W arrives as its kept halves WC [N][KP/2]
and their 2-bit positions WE, packed per instruction (``codegen.sparse24.metadata_m16n8k32``);
every stage of the ``cp.async`` pipeline holds a k-tile of X [bm][bk], of WC [bn][bk/2] and of WE
[bn/16][bk/32][16 words]. ``ldmatrix`` reads both operand tiles (XOR-swizzled or row-padded, as
the tensor-core family's), each lane takes its metadata word from the tile, and the accumulators,
which hold Yᵀ, are stored transposed: through a shared fp32 tile as 16-byte rows (epilogue
``smem``) or element by element (``direct``). K need not be a multiple of anything: X past K and
the padding of WC are zeros, and metadata past W's last rows and columns is filled in as valid.
``split_k`` splits K over the grid, reduced in a second pass.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import ClassVar

from codegen.launch import (
    SP24_ARGS,
    SP24_ARGS_NOTE,
    KernelLaunch,
    LaunchPlan,
    reduce_launch,
    reduce_rule,
    workspace_bytes,
)
from codegen.problem import DType, Problem
from codegen.sparse24 import K_ALIGN, M16N8K32_ROWS, padded_k
from codegen.spec import (
    DeviceLimits,
    SpecData,
    arch_rules,
    dtype_rules,
    field_rules,
    problem_rules,
    resource_rules,
)

NAME = "sparse24"
DTYPES = (DType.bf16, DType.fp16)
#: The structured sparsities of W this family computes (search.space.space_for; others compute none).
SPARSITIES = ("2:4",)
#: Place among the families that fit a problem, fastest first (search.fit).
RANK = 1
LAYOUTS = ("swizzle", "pad")
EPILOGUES = ("direct", "smem")
REDUCES = ("none", "two_pass")
REDUCE_MARK = {"none": "", "two_pass": "r"}
K_TILES = (32, 64, 128, 256)
C_PAD = 4  # floats of padding per row of the staged fp32 output tile (the transposed stores spread over banks)
#: 32-bit words of metadata per instruction (16 rows x 32 columns): one per contributing lane.
META_WORDS = 16
#: Metadata of a group that keeps positions 0 and 1, eight groups to a word: what fills the tile past W.
META_FILL = 0x44444444
MMA_SP_PTX = {
    DType.bf16: "mma.sp::ordered_metadata.sync.aligned.m16n8k32.row.col.f32.bf16.bf16.f32",
    DType.fp16: "mma.sp::ordered_metadata.sync.aligned.m16n8k32.row.col.f32.f16.f16.f32",
}


@dataclass(frozen=True)
class Spec(SpecData):
    """One 2:4 sparse tensor-core GEMM variant; its generated ``name`` is its identity.

    The defaults (8 warps of 32x32) keep register headroom: about 155 registers and no spills under
    NVRTC 13.0 for sm_80 and sm_90. Registers grow with the k-tile's depth (each of its k-steps'
    operands is loaded ahead); a k-tile of 256 under small warp tiles can spill."""

    dtype: DType = DType.bf16
    bias: bool = False
    bm: int = field(default=64, metadata={"help": "block tile rows of X and Y (M)"})
    bn: int = field(default=128, metadata={"help": "block tile rows of W, columns of Y (N)"})
    bk: int = field(default=64, metadata={"help": "k-tile depth in W's dense columns (32 to 256)"})
    wm: int = field(default=32, metadata={"help": "warp tile rows of X (a multiple of 8)"})
    wn: int = field(default=32, metadata={"help": "warp tile rows of W (a multiple of 16)"})
    stages: int = field(default=4, metadata={"help": "cp.async pipeline depth (2-16)"})
    smem: str = field(default="swizzle", metadata={"choices": LAYOUTS, "help": "shared tile layout"})
    epilogue: str = field(default="smem", metadata={"choices": EPILOGUES, "help": "output stores"})
    group_m: int = field(default=8, metadata={"help": "block rows grouped for L2 reuse"})
    split_k: int = field(default=1, metadata={"help": "K split over the grid"})
    reduce: str = field(default="none", metadata={"choices": REDUCES, "help": "split-K reduction"})

    family: ClassVar[str] = NAME
    #: W is never block-sparse here, and always 2:4 (codegen.spec.problem_rules compares both).
    block: ClassVar[int] = 0
    sparsity: ClassVar[str] = "2:4"

    # ---- identity -------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return (f"sp24_{self.dtype.value}_{'bias' if self.bias else 'nobias'}_{self.bm}x{self.bn}x{self.bk}"
                f"_w{self.wm}x{self.wn}_s{self.stages}{'x' if self.smem == 'swizzle' else 'p'}_e{self.epilogue[0]}"
                f"_g{self.group_m}_k{self.split_k}{REDUCE_MARK.get(self.reduce, '?')}")

    _NAME = re.compile(
        r"sp24_(?P<dtype>bf16|fp16)_(?P<bias>bias|nobias)_(?P<bm>\d+)x(?P<bn>\d+)x(?P<bk>\d+)_w(?P<wm>\d+)x(?P<wn>\d+)"
        r"_s(?P<stages>\d+)(?P<smem>[xp])_e(?P<epilogue>[ds])_g(?P<group_m>\d+)_k(?P<split_k>\d+)(?P<reduce>r?)")
    _MARKS = {"smem": {"x": "swizzle", "p": "pad"}, "epilogue": {"d": "direct", "s": "smem"},
              "reduce": {m: r for r, m in REDUCE_MARK.items()}}

    # ---- derived geometry -----------------------------------------------------------------
    @property
    def warps_m(self) -> int:
        return self.bm // self.wm

    @property
    def warps_n(self) -> int:
        return self.bn // self.wn

    @property
    def threads(self) -> int:
        return 32 * self.warps_m * self.warps_n

    @property
    def x_stride(self) -> int:
        """Shared row stride of X's k-tile, in elements (a 16-byte pad, or none when swizzled)."""
        return self.bk + (8 if self.smem == "pad" else 0)

    @property
    def w_stride(self) -> int:
        """Shared row stride of WC's k-tile (bk/2 kept elements a row), in elements."""
        return self.bk // 2 + (8 if self.smem == "pad" else 0)

    @property
    def meta_elems(self) -> int:
        """One stage's metadata words [bn/16][bk/32][16], counted in 16-bit elements."""
        return (self.bn // M16N8K32_ROWS) * (self.bk // K_ALIGN) * META_WORDS * 2

    @property
    def stage_elems(self) -> int:
        return self.bm * self.x_stride + self.bn * self.w_stride + self.meta_elems

    @property
    def staged(self) -> bool:
        return self.epilogue == "smem"

    @property
    def c_stride(self) -> int:
        return self.bn + C_PAD

    @property
    def smem_bytes(self) -> int:
        staged = self.bm * self.c_stride * 4 if self.staged else 0
        return max(self.stages * self.stage_elems * 2, staged)

    @property
    def regs_estimate(self) -> int:
        acc = self.wm * self.wn // 32
        frags = 2 * ((self.wn // 16) * 5 + (self.wm // 8) * 4)  # double-buffered: W's 4 + 1 metadata, X's 4
        return acc + frags + 40

    # ---- validity ---------------------------------------------------------------------------
    def check(self, problem: Problem | None = None, limits: DeviceLimits | None = None) -> list[str]:
        """Why this point is invalid (empty when it is valid). Costs no compile."""
        limits = limits or DeviceLimits()
        why = field_rules(self, positive=("bm", "bn", "bk", "wm", "wn", "stages", "group_m", "split_k"),
                          choices=(("smem", LAYOUTS), ("epilogue", EPILOGUES), ("reduce", REDUCES),
                                   ("bk", K_TILES)))
        why += dtype_rules(self, DTYPES, " (2:4 sparse tensor cores multiply 16-bit inputs)")
        if why:
            return why
        why += arch_rules(self, limits, 80, "mma.sp.sync m16n8k32, cp.async")
        if self.wn % M16N8K32_ROWS or self.wm % 8:
            why.append(f"warp tile {self.wm}x{self.wn}: its X rows (wm) must be a multiple of 8 and its W rows (wn) "
                       f"of 16")
        if self.bm % self.wm or self.bn % self.wn:
            why.append(f"warp tile {self.wm}x{self.wn} does not divide block tile {self.bm}x{self.bn}")
        if not 2 <= self.stages <= 16:
            why.append(f"stages must be 2 to 16, got {self.stages}")
        if (self.split_k == 1) != (self.reduce == "none"):
            why.append("reduce is 'none' exactly when split_k is 1")
        if why:
            return why
        return resource_rules(self, limits) + problem_rules(self, problem, k_tile=self.bk)


# ---- template values and launch plan --------------------------------------------------------
def _shift(chunks: int) -> int:
    """Swizzle shift of a tile with ``chunks`` 16-byte chunks per row: log2 of rows per 128-byte line."""
    return max(1, 8 // max(chunks, 1)).bit_length() - 1


def template_values(spec: Spec) -> dict:
    """Every number the template uses, computed here once."""
    values = spec.to_dict()
    x_chunks, w_chunks = spec.bk // 8, spec.bk // 16  # 16-byte chunks per k-tile row of X and of WC
    meta_chunks = (spec.bn // M16N8K32_ROWS) * (spec.bk // K_ALIGN) * META_WORDS // 4
    values.update(
        name=spec.name, threads=spec.threads, warps_m=spec.warps_m, warps_n=spec.warps_n,
        frag_m=spec.wm // 8, frag_n=spec.wn // M16N8K32_ROWS, k_steps=spec.bk // K_ALIGN,
        x_stride=spec.x_stride, w_stride=spec.w_stride, stage_elems=spec.stage_elems,
        w_offset=spec.bm * spec.x_stride, e_offset=spec.bm * spec.x_stride + spec.bn * spec.w_stride,
        x_chunks=x_chunks, w_chunks=w_chunks, meta_chunks=meta_chunks,
        x_iters=-(-spec.bm * x_chunks // spec.threads), w_iters=-(-spec.bn * w_chunks // spec.threads),
        e_iters=-(-meta_chunks // spec.threads),
        x_shift=_shift(x_chunks), x_mask=min(x_chunks, 8) - 1, w_shift=_shift(w_chunks), w_mask=min(w_chunks, 8) - 1,
        meta_words=META_WORDS, meta_row_words=(spec.bk // K_ALIGN) * META_WORDS, meta_fill=f"0x{META_FILL:08x}u",
        k_align=K_ALIGN, staged=spec.staged, c_stride=spec.c_stride,
        out_vec=8, out_vecs_per_row=spec.bn // 8, mma_ptx=MMA_SP_PTX[spec.dtype],
    )
    return values


def _partials_bytes(spec: Spec, problem: Problem) -> int:
    return workspace_bytes(spec.split_k, problem) if spec.reduce == "two_pass" else 0


def plan(spec: Spec, problem: Problem) -> LaunchPlan:
    tiles = -(-problem.m // spec.bm) * -(-problem.n // spec.bn)
    launches = [KernelLaunch(symbol=spec.name, grid=(tiles, spec.split_k, 1), block=(spec.threads, 1, 1),
                             smem=spec.smem_bytes, args=SP24_ARGS)]
    if spec.reduce == "two_pass":
        launches.append(reduce_launch(spec.name, spec.split_k, problem))
    return LaunchPlan(launches=tuple(launches), workspace_bytes=_partials_bytes(spec, problem), zero_output=False)


def headers(spec: Spec) -> list[str]:
    """Toolkit headers the source includes beyond the element type's (none)."""
    return []


def manifest_sparse(spec: Spec, problem: Problem) -> dict:
    """What an export manifest says of the 2:4 W's arguments for ``problem`` (its ``sparse``)."""
    kp = padded_k(problem.k)
    return {"format": "2:4", "density": problem.density, "arguments": SP24_ARGS_NOTE,
            "operands": {"WC": {"shape": [problem.n, kp // 2], "element_type": "the element type"},
                         "WE": {"shape": [-(-problem.n // M16N8K32_ROWS), kp // K_ALIGN, META_WORDS],
                                "element_type": "uint32"}},
            "made_by": "codegen.sparse24: compress(W) (or compress(W, mask24(W)) to prune), then metadata_m16n8k32"}


def grid_rule(spec: Spec) -> str:
    """How to launch this variant on any M, N, K, in words (export manifests carry it)."""
    parts = [f"{spec.name}: grid = (ceil(M/{spec.bm}) * ceil(N/{spec.bn}), {spec.split_k}, 1), "
             f"block = ({spec.threads}, 1, 1), dynamic shared memory {spec.smem_bytes} B", SP24_ARGS_NOTE]
    if spec.reduce == "two_pass":
        parts.append("then " + reduce_rule(spec.name, spec.split_k))
    return "; ".join(parts)
