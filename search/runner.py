"""The study runner: Optuna proposes points of the space, a measurer evaluates them.

Budget counts evaluated (compiled and run) trials, across runs of the same study. Invalid points
and points already measured are answered without the GPU and cost nothing; a long run of them
ends the search with a message instead of looping. Every evaluated trial is written to the store
as soon as it finishes. "Already measured" means measured with the same source: a result is reused
only for the (kernel name, source hash) it was measured with, so a template change measures anew.
"""

from __future__ import annotations

import collections
import time
import warnings
from dataclasses import dataclass, field

import optuna
from tqdm import tqdm

from codegen.evaluate import blank_result
from codegen.problem import Problem
from search.space import Space

SAMPLERS = ("tpe", "random", "grid", "cmaes", "gp")


def make_sampler(name: str, seed: int | None, space: Space) -> optuna.samplers.BaseSampler:
    if name == "tpe":
        return optuna.samplers.TPESampler(seed=seed, multivariate=True, constant_liar=True, n_startup_trials=16)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "grid":
        return optuna.samplers.GridSampler({k: list(range(len(v))) for k, v in space.dims.items()}, seed=seed)
    if name == "cmaes":
        return optuna.samplers.CmaEsSampler(seed=seed, warn_independent_sampling=False)
    if name == "gp":
        try:
            import scipy  # noqa: F401
            import torch  # noqa: F401
        except ImportError as e:
            raise SystemExit(f"codegen search: the gp sampler needs torch and scipy ({e.name} is missing)") from None
        return optuna.samplers.GPSampler(seed=seed)
    raise ValueError(f"unknown sampler {name!r}; choose from {', '.join(SAMPLERS)}")


@dataclass
class Summary:
    study: str
    budget: int
    evaluated: int  # in the study, all runs
    evaluated_now: int
    proposals: int
    best: dict | None
    failures: collections.Counter = field(default_factory=collections.Counter)
    wall_s: float = 0.0
    gpu_wait_s: float = 0.0
    stopped: str = ""
    history: list[float] = field(default_factory=list)  # best-so-far TFLOP/s per evaluated trial


def study_name(problem: Problem, space_name: str, sampler: str, seed: int | None, device: str) -> str:
    return f"gemmscape:{problem.key}:{space_name}:{sampler}:seed{seed}:{device}"


def run_search(
    problem: Problem,
    space: Space,
    measurer,
    *,
    sampler: str = "tpe",
    seed: int | None = 0,
    budget: int = 200,
    space_name: str = "full",
    store=None,
    lookahead: int = 4,
    max_idle: int = 2000,
    progress: bool = True,
    command: str = "",
    versions: dict | None = None,
    seeds: list[dict] | None = None,
) -> Summary:
    """Search ``space`` for ``problem`` until ``budget`` trials are evaluated.

    ``seeds`` are points (values, as ``search.space.point_of`` gives) tried first when the study
    is new: known-good variants the sampler then builds on. Points outside the space are skipped.
    """
    if budget < 1:
        raise ValueError("budget must be >= 1")
    started = time.monotonic()
    device = measurer.device
    name = study_name(problem, space_name, sampler, seed, device.get("name", "?"))
    storage = None
    if store is not None:
        storage = optuna.storages.RDBStorage(store.optuna_url(), engine_kwargs=store.optuna_engine_kwargs())
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    study = optuna.create_study(study_name=name, storage=storage, sampler=make_sampler(sampler, seed, space),
                                direction="maximize", load_if_exists=True)

    if seeds and not study.get_trials(deepcopy=False):
        for point in seeds:
            indices = space.indices(point)
            if indices is not None:
                study.enqueue_trial(indices, skip_if_exists=True)

    # What earlier runs of this study measured (a killed run leaves RUNNING trials: fail them),
    # by (kernel, source hash); trials that carry no hash are never reused.
    seen: dict[tuple[str, str], float] = {}
    evaluated = 0
    best: dict | None = None
    for t in study.get_trials(deepcopy=False):
        if t.state == optuna.trial.TrialState.RUNNING:
            study.tell(t.number, state=optuna.trial.TrialState.FAIL)
        elif t.state == optuna.trial.TrialState.COMPLETE and "kernel" in t.user_attrs:
            if t.user_attrs.get("source_hash"):
                seen[(t.user_attrs["kernel"], t.user_attrs["source_hash"])] = t.value
            if t.user_attrs.get("evaluated"):
                evaluated += 1
                if t.value > 0 and (best is None or t.value > best["tflops"]):
                    best = {"kernel": t.user_attrs["kernel"], "tflops": t.value, "ratio": t.user_attrs.get("ratio", {})}

    device_id = store.device(device) if store is not None else None
    run_id = None
    if store is not None:
        run_id = store.start_run(problem, device_id, space.family, sampler, seed, budget, name,
                                 versions or {}, command)
    limits = measurer.limits
    summary = Summary(name, budget, evaluated, 0, 0, best)
    in_flight: dict[str, list] = {}  # kernel name -> trials waiting on its measurement
    invalid_stored: set[str] = set()
    idle = 0
    bar = tqdm(total=budget, initial=min(evaluated, budget), desc=problem.key, unit="trial", disable=not progress,
               dynamic_ncols=True)

    def tell(trial, value: float, status: str, measured: bool, ratio: dict | None = None,
             source: str | None = None) -> None:
        trial.set_user_attr("status", status)
        if source:
            trial.set_user_attr("source_hash", source)
        trial.set_user_attr("evaluated", measured)
        if ratio:
            trial.set_user_attr("ratio", ratio)
        study.tell(trial, value)

    try:
        while True:
            while len(measurer) < lookahead and summary.evaluated + len(measurer) < budget and idle < max_idle:
                trial = study.ask()
                summary.proposals += 1
                point = {k: v[trial.suggest_int(k, 0, len(v) - 1)] for k, v in space.dims.items()}
                spec = space.spec(point, problem)
                trial.set_user_attr("kernel", spec.name)
                reasons = spec.check(problem, limits)
                if reasons:
                    tell(trial, 0.0, "invalid", False)
                    if store is not None and spec.name not in invalid_stored:
                        invalid_stored.add(spec.name)
                        store.add_trial(run_id, spec.name, measurer.arch, problem, device_id, trial.number,
                                        blank_result("invalid", "; ".join(reasons)), spec.to_dict(), source_hash=None)
                    idle += 1
                    continue
                if spec.name in in_flight:
                    in_flight[spec.name].append(trial)
                    idle += 1
                    continue
                source = measurer.source_hash(spec)
                known = seen.get((spec.name, source)) if source else None
                if known is None and store is not None and source:
                    stored = store.known_result(problem, device_id, spec.name, source)
                    if stored is not None:
                        known = stored["tflops"] if stored["status"] == "ok" else 0.0
                if known is not None:
                    tell(trial, known, "known", False, source=source)
                    idle += 1
                    continue
                in_flight[spec.name] = [trial]
                measurer.submit(trial, spec)
                idle = 0
            if len(measurer) == 0:
                break
            done = measurer.next_done()
            result = done.result
            status = result["status"]
            value = result["tflops"] if status == "ok" else 0.0
            measured = done.kernel.get("source_hash")
            waiting = in_flight.pop(done.spec.name, [done.tag])
            tell(waiting[0], value, status, True, result.get("ratio"), source=measured)
            for other in waiting[1:]:
                tell(other, value, "known", False, source=measured)
            if measured:
                seen[(done.spec.name, measured)] = value
            if store is not None:
                store.kernel(done.kernel)
                store.add_trial(run_id, done.spec.name, done.kernel.get("arch", measurer.arch), problem, device_id,
                                waiting[0].number, result, done.spec.to_dict(), source_hash=measured)
            summary.evaluated += 1
            summary.evaluated_now += 1
            if status != "ok":
                summary.failures[status] += 1
            elif summary.best is None or value > summary.best["tflops"]:
                summary.best = {"kernel": done.spec.name, "tflops": value,
                                **{k: result.get(k) for k in ("median_ms", "p20_ms", "p80_ms", "gbps", "baselines")},
                                "ratio": result.get("ratio", {})}
            summary.history.append(summary.best["tflops"] if summary.best else 0.0)
            bar.update(1)
            bar.set_postfix_str(_postfix(summary), refresh=False)
        if idle >= max_idle:
            summary.stopped = (f"stopped after {max_idle} proposals in a row that were invalid or already measured: "
                               f"the {sampler} sampler finds nothing new in this space")
        elif summary.evaluated >= budget:
            summary.stopped = "budget reached"
    finally:
        bar.close()
        summary.wall_s = time.monotonic() - started
        summary.gpu_wait_s = getattr(measurer, "gpu_wait_seconds", 0.0)
        if store is not None and run_id is not None:
            store.end_run(run_id)
    return summary


def _postfix(s: Summary) -> str:
    parts = []
    if s.best:
        parts.append(f"best {s.best['tflops']:.2f} TFLOP/s")
        if s.best.get("ratio", {}).get("cublas"):
            parts.append(f"{s.best['ratio']['cublas']:.2f}x cuBLAS")
    if s.failures:
        parts.append("fail " + ",".join(f"{k}:{v}" for k, v in sorted(s.failures.items())))
    return " ".join(parts)
