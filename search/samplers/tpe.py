"""Optuna's TPE: multivariate, constant liar (several trials in flight), 16 startup trials."""

from __future__ import annotations

from search.samplers import Strategy as Base

NAME = "tpe"
RANK = 2


class Strategy(Base):
    def build(self):
        import optuna

        return optuna.samplers.TPESampler(seed=self.seed, multivariate=True, constant_liar=True, n_startup_trials=16)
