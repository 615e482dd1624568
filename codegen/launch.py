"""Launch geometry: how a rendered variant is run on a problem, derived in Python.

A plan is plain data (it crosses process boundaries and goes into export manifests): an optional
float32 workspace, whether Y is zeroed first, and the kernels to launch in order with their
arguments named from ``ARGS``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from codegen.problem import Problem
from codegen.spec import SimtSpec

#: Every kernel argument gemmscape passes, by name, with its C type (T is the element type).
ARG_TYPES = {
    "Y": "T*",
    "X": "const T*",
    "W": "const T*",
    "B": "const T*",
    "WS": "float*",
    "M": "int",
    "N": "int",
    "K": "int",
}
MAIN_ARGS = ("Y", "X", "W", "B", "WS", "M", "N", "K")
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


def reduce_symbol(spec: SimtSpec) -> str:
    return spec.name + "_reduce"


def plan(spec: SimtSpec, problem: Problem) -> LaunchPlan:
    grid_m = -(-problem.m // spec.bm)
    grid_n = -(-problem.n // spec.bn)
    main = KernelLaunch(
        symbol=spec.name,
        grid=(grid_m * grid_n, spec.split_k, 1),
        block=(spec.threads, 1, 1),
        smem=spec.smem_bytes,
        args=MAIN_ARGS,
    )
    if spec.reduce != "two_pass":
        return LaunchPlan(launches=(main,), zero_output=spec.reduce == "atomic")
    total = problem.m * problem.n
    reduce = KernelLaunch(
        symbol=reduce_symbol(spec),
        grid=(-(-total // REDUCE_THREADS), 1, 1),
        block=(REDUCE_THREADS, 1, 1),
        smem=0,
        args=REDUCE_ARGS,
    )
    return LaunchPlan(launches=(main, reduce), workspace_bytes=4 * spec.split_k * total)


def grid_rule(spec: SimtSpec) -> str:
    """How to launch this variant on any M, N, K, in words (export manifests carry it)."""
    rule = f"{spec.name}: grid = (ceil(M/{spec.bm}) * ceil(N/{spec.bn}), {spec.split_k}, 1), block = ({spec.threads}, 1, 1)"
    if spec.reduce == "two_pass":
        rule += (f"; then {reduce_symbol(spec)}: grid = (ceil(M*N/{REDUCE_THREADS}), 1, 1), block = ({REDUCE_THREADS}, 1, 1)"
                 f"; workspace WS = 4*{spec.split_k}*M*N bytes")
    if spec.reduce == "atomic":
        rule += "; Y must be zeroed before the launch (split-K partial sums are added atomically)"
    return rule
