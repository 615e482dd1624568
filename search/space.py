"""The parameter space of each kernel family, defined once and used by every sampler.

Each dimension is an ordered list of choices; samplers pick an index (so TPE, CMA-ES and GP
see an ordinal axis, and the grid sampler enumerates indices). A restricted space is the same
definition with fewer choices per dimension; it serializes to plain data (replay files carry it).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from codegen.problem import DType, Problem
from codegen.spec import SimtSpec


@dataclass(frozen=True)
class Space:
    family: str
    dims: dict[str, tuple] = field(hash=False)

    def to_dict(self) -> dict:
        return {"family": self.family, "dims": {k: list(v) for k, v in self.dims.items()}}

    @classmethod
    def from_dict(cls, d: dict) -> Space:
        return cls(d["family"], {k: tuple(v) for k, v in d["dims"].items()})

    def restrict(self, **choices) -> Space:
        """The same space with some dimensions narrowed (each value must be a choice already)."""
        dims = dict(self.dims)
        for name, values in choices.items():
            values = tuple(values)
            if name not in dims or not set(values) <= set(dims[name]):
                raise ValueError(f"{name}={values} is not a narrowing of {dims.get(name)}")
            dims[name] = values
        return Space(self.family, dims)

    @property
    def size(self) -> int:
        n = 1
        for v in self.dims.values():
            n *= len(v)
        return n

    def points(self):
        """Every combination, as {dim: value} (for sweeps and the grid sampler)."""
        names = list(self.dims)
        for combo in itertools.product(*(self.dims[n] for n in names)):
            yield dict(zip(names, combo, strict=True))

    def spec(self, point: dict, problem: Problem) -> SimtSpec:
        return to_spec(self.family, point, problem)

    def indices(self, point: dict) -> dict[str, int] | None:
        """The sampler's view of a point (choice indices), or None if a value is not a choice."""
        try:
            return {k: self.dims[k].index(point[k]) for k in self.dims}
        except (KeyError, ValueError):
            return None


def simt_space(dtype: DType = DType.fp32) -> Space:
    """Everything the SIMT template can express that is worth trying."""
    return Space(
        "simt",
        {
            "bm": (1, 2, 4, 8, 16, 32, 64, 128, 256),
            "bn": (32, 64, 128, 256),
            "bk": (8, 16, 32, 64, 128),
            "tm": (1, 2, 4, 8),
            "tn": (1, 2, 4, 8),
            "lanes_m": (1, 2, 4, 8, 16, 32),  # lanes along m in a warp; 32 / lanes_m along n
            "pad": (0, 4, 8),
            "vec": (1, 2, 4) if dtype is DType.fp32 else (1, 2, 4, 8),
            "stages": (1, 2, 3, 4),
            "copy": ("reg", "async"),
            "group_m": (1, 4, 8),
            "split_k": (1, 2, 4, 8, 16, 32),
            "reduce": ("atomic", "two_pass"),
        },
    )


SPACES = {"simt": simt_space}

#: Narrowings small enough to sweep exhaustively on a GPU in minutes (replay recordings use them).
RESTRICTED = {
    "simt": dict(
        bm=(64, 128, 256), bn=(64, 128), bk=(8, 16, 32), tm=(4, 8), tn=(4, 8), lanes_m=(2, 4, 8),
        pad=(0, 4), vec=(4,), stages=(2,), copy=("reg",), group_m=(1, 8), split_k=(1,), reduce=("atomic",),
    ),
}


def space_for(family: str, dtype: DType, restricted: bool = False) -> Space:
    if family not in SPACES:
        raise ValueError(f"unknown family {family!r}; known: {', '.join(SPACES)}")
    space = SPACES[family](dtype)
    return space.restrict(**RESTRICTED[family]) if restricted else space


def to_spec(family: str, point: dict, problem: Problem) -> SimtSpec:
    """Map a point of the space onto a spec for the problem (may be an invalid spec)."""
    if family != "simt":
        raise ValueError(f"unknown family {family!r}")
    p = dict(point)
    lanes_m = p.pop("lanes_m")
    split_k = p["split_k"]
    p["reduce"] = p["reduce"] if split_k > 1 else "none"
    return SimtSpec(
        dtype=problem.dtype,
        bias=problem.bias,
        wm=lanes_m * p["tm"],
        wn=(32 // lanes_m) * p["tn"],
        **p,
    )


def point_of(spec: SimtSpec) -> dict:
    """The point of the SIMT space that maps onto ``spec`` (inverse of to_spec)."""
    d = spec.to_dict()
    point = {k: d[k] for k in ("bm", "bn", "bk", "tm", "tn", "pad", "vec", "stages", "copy", "group_m", "split_k")}
    point["lanes_m"] = spec.wm // spec.tm
    point["reduce"] = spec.reduce if spec.split_k > 1 else "atomic"
    return point
