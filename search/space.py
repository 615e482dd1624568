"""The parameter space of each kernel family, defined once and used by every sampler.

Each dimension is an ordered list of choices; samplers pick an index (so TPE, CMA-ES and GP
see an ordinal axis, and the grid sampler enumerates indices). A restricted space is the same
definition with fewer choices per dimension; it serializes to plain data (replay files carry it).
Each family's space lives in ``search/spaces/<family>.py``; the functions here dispatch to it.

Choices that a rule ties together are one dimension, so that a sampler cannot propose what the
rule refuses: ``split`` is split-K with its reduction (``k1``: none; ``k4a``: 4 splits added
atomically; ``k4r``: 4 splits reduced in a second pass; ``k4d``: 4 splits of one thread-block
cluster reduced through distributed shared memory), spelled as in kernel names
(``split_value`` / ``split_of``). A replay recording written with an older space's dimensions is
read through ``recorded_space``.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from codegen import families
from codegen.problem import DType, Layout, Problem
from codegen.spec import KernelSpec

__all__ = ["Space", "narrowings", "point_of", "recorded_space", "seeds", "space_for", "split_choices", "split_of",
           "split_value", "to_spec"]


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

    def spec(self, point: dict, problem: Problem) -> KernelSpec:
        return to_spec(self.family, point, problem)

    def indices(self, point: dict) -> dict[str, int] | None:
        """The sampler's view of a point (choice indices), or None if a value is not a choice."""
        try:
            return {k: self.dims[k].index(point[k]) for k in self.dims}
        except (KeyError, ValueError):
            return None


_REDUCE_MARK = {"atomic": "a", "two_pass": "r", "cluster": "d", "last": "l"}


def split_value(split_k: int, reduce: str) -> str:
    """The ``split`` choice of ``split_k`` splits reduced by ``reduce`` (``k1`` when not split)."""
    return "k1" if split_k == 1 else f"k{split_k}{_REDUCE_MARK.get(reduce, '?' + reduce)}"


def split_of(value: str) -> tuple[int, str]:
    """(split_k, reduce) of a ``split`` choice (the inverse of ``split_value``)."""
    if value == "k1":
        return 1, "none"
    mark = value[-1]
    reduce = next((r for r, m in _REDUCE_MARK.items() if m == mark), None)
    if reduce is None or not value.startswith("k") or not value[1:-1].isdigit():
        raise ValueError(f"{value!r} is not a split choice (k1, or k<splits> then a for atomic, r for two_pass, d for cluster or l for last)")
    return int(value[1:-1]), reduce


def split_choices(split_ks, reduces) -> tuple[str, ...]:
    """The ``split`` dimension: no split, then each split count with each reduction, in order."""
    return tuple(split_value(k, r) for k in split_ks for r in (reduces if k > 1 else ("none",)))


def recorded_space(family: str, dims: dict, results: dict, problem: Problem) -> Space:
    """The space of a replay recording in the family's current dimensions. A recording written
    with the current dimensions is read as it is; an older one (e.g. ``copy`` and ``stages``, or
    ``split_k`` and ``reduce``, as separate dimensions) becomes the family's space narrowed to the
    values its recorded kernels take (each kernel's name read back and mapped through
    ``point_of``). The older space was a product of its dimensions and the current dimensions are
    functions of disjoint groups of them, so the valid points are the same kernels."""
    space = Space(family, {k: tuple(v) for k, v in dims.items()})
    full = space_for(family, problem.dtype, block=problem.block, layout=problem.layout, sparsity=problem.sparsity)
    if set(space.dims) == set(full.dims):
        return space
    seen: dict[str, set] = {k: set() for k in full.dims}
    for name in results:
        point = point_of(families.spec_from_name(name))
        for k in full.dims:
            seen[k].add(point[k])
    return Space(family, {k: tuple(v for v in full.dims[k] if v in seen[k]) for k in full.dims})


def _module(family: str):
    from search import spaces

    return spaces.get(family)


def space_for(family: str, dtype: DType, restricted: bool | str = False, block: int = 0,
              layout: Layout | str = Layout.forward, sparsity: str = "") -> Space:
    """The family's space for ``dtype`` (and a W block-sparse in ``block``-sized blocks, 0: dense;
    and the linear layer's GEMM ``layout``, where the family generates the backward ones; and a W
    of structured ``sparsity`` such as "2:4", which only the families that name it in their
    ``SPARSITIES`` compute); ``restricted`` narrows it to what sweeps record: True (or "restricted")
    the family's RESTRICTED narrowing, another name one of its NARROWINGS (larger ones, recorded for
    harder replays)."""
    module = _module(family)
    takes = getattr(families.get(family), "DTYPES", None)
    if takes is not None and DType(dtype) not in takes:
        raise ValueError(f"the {family} family takes {', '.join(d.value for d in takes)} problems, not "
                         f"{DType(dtype).value} (choose --dtype or another --family)")
    if not families.takes_sparsity(family, sparsity):
        others = " or ".join(n for n in families.names() if families.takes_sparsity(n, sparsity))
        own = getattr(families.get(family), "SPARSITIES", ("",))
        raise ValueError(f"the {family} family has no {sparsity} sparse variants; choose --family {others}" if sparsity
                         else f"the {family} family computes a {' or '.join(own)} sparse W only: give --sparsity "
                              f"{own[0]} or choose another --family")
    layout = Layout(layout)
    if layout is Layout.forward:
        space = module.space(dtype, block)
    elif not families.takes_layouts(family):
        raise ValueError(f"the {family} family generates the forward layout only, not {layout.value}; choose "
                         f"--family " + " or ".join(n for n in families.names() if families.takes_layouts(n)))
    else:
        space = module.space(dtype, block, layout=layout)
    if not restricted:
        return space
    narrowings = {"restricted": module.RESTRICTED, **getattr(module, "NARROWINGS", {})}
    name = "restricted" if restricted is True else restricted
    if name not in narrowings:
        raise ValueError(f"the {family} family has no narrowing {name!r}; it has {', '.join(sorted(narrowings))}")
    narrow = {k: [v for v in vs if v in space.dims[k]] for k, vs in narrowings[name].items() if k in space.dims}
    return space.restrict(**{k: vs for k, vs in narrow.items() if vs})


def narrowings(family: str) -> list[str]:
    """The names ``space_for(..., restricted=NAME)`` accepts for the family."""
    return ["restricted", *getattr(_module(family), "NARROWINGS", {})]


def to_spec(family: str, point: dict, problem: Problem) -> KernelSpec:
    """Map a point of the family's space onto a spec for the problem (may be an invalid spec)."""
    return _module(family).to_spec(point, problem)


def point_of(spec: KernelSpec) -> dict:
    """The point of its family's space that maps onto ``spec`` (inverse of to_spec)."""
    return _module(spec.family).point_of(spec)


def seeds(family: str, block: int = 0, layout: Layout | str = Layout.forward) -> list[dict]:
    """Known-good points of the family's space, tried first by a new search (for a block-sparse W,
    the family's SPARSE_SEEDS where it has them; for the weight gradient sampled at one, its
    SAMPLED_SEEDS). The backward layouts start from the forward seeds (no backward kernel has been
    timed yet); those their rules refuse are left out."""
    module = _module(family)
    if block and Layout(layout) is Layout.grad_weight and hasattr(module, "SAMPLED_SEEDS"):
        return [dict(p) for p in module.SAMPLED_SEEDS]
    if block and hasattr(module, "sparse_seeds"):  # a family whose sparse seeds depend on the block
        return [dict(p) for p in module.sparse_seeds(block)]
    return [dict(p) for p in (getattr(module, "SPARSE_SEEDS", []) if block else module.SEEDS)]
