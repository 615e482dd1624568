"""A local search around the best kernel, ranked by a small model, over a global sampler.

``LocalSampler`` is an Optuna sampler for spaces of ordered integer dimensions (a family's
choice indices). Until ``startup`` trials are complete, and whenever the best trial has no
untried neighbour left, its ``fallback`` sampler proposes (the runner gives it CMA-ES). Otherwise
it proposes a neighbour of the best trial so far: the point one choice step away in one
dimension (index ± 1) that no trial of the study has (in any state, in flight too), the one an
additive ridge model of every complete trial predicts best. The model: one indicator per
(dimension, choice), least squares on the objective relative to the best with a ridge penalty,
refit at each proposal (a few dozen unknowns; microseconds to milliseconds).

Why: on the replay recordings this needed fewer trials than CMA-ES, TPE, and a one-dimension
hill climb that takes its neighbours in random order (which stops longer on local optima); the
numbers and what else was tried are in README ("Search quality") and benchmarks/NOTES.md. The
objective is maximized (the runner's TFLOP/s).
"""

from __future__ import annotations

import random

import numpy as np
import optuna
from optuna.distributions import IntDistribution
from optuna.search_space import IntersectionSearchSpace
from optuna.trial import TrialState

#: Complete trials proposed by the fallback before the local search starts.
STARTUP = 10
#: Ridge penalty of the neighbour-ranking model (objective relative to the best, so about 0..1).
RIDGE = 3.0


class LocalSampler(optuna.samplers.BaseSampler):
    """One-dimension neighbours of the best trial, ranked by a ridge model; ``fallback`` before
    ``startup`` complete trials and whenever the best trial's neighbours are all tried.
    ``fallback`` may be replaced between trials (the runner restarts a converged CMA-ES so)."""

    def __init__(self, fallback: optuna.samplers.BaseSampler, *, startup: int = STARTUP, ridge: float = RIDGE,
                 seed: int | None = None) -> None:
        self.fallback, self.startup, self.ridge = fallback, startup, ridge
        self._rng = random.Random(seed)
        self._space = IntersectionSearchSpace()
        self.local_proposals = 0  # how many proposals were neighbours (the rest: the fallback's)

    def infer_relative_search_space(self, study, trial):
        return {n: d for n, d in self._space.calculate(study).items()
                if isinstance(d, IntDistribution) and d.step == 1 and not d.log}

    def sample_relative(self, study, trial, search_space):
        point = self._neighbour(study, search_space) if search_space else None
        if point is not None:
            self.local_proposals += 1
            return point
        return self.fallback.sample_relative(study, trial, self.fallback.infer_relative_search_space(study, trial))

    def _neighbour(self, study, space: dict[str, IntDistribution]) -> dict[str, int] | None:
        trials = study.get_trials(deepcopy=False)
        names = sorted(space)
        done = [t for t in trials if t.state == TrialState.COMPLETE and all(n in t.params for n in names)]
        if len(done) < self.startup:
            return None
        best = max(done, key=lambda t: t.value)
        tried = {tuple(t.params.get(n) for n in names) for t in trials}
        candidates = []
        for n in names:
            for step in (-1, 1):
                value = best.params[n] + step
                if space[n].low <= value <= space[n].high:
                    point = {**{m: best.params[m] for m in names}, n: value}
                    if tuple(point[m] for m in names) not in tried:
                        candidates.append(point)
        if not candidates:
            return None
        self._rng.shuffle(candidates)  # ties go to a random one
        scores = self._model_scores(done, best.value, space, names, candidates)
        return candidates[int(np.argmax(scores))]

    def _model_scores(self, done, best_value: float, space, names, candidates) -> np.ndarray:
        """Predicted objective (relative to the best) of each candidate: ridge regression on one
        indicator per (dimension, choice) over the complete trials."""
        offset, columns = {}, 0
        for n in names:
            offset[n] = columns - space[n].low
            columns += space[n].high - space[n].low + 1

        def encode(points) -> np.ndarray:
            x = np.zeros((len(points), columns))
            for row, p in enumerate(points):
                for n in names:
                    x[row, offset[n] + p[n]] = 1.0
            return x

        x = encode([t.params for t in done])
        y = np.array([t.value for t in done]) / (best_value or 1.0)
        w = np.linalg.solve(x.T @ x + self.ridge * np.eye(columns), x.T @ (y - y.mean()))
        return encode(candidates) @ w

    def sample_independent(self, study, trial, param_name, param_distribution):
        return self.fallback.sample_independent(study, trial, param_name, param_distribution)

    def before_trial(self, study, trial) -> None:
        self.fallback.before_trial(study, trial)

    def after_trial(self, study, trial, state, values) -> None:
        self.fallback.after_trial(study, trial, state, values)

    def reseed_rng(self) -> None:
        self._rng.seed()
        self.fallback.reseed_rng()
