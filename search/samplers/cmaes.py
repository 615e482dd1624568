"""CMA-ES (``search.cmaes.CmaEs``: Optuna's, with a cost per proposal that does not grow with
the study). Each time it converges it restarts from the best point so far with a fresh
optimizer, whose state is kept under another prefix of the trials' attributes, so its cost per
proposal stays flat as the study grows. Where Optuna keeps that state elsewhere, TPE takes over
instead."""

from __future__ import annotations

import warnings

from search import samplers
from search.samplers import CONVERGED
from search.samplers import Strategy as Base

NAME = "cmaes"
RANK = 1


def fresh_cmaes(seed: int | None, x0: dict | None):
    """A new CMA-ES optimizer started at ``x0`` (None: the middle of the space)."""
    from search.cmaes import CmaEs

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # x0 is deprecated since Optuna 4.9
        try:
            return CmaEs(seed=seed, x0=x0, warn_independent_sampling=False)
        except TypeError:  # an Optuna without x0: restart from the middle of the space
            return CmaEs(seed=seed, warn_independent_sampling=False)


class Strategy(Base):
    #: How the summary names the optimizer that restarts.
    who = "cmaes"

    def __init__(self, seed: int | None, space) -> None:
        super().__init__(seed, space)
        self.restarts = 0
        self.handed_over = False

    def build(self):
        from search.cmaes import CmaEs

        return CmaEs(seed=self.seed, warn_independent_sampling=False)

    def install(self, study, sampler) -> None:
        """Put the restarted optimizer (or its successor) to work."""
        study.sampler = sampler

    def converged(self, study, proposals: int) -> str | None:
        if self.handed_over:
            return None
        self.restarts += 1
        try:
            x0 = dict(study.best_trial.params)
        except ValueError:  # nothing ran yet
            x0 = None
        sampler = fresh_cmaes(None if self.seed is None else self.seed + self.restarts, x0)
        if not isinstance(getattr(sampler, "_attr_prefix", None), str):  # an Optuna that keeps its state elsewhere
            self.handed_over = True
            self.install(study, samplers.make_sampler("tpe", self.seed, self.space))
            return self.handover_line(proposals)
        sampler._attr_prefix = f"cma{self.restarts}:"  # not the converged optimizer's state
        self.install(study, sampler)
        return (f"{self.who} converged {self.restarts} time{'s' if self.restarts > 1 else ''} "
                f"({CONVERGED} proposals in a row that brought nothing new) and restarted from the best "
                f"point; last restart after {proposals} proposals")

    def handover_line(self, proposals: int) -> str:
        return (f"cmaes converged after {proposals} proposals ({CONVERGED} in a row brought nothing new): "
                f"TPE took over the study")
