"""Launch geometry: how a rendered variant is run on a problem, derived in Python.

A plan is plain data (it crosses process boundaries and goes into export manifests): an optional
float32 workspace, an optional array of int32 counters that must be zero before the first launch
and that every launch leaves zero again, whether Y is zeroed first, the tensor maps the runtime
encodes for the problem, and the kernels to launch in order with their arguments named from
``ARG_TYPES`` or after one of the plan's tensor maps. Each family makes its own plan (``codegen.families``); what they share,
the second pass of a two-pass split-K and the pack prepass, is spelled here once.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from codegen.problem import Layout, Problem

if TYPE_CHECKING:
    from codegen.spec import KernelSpec

__all__ = [
    "ARG_TYPES", "BSR_ARGS", "SP24_ARGS", "SP24_ARGS_NOTE", "COUNTER_ARG", "BSR_GI_ARGS", "BSR_GW_ARGS", "bsr_args", "sampled_blocks", "DB_ARGS", "DB_COLS", "DB_ROWS", "LAYOUT_SLOTS", "MAIN_ARGS", "SPARSE_ARGS", "REDUCE_ARGS", "REDUCE_THREADS", "PACK_ARGS", "PACK_THREADS",
    "TENSOR_MAP_TYPE", "KernelLaunch", "LaunchPlan", "TensorMapArg", "db_launch", "db_rule", "grid_rule", "launched_grid",
    "layout_args",
    "pack_launch", "pack_rule", "pack_symbol",
    "packed_k", "plan", "reduce_launch", "reduce_rule", "reduce_symbol", "workspace_bytes",
]  # fmt: skip

#: Every kernel argument gemmscape passes, by name, with its C type (T is the element type).
ARG_TYPES = {
    "Y": "T*",
    "X": "const T*",
    "W": "const T*",
    "B": "const T*",
    "WS": "float*",
    "CT": "int*",
    "RP": "const int*",
    "CI": "const int*",
    "M": "int",
    "N": "int",
    "K": "int",
    "DX": "T*",
    "DW": "T*",
    "DB": "T*",
    "DY": "const T*",
    "WT": "const T*",
    "BI": "const int*",
    "WC": "const T*",
    "WE": "const unsigned*",
}
MAIN_ARGS = ("Y", "X", "W", "B", "WS", "M", "N", "K")
#: A split-K whose last split sums the tile takes its tile counters (CT) after the workspace.
COUNTER_ARG = "CT"
#: The arrays each layout's GEMM kernel takes in its output, left and right operand slots (the
#: kernel's Y, X and W parameters): dX[M,N] = dY[M,K]·W[K,N] and dW[M,N] = dY[K,M]ᵀ·X[K,N] in the
#: problem's M, N, K (codegen.problem.Layout). B is the forward bias (null in the backward GEMMs).
LAYOUT_SLOTS = {Layout.forward: ("Y", "X", "W"), Layout.grad_input: ("DX", "DY", "W"),
                Layout.grad_weight: ("DW", "DY", "X")}
#: The bias gradient kernel of grad_weight: DB[M] = sum over the K rows of DY[K][M].
DB_ARGS = ("DB", "DY", "M", "K")
DB_COLS, DB_ROWS = 32, 16  # columns per block, threads summing each column
#: The main kernel's arguments when W is block-sparse: its BSR index arrays after WS.
SPARSE_ARGS = ("Y", "X", "W", "B", "WS", "RP", "CI", "M", "N", "K")
#: What a block-sparse grad_input kernel's WT, RP and CI hold: the layer's W [out, in] = [K, N] is
#: block-sparse on the problem's pattern; the kernel reads Wᵀ [N, K] in BSR (each kept block transposed).
BSR_GI_ARGS = ("WT holds the kept blocks of Wᵀ[N,K] (W[K,N] is the layer's weight, out x in) in BSR order, "
               "[nnzb][{block}][{block}] row-major (each of W's kept blocks transposed), 16-byte aligned, blocks past "
               "N or K zero-padded; RP[ceil(N/{block})+1] (int32) indexes CI per block row of Wᵀ; CI[nnzb] (int32) "
               "its block columns kept, ascending in each row")
#: The same when the kernel reads W's own kept blocks in place (transposed as it multiplies), with BI.
BSR_GI_IN_PLACE_ARGS = ("W holds the kept blocks of the layer's weight W[K,N] (out x in) in its own BSR order, "
                        "[nnzb][{block}][{block}] row-major, 16-byte aligned, blocks past N or K zero-padded; RP"
                        "[ceil(N/{block})+1] (int32) indexes CI per block row of Wᵀ[N,K]; CI[nnzb] (int32) Wᵀ's block "
                        "columns kept, ascending in each row; BI[nnzb] (int32) the index in W of each of Wᵀ's kept "
                        "blocks, in Wᵀ's BSR order")
#: What a weight gradient sampled at a block-sparse W writes to DW and reads from RP and CI: W [out, in]
#: = [M, N] is block-sparse on the problem's pattern, and dW is computed at its kept blocks only.
BSR_GW_ARGS = ("DW receives dW at the kept blocks of W[M,N] only, as W's BSR values [nnzb][{block}][{block}] "
               "row-major in the order of CI (zeros past M or N; nothing else is written); RP[ceil(M/{block})+1] "
               "(int32) indexes CI per block row of W; CI[nnzb] (int32) its block columns kept, ascending in each row")
#: What a block-sparse kernel's W, RP and CI hold, for export manifests.
BSR_ARGS = ("W holds the kept blocks of W[N,K] in BSR order, [nnzb][{block}][{block}] row-major, 16-byte aligned, "
            "blocks past N or K zero-padded; RP[ceil(N/{block})+1] (int32) indexes CI per block row; "
            "CI[nnzb] (int32) the block columns kept, ascending in each row")
#: The main kernel's arguments when W is 2:4 sparse: its kept halves WC in W's slot, their metadata WE
#: after WS (codegen.sparse24).
SP24_ARGS = ("Y", "X", "WC", "B", "WS", "WE", "M", "N", "K")
#: What a 2:4 kernel's WC and WE hold, for export manifests (codegen.sparse24.compress, metadata_m16n8k32).
SP24_ARGS_NOTE = (
    "W[N,K] is 2:4 sparse along K (at most two non-zeros in each group of four columns 4j..4j+3; K padded with "
    "zeros to KP = ceil(K/32)*32). WC[N][KP/2] holds each group's two kept values in order of K (a group with "
    "fewer non-zeros keeps zeros at its lowest other positions), row-major, 16-byte aligned. WE[ceil(N/16)][KP/32]"
    "[16] (uint32) holds their positions as mma.sp.sync m16n8k32 reads them with sparsity selector 0: word "
    "[b][s][2g+h] covers rows 16b+g (bits 15..0) and 16b+g+8 (bits 31..16), columns 32s+16h..32s+16h+15, four "
    "bits per group of four (group q of the 16 columns in bits 4q+3..4q: first kept position in the low two bits, "
    "second in the high two, ascending); rows past N are coded 0b0100 (positions 0 and 1)")
REDUCE_ARGS = ("Y", "B", "WS", "M", "N")
REDUCE_THREADS = 256
#: The pack prepass's arguments (templates/common.cuh.j2, pack_kernel).
PACK_ARGS = ("WS", "X", "W", "M", "N", "K")
PACK_THREADS = 256
#: C type of a tensor-map argument: the driver's 128-byte CUtensorMap, passed by value.
TENSOR_MAP_TYPE = "const __grid_constant__ CUtensorMap"
#: Operands a tensor map may view (pointer arguments of ARG_TYPES).
TENSOR_MAP_OPERANDS = ("X", "W", "DY", "WS", "WC")
#: The driver's names for a tensor map's element type (by gemmscape dtype) and swizzle (by bytes).
TENSOR_MAP_DTYPES = {"bf16": "CU_TENSOR_MAP_DATA_TYPE_BFLOAT16", "fp16": "CU_TENSOR_MAP_DATA_TYPE_FLOAT16",
                     "fp32": "CU_TENSOR_MAP_DATA_TYPE_FLOAT32", "tf32": "CU_TENSOR_MAP_DATA_TYPE_FLOAT32"}
TENSOR_MAP_SWIZZLES = {0: "CU_TENSOR_MAP_SWIZZLE_NONE", 32: "CU_TENSOR_MAP_SWIZZLE_32B",
                       64: "CU_TENSOR_MAP_SWIZZLE_64B", 128: "CU_TENSOR_MAP_SWIZZLE_128B"}


@dataclass(frozen=True)
class TensorMapArg:
    """A kernel argument that is a 2-D tiled tensor map (CUtensorMap, 128 bytes by value), encoded
    by the runtime for one problem (cuTensorMapEncodeTiled): rows of ``dims[0]`` elements of the
    problem's element type ``dtype``, ``dims[1]`` rows ``pitch`` bytes apart, starting ``offset``
    bytes into the operand ``operand``; copied ``box`` = (elements, rows) at a time into shared
    memory with a ``swizzle``-byte swizzle (0: none); elements outside ``dims`` read as zeros."""

    name: str
    operand: str
    dtype: str
    dims: tuple[int, int]
    pitch: int
    box: tuple[int, int]
    swizzle: int = 128
    offset: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "dims", tuple(self.dims))
        object.__setattr__(self, "box", tuple(self.box))

    def problems(self) -> list[str]:
        """Why the driver would refuse to encode this map (empty: it is encodable)."""
        from codegen.problem import DType

        why = []
        if self.operand not in TENSOR_MAP_OPERANDS:
            why.append(f"tensor map {self.name}: operand {self.operand!r} is not one of {TENSOR_MAP_OPERANDS}")
        item = DType(self.dtype).itemsize
        if self.pitch % 16 or self.offset % 16:
            why.append(f"tensor map {self.name}: row pitch {self.pitch} B and offset {self.offset} B must be multiples "
                       f"of 16 (rows of {self.dims[0]} {self.dtype} elements)")
        if self.pitch < self.dims[0] * item:
            why.append(f"tensor map {self.name}: pitch {self.pitch} B is shorter than a row ({self.dims[0]} elements)")
        if not all(1 <= b <= 256 for b in self.box) or self.box[0] * item % 16:
            why.append(f"tensor map {self.name}: box {self.box} must be 1..256 per side, its rows multiples of 16 bytes")
        if self.swizzle not in TENSOR_MAP_SWIZZLES:
            why.append(f"tensor map {self.name}: swizzle {self.swizzle} is not one of {tuple(TENSOR_MAP_SWIZZLES)}")
        elif self.swizzle and self.box[0] * item > self.swizzle:
            why.append(f"tensor map {self.name}: a box row of {self.box[0] * item} B exceeds the {self.swizzle}-byte swizzle")
        if not all(1 <= d < 2**32 for d in self.dims):
            why.append(f"tensor map {self.name}: dims {self.dims} must be 1 to 2^32 - 1")
        return why

    def encoding(self) -> dict:
        """How to encode this map: the arguments of the driver's cuTensorMapEncodeTiled by name (enums
        as the driver spells them), the global address being the operand's plus ``offset_bytes``.
        The runtime encodes from this; an export manifest carries it."""
        return {
            "encode": "cuTensorMapEncodeTiled", "operand": self.operand, "offset_bytes": self.offset,
            "data_type": TENSOR_MAP_DTYPES[self.dtype], "rank": 2, "global_dim": list(self.dims),
            "global_strides_bytes": [self.pitch], "box_dim": list(self.box), "element_strides": [1, 1],
            "interleave": "CU_TENSOR_MAP_INTERLEAVE_NONE", "swizzle": TENSOR_MAP_SWIZZLES[self.swizzle],
            "l2_promotion": "CU_TENSOR_MAP_L2_PROMOTION_L2_256B", "oob_fill": "CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE",
        }


@dataclass(frozen=True)
class KernelLaunch:
    """One kernel launch. ``persistent``: ``grid[0]`` counts work tiles, and the launcher starts
    min(grid[0], p x multiprocessor count) blocks (rounded down to whole clusters), which loop over
    the tiles; p is 1 for True, else the blocks per multiprocessor it gives (2: two share one). ``cluster``: the thread-block cluster shape; other than (1, 1, 1) the launcher uses
    cuLaunchKernelEx with a cluster dimension (the grid, in blocks, is a multiple of it)."""

    symbol: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    smem: int
    args: tuple[str, ...]
    persistent: bool | int = False
    cluster: tuple[int, int, int] = (1, 1, 1)

    def __post_init__(self) -> None:
        object.__setattr__(self, "cluster", tuple(self.cluster))

    def grid_on(self, sms: int) -> tuple[int, int, int]:
        """The grid to launch on a device of ``sms`` multiprocessors."""
        return launched_grid(self.grid, self.persistent, self.cluster, sms)


def launched_grid(grid, persistent: bool | int, cluster, sms: int) -> tuple[int, int, int]:
    """The grid a launcher starts: ``grid`` itself, or for a persistent kernel at most ``persistent``
    blocks per multiprocessor (True: one), in whole clusters along x (at least one cluster)."""
    if not persistent:
        return tuple(grid)
    cl = cluster[0]
    return (max(cl, min(grid[0], sms * int(persistent)) // cl * cl), *grid[1:])


def blocks_rule(bm: int, bn: int, cluster: int, persistent: bool, ctas: int = 1) -> str:
    """A tiled kernel's grid along x in words (export manifests): its tiles of bm x bn over M x N, the
    m-tiles rounded up to whole clusters; a persistent kernel at most ``ctas`` blocks per multiprocessor,
    in whole clusters (``launched_grid``)."""
    if cluster > 1:
        tiles = f"ceil(M/{cluster * bm})*{cluster} * ceil(N/{bn})"
        return (f"min({tiles}, multiprocessor count) rounded down to a multiple of {cluster}" if persistent
                else tiles)
    tiles = f"ceil(M/{bm}) * ceil(N/{bn})"
    per_sm = f"{ctas} x " if ctas > 1 else ""
    return f"min({tiles}, {per_sm}multiprocessor count)" if persistent else tiles


def _persistent(value) -> bool | int:
    """``KernelLaunch.persistent`` read back from a dict: a flag, or the blocks per multiprocessor."""
    return value if isinstance(value, bool) else int(value)


@dataclass(frozen=True)
class LaunchPlan:
    """The launches in order; ``workspace_bytes`` of float32 scratch (WS, any contents at launch);
    ``counters``: int32s in CT that must be zero before the first launch and that the plan leaves
    zero (kept by the caller between launches, so not shared by two launches in flight at once);
    ``zero_output``: Y is zeroed before the launches; the tensor maps the runtime encodes."""

    launches: tuple[KernelLaunch, ...]
    workspace_bytes: int = 0
    zero_output: bool = False
    tensor_maps: tuple[TensorMapArg, ...] = ()
    counters: int = 0

    def tensor_map(self, name: str) -> TensorMapArg | None:
        """The plan's tensor map called ``name`` (an argument name), if it has one."""
        return next((t for t in self.tensor_maps if t.name == name), None)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> LaunchPlan:
        launches = tuple(
            KernelLaunch(
                symbol=x["symbol"],
                grid=tuple(x["grid"]),
                block=tuple(x["block"]),
                smem=x["smem"],
                args=tuple(x["args"]),
                persistent=_persistent(x.get("persistent", False)),
                cluster=tuple(x.get("cluster", (1, 1, 1))),
            )
            for x in d["launches"]
        )
        maps = tuple(TensorMapArg(**t) for t in d.get("tensor_maps", ()))
        return cls(launches=launches, workspace_bytes=d["workspace_bytes"], zero_output=d["zero_output"],
                   tensor_maps=maps, counters=d.get("counters", 0))


# ---- the two-pass split-K reduce (templates/common.cuh.j2, reduce_kernel) ----------------------------
def reduce_symbol(name: str) -> str:
    """Symbol of the reduce kernel that goes with the main kernel ``name``."""
    return name + "_reduce"


def workspace_bytes(split_k: int, problem: Problem) -> int:
    """The float32 workspace of a two-pass split-K: one M×N partial sum per split."""
    return 4 * split_k * problem.m * problem.n


def layout_args(args: tuple[str, ...], layout: Layout, sparse: bool = False) -> tuple[str, ...]:
    """A forward argument list (MAIN_ARGS, REDUCE_ARGS, ...) with the Y, X and W slots naming the
    arrays of ``layout`` (LAYOUT_SLOTS; a block-sparse grad_input reads WT, Wᵀ in BSR)."""
    slots = ("DX", "DY", "WT") if sparse and layout is Layout.grad_input else LAYOUT_SLOTS[layout]
    rename = dict(zip(LAYOUT_SLOTS[Layout.forward], slots, strict=True))
    return tuple(rename.get(a, a) for a in args)


def bsr_args(layout: Layout, block: int, in_place: bool = False) -> str:
    """What a block-sparse kernel's BSR arguments hold in ``layout`` (BSR_ARGS, BSR_GI_ARGS, BSR_GW_ARGS; a
    grad_input kernel that reads W's blocks ``in_place``: BSR_GI_IN_PLACE_ARGS)."""
    if layout is Layout.grad_input and in_place:
        return BSR_GI_IN_PLACE_ARGS.format(block=block)
    return {Layout.forward: BSR_ARGS, Layout.grad_input: BSR_GI_ARGS, Layout.grad_weight: BSR_GW_ARGS}[layout].format(
        block=block)


def sampled_blocks(problem: Problem, bm: int, bn: int) -> int:
    """The grid of a weight gradient sampled at a block-sparse W: one thread block per ``bm x bn``
    tile of each kept block (at least one block's tiles when none is kept: they return at once)."""
    return max(1, problem.nnzb) * (problem.block // bm) * (problem.block // bn)


def db_launch(spec_name: str, problem: Problem) -> KernelLaunch:
    """The bias gradient of a grad_weight problem with bias: DB_ROWS threads per column of dY."""
    return KernelLaunch(symbol=spec_name + "_db", grid=(-(-problem.m // DB_COLS), 1, 1),
                        block=(DB_COLS * DB_ROWS, 1, 1), smem=0, args=DB_ARGS)


def db_rule(spec_name: str) -> str:
    """The db launch for any M, K, in words."""
    return (f"{spec_name}_db(DB, DY, M, K): grid = (ceil(M/{DB_COLS}), 1, 1), block = ({DB_COLS * DB_ROWS}, 1, 1); "
            f"DB[M] = sum over the K rows of DY[K][M]")


def reduce_launch(spec_name: str, split_k: int, problem: Problem) -> KernelLaunch:
    """Second pass: Y = sum of the ``split_k`` partial sums in WS (+ B), one thread per output."""
    if split_k < 2:
        raise ValueError(f"a two-pass reduce needs split_k >= 2, got {split_k}")
    total = problem.m * problem.n
    return KernelLaunch(
        symbol=reduce_symbol(spec_name),
        grid=(-(-total // REDUCE_THREADS), 1, 1),
        block=(REDUCE_THREADS, 1, 1),
        smem=0,
        args=layout_args(REDUCE_ARGS, problem.layout),
    )


def reduce_rule(spec_name: str, split_k: int) -> str:
    """The reduce launch and its workspace for any M, N, in words."""
    return (f"{reduce_symbol(spec_name)}: grid = (ceil(M*N/{REDUCE_THREADS}), 1, 1), block = ({REDUCE_THREADS}, 1, 1)"
            f"; workspace WS = 4*{split_k}*M*N bytes")


# ---- the pack prepass (templates/common.cuh.j2, pack_kernel) -------------------------------------------
def pack_symbol(spec_name: str) -> str:
    """Symbol of the pack prepass that goes with the main kernel ``spec_name``."""
    return spec_name + "_pack"


def packed_k(chunk_elems: int, k: int) -> int:
    """Row pitch of the packed copies, in elements: K rounded up to whole 16-byte chunks."""
    return -(-k // chunk_elems) * chunk_elems


def pack_launch(spec_name: str, chunk_elems: int, problem: Problem) -> KernelLaunch:
    """X then W copied into the workspace (at the kernel's own offset) with rows padded to 16 bytes."""
    chunks = (problem.m + problem.n) * (packed_k(chunk_elems, problem.k) // chunk_elems)
    return KernelLaunch(symbol=pack_symbol(spec_name), grid=(-(-chunks // PACK_THREADS), 1, 1),
                        block=(PACK_THREADS, 1, 1), smem=0, args=PACK_ARGS)


def pack_rule(spec_name: str, chunk_elems: int, elem: int, offset: str) -> str:
    """The pack launch for any M, N, K, in words."""
    ce = chunk_elems
    return (f"{pack_symbol(spec_name)}: KP = ceil(K/{ce})*{ce}; grid = (ceil((M+N)*KP/{ce}/{PACK_THREADS}), 1, 1), "
            f"block = ({PACK_THREADS}, 1, 1); it writes zero-padded copies of X and W to WS at byte {offset}, "
            f"(M+N)*KP*{elem} bytes")


# ---- dispatch ----------------------------------------------------------------------------------------
def plan(spec: KernelSpec, problem: Problem) -> LaunchPlan:
    """The launches of ``spec`` on ``problem``, as its family plans them."""
    from codegen.families import family_of

    return family_of(spec).plan(spec, problem)


def grid_rule(spec: KernelSpec) -> str:
    """How to launch ``spec`` on any M, N, K, in words, as its family says."""
    from codegen.families import family_of

    return family_of(spec).grid_rule(spec)
