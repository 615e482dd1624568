"""The points of a space as a search sees them: each checked once, the kernels taken so far
(measured, known or in flight), the nearest unmeasured valid point to a proposal, or a uniformly
random one, and how many valid kernels an enumerable space has."""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass

from codegen.problem import Problem
from search.space import Space

__all__ = ["DRAWS", "ENUMERABLE", "Point", "Pool"]

#: Spaces with at most this many points are enumerated (once, when first needed) to find an
#: unmeasured valid point or to say that none is left; larger ones are sampled.
ENUMERABLE = 50_000
#: Random draws to find an unmeasured valid point of a space too large to enumerate.
DRAWS = 4000


@dataclass
class Point:
    """What the search knows of one point of the space (by choice indices)."""

    key: tuple[int, ...]
    spec: object
    reasons: list[str]
    name: str


class Pool:
    """The space's points, checked once each, with the kernels taken so far."""

    def __init__(self, space: Space, problem: Problem, limits, rng: random.Random) -> None:
        self.space, self.problem, self.limits, self.rng = space, problem, limits, rng
        self.names = list(space.dims)
        self.sizes = [len(space.dims[n]) for n in self.names]
        self.cache: dict[tuple[int, ...], Point] = {}
        self.taken: set[str] = set()  # kernels measured, known or in flight in this study
        self._left: list[tuple[int, ...]] | None = None  # one valid point per kernel not yet seen taken
        self._valid_kernels: int | None = None  # enumerable spaces: how many kernels are valid

    def at(self, key: tuple[int, ...]) -> Point:
        p = self.cache.get(key)
        if p is None:
            point = {n: self.space.dims[n][i] for n, i in zip(self.names, key, strict=True)}
            spec = self.space.spec(point, self.problem)
            p = self.cache[key] = Point(key, spec, spec.check(self.problem, self.limits), spec.name)
        return p

    def key_of(self, indices: dict[str, int]) -> tuple[int, ...]:
        """A point given as {dimension: choice index}, as a key."""
        return tuple(indices[n] for n in self.names)

    def open(self, key: tuple[int, ...]) -> bool:
        """Whether the point is valid and its kernel not yet taken."""
        p = self.at(key)
        return not p.reasons and p.name not in self.taken

    def nearest(self, key: tuple[int, ...], rings: int = 2) -> tuple[int, ...] | None:
        """An open point that differs from ``key`` in the fewest dimensions (at most ``rings``),
        by as few choice steps as possible, chosen at random among equals."""
        dims = range(len(key))
        for ring in range(1, rings + 1):
            found = []
            for changed in itertools.combinations(dims, ring):
                for values in itertools.product(*[[v for v in range(self.sizes[d]) if v != key[d]] for d in changed]):
                    other = list(key)
                    for d, v in zip(changed, values, strict=True):
                        other[d] = v
                    other = tuple(other)
                    if self.open(other):
                        found.append((sum(abs(other[d] - key[d]) for d in changed), other))
            if found:
                least = min(f[0] for f in found)
                return self.rng.choice(sorted(o for s, o in found if s == least))
        return None

    def any_open(self) -> tuple[int, ...] | None | bool:
        """A uniformly random open point; None when the space has none left (enumerable spaces),
        False when ``DRAWS`` random draws found none (a space too large to enumerate)."""
        if self.space.size <= ENUMERABLE:
            if self._left is None:  # one point per kernel, so that every unmeasured kernel is equally likely
                by_name: dict[str, tuple[int, ...]] = {}
                for k in itertools.product(*[range(s) for s in self.sizes]):
                    p = self.at(k)
                    if not p.reasons:
                        by_name.setdefault(p.name, k)
                self._left, self._valid_kernels = list(by_name.values()), len(by_name)
            left = self._left
            while left:  # taken ones are dropped as they are met (swap with the last)
                i = self.rng.randrange(len(left))
                key = left[i]
                if self.cache[key].name not in self.taken:
                    return key
                left[i] = left[-1]
                left.pop()
            return None
        for _ in range(DRAWS):
            key = tuple(self.rng.randrange(s) for s in self.sizes)
            if self.open(key):
                return key
        return False

    def exhausted(self) -> str:
        """Why proposing ends when no open point is left: the line a search stops with."""
        if self.space.size <= ENUMERABLE:
            self.any_open()  # enumerates the valid points once
        valid = self._valid_kernels
        if valid == 0:
            return "space exhausted: no point of the space is valid for this problem on this device"
        if valid is not None:
            return f"space exhausted: all {valid} valid kernels of the space are measured"
        return f"space exhausted: every one of its {self.space.size} points was proposed"
