"""Hopper family: warpgroup matrix instructions (wgmma) fed by the tensor memory accelerator (TMA).

One producer warpgroup (registers shrunk by ``setmaxnreg``) has one thread copy k-tiles of X and W
with ``cp.async.bulk.tensor`` into a ring of ``stages`` shared-memory buffers, in the 128-byte
swizzled K-major layout that ``wgmma`` reads; each buffer has a "full" mbarrier (the copy engine
completes its byte count) and an "empty" one (every consumer warp arrives when its wgmma have
read it). ``consumers`` (1 or 2) consumer warpgroups (registers grown by ``setmaxnreg``) each own
``bm / consumers`` rows of the ``bm x bn`` block tile (dW sampled at a sparse W's kept blocks, below, splits
the columns instead) and issue ``wgmma.mma_async`` m64n``bn``k16
from shared-memory descriptors, keeping one k-tile of wgmma in flight while the next is issued.
The epilogue adds the bias in fp32, converts and stores straight from the accumulators with
bounds checks. X and W are read through tensor maps (``codegen.launch.TensorMapArg``) that the
runtime encodes per problem: TMA zero-fills whatever lies past M, N or K, so every shape runs
the same pipeline. TMA needs 16-byte row pitches: when K is not a multiple of 8,
``prepass="pack"`` first copies X and W into the workspace with rows padded to 16 bytes.
``persistent`` launches one block per multiprocessor, each looping over output tiles in the
grouped order (``group_m``), so the loads of the next tile overlap the epilogue of the last.
``block`` > 0 makes W block-sparse (BSR, ``block x block`` blocks, codegen.sparse): a block tile
spans one block row (``bn == block``), the k-tile is one block (``bk == block``: rows of 128, 64
or 32 bytes for blocks of 64, 32 or 16, swizzled by the same span, and the wgmma descriptors say
so), and the producer walks only the row's kept blocks: X's k-columns of each kept block through
X's tensor map, the block itself through a second tensor map over the contiguous block array
(rows of ``block`` elements, one block every ``block`` rows). An empty block row writes zeros
(+ bias). Its tile may be 512 rows tall (two consumers of 256): X's tile is then two TMA boxes of 256 rows
(a box holds at most 256), the second not loaded where it lies wholly past M. A block-sparse W's grad_input dX = dY·W (blocks of 64) runs the same pipeline over Wᵀ's block
rows (Wᵀ's row pointers RP and block columns CI), reading dY as the forward reads X and W's own kept blocks
in place: BI gives each of Wᵀ's kept blocks' index in W, its box is loaded as stored ([out][in], k-outer for
this GEMM) and wgmma reads it transposed (codegen.launch.BSR_GI_IN_PLACE_ARGS), so no transposed copy of W is
made. A persistent grid over a block-sparse W does not stride over the tiles: each block takes a
contiguous range of (block row, m-tile) tiles of equal work (kept blocks + 1 per tile), found from
the row pointers alone, so rows of many kept blocks do not pile up on a few multiprocessors
(``group_m`` orders the plain grid only); ``grouped`` makes it stride over the tiles in ``group_m``
order instead, as a dense persistent grid does (the tiles in flight then share X's m-tiles). ``ctas=2`` sizes the ring and the registers so that two blocks share a multiprocessor,
one's fill and epilogue overlapping the other's wgmma (for tiles with few k-tiles, as sparse rows
have); with ``persistent`` the grid is then two blocks per multiprocessor.
``cluster=2`` (dense W only) launches pairs of blocks as a thread-block cluster along M: the two
blocks of a pair take m-tiles 2i and 2i+1 of the same block column, so they read the same W tile;
each block's producer loads half of W's box (``bn / 2`` rows) with a multicast TMA that writes it into
both blocks' shared memory (same offset) and completes on both blocks' "full" barriers, so W
crosses L2 once per pair. The larger operand of the default tiles (128 x 256: W's box is twice
X's) is the one shared, hence pairs along M. A stage is refilled only when the consumers of both
blocks are done with it: each consumer warp arrives on the "empty" barrier of both blocks (the
peer's through its shared::cluster address). The kernel starts with a cluster barrier (the peer's
barriers are initialized before anything lands in them) and ends with one (no block exits while
its peer may still write into its shared memory or arrive on its barriers). An odd count of
m-tiles leaves the pair's second block past M: it loads no X, still loads and multicasts its half
of W, and stores nothing; a half of W starting past N is loaded by neither block (no TMA box lies
wholly outside its tensor). The grid counts pairs (2 blocks each); a persistent grid strides over
pair tiles by the number of pairs launched. The launch needs ``cuLaunchKernelEx`` with a cluster
dimension of (2, 1, 1) (``codegen.launch.KernelLaunch.cluster``).
The backward GEMMs of the linear layer (``layout``, dense W): grad_input dX = dY·W reads W [K][N]
and grad_weight dW = dYᵀ·X reads dY [K][M] and X [K][N], operands stored k-outer (MN-major). Their
tensor maps run along M or N (boxes of 64 elements, one 128-byte swizzle span, by ``bk`` k-rows), a
tile's MN extent is ``extent / 64`` such boxes side by side, and wgmma reads them transposed (its
trans-a / trans-b flags; descriptors with 1024 bytes between 8-row groups along K and one box
between 64-element groups along M or N). Boxes wholly past M or N are not loaded (their rows and
columns are not stored). grad_weight's bias gradient db is a kernel of its own (codegen.launch.db_launch).
The weight gradient of a block-sparse W (blocks of 64) is sampled at its kept blocks (``sampled``): dW = dYᵀ·X
only there, written as W's BSR values DW[nnzb][64][64] (codegen.launch.BSR_GW_ARGS). A tile is one block row
(``bm`` = 64) and up to ``consumers x bn / 64`` of its kept blocks: per k-tile of the batch the producer loads
dY's box of the row once and X's box under each kept block side by side after it (the stage holds 64 +
``consumers x bn`` rows). Each consumer warpgroup owns all 64 rows and ``bn / 64`` of the blocks: consumer c runs
wgmma m64n``bn`` with A the shared dY box and B gathered from X's boxes ``c x bn / 64`` on, and stores those
blocks; two consumers thus read dY's box from L2 once for twice the FLOPs. A consumer without blocks in a
tile (a row's short last group) still waits for and hands back every stage (the empty barriers count every
consumer warp), computing on whatever its part of the stage holds, and stores nothing. The grid is persistent
(``ctas`` blocks per multiprocessor, at most one per kept block); tile j is the j-th group of kept blocks
counted row by row (a row's last group may be short), and each thread walks the row pointers forward as its
tiles need them (``SampledTiles``). The epilogue stores each kept block's 64 x 64 values whole, 16 bytes a
lane: rows past M and columns past N are zeros (TMA zero-filled dY and X there), as the BSR values want.
``split_k`` > 1 (dense W, plain grid, no cluster) splits K over the grid's y dimension, for layers of
few output tiles: block (tile, split) runs its split's k-tiles (``split_range``; a split past K's last
k-tile has none and writes zeros) and stores its fp32 partial sums into the workspace WS[split][M][N];
a second kernel (``reduce_kernel``) sums the splits, adds the bias and converts (the two-pass split-K
of codegen.launch). With the pack prepass, the packed copies follow the partial sums in the workspace.
``a_regs`` gives wgmma X's fragments from registers instead of a descriptor: per k-step each consumer
warp loads its 16 rows of every m64 block with one ``ldmatrix`` x4 from the swizzled X tile (lane l
gives row l % 16 and 16-byte chunk 2s + l / 16 of k-step s, at the chunk XOR the row's address bits
from 7 up, which is TMA's swizzle of every span), in mma.m16n8k16's A layout, and issues the register
form of wgmma (B still from its descriptor, transposed where W is k-outer). wgmma reads A's registers
asynchronously, so they must not be rewritten until it completes: the consumer commits one group per
k-step and waits until only the latest is in flight before loading the next k-step's fragments (two
fragment sets live, ``a_frag_regs``, counted in the register rule), with ``wgmma.fence`` between the
loads and the wgmma that read them; the stage is handed back after the first k-step of the next
k-tile, when every wgmma of the previous one is done. Refused where X is k-outer (grad_weight: the
register form has no transpose for A) and for blocks of 16 (one k-step per k-tile, so the two
fragment sets could not alternate).
``swap`` (forward layout; no cluster, split-K or a_regs) swaps wgmma's operands: W's tile (``bn`` rows, a
multiple of 64: with a sparse W, blocks of 64) is A, its rows the M side in ``bn / 64`` m64 fragments, and
each consumer's ``bm / consumers`` rows of X are B, wgmma's N (16 to 256). Both stay K-major in the same
boxes, so the producer is unchanged. A one-block-row sparse tile then runs wgmma at N up to 256 instead
of 64, which reads less shared memory per FLOP, and a batch of 32 fills its m64 instead of half of it.
The accumulators hold Y's tile transposed; ``movmatrix.trans`` turns each converted pair back into the
usual row layout, and interior tiles exchange pairs within each quad as ``store_rows`` does, then store
16 bytes per lane.
Needs sm_90 and compiles for sm_90a (wgmma and setmaxnreg are arch-specific).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import ClassVar

from codegen.launch import (
    DB_COLS,
    DB_ROWS,
    LAYOUT_SLOTS,
    PACK_THREADS,
    KernelLaunch,
    LaunchPlan,
    TensorMapArg,
    blocks_rule,
    bsr_args,
    db_launch,
    db_rule,
    layout_args,
    pack_launch,
    pack_rule,
    packed_k,
    reduce_launch,
    reduce_rule,
    workspace_bytes,
)
from codegen.problem import DType, Layout, Problem
from codegen.spec import (
    LAYOUT_SUFFIX,
    DeviceLimits,
    SpecData,
    dtype_rules,
    field_rules,
    layout_rules,
    problem_rules,
    smem_rules,
    sparse_rules,
    thread_rules,
)

NAME = "hopper"
DTYPES = (DType.bf16, DType.fp16)
#: Place among the families that fit a problem, fastest first (search.fit).
RANK = 0
PREPASSES = ("none", "pack")
SWIZZLE = 128  # bytes: a dense k-tile row is one 128-byte swizzle span
#: The wgmma shared-memory descriptor's layout type (bits 62-63) of each swizzle span in bytes.
SWIZZLE_MODE = {128: 1, 64: 2, 32: 3}
#: A stage's tiles start on this boundary: the longest swizzle period (8 rows of 128 bytes).
STAGE_ALIGN = 1024
WG = 128  # threads in a warpgroup
WGMMA_M, WGMMA_K = 64, 16
#: Elements of a k-outer (MN-major) operand's box along M or N: one 128-byte swizzle span of 16-bit values.
MN_BOX = 64
#: Rows of a TMA box of X's tile (a box dimension holds at most 256 elements); a block-sparse W's 512-row tile is two.
X_BOX_ROWS = 256
CONSUMERS = (1, 2)
#: The block of dW sampled at a block-sparse W's kept blocks: one block row is wgmma's 64 rows.
SAMPLED_BLOCK = 64
CTAS = (1, 2)
CLUSTERS = (1, 2)
MAX_STAGES = {False: 8, True: 16}  # dense; block-sparse (smaller stages, deeper rings)
#: Registers per thread after setmaxnreg: the producer gives up what the consumers take. With two
#: consumer warpgroups the block starts at 168 (65536 / 384, in steps of 8) and 40 + 2 x 232 fits;
#: with one it starts at the 255 cap.
PRODUCER_REGS = 40
CONSUMER_REGS = {1: 240, 2: 232}


def launch_regs(consumers: int, ctas: int) -> int:
    """Registers per thread a block starts with under ``__launch_bounds__(threads, ctas)``: the
    register file shared by ``ctas`` blocks, in steps of 8, at most 248 (the 255 cap's step)."""
    return min(248, 65536 // (ctas * WG * (consumers + 1)) // 8 * 8)


def consumer_regs(consumers: int, ctas: int) -> int:
    """A consumer thread's registers after setmaxnreg: one block per SM keeps the measured table;
    two take what the producer gives up, no more (setmaxnreg.inc waits for registers the block
    does not have forever)."""
    if ctas == 1:
        return CONSUMER_REGS[consumers]
    start = launch_regs(consumers, ctas)
    return min(256, start + (start - PRODUCER_REGS) // consumers // 8 * 8)


#: Registers a consumer thread needs beside its accumulators (descriptors, indices, epilogue).
CONSUMER_OVERHEAD = 56
#: Registers one wgmma instruction needs beside its own accumulators (wgmma N / 2 of them). ptxas compiles
#: each instruction within __launch_bounds__' cap (before setmaxnreg raises the consumers'): NVRTC 13.0 asked
#: for a target of 154 for m64n256 (128 accumulators), 138 for m64n224 and 90 for m64n128 where the cap was 128
#: or 80 (two blocks per multiprocessor), and compiled m64n192 within 128 and m64n96 within 80.
WGMMA_LIVE = 26
#: 32-bit registers of one thread's share of an m64 x k16 A fragment in registers (8 16-bit elements).
A_FRAG_REGS = 4
ARGS = ("Y", "TX", "TW", "B", "M", "N", "K")
SPARSE_ARGS = ("Y", "TX", "TW", "B", "RP", "CI", "M", "N", "K")
#: A block-sparse grad_input: W's blocks in place (TW), Wᵀ's RP and CI, and BI, each of Wᵀ's kept blocks' index in W.
IN_PLACE_ARGS = ("Y", "TX", "TW", "B", "RP", "CI", "BI", "M", "N", "K")
SPLIT_ARGS = ("Y", "TX", "TW", "B", "WS", "M", "N", "K")  # split-K: partial sums into WS
PTX_TYPE = {DType.bf16: "bf16", DType.fp16: "f16"}
PAIR_TYPE = {DType.bf16: "__nv_bfloat162", DType.fp16: "__half2"}


@dataclass(frozen=True)
class Spec(SpecData):
    """One warp-specialized wgmma + TMA GEMM variant; its generated ``name`` is its identity.

    The k-tile is one 128-byte swizzle span (64 elements of a 16-bit type), or with a block-sparse W
    one block, so it is not a field."""

    dtype: DType = DType.bf16
    bias: bool = False
    bm: int = field(default=128, metadata={"help": "block tile rows (M): 64 or 128 per consumer warpgroup"})
    bn: int = field(default=256, metadata={"help": "block tile columns (N) = wgmma N, a multiple of 8 up to 256"})
    stages: int = field(default=4, metadata={"help": "shared-memory ring depth (2-8)"})
    consumers: int = field(default=2, metadata={"help": "consumer warpgroups (1 or 2), each owns bm/consumers rows "
                                                        "(sampled dW: all bm rows, bn columns of kept blocks each)"})
    group_m: int = field(default=8, metadata={"help": "block rows grouped for L2 reuse"})
    persistent: bool = field(default=False, metadata={"help": "one block per multiprocessor looping over tiles"})
    grouped: bool = field(default=False, metadata={"help": "a persistent grid over a block-sparse W strides over "
                                                           "tiles in group_m order (default: balanced ranges)"})
    prepass: str = field(default="none", metadata={"choices": PREPASSES,
                                                   "help": "pack rows to 16 bytes first (needed when K is not a multiple of 8)"})
    ctas: int = field(default=1, metadata={"help": "blocks sharing a multiprocessor (1 or 2; 2 halves ring and registers)"})
    block: int = field(default=0, metadata={"help": "W block-sparse in block x block blocks (BSR); 0: dense W"})
    cluster: int = field(default=1, metadata={"help": "blocks per cluster along M sharing W's tile by TMA multicast (1 or 2)"})
    layout: Layout = field(default=Layout.forward, metadata={"help": "which GEMM of the linear layer"})
    split_k: int = field(default=1, metadata={"help": "K split over the grid, reduced by a second pass (1: no split)"})
    a_regs: bool = field(default=False, metadata={"help": "consumers load X's fragments from shared memory into registers "
                                                          "(ldmatrix) for wgmma with A from registers"})
    swap: bool = field(default=False, metadata={"help": "W's tile is wgmma's A and X's rows its N side (wgmma N = "
                                                        "bm/consumers): wide wgmma for narrow W tiles (a sparse block row)"})

    family: ClassVar[str] = NAME

    # ---- identity -------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return (f"hp_{self.dtype.value}_{'bias' if self.bias else 'nobias'}_{self.bm}x{self.bn}x{self.bk}"
                f"_c{self.consumers}_s{self.stages}_g{self.group_m}{'_ps' if self.persistent else ''}{'g' if self.grouped else ''}"
                f"{'_pk' if self.prepass == 'pack' else ''}{f'_bsr{self.block}' if self.block else ''}"
                f"{f'_o{self.ctas}' if self.ctas != 1 else ''}{f'_cl{self.cluster}' if self.cluster != 1 else ''}"
                f"{f'_k{self.split_k}' if self.split_k != 1 else ''}{'_ar' if self.a_regs else ''}{'_sw' if self.swap else ''}"
                f"{LAYOUT_SUFFIX[self.layout]}")

    _NAME = re.compile(
        r"hp_(?P<dtype>bf16|fp16)_(?P<bias>bias|nobias)_(?P<bm>\d+)x(?P<bn>\d+)x(?P<bk>\d+)_c(?P<consumers>\d+)"
        r"_s(?P<stages>\d+)_g(?P<group_m>\d+)(?P<persistent>(_ps)?)(?P<grouped>g?)(?P<prepass>(_pk)?)(?:_bsr(?P<block>\d+))?"
        r"(?:_o(?P<ctas>\d+))?(?:_cl(?P<cluster>\d+))?(?:_k(?P<split_k>\d+))?(?P<a_regs>(_ar)?)(?P<swap>(_sw)?)(?:_(?P<layout>gi|gw))?"
    )

    _MARKS = {"persistent": {"": False, "_ps": True}, "grouped": {"": False, "g": True},
              "prepass": {"": "none", "_pk": "pack"}, "a_regs": {"": False, "_ar": True},
              "swap": {"": False, "_sw": True}}

    # ---- derived geometry -----------------------------------------------------------------
    @property
    def elem(self) -> int:
        return self.dtype.itemsize

    @property
    def bk(self) -> int:
        """k-tile depth: one 128-byte swizzled row, or one block of a block-sparse W."""
        return self.block or SWIZZLE // self.elem

    @property
    def row_bytes(self) -> int:
        """Bytes of one k-tile row in shared memory: the swizzle span (128, 64 or 32)."""
        return self.bk * self.elem

    @property
    def wg_m(self) -> int:
        """Rows of the block tile each consumer warpgroup owns: with dW sampled at the kept blocks all of them
        (the consumers share dY's box, each against kept blocks of its own)."""
        return self.bm if self.sampled else self.bm // max(self.consumers, 1)

    @property
    def frag_m(self) -> int:
        """m64 wgmma row blocks per consumer warpgroup (of W's rows with ``swap``)."""
        return (self.bn if self.swap else self.wg_m) // WGMMA_M

    @property
    def wg_n(self) -> int:
        """wgmma's N: W's tile rows, or with ``swap`` the consumer's rows of X."""
        return self.wg_m if self.swap else self.bn

    @property
    def acc_regs(self) -> int:
        """fp32 accumulators per consumer thread."""
        return self.frag_m * self.wg_n // 2

    @property
    def threads(self) -> int:
        return WG * (self.consumers + 1)

    @property
    def x_box_rows(self) -> int:
        """Rows of one TMA box of X's tile: the tile, or half of a 512-row one (a box has at most 256 rows)."""
        return min(self.bm, X_BOX_ROWS)

    @property
    def tx_bytes(self) -> int:
        """Bytes the copy engine writes into one stage: X's box then W's (with dW sampled at the kept blocks,
        one W box of ``bn`` rows per consumer warpgroup)."""
        return (self.bm + (self.consumers if self.sampled else 1) * self.bn) * self.row_bytes

    @property
    def stage_bytes(self) -> int:
        """One stage of the ring, rounded up to the 1024-byte swizzle period."""
        return -(-self.tx_bytes // STAGE_ALIGN) * STAGE_ALIGN

    @property
    def smem_bytes(self) -> int:
        """The ring, its full and empty barriers, and 1 KiB to align the ring to the swizzle's 1024-byte period."""
        return self.stages * self.stage_bytes + 2 * 8 * self.stages + 1024

    @property
    def w_slice_rows(self) -> int:
        """Rows of W's box each block of a cluster loads and multicasts (all of it without a cluster)."""
        return self.bn // self.cluster

    @property
    def consumer_regs(self) -> int:
        return consumer_regs(self.consumers, self.ctas)

    @property
    def sampled(self) -> bool:
        """The weight gradient of a block-sparse W: dW at its kept blocks only, as its BSR values."""
        return bool(self.block) and self.layout is Layout.grad_weight

    @property
    def in_place(self) -> bool:
        """A block-sparse W's grad_input: W's own kept blocks are read in place (through BI, in Wᵀ's BSR order)."""
        return bool(self.block) and self.layout is Layout.grad_input

    @property
    def w_t(self) -> bool:
        """Whether W's tile is k-outer: in the backward layouts, a block-sparse grad_input included (each of W's
        blocks [out][in] is read as it is stored, its rows along that GEMM's K, and wgmma transposes it)."""
        return super().w_t or self.in_place

    @property
    def a_frag_regs(self) -> int:
        """Registers a consumer thread holds A's fragments in (``a_regs``; 0 without): two k-steps' worth,
        the one whose wgmma are in flight and the next, loading, each 4 per m64 row block."""
        return 2 * self.frag_m * A_FRAG_REGS if self.a_regs else 0

    # ---- validity ---------------------------------------------------------------------------
    def check(self, problem: Problem | None = None, limits: DeviceLimits | None = None) -> list[str]:
        """Why this point is invalid (empty when it is valid). Costs no compile."""
        limits = limits or DeviceLimits()
        why = field_rules(self, positive=("bm", "bn", "stages", "group_m", "split_k"),
                          choices=(("prepass", PREPASSES), ("consumers", CONSUMERS), ("ctas", CTAS),
                                   ("cluster", CLUSTERS)))
        why += dtype_rules(self, DTYPES)
        if why:
            return why
        if limits.sm != 90:
            why.append(f"the {NAME} family needs sm_90 (wgmma and setmaxnreg are sm_90a instructions), not sm_{limits.sm}")
        why += self._tile_rules() + self._option_rules()
        if why:
            return why
        budget = self.consumer_regs
        if self.acc_regs + CONSUMER_OVERHEAD + self.a_frag_regs > budget:
            frags = f", +{self.a_frag_regs} for A's fragments" if self.a_regs else ""
            why.append(f"{self.acc_regs} accumulators per consumer thread (+{CONSUMER_OVERHEAD}{frags}) > the {budget} "
                       f"registers a consumer gets: make {'bn' if self.sampled else 'bm/consumers x bn'} smaller")
        cap, per_wgmma = launch_regs(self.consumers, self.ctas), self.wg_n // 2 + (A_FRAG_REGS if self.a_regs else 0)
        if per_wgmma + WGMMA_LIVE > cap:
            why.append(f"one wgmma of N {self.wg_n} needs {per_wgmma + WGMMA_LIVE} registers, over the {cap} ptxas "
                       f"compiles an instruction with under __launch_bounds__({self.threads}, {self.ctas}): make wgmma's "
                       f"N smaller ({'bm/consumers' if self.swap else 'bn'}) or ctas 1")
        why += thread_rules(self, limits) + smem_rules(self, limits)
        if self.smem_bytes <= limits.max_smem and self.ctas * (self.smem_bytes + 1024) > limits.max_smem + 1024:
            # 1 KiB per block is the system's
            why.append(f"shared memory {self.smem_bytes} B per block: {self.ctas} blocks (+1 KiB each) exceed the "
                       f"{limits.max_smem + 1024} B of a multiprocessor")
        why += problem_rules(self, problem)
        if problem is not None and problem.block == self.block:
            why += _pitch_rules(self, problem)
        return why

    def _tile_rules(self) -> list[str]:
        """What the tile, the ring and a block-sparse W's blocks must be."""
        why: list[str] = self._sampled_rules() if self.sampled else []
        if self.swap:
            if self.bm % (16 * self.consumers) or not 16 <= self.wg_m <= 256:
                why.append(f"bm {self.bm} must be a multiple of 16 x {self.consumers} consumer warpgroup(s) with swap "
                           f"(each consumer's rows of X are wgmma's N, 16 to 256)")
            if self.bn % WGMMA_M:
                why.append(f"bn {self.bn} must be a multiple of 64 with swap (W's rows are wgmma's M side)"
                           + (": swap needs blocks of 64" if self.block else ""))
            for name, bad in (("layout", self.layout is not Layout.forward), ("cluster", self.cluster != 1),
                              ("split_k", self.split_k != 1), ("a_regs", self.a_regs)):
                if bad:
                    why.append(f"swap is generated for the forward layout without cluster, split_k or a_regs: "
                               f"{name} is {getattr(self, name).value if name == 'layout' else getattr(self, name)}")
        elif not self.sampled and self.bm % (WGMMA_M * self.consumers):  # sampled: each consumer has all bm rows
            why.append(f"bm {self.bm} must be a multiple of 64 x {self.consumers} consumer warpgroup(s)")
        if self.bn % 8 or not 8 <= self.bn <= 256:
            why.append(f"bn {self.bn} must be a multiple of 8 from 8 to 256 (wgmma N, TMA box rows)")
        if self.bm > X_BOX_ROWS and not (self.block and not self.sampled and self.bm == 2 * X_BOX_ROWS):
            why.append(f"bm {self.bm} > {X_BOX_ROWS} (TMA box rows): only a block-sparse W's forward and grad_input "
                       f"load X's tile as two boxes, bm {2 * X_BOX_ROWS}")
        top = MAX_STAGES[bool(self.block)]
        if not 2 <= self.stages <= top:
            why.append(f"stages must be 2 to {top}, got {self.stages}")
        if self.block and not self.sampled:
            why += sparse_rules(self.block, self.bn, self.bk)
        if self.block:
            if self.prepass != "none":
                why.append("a block-sparse W is read in its blocks: prepass must be 'none'")
        if self.grouped and not (self.block and self.persistent):
            why.append("grouped orders a persistent grid over a block-sparse W: it needs block > 0 and persistent")
        return why

    def _sampled_rules(self) -> list[str]:
        """What dW sampled at a block-sparse W's kept blocks is generated with: a tile is up to bn/block kept
        blocks of one block row per consumer warpgroup (1 or 2, sharing the row's dY), on a persistent grid
        walking the tiles row by row."""
        b = self.block
        why = [] if b == SAMPLED_BLOCK else [
            f"dW sampled at the kept blocks is generated on Hopper for blocks of {SAMPLED_BLOCK} (a tile is one block "
            f"row, wgmma's {WGMMA_M} rows): block is {b}; the tensorcore family generates it for any block"]
        if self.bm != b:
            why.append(f"bm must be the block ({b}) for dW sampled at the kept blocks: a tile is one block row")
        if self.bn % b or not b <= self.bn <= 256:
            why.append(f"bn {self.bn} must be a multiple of the block ({b}) up to 256 for dW sampled at the kept "
                       f"blocks: a tile is bn/{b} kept blocks of one block row")
        for name, bad, need in (("persistent", not self.persistent, True), ("grouped", self.grouped, False),
                                ("group_m", self.group_m != 1, 1), ("split_k", self.split_k != 1, 1)):
            if bad:
                why.append(f"dW sampled at the kept blocks runs on a persistent grid walking the tiles row by row: "
                           f"{name} must be {need}")
        return why

    def _option_rules(self) -> list[str]:
        """What each option (the backward layouts, a cluster, a_regs, split-K) is generated with."""
        why: list[str] = []
        if self.layout is not Layout.forward:
            why += layout_rules(self.layout, self.bias)
            if self.prepass != "none":
                why.append(f"the {self.layout.value} layout has no pack prepass: prepass must be 'none'")
            if self.cluster != 1:
                why.append("cluster > 1 is generated for the forward layout only: cluster must be 1")
            if self.in_place and self.block != MN_BOX:
                why.append(f"a block-sparse W's grad_input reads W's blocks in place, transposed by wgmma, in blocks of "
                           f"{MN_BOX} (one 128-byte swizzle span): block is {self.block}; the tensorcore family takes "
                           f"any block")
            elif self.w_t and self.bn % MN_BOX:
                why.append(f"bn {self.bn} must be a multiple of {MN_BOX} in the {self.layout.value} layout: the right "
                           f"operand is loaded k-outer in boxes of {MN_BOX} columns")
        if self.cluster > 1:
            if self.block:
                why.append("cluster > 1 is generated for a dense W only (a block-sparse W's pairs would walk different "
                           "kept blocks): cluster must be 1")
            if self.ctas != 1:
                why.append("cluster > 1 is generated with one block per multiprocessor only: ctas must be 1")
            if self.bn % (8 * self.cluster):
                why.append(f"bn {self.bn} must be a multiple of 8 x cluster {self.cluster}: each block multicasts "
                           f"bn/{self.cluster} rows of W, whole 8-row swizzle groups")
        if self.a_regs:
            if self.a_t:
                why.append(f"a_regs loads X's fragments from a K-major tile, and the {self.layout.value} layout stores X "
                           f"k-outer (wgmma has no transpose for an A from registers): a_regs must be false")
            if self.bk // WGMMA_K < 2:
                why.append(f"a_regs alternates two fragment sets between the k-steps of a k-tile, and a k-tile of "
                           f"{self.bk} is one k-step: a_regs needs a dense W or blocks of 32 or 64")
        if self.split_k > 1:
            if self.block:
                why.append("split_k > 1 is generated for a dense W only (a block-sparse row's kept blocks are not "
                           "split): split_k must be 1")
            if self.cluster > 1:
                why.append("split_k > 1 is generated without clusters (the splits of a pair are not generated): "
                           "cluster must be 1")
            if self.persistent:
                why.append("split_k > 1 launches one block per (tile, split) on a plain grid: persistent must be false")
        return why

def _pitch_rules(spec: Spec, problem: Problem) -> list[str]:
    """The 16-byte row pitches TMA needs of the operands' rows in the problem."""
    if spec.block and not spec.sampled:  # only X's (dY's) rows: the blocks' rows are whole 16-byte units
        return [f"K={problem.k}: rows of X are {problem.k * spec.elem} bytes apart, not a multiple of 16 as TMA needs, "
                f"and a block-sparse W has no pack prepass: use the tensorcore family"] if problem.k * spec.elem % 16 else []
    if spec.layout is not Layout.forward:
        pitches = {"M": problem.m} if spec.a_t else {"K": problem.k}
        pitches["N"] = problem.n
        bad = [f"{d}={v}" for d, v in pitches.items() if v * spec.elem % 16]
        return [f"{' and '.join(bad)}: the {spec.layout.value} layout reads rows of that many elements, which TMA "
                f"needs in whole 16-byte units (the backward layouts have no pack prepass): use the tensorcore "
                f"family"] if bad else []
    if problem.k * spec.elem % 16 and spec.prepass != "pack":
        return [f"K={problem.k}: rows of X and W are {problem.k * spec.elem} bytes apart, not a multiple of 16 as TMA "
                f"needs; use prepass='pack' (rows copied to a 16-byte pitch first) or the tensorcore family"]
    return []


# ---- template values and launch plan --------------------------------------------------------
#: The GEMM of each backward layout in the kernel's argument names, for the source's header.
COMMENT = {
    Layout.forward: "",
    Layout.grad_input: "grad_input: Y[M,N] = X[M,K] * W[K,N] (dX = dY * W), W read k-outer",
    Layout.grad_weight: "grad_weight: Y[M,N] = X[K,M]^T * W[K,N] (dW = dY^T * X), both read k-outer",
}
SAMPLED_COMMENT = ("grad_weight sampled at W's kept blocks: Y[nnzb][BLOCK][BLOCK] = X[K,M]^T * W[K,N] at each kept "
                   "block (dW = dY^T * X), both read k-outer")
IN_PLACE_COMMENT = ("grad_input: Y[M,N] = X[M,K] * W[K,N] (dX = dY * W), W's kept blocks read in place, k-outer, in Wᵀ's "
                     "BSR order (RP, CI) through BI")


def template_values(spec: Spec) -> dict:
    """Every number the template uses, computed here once."""
    values = spec.to_dict()
    acc = spec.wg_n // 2
    box_bytes = MN_BOX * spec.elem * spec.bk  # a k-outer box: MN_BOX elements by bk k-rows
    values.update(
        name=spec.name,
        bk=spec.bk,
        balanced=bool(spec.block and spec.persistent and not spec.grouped and not spec.sampled),
        sampled=spec.sampled,
        in_place=spec.in_place,
        group=spec.bn // spec.block if spec.sampled else 0,  # kept blocks per consumer warpgroup
        tile_group=spec.consumers * spec.bn // spec.block if spec.sampled else 0,  # and per tile
        threads=spec.threads,
        wg_m=spec.wg_m,
        wg_n=spec.wg_n,
        frag_m=spec.frag_m,
        acc=acc,
        k_steps=spec.bk // WGMMA_K,
        # a k-step is 16 elements along a K-major row, or 16 rows of a k-outer box
        a_k_step_bytes=WGMMA_K * (spec.row_bytes if spec.a_t else spec.elem),
        b_k_step_bytes=WGMMA_K * (spec.row_bytes if spec.w_t else spec.elem),
        a_lbo=box_bytes if spec.a_t else 16,
        b_lbo=box_bytes if spec.w_t else 16,
        a_t=int(spec.a_t),
        w_t=int(spec.w_t),
        mn_box=MN_BOX,
        a_boxes=spec.bm // MN_BOX,
        b_boxes=spec.bn // MN_BOX,
        box_bytes=box_bytes,
        bias=spec.bias and spec.layout is Layout.forward,
        db=spec.bias and spec.layout is Layout.grad_weight,
        db_cols=DB_COLS,
        db_rows=DB_ROWS,
        comment=SAMPLED_COMMENT if spec.sampled else IN_PLACE_COMMENT if spec.in_place else COMMENT[spec.layout],
        row_bytes=spec.row_bytes,
        swizzle_mode=SWIZZLE_MODE[spec.row_bytes],
        swizzle_mask=spec.row_bytes // 16 - 1,  # the 16-byte chunk index bits of a swizzled row
        a_bytes=spec.bm * spec.row_bytes,
        two_x_boxes=spec.bm > spec.x_box_rows,
        x_box_rows=spec.x_box_rows,
        tx_bytes=spec.tx_bytes,
        stage_bytes=spec.stage_bytes,
        bar_offset=spec.stages * spec.stage_bytes,
        wg_a_bytes=spec.wg_m * spec.row_bytes,
        frag_a_bytes=WGMMA_M * spec.row_bytes,
        sbo=8 * spec.row_bytes,  # bytes between 8-row groups of a swizzled tile
        empty_arrivals=spec.cluster * spec.consumers * (WG // 32),
        w_slice_rows=spec.w_slice_rows,
        w_slice_bytes=spec.w_slice_rows * spec.row_bytes,
        producer_regs=PRODUCER_REGS,
        consumer_regs=spec.consumer_regs,
        wgmma_ptx=f"wgmma.mma_async.sync.aligned.m{WGMMA_M}n{spec.wg_n}k{WGMMA_K}.f32.{PTX_TYPE[spec.dtype]}.{PTX_TYPE[spec.dtype]}",
        acc_operands=", ".join(f"%{i}" for i in range(acc)),
        acc_constraints=", ".join(f'"+f"(d[{i}])' for i in range(acc)),
        pair_type=PAIR_TYPE[spec.dtype],
        pack_threads=PACK_THREADS,
        chunk_elems=16 // spec.elem,
    )
    return values


def compile_target(arch: str) -> str:
    """NVRTC's -arch for this family on ``arch``: wgmma and setmaxnreg need the arch-specific sm_90a."""
    return "sm_90a" if arch == "sm_90" else arch


def block_rows_bound(problem: Problem, block: int) -> int:
    """Rows of the block array's tensor map: room for every block W could keep (the map does not
    depend on the pattern, so one manifest serves any pattern of the shape)."""
    return -(-problem.n // block) * -(-problem.k // block) * block


def _partials_bytes(spec: Spec, problem: Problem) -> int:
    """Two-pass split-K partial sums, first in the workspace, rounded up to 16 bytes (0 without a split)."""
    return -(-workspace_bytes(spec.split_k, problem) // 16) * 16 if spec.split_k > 1 else 0


def _maps(spec: Spec, problem: Problem) -> tuple[tuple[TensorMapArg, TensorMapArg], int]:
    """The tensor maps of X and W, and the workspace the pack prepass needs (0 without it), which
    follows any split-K partial sums."""
    m, n, k, e = problem.m, problem.n, problem.k, spec.elem
    common = dict(dtype=spec.dtype.value, swizzle=spec.row_bytes)
    if spec.block and not spec.sampled:  # X (dY in grad_input) and W's block array
        b, (x, w) = spec.block, layout_args(("X", "W"), spec.layout)
        return (TensorMapArg("TX", x, dims=(k, m), pitch=k * e, box=(b, spec.x_box_rows), **common),
                TensorMapArg("TW", w, dims=(b, block_rows_bound(problem, b)), pitch=b * e, box=(b, b),
                             **common)), 0
    if spec.layout is not Layout.forward:  # the operands of the layout's left and right slots
        left, right = LAYOUT_SLOTS[spec.layout][1:]
        tx = (TensorMapArg("TX", left, dims=(m, k), pitch=m * e, box=(MN_BOX, spec.bk), **common) if spec.a_t else
              TensorMapArg("TX", left, dims=(k, m), pitch=k * e, box=(spec.bk, spec.bm), **common))
        return (tx, TensorMapArg("TW", right, dims=(n, k), pitch=n * e, box=(MN_BOX, spec.bk), **common)), 0
    if spec.prepass == "pack":
        kp, at = packed_k(16 // e, k), _partials_bytes(spec, problem)
        return (TensorMapArg("TX", "WS", dims=(k, m), pitch=kp * e, box=(spec.bk, spec.bm), offset=at, **common),
                TensorMapArg("TW", "WS", dims=(k, n), pitch=kp * e, box=(spec.bk, spec.w_slice_rows),
                             offset=at + m * kp * e, **common)), (m + n) * kp * e
    return (TensorMapArg("TX", "X", dims=(k, m), pitch=k * e, box=(spec.bk, spec.bm), **common),
            TensorMapArg("TW", "W", dims=(k, n), pitch=k * e, box=(spec.bk, spec.w_slice_rows), **common)), 0


def plan(spec: Spec, problem: Problem) -> LaunchPlan:
    """With a cluster, the grid counts blocks in whole clusters: the m-tiles rounded up to pairs. dW sampled
    at the kept blocks counts at most one tile per kept block (a tile holds one or more)."""
    cl = spec.cluster
    tiles = -(-problem.m // (cl * spec.bm)) * cl * -(-problem.n // spec.bn)
    if spec.sampled:
        tiles = max(1, problem.nnzb)
    maps, workspace = _maps(spec, problem)
    launches = [pack_launch(spec.name, 16 // spec.elem, problem)] if spec.prepass == "pack" else []
    args = (IN_PLACE_ARGS if spec.in_place else SPARSE_ARGS if spec.block else SPLIT_ARGS if spec.split_k > 1
            else ARGS)
    args = layout_args(args, spec.layout)
    launches.append(KernelLaunch(symbol=spec.name, grid=(tiles, spec.split_k, 1), block=(spec.threads, 1, 1),
                                 smem=spec.smem_bytes, args=args, persistent=spec.persistent and (spec.ctas if spec.ctas > 1 else True),
                                 cluster=(cl, 1, 1)))
    if spec.split_k > 1:
        launches.append(reduce_launch(spec.name, spec.split_k, problem))
    if spec.bias and spec.layout is Layout.grad_weight:
        launches.append(db_launch(spec.name, problem))
    return LaunchPlan(launches=tuple(launches), workspace_bytes=_partials_bytes(spec, problem) + workspace,
                      tensor_maps=maps)


def grid_rule(spec: Spec) -> str:
    """How to launch this variant on any M, N, K, in words (export manifests carry it)."""
    e, ce, sw = spec.elem, 16 // spec.elem, spec.row_bytes
    parts = []
    if spec.prepass == "pack":
        at = f"ceil16(4*{spec.split_k}*M*N)" if spec.split_k > 1 else "0"  # after the partial sums
        parts.append(pack_rule(spec.name, ce, e, at))
        src_x, src_w = ("WS", f"WS + M*KP*{e} bytes") if spec.split_k == 1 else (f"WS + {at} bytes",
                                                                                  f"WS + {at} + M*KP*{e} bytes")
        pitch = f"KP*{e}"
    else:
        src_x, src_w, pitch = "X", "W", f"K*{e}"
    blocks = (f"min(max(1, nnzb), {f'{spec.ctas} x ' if spec.ctas > 1 else ''}multiprocessor count) (nnzb: W's kept "
              f"blocks)" if spec.sampled else blocks_rule(spec.bm, spec.bn, spec.cluster, spec.persistent, spec.ctas))
    head = (f"{spec.name}: grid = ({blocks}, {spec.split_k}, 1), block = ({spec.threads}, 1, 1), dynamic shared memory "
            f"{spec.smem_bytes} B")
    if spec.block and not spec.sampled:
        b = spec.block
        y, x, w = layout_args(LAYOUT_SLOTS[Layout.forward], spec.layout)
        parts.append(f"{head}; TX and TW are 2-D tensor maps ({spec.dtype.value}, {sw}-byte swizzle, zero fill): TX "
                     f"over {x} with dims (K, M), row pitch K*{e} bytes (a multiple of 16), box ({b}, {spec.x_box_rows}); TW "
                     f"over the block array {w} with dims ({b}, ceil(N/{b})*ceil(K/{b})*{b}), row pitch {b * e} bytes, "
                     f"box ({b}, {b}); {x} and {w} 16-byte aligned")
        parts.append(bsr_args(spec.layout, b, spec.in_place))
        if spec.layout is not Layout.forward:
            parts.append(f"argument Y is {y} ({IN_PLACE_COMMENT}), B is null")
    elif spec.layout is not Layout.forward:
        left, right = LAYOUT_SLOTS[spec.layout][1:]
        tx = (f"TX over {left} [K][M] with dims (M, K), row pitch M*{e} bytes, box ({MN_BOX}, {spec.bk})" if spec.a_t
              else f"TX over {left} [M][K] with dims (K, M), row pitch K*{e} bytes, box ({spec.bk}, {spec.bm})")
        parts.append(f"{head}; TX and TW are 2-D tensor maps ({spec.dtype.value}, 128-byte swizzle, zero fill): {tx}; "
                     f"TW over {right} [K][N] with dims (N, K), row pitch N*{e} bytes, box ({MN_BOX}, {spec.bk}); row "
                     f"pitches multiples of 16 bytes, operands 16-byte aligned")
        slots = layout_args(LAYOUT_SLOTS[Layout.forward], spec.layout)
        parts.append(f"argument Y is {slots[0]} ({COMMENT[spec.layout]}), B is null")
        if spec.sampled:
            group = spec.bn // spec.block
            share = f" ({group} per consumer warpgroup)" if spec.consumers > 1 else ""
            parts.append(bsr_args(spec.layout, spec.block) + f"; a tile is up to {spec.consumers * group} kept blocks "
                         f"of one block row{share}, the grid walks the tiles row by row")
    else:
        parts.append(f"{head}; TX and TW are 2-D tensor maps ({spec.dtype.value}, 128-byte swizzle, zero "
                     f"fill): TX over {src_x} with dims (K, M), TW over {src_w} with dims (K, N), row pitch {pitch} bytes "
                     f"(a multiple of 16), boxes ({spec.bk}, {spec.bm}) and ({spec.bk}, {spec.w_slice_rows}); "
                     f"X, W and WS 16-byte aligned")
    if (cl := spec.cluster) > 1:
        parts.append(f"a thread-block cluster launch (cuLaunchKernelEx, CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION "
                     f"= ({cl}, 1, 1)): each cluster of {cl} consecutive blocks shares W's tile by TMA multicast")
    if spec.bias and spec.layout is Layout.grad_weight:
        parts.append("then " + db_rule(spec.name))
    if spec.ctas > 1:
        parts.append(f"{spec.ctas} blocks share a multiprocessor (__launch_bounds__({spec.threads}, {spec.ctas}))")
    if spec.split_k > 1:
        parts.append(f"block y of the grid is the split of K: it writes fp32 partial sums to WS[{spec.split_k}][M][N] "
                     f"at byte 0 (no bias), then " + reduce_rule(spec.name, spec.split_k) + " (rounded up to 16 bytes)")
    return "; ".join(parts)
