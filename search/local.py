"""A local search around the best kernel, ranked by a small model, over a global sampler.

``LocalSampler`` is an Optuna sampler for spaces of integer dimensions (a family's choice
indices). Until ``startup`` trials are complete, and whenever the best trial has no untried
neighbour left, its ``fallback`` sampler proposes (the runner gives it CMA-ES). Otherwise it
proposes the neighbour of the best trial so far that a model predicts best, among those no trial
of the study has (in any state, in flight too). A neighbour differs from the best in one
dimension: by one choice step, or set to any other choice where the dimension is ``unordered``
(named choices such as a copy mode); or in both dimensions of a ``linked`` pair (choices that pay
only together, such as a k-tile and a copy mode), each set to any other choice.

The model is ridge regression, additive in indicators: one per (dimension, choice); one per part
of a choice where ``parts`` says what a dimension's choices are made of (a split-K choice ``k4a``
is 4 splits and an atomic reduction, so what the model learns of ``k4a`` carries to ``k4r``); and
one per (linked pair, pair of choices). It is fitted to the objective relative to the best, by
least squares with a ridge penalty, solved at each proposal from normal equations kept up to
date as trials complete; the tried points are kept the same way, so a proposal's cost does not
grow with the study.

Why: on the replay recordings, ranking neighbours by the model needed fewer trials than CMA-ES,
TPE, and a hill climb taking its neighbours in random order. On the full SIMT space, climbs of
one choice step at a time stopped on kernels three or four dimensions from the best, where the
dimensions that had to change together (k-tile, copy mode, padding) each lose alone; the
unordered and linked moves and the model's parts and pair terms are for that. The numbers and
what else was tried are in README ("Search quality") and benchmarks/NOTES.md. The objective is
maximized (the runner's TFLOP/s).
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
    """Neighbours of the best trial, ranked by a ridge model; ``fallback`` before ``startup``
    complete trials and whenever the best trial's neighbours are all tried. ``unordered``: the
    dimensions whose choices are names, not magnitudes; ``linked``: pairs of dimensions also moved
    together; ``parts``: for some dimensions, a tuple per choice (by index) of what the choice is
    made of. Dimensions not in the study's space are ignored. ``fallback`` may be replaced between
    trials (the runner restarts a converged CMA-ES so)."""

    def __init__(self, fallback: optuna.samplers.BaseSampler, *, startup: int = STARTUP, ridge: float = RIDGE,
                 unordered=(), linked=(), parts: dict | None = None, seed: int | None = None) -> None:
        self.fallback, self.startup, self.ridge = fallback, startup, ridge
        self.unordered = frozenset(unordered)
        self.linked = tuple((a, b) for a, b in linked)
        self.parts = {n: tuple(tuple(p) for p in per_choice) for n, per_choice in (parts or {}).items()}
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
        best = tuple(seen.best[2][n] for n in names)
        choices = [range(space[n].low, space[n].high + 1) for n in names]
        keys = []
        for i, n in enumerate(names):
            far = n in self.unordered
            keys += [best[:i] + (v,) + best[i + 1:] for v in choices[i] if v != best[i] and (far or abs(v - best[i]) == 1)]
        for i, j in seen.pairs:
            for u in choices[i]:
                for v in choices[j]:
                    if u != best[i] and v != best[j]:
                        key = list(best)
                        key[i], key[j] = u, v
                        keys.append(tuple(key))
        keys = [k for k in keys if k not in seen.tried]
        if not keys:
            return None
        self._rng.shuffle(keys)  # ties go to a random one
        return dict(zip(names, keys[int(np.argmax(seen.scores(keys, self.ridge)))], strict=True))

    def _read(self, study, names: list[str], space: dict[str, IntDistribution]) -> _Seen:
        """What the study holds, read incrementally: trials new since the last call, and those
        that were still running then (so a proposal costs the same late in a long study as early)."""
        bounds = tuple((n, space[n].low, space[n].high) for n in names)
        trials = study.get_trials(deepcopy=False)
        seen = self._seen
        if seen is None or (seen.storage, seen.study_id, seen.bounds) != (study._storage, study._study_id, bounds) \
                or len(trials) < seen.read:  # another study (or space): read it from the start
            pairs = tuple((names.index(a), names.index(b)) for a, b in self.linked if a in space and b in space)
            parts = {names.index(n): p for n, p in self.parts.items() if n in space and len(p) == space[n].high + 1}
            seen = self._seen = _Seen(study._storage, study._study_id, bounds, pairs, parts)
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
    running when read again at each call until it finishes. Holds the points tried (any state, as
    tuples of choice indices in ``names`` order), the best complete trial, and the ridge model's
    normal equations over the complete trials (x.T @ x, x.T @ y and the column sums of the
    indicator encoding x, with y the objective itself: the model's objective relative to the best
    is y / best, which only scales its weights)."""

    def __init__(self, storage, study_id: int, bounds: tuple[tuple[str, int, int], ...],
                 pairs: tuple[tuple[int, int], ...], parts: dict[int, tuple[tuple, ...]]) -> None:
        self.storage, self.study_id, self.bounds, self.pairs = storage, study_id, bounds, pairs
        self.names = [n for n, _, _ in bounds]
        self.lows = np.array([low for _, low, _ in bounds])
        self.sizes = np.array([high - low + 1 for _, low, high in bounds])
        # the columns: each dimension's choices, then each linked pair's pairs of choices (u, v) at
        # pair_offset[p] + (u - low_i) * size_j + (v - low_j), then the parts
        self.offset = np.cumsum([0, *self.sizes[:-1]])
        self.pair_offset = int(self.sizes.sum()) + np.cumsum([0, *[self.sizes[i] * self.sizes[j] for i, j in pairs]])
        columns = int(self.pair_offset[-1])
        labels: dict[tuple, int] = {}
        self.part_columns = []  # (dimension, choice index - low, column)
        for i, per_choice in parts.items():
            for c, made_of in enumerate(per_choice[self.lows[i]:]):
                for position, part in enumerate(made_of):
                    column = labels.setdefault((i, position, part), columns + len(labels))
                    self.part_columns.append((i, c, column))
        columns += len(labels)
        self.xtx, self.xty, self.xsum = np.zeros((columns, columns)), np.zeros(columns), np.zeros(columns)
        self.complete, self.total = 0, 0.0  # complete trials, sum of their values
        self.best: tuple[float, int, dict] | None = None  # (value, -number, params): the first of equals wins
        self.tried: set[tuple] = set()
        self.read = 0  # trials[:read] were read
        self.running: list[int] = []  # of those, the ones not finished when read

    def encode(self, keys: np.ndarray) -> np.ndarray:
        """The indicator rows of points (rows of choice indices)."""
        rel = keys - self.lows
        x = np.zeros((len(keys), len(self.xty)))
        rows = np.arange(len(keys))[:, None]
        x[rows, self.offset + rel] = 1.0
        for p, (i, j) in enumerate(self.pairs):
            x[rows[:, 0], self.pair_offset[p] + rel[:, i] * self.sizes[j] + rel[:, j]] = 1.0
        for i, c, column in self.part_columns:
            x[rel[:, i] == c, column] = 1.0
        return x

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
        x = self.encode(np.array([[t.params[n] for n in self.names]]))[0]
        self.xtx += np.outer(x, x)
        self.xty += x * t.value
        self.xsum += x
        self.complete += 1
        self.total += t.value
        if self.best is None or (t.value, -t.number) > self.best[:2]:
            self.best = (t.value, -t.number, t.params)

    def scores(self, keys: list[tuple], ridge: float) -> np.ndarray:
        """Predicted objective (relative to the best) of each point: ridge regression on the
        indicators over the complete trials, the objective centred."""
        rhs = (self.xty - self.xsum * (self.total / self.complete)) / (self.best[0] or 1.0)
        w = np.linalg.solve(self.xtx + ridge * np.eye(len(rhs)), rhs)
        return self.encode(np.array(keys)) @ w
