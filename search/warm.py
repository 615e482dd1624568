"""Warm start: a new search first tries the best kernels the store knows for the nearest problems.

Where it looks: ok trials of the same family and dtype, on a device of the same name (one GPU
model: results replayed from a recording of that GPU count too, see ``store.records.measured_on``),
on problems with the same kind of W (dense only from dense; block-sparse only from the same block
size). Bias is left out of the distance (it adds b[N] in the epilogue; the tile that wins hardly
changes) and breaks ties: of two equally near problems, the one with the problem's bias comes
first. The problem itself counts, at distance 0: a new study of a problem already searched (another
sampler or seed) starts from its best kernels, and those cost no budget where this device's
result for the same source is stored (the runner reuses it).

Nearness is the Euclidean distance over ln m, ln n and ln k, and for a block-sparse W ln density
too (floored at 1%, so that an all-zero W is not infinitely far).

Each seed is the point of the space that gives the stored kernel for the new problem
(``to_spec(point_of(spec), problem)``: dtype, bias and block are the new problem's). One that is not
a point of this space (a value that is not among its choices, or a choice the space does not
sample and fixes otherwise), or that is invalid for the new problem on this device
(``spec.check``), is dropped, and the reason kept. The nearest problems give up to ``per_problem``
kernels each (their fastest that survive) until ``problems`` problems have given some; distinct
kernels, at most ``k`` in all. Places left are filled with the family's built-in seeds
(``search.space.seeds``) that are valid here, so a store with nothing usable for this family,
dtype and device gives the built-in seeds alone.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from codegen import families
from codegen.problem import Problem
from codegen.spec import DeviceLimits, KernelSpec
from search.space import Space, point_of, seeds

__all__ = ["Seed", "Seeding", "builtin_seeds", "distance", "no_seeds", "resumed", "study_started", "warm_seeds"]

#: Seeds at most, problems that give seeds, and kernels each of them gives.
K, PROBLEMS, PER_PROBLEM = 8, 4, 2
#: Kernels read per stored problem: its fastest may be invalid here, the next ones are tried.
DEPTH = 4
#: Densities below this count as this (ln 0 is not a distance).
MIN_DENSITY = 0.01


@dataclass(frozen=True)
class Seed:
    """A point tried first, and where it comes from."""

    point: dict[str, Any]  # the space's values (what the runner enqueues)
    kernel: str  # the kernel the point is for the new problem
    origin: str  # "history" (the store) or "built-in" (the family's SEEDS / SPARSE_SEEDS)
    problem: str | None = None  # history: the problem it was measured on (its key)
    measured: str | None = None  # history: the kernel measured there (its bias may differ)
    device: str | None = None  # history: the device it was measured on
    tflops: float | None = None  # history: its measured rate there
    ratio_cublas: float | None = None
    distance: float | None = None  # history: how far that problem is from the new one

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def describe(self) -> str:
        """One line: the kernel, where it comes from, its measured rate."""
        if self.origin != "history":
            return f"{self.kernel}  built-in seed"
        rate = f"{self.tflops:.2f} TFLOP/s" if self.tflops is not None else "rate unknown"
        if self.ratio_cublas:
            rate += f", {self.ratio_cublas:.3f}x cuBLAS"
        line = f"{self.kernel}  from {self.problem}: {rate}"
        if self.measured and self.measured != self.kernel:
            line += f" (measured as {self.measured})"
        return line


@dataclass
class Seeding:
    """The seeds of a search and how they were chosen."""

    seeds: list[Seed]
    source: str  # "history" (some seeds from the store), "built-in", "none" or "resumed"
    note: str  # one line: where the seeds come from
    dropped: list[dict[str, Any]] = field(default_factory=list)  # {"kernel", "problem", "why"}

    @property
    def points(self) -> list[dict[str, Any]] | None:
        """What ``run_search(seeds=...)`` takes (None: no seeds)."""
        return [dict(s.point) for s in self.seeds] or None

    @property
    def from_history(self) -> int:
        return sum(1 for s in self.seeds if s.origin == "history")

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "note": self.note, "seeds": [s.to_dict() for s in self.seeds],
                "dropped": list(self.dropped)}


def distance(a: Problem | dict, b: Problem | dict) -> float:
    """How far apart two problems' shapes are: Euclidean over ln m, ln n, ln k, and ln density
    (floored at MIN_DENSITY) where either W is block-sparse. Takes Problems or store rows."""

    def get(p, name):
        return p[name] if isinstance(p, dict) else getattr(p, name)

    terms = [math.log(get(a, d) / get(b, d)) for d in ("m", "n", "k")]
    if get(a, "block") or get(b, "block"):
        da, db = (max(float(get(p, "density") if get(p, "density") is not None else 1.0), MIN_DENSITY)
                  for p in (a, b))
        terms.append(math.log(da / db))
    return math.sqrt(sum(t * t for t in terms))


def _adapt(spec: KernelSpec, problem: Problem, space: Space, limits: DeviceLimits | None
           ) -> tuple[dict | None, KernelSpec | None, str]:
    """The point of ``space`` giving ``spec``'s variant for ``problem``, and that spec; or None and why not."""
    try:
        full = point_of(spec)
    except (KeyError, ValueError, TypeError, AttributeError) as e:
        return None, None, f"not a point of the {space.family} space ({e})"
    point = {k: v for k, v in full.items() if k in space.dims}
    outside = [f"{k}={full.get(k)!r} is not one of {list(space.dims[k])}" for k in space.dims
               if k not in full or full[k] not in space.dims[k]]
    if outside:
        return None, None, "not a point of this space: " + "; ".join(outside)
    try:
        wanted = space.spec(full, problem)
        tried = space.spec(point, problem)  # what the runner builds from the point's indices
    except (KeyError, ValueError, TypeError) as e:
        return None, None, f"does not map onto a {space.family} variant for {problem.key} ({e})"
    if tried != wanted:
        return None, None, (f"this space fixes what the kernel chose: it would be tried as {tried.name}, "
                            f"not {wanted.name}")
    reasons = tried.check(problem, limits)
    if reasons:
        return None, tried, f"invalid for {problem.key}: " + "; ".join(reasons)
    return point, tried, ""


def builtin_seeds(problem: Problem, space: Space, limits: DeviceLimits | None = None, *, k: int | None = None,
                  exclude: set[str] | None = None, dropped: list | None = None) -> list[Seed]:
    """The family's built-in seeds (``search.space.seeds``) that are points of ``space`` and valid
    for ``problem``, as Seeds; at most ``k``, none whose kernel is in ``exclude``."""
    out: list[Seed] = []
    taken = set(exclude or ())
    for raw in seeds(space.family, problem.block, problem.layout):
        if k is not None and len(out) >= k:
            break
        try:
            spec = space.spec(raw, problem)
        except (KeyError, ValueError, TypeError) as e:
            if dropped is not None:
                dropped.append({"kernel": None, "problem": None, "origin": "built-in", "why": str(e)})
            continue
        point, tried, why = _adapt(spec, problem, space, limits)
        if point is None:
            if dropped is not None:
                dropped.append({"kernel": spec.name, "problem": None, "origin": "built-in", "why": why})
            continue
        if tried.name in taken:
            continue
        taken.add(tried.name)
        out.append(Seed(point=point, kernel=tried.name, origin="built-in"))
    return out


def _spec_of(row: dict) -> KernelSpec | None:
    try:
        return families.spec_from_dict(row["params"])
    except (KeyError, ValueError, TypeError):
        pass
    try:
        return families.spec_from_name(row["kernel"])
    except ValueError:
        return None


def _device_name(device: dict | str) -> str:
    return device.get("name", "") if isinstance(device, dict) else str(device)


def warm_seeds(store, problem: Problem, space: Space, device: dict | str, *, limits: DeviceLimits | None = None,
               k: int = K, problems: int = PROBLEMS, per_problem: int = PER_PROBLEM) -> Seeding:
    """The seeds of a new search of ``space`` for ``problem`` on ``device`` (its dict or name): the
    best stored kernels of the nearest problems, then built-in seeds (see the module docstring).
    ``store`` None: the built-in seeds alone."""
    from store.records import measured_on

    family, dtype = space.family, problem.dtype.value
    kind = f"block-sparse ({problem.block}x{problem.block} blocks)" if problem.block else "dense"
    what = f"{family} {dtype} {kind}"
    gpu = measured_on(_device_name(device))
    dropped: list[dict] = []
    if store is None:
        found = builtin_seeds(problem, space, limits, k=k, dropped=dropped)
        return Seeding(found, "built-in" if found else "none",
                       "no store to learn from: the family's built-in seeds", dropped)
    device_ids = [d["id"] for d in store.devices() if measured_on(d["name"]) == gpu]
    rows = store.best_similar(family=family, dtype=dtype, block=problem.block, device_ids=device_ids,
                              per_problem=max(per_problem, 1) * DEPTH)
    by_problem: dict[str, list[dict]] = {}
    for row in rows:
        by_problem.setdefault(row["problem"], []).append(row)
    order = sorted(by_problem, key=lambda key: (distance(problem, by_problem[key][0]),
                                                bool(by_problem[key][0]["bias"]) != problem.bias, key))
    chosen: list[Seed] = []
    names: set[str] = set()
    givers = 0
    for key in order:
        if len(chosen) >= k or givers >= problems:
            break
        first = by_problem[key][0]
        far = distance(problem, first)
        given = 0
        candidates = sorted(by_problem[key], key=lambda r: (-(r["tflops"] or 0.0), r["median_ms"], r["id"]))
        seen_here: set[str] = set()
        for row in candidates:
            if given >= per_problem or len(chosen) >= k:
                break
            if row["kernel"] in seen_here:  # the same kernel measured on two devices of this name
                continue
            seen_here.add(row["kernel"])
            spec = _spec_of(row)
            if spec is None:
                dropped.append({"kernel": row["kernel"], "problem": key, "origin": "history",
                                "why": "not a kernel name or spec this version reads"})
                continue
            point, tried, why = _adapt(spec, problem, space, limits)
            if point is None:
                dropped.append({"kernel": tried.name if tried is not None else row["kernel"], "problem": key,
                                "origin": "history", "why": why})
                continue
            if tried.name in names:
                continue
            names.add(tried.name)
            given += 1
            chosen.append(Seed(point=point, kernel=tried.name, origin="history", problem=key,
                               measured=row["kernel"], device=row["device"], tflops=row["tflops"],
                               ratio_cublas=row.get("ratio_cublas"), distance=round(far, 4)))
        givers += bool(given)
    extra = builtin_seeds(problem, space, limits, k=k - len(chosen), exclude=names, dropped=dropped)
    if chosen:
        n_problems = len({s.problem for s in chosen})
        note = (f"warm start from the store: {len(chosen)} of the best {what} kernels of the {n_problems} nearest "
                f"stored problem{'s' if n_problems != 1 else ''} on {gpu}"
                + (f", then {len(extra)} built-in" if extra else ""))
        return Seeding(chosen + extra, "history", note, dropped)
    if by_problem:
        why = f"none of the {what} kernels stored on {gpu} fits this problem and space"
    else:
        why = f"nothing stored for {what} on {gpu}"
    return Seeding(extra, "built-in" if extra else "none", f"warm start: {why}; the family's built-in seeds",
                   dropped)


def no_seeds(why: str) -> Seeding:
    return Seeding([], "none", why)


def resumed(study: str) -> Seeding:
    return Seeding([], "resumed", f"resuming study {study}: seeds are tried only when a study starts")


def study_started(store, study: str) -> bool:
    """Whether the store holds trials of the study ``study`` (a run of it seeded it already)."""
    if store is None or not store.ready:
        return False
    return store.count_trials(study) > 0
