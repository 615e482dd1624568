"""search.local.LocalSampler on made-up studies (every objective value below is MADE UP, small
numbers chosen so the expected proposal can be worked out by hand; none is a measurement)."""

from __future__ import annotations

import optuna
import pytest
from optuna.distributions import IntDistribution

from search.local import LocalSampler

DISTS = {"a": IntDistribution(0, 4), "b": IntDistribution(0, 2)}


class Recorder(optuna.samplers.RandomSampler):
    """The fallback: a random sampler that counts the relative proposals asked of it."""

    def __init__(self) -> None:
        super().__init__(seed=0)
        self.asked = 0

    def sample_relative(self, study, trial, search_space):
        self.asked += 1
        return super().sample_relative(study, trial, search_space)


def study_with(points: list[tuple[int, int, float | None]], startup: int = 3) -> tuple[optuna.Study, Recorder]:
    """A study holding made-up trials (a, b, value; None: a pruned trial, as the runner tells an invalid point)."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    fallback = Recorder()
    study = optuna.create_study(direction="maximize", sampler=LocalSampler(fallback, startup=startup, seed=0))
    for a, b, value in points:
        state = optuna.trial.TrialState.COMPLETE if value is not None else optuna.trial.TrialState.PRUNED
        study.add_trial(optuna.trial.create_trial(params={"a": a, "b": b}, distributions=DISTS, value=value,
                                                  state=state))
    return study, fallback


def ask(study: optuna.Study) -> tuple[int, int]:
    trial = study.ask()
    return trial.suggest_int("a", 0, 4), trial.suggest_int("b", 0, 2)


def test_before_startup_the_fallback_proposes():
    study, fallback = study_with([(0, 0, 1.0), (4, 2, 2.0)])
    ask(study)
    assert fallback.asked == 1 and study.sampler.local_proposals == 0


def test_proposes_the_neighbour_of_the_best_that_the_model_ranks_first():
    # made up: b = 0 scores 1 more than b = 1 wherever both were tried; the best is (2, 1). Its
    # untried neighbours: (3, 1), (2, 0), (2, 2); the additive model predicts (2, 0) best (b = 0
    # was seen good; a = 3 and b = 2 were never seen, so the model gives them no gain)
    study, fallback = study_with([(0, 0, 2.0), (0, 1, 1.0), (1, 0, 2.0), (1, 1, 1.0), (2, 1, 3.0)])
    assert ask(study) == (2, 0)
    assert fallback.asked == 0 and study.sampler.local_proposals == 1


def test_tried_points_are_not_proposed_again_pruned_ones_included():
    # made up: as above, but (2, 0) was tried and pruned (invalid): the next neighbour
    study, _ = study_with([(0, 0, 2.0), (0, 1, 1.0), (1, 0, 2.0), (1, 1, 1.0), (2, 1, 3.0), (2, 0, None)])
    assert ask(study) in {(3, 1), (2, 2)}


def test_a_spent_neighbourhood_hands_over_to_the_fallback():
    # made up: every one-step neighbour of the best (2, 1) is tried
    study, fallback = study_with([(2, 1, 5.0), (1, 1, 1.0), (3, 1, 1.0), (2, 0, 1.0), (2, 2, None)])
    ask(study)
    assert fallback.asked == 1 and study.sampler.local_proposals == 0


@pytest.mark.parametrize("corner", [(0, 0), (4, 2)])
def test_neighbours_stay_inside_the_space(corner):
    a, b = corner
    study, _ = study_with([(a, b, 9.0), (2, 1, 1.0), (1, 1, 1.0)])
    got = ask(study)
    assert 0 <= got[0] <= 4 and 0 <= got[1] <= 2 and abs(got[0] - a) + abs(got[1] - b) == 1


def test_the_state_kept_between_proposals_is_what_a_refit_over_the_study_gives():
    # made up: a random objective over a 3-dimension space, asked with up to 3 trials running at
    # once (as the runner's lookahead does), some pruned; after each proposal the sampler's kept
    # state (tried points, best, model) must equal one computed afresh from every trial
    import random

    import numpy as np

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    dists = {"a": IntDistribution(0, 5), "b": IntDistribution(0, 3), "c": IntDistribution(1, 4)}
    names = sorted(dists)
    sampler = LocalSampler(optuna.samplers.RandomSampler(seed=1), startup=4, seed=0)
    study = optuna.create_study(direction="maximize", sampler=sampler)
    rng, running, checked = random.Random(2), [], 0
    for _ in range(120):
        trial = study.ask()
        params = {n: trial.suggest_int(n, dists[n].low, dists[n].high) for n in names}
        running.append((trial, params))
        if len(running) > rng.randrange(1, 4):
            done, p = running.pop(rng.randrange(len(running)))
            if rng.random() < 0.2:
                study.tell(done, state=optuna.trial.TrialState.PRUNED)
            else:
                study.tell(done, float(sum((i + 1) * p[n] for i, n in enumerate(names)) % 7 + rng.random()))
        seen = sampler._seen
        trials = study.get_trials(deepcopy=False)
        complete = [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE]
        if seen is None or len(complete) < 4:
            continue
        sampler._read(study, names, dists)
        assert seen.tried == {tuple(t.params[n] for n in names) for t in trials if len(t.params) == 3}
        best = max(complete, key=lambda t: t.value)
        assert seen.complete == len(complete) and seen.best[2] == best.params
        # the model as it was refit from every complete trial at each proposal
        offset, cols = {}, 0
        for n in names:
            offset[n], cols = cols - dists[n].low, cols + dists[n].high - dists[n].low + 1
        x = np.zeros((len(complete), cols))
        for row, t in enumerate(complete):
            for n in names:
                x[row, offset[n] + t.params[n]] = 1.0
        y = np.array([t.value for t in complete]) / best.value
        w = np.linalg.solve(x.T @ x + sampler.ridge * np.eye(cols), x.T @ (y - y.mean()))
        points = [{n: rng.randint(dists[n].low, dists[n].high) for n in names} for _ in range(5)]
        expected = [sum(w[offset[n] + p[n]] for n in names) for p in points]
        assert np.allclose(seen.scores(points, sampler.ridge), expected, rtol=1e-9, atol=1e-12)
        checked += 1
    assert checked > 80 and sampler.local_proposals > 5
