"""Uniform random sampling over the valid points: a proposal that brings nothing new is replaced
by a uniformly random unmeasured valid point (never the nearest one), so the search stays
uniform over what is left."""

from __future__ import annotations

from search.samplers import Strategy as Base

NAME = "random"
RANK = 3


class Strategy(Base):
    def build(self):
        import optuna

        return optuna.samplers.RandomSampler(seed=self.seed)

    def replacement(self, pool, key):
        return pool.any_open()
