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
