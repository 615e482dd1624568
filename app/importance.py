"""Parameter importances from Optuna, computed in memory from stored trials (no DB writes)."""

from __future__ import annotations

import math
from typing import Any

MIN_TRIALS = 5
SCALAR = (bool, int, float, str)


def varying_params(rows: list[dict[str, Any]]) -> dict[str, list[Any]]:
    """Spec parameters that take at least two values across ``rows``, with those values."""
    values: dict[str, set[Any]] = {}
    for row in rows:
        for key, value in row["params"].items():
            if key != "family" and isinstance(value, SCALAR):
                values.setdefault(key, set()).add(value)
    return {key: sorted(vals, key=str) for key, vals in values.items() if len(vals) > 1}


def param_importances(rows: list[dict[str, Any]], objective: str = "tflops") -> tuple[dict[str, float] | None, str]:
    """fANOVA importances of the spec parameters for ``objective`` over the ok trials in ``rows``.

    Returns (importances or None, a note saying what was used or why nothing could be computed).
    """
    ok = [r for r in rows if r["status"] == "ok" and isinstance(r.get(objective), int | float)]
    ok = [r for r in ok if math.isfinite(r[objective])]
    if len(ok) < MIN_TRIALS:
        return None, f"Parameter importances need at least {MIN_TRIALS} ok trials; {len(ok)} match the filters."
    params = varying_params(ok)
    ok = [r for r in ok if all(key in r["params"] for key in params)]
    if not params or len(ok) < MIN_TRIALS:
        return None, "No spec parameter varies across the matching ok trials."
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    dists = {key: optuna.distributions.CategoricalDistribution(vals) for key, vals in params.items()}
    study = optuna.create_study(direction="maximize")  # in-memory storage
    study.add_trials(
        [
            optuna.trial.create_trial(
                params={k: r["params"][k] for k in params}, distributions=dists, value=r[objective]
            )
            for r in ok
        ]
    )
    method, evaluator = evaluator_at_hand(optuna)
    try:
        found = optuna.importance.get_param_importances(study, evaluator=evaluator)
    except (RuntimeError, ValueError) as err:
        return None, f"Optuna could not compute importances: {err}"
    return dict(found), f"Optuna {method} over {len(ok)} ok trials, objective {objective}."


def evaluator_at_hand(optuna: Any) -> tuple[str, Any]:
    """fANOVA where scikit-learn is installed (Optuna's default), else PED-ANOVA (numpy only)."""
    try:
        import sklearn  # noqa: F401
    except ImportError:
        return "PED-ANOVA", optuna.importance.PedAnovaImportanceEvaluator()
    return "fANOVA", optuna.importance.FanovaImportanceEvaluator(seed=0)
