"""Every point of the space once, in a seeded order (an affine permutation of the point indices,
so nothing is enumerated up front). The study's own sampler only answers its bookkeeping."""

from __future__ import annotations

import math
import random

from search.samplers import Strategy as Base

NAME = "grid"
RANK = 4


class Strategy(Base):
    def build(self):
        import optuna

        return optuna.samplers.RandomSampler(seed=self.seed)

    def order(self, sizes: list[int]) -> Order:
        return Order(sizes, self.seed)


class Order:
    """The points of a space of ``sizes`` choices per dimension, each once, in a seeded order."""

    def __init__(self, sizes: list[int], seed: int | None) -> None:
        self.sizes, self.total = sizes, math.prod(sizes)
        rng = random.Random(seed)
        self.step = rng.randrange(1, self.total) if self.total > 1 else 1
        while math.gcd(self.step, self.total) != 1:
            self.step = rng.randrange(1, self.total)
        self.offset = rng.randrange(self.total)
        self.i = 0

    def next(self) -> tuple[int, ...] | None:
        if self.i >= self.total:
            return None
        n = (self.offset + self.step * self.i) % self.total
        self.i += 1
        key = []
        for s in reversed(self.sizes):
            n, r = divmod(n, s)
            key.append(r)
        return tuple(reversed(key))
