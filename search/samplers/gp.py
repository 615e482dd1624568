"""Optuna's Gaussian-process sampler (needs torch and scipy). Once it converges it hands the
study over to TPE."""

from __future__ import annotations

from search import samplers
from search.samplers import CONVERGED
from search.samplers import Strategy as Base

NAME = "gp"
RANK = 5


def missing() -> str | None:
    """Why the gp sampler cannot run here, or None."""
    try:
        import scipy  # noqa: F401
        import torch  # noqa: F401
    except ImportError as e:
        return f"needs torch and scipy ({e.name} is missing)"
    return None


class Strategy(Base):
    handed_over = False

    def build(self):
        import optuna

        why = missing()
        if why:
            raise SystemExit(f"codegen search: the gp sampler {why}")
        return optuna.samplers.GPSampler(seed=self.seed)

    def converged(self, study, proposals: int) -> str | None:
        if self.handed_over:
            return None
        self.handed_over = True
        study.sampler = samplers.make_sampler("tpe", self.seed, self.space)
        return (f"gp converged after {proposals} proposals ({CONVERGED} in a row brought nothing new): "
                f"TPE took over the study")
