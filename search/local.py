"""A local search around the best kernel, ranked by a small model, over a global sampler.

``LocalSampler`` is an Optuna sampler for spaces of ordered integer dimensions (a family's
choice indices). Until ``startup`` trials are complete, and whenever the best trial has no
untried neighbour left, its ``fallback`` sampler proposes (the runner gives it CMA-ES). Otherwise
it proposes a neighbour of the best trial so far: the point one choice step away in one
dimension (index ± 1) that no trial of the study has (in any state, in flight too), the one an
additive ridge model of every complete trial predicts best. The model: one indicator per
(dimension, choice), least squares on the objective relative to the best with a ridge penalty,
solved at each proposal (a few dozen unknowns) from normal equations kept up to date as trials
complete; the tried points are kept the same way, so a proposal's cost does not grow with the
study.

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
        self._seen: _Seen | None = None
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
        names = sorted(space)
        seen = self._read(study, names, space)
        if seen.complete < self.startup:
            return None
        best = seen.best[2]
        candidates = []
        for n in names:
            for step in (-1, 1):
                value = best[n] + step
                if space[n].low <= value <= space[n].high:
                    point = {**{m: best[m] for m in names}, n: value}
                    if tuple(point[m] for m in names) not in seen.tried:
                        candidates.append(point)
        if not candidates:
            return None
        self._rng.shuffle(candidates)  # ties go to a random one
        return candidates[int(np.argmax(seen.scores(candidates, self.ridge)))]

    def _read(self, study, names: list[str], space: dict[str, IntDistribution]) -> _Seen:
        """What the study holds, read incrementally: trials new since the last call, and those
        that were still running then (so a proposal costs the same late in a long study as early)."""
        bounds = tuple((n, space[n].low, space[n].high) for n in names)
        trials = study.get_trials(deepcopy=False)
        seen = self._seen
        if seen is None or (seen.storage, seen.study_id, seen.bounds) != (study._storage, study._study_id, bounds) \
                or len(trials) < seen.read:  # another study (or space): read it from the start
            seen = self._seen = _Seen(study._storage, study._study_id, bounds)
        seen.catch_up(trials)
        return seen

    def sample_independent(self, study, trial, param_name, param_distribution):
        return self.fallback.sample_independent(study, trial, param_name, param_distribution)

    def before_trial(self, study, trial) -> None:
        self.fallback.before_trial(study, trial)

    def after_trial(self, study, trial, state, values) -> None:
        self.fallback.after_trial(study, trial, state, values)

    def reseed_rng(self) -> None:
        self._rng.seed()
        self.fallback.reseed_rng()


class _Seen:
    """One study's trials as the sampler has read them: every trial once, and a trial that was
    running when read again at each call until it finishes. Holds the points tried (any state),
    the best complete trial, and the ridge model's normal equations over the complete trials
    (x.T @ x and x.T @ y of the indicator encoding, with y the objective itself: the model's
    objective relative to the best is y / best, which only scales its weights)."""

    def __init__(self, storage, study_id: int, bounds: tuple[tuple[str, int, int], ...]) -> None:
        self.storage, self.study_id, self.bounds = storage, study_id, bounds
        self.names = [n for n, _, _ in bounds]
        self.offset, columns = {}, 0
        for n, low, high in bounds:
            self.offset[n] = columns - low
            columns += high - low + 1
        self.xtx, self.xty = np.zeros((columns, columns)), np.zeros(columns)
        self.complete, self.total = 0, 0.0  # complete trials, sum of their values
        self.best: tuple[float, int, dict] | None = None  # (value, -number, params): the first of equals wins
        self.tried: set[tuple] = set()
        self.read = 0  # trials[:read] were read
        self.running: list[int] = []  # of those, the ones not finished when read

    def catch_up(self, trials) -> None:
        again, self.running = self.running, []
        for i in [*again, *range(self.read, len(trials))]:
            t = trials[i]
            if all(n in t.params for n in self.names):
                self.tried.add(tuple(t.params[n] for n in self.names))
            if not t.state.is_finished():
                self.running.append(i)
            elif t.state == TrialState.COMPLETE and all(n in t.params for n in self.names):
                self._add(t)
        self.read = len(trials)

    def _add(self, t) -> None:
        cols = [self.offset[n] + t.params[n] for n in self.names]
        self.xtx[np.ix_(cols, cols)] += 1.0
        self.xty[cols] += t.value
        self.complete += 1
        self.total += t.value
        if self.best is None or (t.value, -t.number) > self.best[:2]:
            self.best = (t.value, -t.number, t.params)

    def scores(self, candidates: list[dict], ridge: float) -> np.ndarray:
        """Predicted objective (relative to the best) of each candidate: ridge regression on one
        indicator per (dimension, choice) over the complete trials, the objective centred."""
        counts = np.diag(self.xtx)
        rhs = (self.xty - counts * (self.total / self.complete)) / (self.best[0] or 1.0)
        w = np.linalg.solve(self.xtx + ridge * np.eye(len(counts)), rhs)
        return np.array([sum(w[self.offset[n] + p[n]] for n in self.names) for p in candidates])
