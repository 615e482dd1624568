"""Optuna's CMA-ES with a cost per proposal that does not grow with the study.

At each proposal ``optuna.samplers.CmaEsSampler`` scans every trial of the study three times: for
the complete trials, for those of its optimizer's current generation, and back to the newest
complete trial holding the optimizer's state (all the way, for an optimizer restarted under a new
attribute prefix that has stored none yet). ``CmaEs`` reads each trial once (one still running
when read, again at each proposal until it finishes) and keeps those three answers, so it proposes
what CmaEsSampler proposes. Pruned trials are not considered (``consider_pruned_trials``, which the
runner never sets, falls back to CmaEsSampler's scans).
"""

from __future__ import annotations

import optuna
from optuna.trial import TrialState


class CmaEs(optuna.samplers.CmaEsSampler):
    """CmaEsSampler (same arguments, same proposals) that reads each trial of the study once."""

    _kept: _Kept | None = None

    def _catch_up(self, study) -> _Kept:
        trials = study.get_trials(deepcopy=False)
        kept = self._kept
        if kept is None or (kept.storage, kept.study_id, kept.prefix) != (study._storage, study._study_id,
                                                                         self._attr_prefix) or len(trials) < kept.read:
            kept = self._kept = _Kept(study._storage, study._study_id, self._attr_prefix)
        kept.catch_up(trials)
        return kept

    def _get_trials(self, study):
        if self._consider_pruned_trials:
            return super()._get_trials(study)
        return self._catch_up(study).complete

    def _get_solution_trials(self, trials, generation):
        kept = self._kept
        if self._consider_pruned_trials or kept is None or trials is not kept.complete:
            return super()._get_solution_trials(trials, generation)
        return sorted(kept.generations.get(generation, []), key=lambda t: t.number)

    def _restore_optimizer(self, completed_trials):
        kept = self._kept
        if self._consider_pruned_trials or kept is None or completed_trials is not kept.complete:
            return super()._restore_optimizer(completed_trials)
        return super()._restore_optimizer([kept.state] if kept.state is not None else [])


class _Kept:
    """One study's complete trials as one optimizer (attribute ``prefix``) has read them."""

    def __init__(self, storage, study_id: int, prefix: str) -> None:
        self.storage, self.study_id, self.prefix = storage, study_id, prefix
        self.complete: list = []  # in the order they finished (CmaEsSampler counts them, no more)
        self.generations: dict[int, list] = {}  # generation -> its complete trials (sorted when asked)
        self.state = None  # the newest complete trial holding the optimizer's state
        self.read = 0  # trials[:read] were read
        self.running: list[int] = []  # of those, the ones not finished when read

    def catch_up(self, trials) -> None:
        again, self.running = self.running, []
        for i in [*again, *range(self.read, len(trials))]:
            t = trials[i]
            if not t.state.is_finished():
                self.running.append(i)
            elif t.state == TrialState.COMPLETE:
                self.complete.append(t)
                generation = t.system_attrs.get(self.prefix + "generation")
                if generation is not None:
                    self.generations.setdefault(generation, []).append(t)
                holds = any(k.startswith(self.prefix + "optimizer") for k in t.system_attrs)
                if holds and (self.state is None or t.number > self.state.number):
                    self.state = t
        self.read = len(trials)
