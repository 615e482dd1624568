"""search.cmaes.CmaEs proposes what Optuna's CmaEsSampler proposes (objective values below are
MADE UP: a fixed function of the point, not a measurement)."""

from __future__ import annotations

import random

import optuna
import pytest
from optuna.distributions import IntDistribution

from search.cmaes import CmaEs

DISTS = {"a": IntDistribution(0, 9), "b": IntDistribution(0, 5), "c": IntDistribution(0, 7)}


def proposals(cls, restart_at: int | None = None) -> list[dict]:
    """120 proposals with up to 4 trials running at once and a fifth of them pruned; the same
    concurrency for either class while the proposals agree. At ``restart_at`` a fresh optimizer
    under another attribute prefix takes over (as the runner restarts a converged one)."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="maximize", sampler=cls(seed=3, warn_independent_sampling=False))
    rng, running, out = random.Random(5), [], []
    for i in range(120):
        if i == restart_at:
            study.sampler = cls(seed=4, x0=dict(study.best_trial.params), warn_independent_sampling=False)
            study.sampler._attr_prefix = "cma1:"
        trial = study.ask()
        p = {n: trial.suggest_int(n, d.low, d.high) for n, d in DISTS.items()}
        out.append(p)
        running.append((trial, p))
        while len(running) > rng.randrange(1, 5):
            t, q = running.pop(rng.randrange(len(running)))
            if (q["a"] + q["b"]) % 5 == 0:
                study.tell(t, state=optuna.trial.TrialState.PRUNED)
            else:
                study.tell(t, -float((q["a"] - 6) ** 2 + (q["b"] - 2) ** 2 + (q["c"] - 3) ** 2))
    return out


@pytest.mark.parametrize("restart_at", [None, 60])
def test_proposes_what_optunas_cmaes_proposes(restart_at):
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # x0
        expected = proposals(optuna.samplers.CmaEsSampler, restart_at)
        got = proposals(CmaEs, restart_at)
    assert got == expected and len({tuple(p.values()) for p in got}) > 30
