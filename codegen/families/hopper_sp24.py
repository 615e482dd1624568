"""Hopper 2:4 family: a 2:4 structured-sparse W on Hopper's sparse warpgroup instructions
(``wgmma.mma_async.sp`` m64nNk32), fed by TMA, warp-specialized (sm_90a).

The Hopper family's pipeline (codegen/families/hopper.py) for a W that keeps two of every four
elements along K (codegen.sparse24). The sparse operand of ``wgmma.sp`` is its A side, so the kernel
computes Yᵀ tile by tile, as the Hopper family's ``swap`` does: W's rows are the instruction's M side
(64 per instruction, ``bn / consumers`` rows of the block tile per consumer warpgroup, ``bn / consumers
/ 64`` instructions per k-step) and X's ``bm`` rows its N side (8 to 256), each instruction 32 deep in
K. One producer thread copies k-tiles of X [bm][bk] (boxes of 64 columns, 128-byte swizzle: one box
per stage at ``bk=64``, two at ``bk=128``) and of the kept halves WC [bn][bk/2] (64-byte swizzle at
``bk=64``, 128-byte at ``bk=128``) with ``cp.async.bulk.tensor`` into a ring of ``stages`` buffers
with full/empty mbarriers, as the Hopper family does; both operands reach wgmma through shared-memory
descriptors, ``bk/32`` k-steps per stage.

The metadata (WE: ``codegen.sparse24.metadata_m16n8k32``, the layout every 2:4 family reads;
``metadata_m64nnk32`` is the same words per instruction) takes one of two paths (``meta``). ``ring``
(the default): warp 1 of the producer warpgroup copies each k-tile's words for the tile's bn/16
m16n8k32 blocks ([bn/16][bk/32][16] uint32, contiguous 16-byte chunks) with ``cp.async`` into a
metadata ring beside the operands' ring, its stages filled and released with the same mbarriers (each
loader thread's arrival on the full barrier waits for its copies: ``cp.async.mbarrier.arrive.noinc``);
the zero-group fill replaces blocks past W's rows and k-steps past KP. A consumer thread reads its
words of the next k-tile from shared memory as soon as that stage is full, while the current k-tile's
wgmma run, so the metadata is as far ahead as the ring is deep. ``global``: each consumer thread loads
its words straight from WE one k-tile ahead. Either way a consumer's words go into one of two
register sets that alternate between k-tiles (an instruction in flight may still read the other), one
word per m64 block and k-step (thread 32w + 4g + h of a warpgroup takes word 2g + (h & 1) of
m16n8k32 block 4b + w; sparsity selector 0 reads lanes 4g and 4g + 1). The epilogue adds the bias in
fp32 and stores Yᵀ's accumulators element by element with bounds checks (``epilogue="direct"``), or
(``"smem"``) an m64 block at a time converted into a shared [bm][64] tile per consumer warpgroup
(rows padded to 72 elements), from which the warpgroup writes Y's rows in 16-byte pieces, element by
element only where a piece passes N or Y's rows are not 16-byte aligned.

Any M, N, K: TMA zero-fills X past M and K and WC past N and KP/2 (KP = K padded to 32 by the
compression). TMA needs 16-byte row pitches, so when K is not a multiple of 8 a prepass first
copies X into the workspace with rows padded to 16 bytes (``prepass="pack"``; WC's rows are always
KP/2 elements, whole 16-byte chunks). ``persistent`` launches one block per multiprocessor, each
looping over output tiles in the grouped order.

``cluster=2`` launches pairs of blocks as a thread-block cluster along M, as the Hopper family's
``cluster`` does: the two blocks of a pair take m-tiles 2i and 2i+1 of the same block column, so they
read the same W rows, and each block's producer loads half of WC's box (``bn / 2`` rows, the tensor
map's box; whole 8-row swizzle groups since bn is a multiple of 64) with a multicast TMA that writes it into both blocks'
shared memory at the same offset and completes on both blocks' full barriers; the stage's expected
bytes stay X's box and all of WC's. WC is the operand shared (not X, which pairs along N would share)
because the grouped order (``block_origin``) walks m-tiles down a block column, so a pair is one
block_origin tile of twice bm, the same pairing as the dense family's; X's box and WC's are the same
size at the default tiles (16 KB each at 128 x 256 x 64), so either would save as much. The metadata is
copied with ``cp.async``, which cannot multicast: each block's warp 1 keeps copying the (same) words of
the pair's W rows into its own metadata ring. A stage is refilled only when the consumers of both blocks
are done with it: each consumer warp arrives on the empty barrier of both blocks (the peer's through its
shared::cluster address), and the metadata loaders wait on the same barriers. The kernel starts with a
cluster barrier after the barriers are initialized and ends with one (no block exits while its peer may
still write into its shared memory or arrive on its barriers). An odd count of m-tiles leaves a last
pair's second block past M: it loads no X, still loads and multicasts its half of WC, runs its
consumers on what it has and stores nothing; a half of WC starting past N is loaded by neither block
(no box lies wholly outside its tensor) and both expect only the bytes that come. The grid counts
pairs (2 blocks each); a persistent grid strides over pair tiles by the number of pairs launched. The
launch needs ``cuLaunchKernelEx`` with a cluster dimension of (2, 1, 1)
(``codegen.launch.KernelLaunch.cluster``).
Needs sm_90 and compiles for sm_90a.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import ClassVar

from codegen.launch import SP24_ARGS_NOTE, KernelLaunch, LaunchPlan, TensorMapArg, blocks_rule, packed_k
from codegen.problem import DType, Problem
from codegen.sparse24 import K_ALIGN, M16N8K32_ROWS, M64NNK32_ROWS, padded_k
from codegen.spec import DeviceLimits, SpecData, dtype_rules, field_rules, problem_rules, smem_rules, thread_rules

NAME = "hopper_sp24"
DTYPES = (DType.bf16, DType.fp16)
#: The structured sparsities of W this family computes (search.space.space_for; others compute none).
SPARSITIES = ("2:4",)
#: Place among the families that fit a problem, fastest first (search.fit): before sparse24, whose mma.sp
#: cannot feed Hopper's tensor cores (its best seed took 0.30 ms at 4096^3 bf16 on an H100, this family's 0.14).
RANK = 0
PREPASSES = ("none", "pack")
#: Dense k-columns per k-tile: 64 (X's rows one 128-byte swizzle span, WC's 32 kept columns one of 64
#: bytes) or 128 (X's rows two such spans, two TMA boxes; WC's 64 kept columns one 128-byte span).
BKS = (64, 128)
#: X's columns per TMA box: one 128-byte swizzle span of 16-bit elements.
X_BOX = 64
#: Where consumers take the metadata from: "ring" (copied into a ring beside the operands' by the
#: producer warpgroup's warp 1, cp.async, read from shared memory) or "global" (each consumer thread
#: loads its words from WE a k-tile ahead).
METAS = ("ring", "global")
#: Producer threads copying a stage's metadata (warp 1 of the producer warpgroup).
META_LOADERS = 32
#: How Yᵀ's accumulators reach Y: "direct" (element by element from registers) or "smem" (an m64 block at
#: a time through a shared tile per consumer, then Y's rows in 16-byte pieces).
EPILOGUES = ("direct", "smem")
#: Blocks per thread-block cluster along M, sharing WC's box by TMA multicast.
CLUSTERS = (1, 2)
#: Elements between rows of the epilogue's tile (64 and a 16-byte pad: conflict-free transposing stores).
EPI_PITCH = 72
WG = 128
PRODUCER_REGS = 40
CONSUMER_REGS = {1: 240, 2: 232}
#: A consumer thread's registers besides accumulators and metadata (addresses, loop state, the epilogue's).
CONSUMER_OVERHEAD = 56
PTX_TYPE = {DType.bf16: "bf16", DType.fp16: "f16"}
#: Metadata of a group that keeps positions 0 and 1, eight groups to a word: the fill past W.
META_FILL = 0x44444444
#: The arguments of the main kernel: X's and WC's tensor maps, WE and the workspace (the pack prepass).
ARGS = ("Y", "TX", "TWC", "B", "WS", "WE", "M", "N", "K")
PACK_ARGS = ("WS", "X", "M", "K")
PACK_THREADS = 256


@dataclass(frozen=True)
class Spec(SpecData):
    """One Hopper 2:4 GEMM variant; its generated ``name`` is its identity."""

    dtype: DType = DType.bf16
    bias: bool = False
    bm: int = field(default=128, metadata={"help": "block tile rows of X (wgmma N, a multiple of 16, at most 256)"})
    bn: int = field(default=256, metadata={"help": "block tile rows of W (a multiple of 64 per consumer)"})
    stages: int = field(default=4, metadata={"help": "TMA ring depth (2-8)"})
    consumers: int = field(default=2, metadata={"help": "consumer warpgroups (1 or 2), splitting W's rows"})
    group_m: int = field(default=8, metadata={"help": "block rows grouped for L2 reuse"})
    persistent: bool = field(default=False, metadata={"help": "one block per multiprocessor looping over tiles"})
    prepass: str = field(default="none", metadata={"choices": PREPASSES,
                                                   "help": "pack: copy X with rows padded to 16 bytes"})
    bk: int = field(default=64, metadata={"help": "dense k-columns per k-tile (64 or 128)"})
    meta: str = field(default="ring", metadata={"choices": METAS,
                                                "help": "ring: metadata copied into shared memory by the producer; "
                                                        "global: each consumer thread loads its words a k-tile ahead"})
    epilogue: str = field(default="direct", metadata={"choices": EPILOGUES,
                                                      "help": "direct: Y's elements stored from registers; smem: "
                                                              "through a shared tile, Y's rows in 16-byte pieces"})
    cluster: int = field(default=1, metadata={"help": "blocks per cluster along M sharing WC's box by TMA multicast "
                                                      "(1 or 2)"})

    family: ClassVar[str] = NAME
    block: ClassVar[int] = 0
    sparsity: ClassVar[str] = "2:4"

    @property
    def name(self) -> str:
        return (f"hsp24_{self.dtype.value}_{'bias' if self.bias else 'nobias'}_{self.bm}x{self.bn}x{self.bk}"
                f"_s{self.stages}_c{self.consumers}_g{self.group_m}{'_p' if self.persistent else ''}"
                f"{'_pk' if self.prepass == 'pack' else ''}{'_mg' if self.meta == 'global' else ''}"
                f"{'_es' if self.epilogue == 'smem' else ''}{f'_cl{self.cluster}' if self.cluster != 1 else ''}")

    _NAME = re.compile(r"hsp24_(?P<dtype>bf16|fp16)_(?P<bias>bias|nobias)_(?P<bm>\d+)x(?P<bn>\d+)x(?P<bk>\d+)"
                       r"_s(?P<stages>\d+)_c(?P<consumers>\d+)_g(?P<group_m>\d+)(?P<persistent>(_p)?)"
                       r"(?P<prepass>(_pk)?)(?P<meta>(_mg)?)(?P<epilogue>(_es)?)(?:_cl(?P<cluster>\d+))?")
    _MARKS = {"persistent": {"_p": True, "": False}, "prepass": {"_pk": "pack", "": "none"},
              "meta": {"_mg": "global", "": "ring"}, "epilogue": {"_es": "smem", "": "direct"}}

    # ---- derived geometry -----------------------------------------------------------------
    @property
    def threads(self) -> int:
        return WG * (1 + self.consumers)

    @property
    def wg_m(self) -> int:
        """Rows of W each consumer warpgroup owns."""
        return self.bn // self.consumers

    @property
    def frag_m(self) -> int:
        return self.wg_m // M64NNK32_ROWS

    @property
    def acc(self) -> int:
        """fp32 accumulators per thread per m64 block: wgmma's N (bm) / 2."""
        return self.bm // 2

    @property
    def k_steps(self) -> int:
        """wgmma.sp k-steps (32 dense columns each) per k-tile."""
        return self.bk // K_ALIGN

    @property
    def x_bytes(self) -> int:
        return self.bm * self.bk * self.dtype.itemsize

    @property
    def wc_bytes(self) -> int:
        return self.bn * (self.bk // 2) * self.dtype.itemsize

    @property
    def stage_bytes(self) -> int:
        """What TMA copies into a stage (its expected transaction bytes): X's boxes and WC's."""
        return self.x_bytes + self.wc_bytes

    @property
    def wc_slice_rows(self) -> int:
        """Rows of WC's box each block of a cluster loads and multicasts (all of it without a cluster)."""
        return self.bn // self.cluster

    @property
    def meta_bytes(self) -> int:
        """A stage of the metadata ring: WE's words of a k-tile for the tile's m16n8k32 blocks (0: none)."""
        return self.bn // M16N8K32_ROWS * self.k_steps * 16 * 4 if self.meta == "ring" else 0

    @property
    def epi_bytes(self) -> int:
        """A consumer's epilogue tile (0: none): an m64 block of Yᵀ as Y's [bm][64], rows EPI_PITCH apart."""
        return self.bm * EPI_PITCH * self.dtype.itemsize if self.epilogue == "smem" else 0

    @property
    def smem_bytes(self) -> int:
        """The operands' ring, the metadata ring, the epilogue's tiles, the mbarriers and the slack that
        aligns it all to 1024 bytes."""
        return (self.stages * (self.stage_bytes + self.meta_bytes) + self.consumers * self.epi_bytes + 16 * self.stages
                + 1024)

    @property
    def regs_estimate(self) -> int:
        """A consumer thread's registers: accumulators, two k-tiles' metadata words and the rest."""
        return self.frag_m * self.acc + 2 * self.frag_m * self.k_steps + CONSUMER_OVERHEAD

    # ---- validity ---------------------------------------------------------------------------
    def check(self, problem: Problem | None = None, limits: DeviceLimits | None = None) -> list[str]:
        """Why this point is invalid (empty when it is valid). Costs no compile."""
        limits = limits or DeviceLimits()
        why = field_rules(self, positive=("bm", "bn", "stages", "consumers", "group_m"),
                          choices=(("prepass", PREPASSES), ("bk", BKS), ("meta", METAS), ("epilogue", EPILOGUES),
                                   ("cluster", CLUSTERS)))
        why += dtype_rules(self, DTYPES, " (2:4 sparse tensor cores multiply 16-bit inputs)")
        if why:
            return why
        if limits.sm != 90:
            why.append(f"the {NAME} family needs sm_90 (wgmma.mma_async.sp and setmaxnreg are sm_90a instructions), "
                       f"not sm_{limits.sm}")
        if self.consumers not in (1, 2):
            why.append(f"consumers must be 1 or 2, got {self.consumers}")
        elif self.bn % (M64NNK32_ROWS * self.consumers):
            why.append(f"bn={self.bn}: each of the {self.consumers} consumer warpgroups takes whole m64 blocks of W")
        if self.bm % 16 or not 16 <= self.bm <= 256:
            why.append(f"bm={self.bm}: wgmma's N is a multiple of 16 from 16 to 256")
        if not 2 <= self.stages <= 8:
            why.append(f"stages must be 2 to 8, got {self.stages}")
        if self.bn > 256:
            why.append(f"bn={self.bn}: a TMA box has at most 256 rows")
        if why:
            return why
        budget = CONSUMER_REGS[self.consumers]
        if self.regs_estimate > budget:
            why.append(f"{self.frag_m * self.acc} accumulators per consumer thread (+{CONSUMER_OVERHEAD} and the "
                       f"metadata) > the {budget} registers a consumer gets: make bn/consumers x bm smaller")
        why += thread_rules(self, limits) + smem_rules(self, limits) + problem_rules(self, problem)
        if problem is not None and problem.k % 8 and self.prepass != "pack":
            why.append(f"K={problem.k} is not a multiple of 8: X's rows need the pack prepass (TMA's 16-byte pitch)")
        return why


def compile_target(arch: str) -> str:
    """NVRTC's -arch for this family on ``arch``: wgmma.sp and setmaxnreg need the arch-specific sm_90a."""
    return "sm_90a" if arch == "sm_90" else arch


def headers(spec: Spec) -> list[str]:
    return []


def template_values(spec: Spec) -> dict:
    """Every number the template uses, computed here once."""
    values = spec.to_dict()
    acc, t = spec.acc, PTX_TYPE[spec.dtype]
    it = spec.dtype.itemsize
    values.update(
        name=spec.name, threads=spec.threads, bk=spec.bk, wg_m=spec.wg_m, frag_m=spec.frag_m, acc=acc,
        k_steps=spec.k_steps, x_bytes=spec.x_bytes, wc_bytes=spec.wc_bytes, stage_bytes=spec.stage_bytes,
        x_boxes=spec.bk // X_BOX, x_box_bytes=spec.bm * X_BOX * it,
        meta_offset=spec.stages * spec.stage_bytes, meta_bytes=spec.meta_bytes, meta_loaders=META_LOADERS,
        epi_offset=spec.stages * (spec.stage_bytes + spec.meta_bytes), epi_bytes=spec.epi_bytes, epi_pitch=EPI_PITCH,
        bar_offset=spec.stages * (spec.stage_bytes + spec.meta_bytes) + spec.consumers * spec.epi_bytes,
        # one arrival per consumer warp of every block of the cluster (each releases a stage to all of them)
        empty_arrivals=4 * spec.consumers * spec.cluster,
        wc_slice_rows=spec.wc_slice_rows, wc_slice_bytes=spec.wc_slice_rows * (spec.bk // 2) * it,
        # the full barrier: the producer's arrival with the TMA bytes, and each metadata loader's (cp.async)
        full_arrivals=1 + (META_LOADERS if spec.meta == "ring" else 0),
        # X's boxes: rows of 128 bytes (128-byte swizzle, 8-row groups 1024 bytes apart), a k-step 64 bytes on;
        # WC's: rows of bk/2 elements, 64 bytes (64-byte swizzle, descriptor mode 2, 8-row groups 512 bytes
        # apart) or 128 (128-byte swizzle, mode 1, 1024), a k-step 32 bytes on.
        x_k_step_bytes=K_ALIGN * it, wc_k_step_bytes=K_ALIGN // 2 * it,
        wc_mode=2 if spec.bk == 64 else 1, wc_sbo=8 * (spec.bk // 2) * it,
        frag_wc_bytes=M64NNK32_ROWS * (spec.bk // 2) * it, wg_wc_bytes=spec.wg_m * (spec.bk // 2) * it,
        meta_rows=M16N8K32_ROWS, meta_fill=f"0x{META_FILL:08x}u", k_align=K_ALIGN,
        producer_regs=PRODUCER_REGS, consumer_regs=CONSUMER_REGS[spec.consumers], pack_threads=PACK_THREADS,
        wgmma_ptx=f"wgmma.mma_async.sp.sync.aligned.m64n{spec.bm}k32.f32.{t}.{t}",
        acc_operands=", ".join(f"%{i}" for i in range(acc)),
        acc_constraints=", ".join(f'"+f"(d[{i}])' for i in range(acc)),
    )
    return values


def _pack_bytes(problem: Problem) -> int:
    return problem.m * packed_k(8, problem.k) * 2


def _maps(spec: Spec, problem: Problem) -> tuple[TensorMapArg, TensorMapArg]:
    m, n, k, e = problem.m, problem.n, problem.k, spec.dtype.itemsize
    kp = padded_k(k)
    dt = spec.dtype.value
    if spec.prepass == "pack":
        tx = TensorMapArg("TX", "WS", dt, dims=(k, m), pitch=packed_k(8, k) * e, box=(X_BOX, spec.bm), swizzle=128)
    else:
        tx = TensorMapArg("TX", "X", dt, dims=(k, m), pitch=k * e, box=(X_BOX, spec.bm), swizzle=128)
    twc = TensorMapArg("TWC", "WC", dt, dims=(kp // 2, n), pitch=kp // 2 * e, box=(spec.bk // 2, spec.wc_slice_rows),
                       swizzle=spec.bk // 2 * e)
    return tx, twc


def plan(spec: Spec, problem: Problem) -> LaunchPlan:
    """With a cluster, the grid counts blocks in whole clusters: the m-tiles rounded up to pairs."""
    cl = spec.cluster
    tiles = -(-problem.m // (cl * spec.bm)) * cl * -(-problem.n // spec.bn)
    launches = []
    if spec.prepass == "pack":
        chunks = problem.m * (packed_k(8, problem.k) // 8)
        launches.append(KernelLaunch(symbol=f"{spec.name}_pack", grid=(-(-chunks // PACK_THREADS), 1, 1),
                                     block=(PACK_THREADS, 1, 1), smem=0, args=PACK_ARGS))
    launches.append(KernelLaunch(symbol=spec.name, grid=(tiles, 1, 1), block=(spec.threads, 1, 1),
                                 smem=spec.smem_bytes, args=ARGS, persistent=spec.persistent,
                                 cluster=(cl, 1, 1)))
    return LaunchPlan(launches=tuple(launches), workspace_bytes=_pack_bytes(problem) if spec.prepass == "pack" else 0,
                      tensor_maps=_maps(spec, problem))


def manifest_sparse(spec: Spec, problem: Problem) -> dict:
    """What an export manifest says of the 2:4 W's arguments for ``problem`` (its ``sparse``)."""
    kp = padded_k(problem.k)
    return {"format": "2:4", "density": problem.density,
            "arguments": SP24_ARGS_NOTE + "; the kernel reads WC through the tensor map TWC (its launch says how "
                                          "to encode it) and WE as a plain pointer",
            "operands": {"WC": {"shape": [problem.n, kp // 2], "element_type": "the element type"},
                         "WE": {"shape": [-(-problem.n // M16N8K32_ROWS), kp // K_ALIGN, 16], "element_type": "uint32"}},
            "made_by": "codegen.sparse24: compress(W) (or compress(W, mask24(W)) to prune), then metadata_m16n8k32"}


def grid_rule(spec: Spec) -> str:
    """How to launch this variant on any M, N, K, in words (export manifests carry it)."""
    blocks = blocks_rule(spec.bm, spec.bn, spec.cluster, spec.persistent)
    parts = []
    src = "X with dims (K, M), row pitch K*2 bytes (a multiple of 16)"
    if spec.prepass == "pack":
        parts.append(f"{spec.name}_pack: grid = (ceil(M*ceil(K/8)/{PACK_THREADS}), 1, 1), block = ({PACK_THREADS}, 1, 1); "
                     f"it writes X with rows padded to ceil(K/8)*8 elements (zeros) to WS")
        src = "WS with dims (K, M), row pitch ceil(K/8)*16 bytes"
    parts.append(f"{spec.name}: grid = ({blocks}, 1, 1), block = ({spec.threads}, 1, 1), dynamic shared memory "
                 f"{spec.smem_bytes} B; TX and TWC are 2-D tensor maps ({spec.dtype.value}, zero fill): TX over {src}, "
                 f"box ({X_BOX}, {spec.bm}), 128-byte swizzle; TWC over WC [N][KP/2] (KP = ceil(K/32)*32) with dims "
                 f"(KP/2, N), row pitch KP bytes, box ({spec.bk // 2}, {spec.wc_slice_rows}), {spec.bk}-byte swizzle; WE the uint32 "
                 f"metadata [ceil(N/16)][KP/32][16] (codegen.sparse24.metadata_m16n8k32), 16-byte aligned")
    if (cl := spec.cluster) > 1:
        parts.append(f"a thread-block cluster launch (cuLaunchKernelEx, CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION "
                     f"= ({cl}, 1, 1)): each cluster of {cl} consecutive blocks shares WC's tile by TMA multicast")
    return "; ".join(parts)
