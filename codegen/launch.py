"""Launch geometry: how a rendered variant is run on a problem, derived in Python.

A plan is plain data (it crosses process boundaries and goes into export manifests): an optional
float32 workspace, whether Y is zeroed first, and the kernels to launch in order with their
arguments named from ``ARG_TYPES``. Each family makes its own plan (``codegen.families``); what
they share, the second pass of a two-pass split-K, is spelled here once.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from codegen.problem import Problem

if TYPE_CHECKING:
    from codegen.spec import KernelSpec

__all__ = [
    "ARG_TYPES", "BSR_ARGS", "MAIN_ARGS", "SPARSE_ARGS", "REDUCE_ARGS", "REDUCE_THREADS", "KernelLaunch", "LaunchPlan", "grid_rule", "plan",
    "reduce_launch", "reduce_rule", "reduce_symbol", "workspace_bytes",
]  # fmt: skip

#: Every kernel argument gemmscape passes, by name, with its C type (T is the element type).
ARG_TYPES = {
    "Y": "T*",
    "X": "const T*",
    "W": "const T*",
    "B": "const T*",
    "WS": "float*",
    "RP": "const int*",
    "CI": "const int*",
    "M": "int",
    "N": "int",
    "K": "int",
}
MAIN_ARGS = ("Y", "X", "W", "B", "WS", "M", "N", "K")
#: The main kernel's arguments when W is block-sparse: its BSR index arrays after WS.
SPARSE_ARGS = ("Y", "X", "W", "B", "WS", "RP", "CI", "M", "N", "K")
#: What a block-sparse kernel's W, RP and CI hold, for export manifests.
BSR_ARGS = ("W holds the kept blocks of W[N,K] in BSR order, [nnzb][{block}][{block}] row-major, 16-byte aligned, "
            "blocks past N or K zero-padded; RP[ceil(N/{block})+1] (int32) indexes CI per block row; "
            "CI[nnzb] (int32) the block columns kept, ascending in each row")
REDUCE_ARGS = ("Y", "B", "WS", "M", "N")
REDUCE_THREADS = 256


@dataclass(frozen=True)
class KernelLaunch:
    symbol: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    smem: int
    args: tuple[str, ...]


@dataclass(frozen=True)
class LaunchPlan:
    launches: tuple[KernelLaunch, ...]
    workspace_bytes: int = 0
    zero_output: bool = False

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
            )
            for x in d["launches"]
        )
        return cls(launches=launches, workspace_bytes=d["workspace_bytes"], zero_output=d["zero_output"])


# ---- the two-pass split-K reduce (templates/common.cuh.j2, reduce_kernel) ----------------------------
def reduce_symbol(name: str) -> str:
    """Symbol of the reduce kernel that goes with the main kernel ``name``."""
    return name + "_reduce"


def workspace_bytes(split_k: int, problem: Problem) -> int:
    """The float32 workspace of a two-pass split-K: one M×N partial sum per split."""
    return 4 * split_k * problem.m * problem.n


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
        args=REDUCE_ARGS,
    )


def reduce_rule(spec_name: str, split_k: int) -> str:
    """The reduce launch and its workspace for any M, N, in words."""
    return (f"{reduce_symbol(spec_name)}: grid = (ceil(M*N/{REDUCE_THREADS}), 1, 1), block = ({REDUCE_THREADS}, 1, 1)"
            f"; workspace WS = 4*{split_k}*M*N bytes")


# ---- dispatch ----------------------------------------------------------------------------------------
def plan(spec: KernelSpec, problem: Problem) -> LaunchPlan:
    """The launches of ``spec`` on ``problem``, as its family plans them."""
    from codegen.families import family_of

    return family_of(spec).plan(spec, problem)


def grid_rule(spec: KernelSpec) -> str:
    """How to launch ``spec`` on any M, N, K, in words, as its family says."""
    from codegen.families import family_of

    return family_of(spec).grid_rule(spec)
