"""The local search (``search.local.LocalSampler``): one-step neighbours of the best kernel,
ranked by a ridge model, over CMA-ES, which proposes during start-up and whenever the best
kernel's neighbours are spent. When CMA-ES converges it restarts as the cmaes sampler does."""

from __future__ import annotations

from search.samplers import cmaes

NAME = "local"
RANK = 0


class Strategy(cmaes.Strategy):
    who = "the local sampler's cmaes"

    def build(self):
        from search.local import LocalSampler

        return LocalSampler(super().build(), seed=self.seed)

    def install(self, study, sampler) -> None:
        study.sampler.fallback = sampler

    def handover_line(self, proposals: int) -> str:
        return f"the local sampler's CMA-ES converged after {proposals} proposals: TPE took over"
