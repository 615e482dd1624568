"""A kernel family that exists only in tests: the registry, the CLI and the search must pick it up
without any of them naming it (it is put on codegen.families' path by the ``toy_family`` fixture)."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field, fields

from codegen.launch import MAIN_ARGS, KernelLaunch, LaunchPlan
from codegen.problem import DType, Problem
from codegen.spec import DeviceLimits

NAME = "toy"


@dataclass(frozen=True)
class Spec:
    dtype: DType = DType.fp32
    bias: bool = False
    tile: int = field(default=64, metadata={"help": "output tile side"})
    mode: str = field(default="plain", metadata={"choices": ("plain", "fancy"), "help": "how it computes"})
    swizzle: bool = field(default=False, metadata={"help": "swizzled blocks"})

    family = NAME

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", DType(self.dtype))

    @property
    def name(self) -> str:
        return (f"toy_{self.dtype.value}_{'bias' if self.bias else 'nobias'}_t{self.tile}_{self.mode}"
                f"{'_s' if self.swizzle else ''}")

    @classmethod
    def from_name(cls, name: str) -> Spec:
        m = re.fullmatch(r"toy_(fp32|fp16|bf16)_(bias|nobias)_t(\d+)_(plain|fancy)(_s)?", name)
        if not m:
            raise ValueError(f"not a toy kernel name: {name!r}")
        return cls(DType(m[1]), m[2] == "bias", int(m[3]), m[4], bool(m[5]))

    def to_dict(self) -> dict:
        d = asdict(self)
        d["dtype"] = self.dtype.value
        d["family"] = NAME
        return d

    @classmethod
    def from_dict(cls, d: dict) -> Spec:
        if d.get("family", NAME) != NAME:
            raise ValueError(f"a {d['family']!r} spec is not a {NAME!r} spec")
        return cls(**{f.name: d[f.name] for f in fields(cls) if f.name in d})

    @property
    def threads(self) -> int:
        return 128

    @property
    def smem_bytes(self) -> int:
        return 0

    def check(self, problem: Problem | None = None, limits: DeviceLimits | None = None) -> list[str]:
        return [] if self.tile >= 1 else ["tile must be >= 1"]


def template_values(spec: Spec) -> dict:
    return spec.to_dict()


def plan(spec: Spec, problem: Problem) -> LaunchPlan:
    grid = -(-problem.m // spec.tile) * -(-problem.n // spec.tile)
    return LaunchPlan(launches=(KernelLaunch(spec.name, (grid, 1, 1), (spec.threads, 1, 1), 0, MAIN_ARGS),))


def grid_rule(spec: Spec) -> str:
    return f"{spec.name}: grid = (ceil(M/{spec.tile}) * ceil(N/{spec.tile}), 1, 1), block = (128, 1, 1)"
