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


def study_of(dists: dict, points: list[tuple], **structure) -> optuna.Study:
    """A study over ``dists`` holding made-up complete trials (the point's values in ``dists``' order, then the value)."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="maximize", sampler=LocalSampler(Recorder(), startup=3, seed=0, **structure))
    for *values, value in points:
        study.add_trial(optuna.trial.create_trial(params=dict(zip(dists, values, strict=True)), distributions=dists,
                                                  value=value))
    return study


def ask_all(study: optuna.Study, dists: dict) -> tuple[int, ...]:
    trial = study.ask()
    return tuple(trial.suggest_int(n, d.low, d.high) for n, d in dists.items())


WIDE = {"a": IntDistribution(0, 1), "b": IntDistribution(0, 4)}


def test_an_unordered_dimension_moves_to_any_choice():
    # made up: b = 4 was seen best where tried; the best is (1, 0). Ordered, b's neighbours of 0 are
    # 1 only; unordered (b's choices are names, not magnitudes), 4 is one move away and ranks first
    points = [(0, 4, 3.0), (0, 0, 2.0), (0, 1, 1.0), (1, 0, 4.0)]
    assert ask_all(study_of(WIDE, points, unordered=["b"]), WIDE) == (1, 4)
    assert ask_all(study_of(WIDE, points), WIDE) == (1, 1)


def test_a_linked_pair_moves_together_before_the_fallback_takes_over():
    # made up: every one-dimension neighbour of the best (1, 2) is tried (b is ordered: 1 and 3);
    # with a and b linked, a move of both is next (not the fallback), and the model picks b = 4,
    # seen good at (1, 4)
    points = [(1, 2, 5.0), (0, 2, 1.0), (1, 1, 1.0), (1, 3, 1.0), (1, 4, 4.0)]
    study = study_of(WIDE, points, linked=[("a", "b")])
    assert ask_all(study, WIDE) == (0, 4) and study.sampler.local_proposals == 1
    unlinked = study_of(WIDE, points)
    ask_all(unlinked, WIDE)
    assert unlinked.sampler.local_proposals == 0 and unlinked.sampler.fallback.asked == 1


def test_what_a_choice_is_made_of_carries_to_choices_not_tried():
    # made up: s's choices are (2, x), (2, y), (4, x), (4, y); (2, x) was good and (4, x) poor. Of
    # the untried (2, y) and (4, y), the model ranks (2, y) first by its part 2; without the parts
    # the two tie (and a random one of them is proposed)
    dists = {"a": IntDistribution(0, 1), "s": IntDistribution(0, 3)}
    parts = {"s": [(2, "x"), (2, "y"), (4, "x"), (4, "y")]}
    points = [(0, 0, 3.0), (0, 2, 1.0), (1, 0, 4.0)]
    for seed in range(5):
        study = study_of(dists, points, unordered=["s"], parts=parts)
        study.sampler._rng.seed(seed)
        assert ask_all(study, dists) == (1, 1)
    assert ask_all(study_of(dists, points, unordered=["s"]), dists) in {(1, 1), (1, 3)}


def test_the_state_kept_between_proposals_is_what_a_refit_over_the_study_gives():
    # made up: a random objective over a 3-dimension space (one dimension unordered, two linked, one
    # made of parts), asked with up to 3 trials running at once (as the runner's lookahead does),
    # some pruned; after each proposal the sampler's kept state (tried points, best, model) must
    # equal one computed afresh from every trial
    import random

    import numpy as np

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    dists = {"a": IntDistribution(0, 5), "b": IntDistribution(0, 3), "c": IntDistribution(1, 4)}
    names = sorted(dists)
    parts = {"c": [("p", 0), ("p", 1), ("q", 0), ("q", 1), ("r", 1)]}  # by choice index 0..4 (c takes 1..4)
    sampler = LocalSampler(optuna.samplers.RandomSampler(seed=1), startup=4, seed=0, unordered=["c"],
                           linked=[("a", "b")], parts=parts)
    study = optuna.create_study(direction="maximize", sampler=sampler)
    rng, running, checked = random.Random(2), [], 0

    def columns(p: dict) -> list[tuple]:
        cols = [(n, p[n]) for n in names] + [("a*b", p["a"], p["b"])]
        return cols + [("c", i, part) for i, part in enumerate(parts["c"][p["c"]])]

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
        # the model as it was refit from every complete trial at each proposal: one indicator per
        # (dimension, choice), per (a, b) pair of choices, per (position, part) of c's choice
        vocab = sorted({col for t in complete for col in columns(t.params)}, key=repr)
        where = {col: i for i, col in enumerate(vocab)}
        x = np.zeros((len(complete), len(vocab)))
        for row, t in enumerate(complete):
            x[row, [where[col] for col in columns(t.params)]] = 1.0
        y = np.array([t.value for t in complete]) / best.value
        w = np.linalg.solve(x.T @ x + sampler.ridge * np.eye(len(vocab)), x.T @ (y - y.mean()))
        points = [{n: rng.randint(dists[n].low, dists[n].high) for n in names} for _ in range(5)]
        expected = [sum(w[where[col]] for col in columns(p) if col in where) for p in points]
        got = seen.scores([tuple(p[n] for n in names) for p in points], sampler.ridge)
        assert np.allclose(got, expected, rtol=1e-9, atol=1e-12)
        checked += 1
    assert checked > 80 and sampler.local_proposals > 5
