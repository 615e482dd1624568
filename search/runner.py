"""The study runner: Optuna proposes points of the space, a measurer evaluates them.

Budget counts evaluated (compiled and run) trials, across runs of the same study. Invalid points
and points already measured are answered without the GPU and cost nothing; a long run of them
ends the search with a message instead of looping. Every evaluated trial is written to the store
as soon as it finishes. "Already measured" means measured with the same source: a result is reused
only for the (kernel name, source hash) it was measured with, so a template change measures anew.

Several processes may run one study (or overlapping ones) against one database: each kernel is
claimed in the store before it is measured (store.coord), so none is measured twice for a problem
and device, and the budget is counted from the store, so together they spend no more than it. A
kernel another process is measuring is waited for and its result reused.

How a search ends: the budget, a long run of proposals that bring nothing new, N identical
failures in a row (a message), Ctrl-C or SIGTERM (``Interrupted``: one line saying how to resume;
the run is marked ended), or an exception in gemmscape's own code (``InternalError``: a bug, never
stored as a kernel's failure). A run killed outright is marked ended by the next run on its store.
"""

from __future__ import annotations

import collections
import re
import signal
import threading
import time
import warnings
from dataclasses import dataclass, field

import optuna
from tqdm import tqdm

from codegen.evaluate import InternalError, blank_result
from codegen.problem import Problem
from search.space import Space

SAMPLERS = ("tpe", "random", "grid", "cmaes", "gp")
#: Identical failures in a row (same status, same evidence but for numbers and kernel names)
#: after which a search stops: something other than the kernels is broken.
MAX_SAME_FAILURES = 10


class Interrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM ended the search; the message is one line saying how to resume."""


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
    evaluated: int  # in the study, all runs (all processes)
    evaluated_now: int
    proposals: int
    best: dict | None
    failures: collections.Counter = field(default_factory=collections.Counter)
    wall_s: float = 0.0
    gpu_wait_s: float = 0.0
    stopped: str = ""
    history: list[float] = field(default_factory=list)  # best-so-far TFLOP/s per evaluated trial
    run_id: int | None = None


def study_name(problem: Problem, space_name: str, sampler: str, seed: int | None, device: str) -> str:
    return f"gemmscape:{problem.key}:{space_name}:{sampler}:seed{seed}:{device}"


def failure_signature(status: str, evidence: str, kernel: str) -> tuple[str, str]:
    """What makes two failures "the same": status and evidence, kernel names and numbers aside."""
    text = (evidence or "").replace(kernel, "<kernel>")
    text = re.sub(r"\b(simt|tc)_\w+", "<kernel>", text)
    return status, re.sub(r"\d+(\.\d+)?", "#", text).strip()[-500:]


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
    max_same_failures: int = MAX_SAME_FAILURES,
    poll_s: float = 0.2,
) -> Summary:
    """Search ``space`` for ``problem`` until ``budget`` trials are evaluated.

    ``seeds`` are points (values, as ``search.space.point_of`` gives) tried first when the study
    is new: known-good variants the sampler then builds on. Points outside the space are skipped.
    Raises ``Interrupted`` on Ctrl-C or SIGTERM and ``InternalError`` when gemmscape's own code
    fails; the run is marked ended either way.
    """
    if budget < 1:
        raise ValueError("budget must be >= 1")
    search = _Search(problem, space, measurer, sampler=sampler, seed=seed, budget=budget, space_name=space_name,
                     store=store, lookahead=lookahead, max_idle=max_idle, max_same_failures=max_same_failures,
                     poll_s=poll_s, seeds=seeds, command=command, versions=versions or {})
    return search.run(progress)


class _Search:
    """One run of a study: the proposal loop and its bookkeeping (see run_search)."""

    def __init__(self, problem: Problem, space: Space, measurer, *, sampler: str, seed: int | None, budget: int,
                 space_name: str, store, lookahead: int, max_idle: int, max_same_failures: int, poll_s: float,
                 seeds: list[dict] | None, command: str, versions: dict) -> None:
        self.started = time.monotonic()
        self.problem, self.space, self.measurer, self.store = problem, space, measurer, store
        self.budget, self.max_idle, self.poll_s = budget, max_idle, poll_s
        self.lookahead = max(lookahead, getattr(measurer, "lookahead", 0) or 0)  # several GPUs want more
        self.max_same_failures = max_same_failures
        self.sampler = sampler
        self.name = study_name(problem, space_name, sampler, seed, measurer.device.get("name", "?"))
        self.limits = measurer.limits
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
        self.device_id = self.run_id = None
        self.seen: dict[tuple[str, str], float] = {}
        sampler_obj = make_sampler(sampler, seed, space)
        if store is None:
            self.study = optuna.create_study(study_name=self.name, sampler=sampler_obj, direction="maximize")
            self._enqueue(seeds)
            evaluated, best = self._resume()
        else:
            storage = store.optuna_storage()
            self.device_id = store.device(measurer.device)
            with store.setup_lock():  # one process at a time creates the study, seeds it, reaps the dead
                store.reap_dead_runs()
                self.study = optuna.create_study(study_name=self.name, storage=storage, sampler=sampler_obj,
                                                 direction="maximize", load_if_exists=True)
                self._enqueue(seeds)
                evaluated, best = self._resume()
                self.run_id = store.start_run(problem, self.device_id, space.family, sampler, seed, budget, self.name,
                                              versions, command)
        self.summary = Summary(self.name, budget, evaluated, 0, 0, best, run_id=self.run_id)
        self.in_flight: dict[str, list] = {}  # kernel name -> trials waiting on our measurement of it
        self.waiting: dict[str, tuple[list, str, object]] = {}  # kernel name -> (trials, source, spec): another run measures it
        self.invalid_stored: set[str] = set()
        self.claimed: set[str] = set()  # kernels in flight under a claim (counted by the store's budget)
        self.idle = 0
        self.same: tuple[tuple[str, str] | None, int] = (None, 0)
        self.last_reap = time.monotonic()

    # ---- set-up ---------------------------------------------------------------------------------
    def _enqueue(self, seeds: list[dict] | None) -> None:
        if seeds and not self.study.get_trials(deepcopy=False):
            for point in seeds:
                indices = self.space.indices(point)
                if indices is not None:
                    self.study.enqueue_trial(indices, skip_if_exists=True)

    def _resume(self) -> tuple[int, dict | None]:
        """What earlier runs of this study measured, by (kernel, source hash); trials that carry no
        hash are never reused. Trials left RUNNING by a run that is over are failed."""
        live = self.store.open_runs(self.name) if self.store is not None else set()
        others_live = bool(live)
        evaluated = 0
        best: dict | None = None
        for t in self.study.get_trials(deepcopy=False):
            if t.state == optuna.trial.TrialState.RUNNING:
                owner = t.user_attrs.get("run")
                if (owner is None and not others_live) or (owner is not None and owner not in live):
                    self._fail(t.number)
            elif t.state == optuna.trial.TrialState.COMPLETE and "kernel" in t.user_attrs:
                if t.user_attrs.get("source_hash"):
                    self.seen[(t.user_attrs["kernel"], t.user_attrs["source_hash"])] = t.value
                if t.user_attrs.get("evaluated"):
                    evaluated += 1
                    if t.value > 0 and (best is None or t.value > best["tflops"]):
                        best = {"kernel": t.user_attrs["kernel"], "tflops": t.value,
                                "ratio": t.user_attrs.get("ratio", {})}
        if self.store is not None:
            evaluated = self.store.count_trials(self.name, evaluated_only=True)
        return evaluated, best

    def _fail(self, number: int) -> None:
        try:
            self.study.tell(number, state=optuna.trial.TrialState.FAIL)
        except (RuntimeError, ValueError):  # finished meanwhile by the process that owns it
            pass

    # ---- the loop -------------------------------------------------------------------------------
    def run(self, progress: bool) -> Summary:
        s = self.summary
        self.bar = tqdm(total=self.budget, initial=min(s.evaluated, self.budget), desc=self.problem.key,
                        unit="trial", disable=not progress, dynamic_ncols=True)
        outcome, note = "finished", ""
        beat = _Heartbeat(self.store, self.run_id)
        old_term = _sigterm_as_interrupt()
        try:
            self._loop()
            outcome, note = ("stopped" if s.stopped.startswith("stopped") else "finished"), s.stopped
        except KeyboardInterrupt:
            outcome, note = "interrupted", "Ctrl-C or SIGTERM"
            raise Interrupted(self._resume_hint()) from None
        except InternalError as e:
            outcome, note = "failed", str(e)[-500:]
            raise
        except Exception as e:
            outcome, note = "failed", f"{type(e).__name__}: {e}"[-500:]
            raise InternalError(f"gemmscape's own code failed ({type(e).__name__}: {e}); the search stopped. "
                                f"This is a bug, not a kernel's failure: nothing was stored for it") from e
        finally:
            _restore_sigterm(old_term)
            beat.stop()
            self.bar.close()
            s.wall_s = time.monotonic() - self.started
            s.gpu_wait_s = getattr(self.measurer, "gpu_wait_seconds", 0.0)
            self._close(outcome, note)
        return s

    def _loop(self) -> None:
        s = self.summary
        while True:
            self._propose()
            if self.waiting:
                self._poll_waiting()
            if s.stopped:
                break
            if len(self.measurer) == 0:
                if not self.waiting:
                    break
                time.sleep(self.poll_s)
                continue
            self._finish(self.measurer.next_done())
        if s.stopped:
            return
        if self.idle >= self.max_idle:
            s.stopped = (f"stopped after {self.max_idle} proposals in a row that were invalid or already measured: "
                         f"the {self.sampler} sampler finds nothing new in this space")
        else:
            s.stopped = "budget reached"

    def _room(self) -> bool:
        """Whether the budget allows one more measurement (across processes, with a store)."""
        if self.store is not None:  # what every process spent, and our measurements that hold no claim
            unclaimed = sum(1 for name in self.in_flight if name not in self.claimed)
            return self.store.used_budget(self.name) + unclaimed < self.budget
        return self.summary.evaluated + len(self.measurer) < self.budget

    def _propose(self) -> None:
        s, store, m = self.summary, self.store, self.measurer
        while len(m) < self.lookahead and self.idle < self.max_idle and not s.stopped and self._room():
            trial = self.study.ask()
            s.proposals += 1
            if self.run_id is not None:
                trial.set_user_attr("run", self.run_id)
            point = {k: v[trial.suggest_int(k, 0, len(v) - 1)] for k, v in self.space.dims.items()}
            spec = self.space.spec(point, self.problem)
            trial.set_user_attr("kernel", spec.name)
            reasons = spec.check(self.problem, self.limits)
            if reasons:
                self._tell(trial, 0.0, "invalid", False)
                if store is not None and spec.name not in self.invalid_stored:
                    self.invalid_stored.add(spec.name)
                    store.add_trial(self.run_id, spec.name, m.arch, self.problem, self.device_id, trial.number,
                                    blank_result("invalid", "; ".join(reasons)), spec.to_dict(), source_hash=None)
                self.idle += 1
                continue
            if spec.name in self.in_flight or spec.name in self.waiting:
                (self.in_flight.get(spec.name) or self.waiting[spec.name][0]).append(trial)
                self.idle += 1
                continue
            source = m.source_hash(spec)
            known = self._known(spec.name, source)
            if known is None and store is not None and source:
                got = store.claim(self.run_id, self.problem, self.device_id, spec.name, m.arch, source,
                                  study=self.name, budget=self.budget)
                if got == "budget":
                    self._tell_state(trial, "budget")
                    return
                if got == "taken":
                    known = self._known(spec.name, source)
                    if known is None:
                        self.waiting[spec.name] = ([trial], source, spec)
                        self.idle += 1
                        continue
                else:
                    self.claimed.add(spec.name)
            if known is not None:
                self._tell(trial, known, "known", False, source=source)
                self.idle += 1
                continue
            self.in_flight[spec.name] = [trial]
            m.submit(trial, spec)
            self.idle = 0

    def _known(self, name: str, source: str | None) -> float | None:
        if not source:
            return None
        known = self.seen.get((name, source))
        if known is None and self.store is not None:
            stored = self.store.known_result(self.problem, self.device_id, name, source)
            if stored is not None:
                known = stored["tflops"] if stored["status"] == "ok" else 0.0
        return known

    def _poll_waiting(self) -> None:
        """Kernels another run was measuring: take its result, or the claim if it gave it up."""
        if time.monotonic() - self.last_reap > 5.0:
            self.store.reap_dead_runs()
            self.last_reap = time.monotonic()
        for name, (trials, source, spec) in list(self.waiting.items()):
            known = self._known(name, source)
            if known is None:
                got = self.store.claim(self.run_id, self.problem, self.device_id, name, self.measurer.arch, source,
                                       study=self.name, budget=self.budget)
                if got == "taken":
                    continue
                del self.waiting[name]
                if got == "budget":
                    for t in trials:
                        self._tell_state(t, "budget")
                    continue
                self.in_flight[name] = trials
                self.claimed.add(name)
                self.measurer.submit(trials[0], spec)
                continue
            del self.waiting[name]
            for t in trials:
                self._tell(t, known, "known", False, source=source)

    def _finish(self, done) -> None:
        s, m = self.summary, self.measurer
        result = done.result
        status = result["status"]
        value = result["tflops"] if status == "ok" else 0.0
        measured = done.kernel.get("source_hash")
        waiting = self.in_flight.pop(done.spec.name, [done.tag])
        self.claimed.discard(done.spec.name)
        if self.store is not None:  # stored first: a store failure must not leave a told trial unstored
            self.store.kernel(done.kernel)
            self.store.add_trial(self.run_id, done.spec.name, done.kernel.get("arch", m.arch), self.problem,
                                 self.device_id, waiting[0].number, result, done.spec.to_dict(), source_hash=measured)
        self._tell(waiting[0], value, status, True, result.get("ratio"), source=measured)
        for other in waiting[1:]:
            self._tell(other, value, "known", False, source=measured)
        if measured:
            self.seen[(done.spec.name, measured)] = value
        s.evaluated += 1
        s.evaluated_now += 1
        if status != "ok":
            s.failures[status] += 1
        elif s.best is None or value > s.best["tflops"]:
            s.best = {"kernel": done.spec.name, "tflops": value,
                      **{k: result.get(k) for k in ("median_ms", "p20_ms", "p80_ms", "gbps", "baselines")},
                      "ratio": result.get("ratio", {})}
        s.history.append(s.best["tflops"] if s.best else 0.0)
        self.bar.update(1)
        self.bar.set_postfix_str(_postfix(s), refresh=False)
        self._count_failure(status, result.get("evidence", ""), done.spec.name)

    def _count_failure(self, status: str, evidence: str, kernel: str) -> None:
        if status == "ok":
            self.same = (None, 0)
            return
        sig = failure_signature(status, evidence, kernel)
        n = self.same[1] + 1 if sig == self.same[0] else 1
        self.same = (sig, n)
        if n >= self.max_same_failures:
            last = (evidence or "").strip().splitlines()[-1:] or [""]
            self.summary.stopped = (f"stopped after {n} identical failures in a row ({status}: {last[0][:200]}): "
                                    f"something other than the kernels is wrong; fix it, then run the same "
                                    f"command again to resume")

    def _tell(self, trial, value: float, status: str, measured: bool, ratio: dict | None = None,
              source: str | None = None) -> None:
        trial.set_user_attr("status", status)
        if source:
            trial.set_user_attr("source_hash", source)
        trial.set_user_attr("evaluated", measured)
        if ratio:
            trial.set_user_attr("ratio", ratio)
        self.study.tell(trial, value)

    def _tell_state(self, trial, status: str) -> None:
        """A proposal that was not evaluated (the budget was spent elsewhere): not an observation."""
        trial.set_user_attr("status", status)
        self.study.tell(trial, state=optuna.trial.TrialState.FAIL)

    # ---- ending ---------------------------------------------------------------------------------
    def _resume_hint(self) -> str:
        s = self.summary
        if self.store is None:
            return (f"interrupted after {s.evaluated_now} evaluated trials; nothing was stored, "
                    f"so a new run starts from the beginning")
        evaluated = s.evaluated
        try:
            evaluated = self.store.count_trials(self.name, evaluated_only=True)
        except Exception:  # the hint must not fail: the count in hand will do
            pass
        return (f"interrupted: {evaluated} of {self.budget} trials of study {self.name} are stored; "
                f"run the same command again to resume")

    def _close(self, outcome: str, note: str) -> None:
        """Fail our proposals still open, count the study, mark the run ended; never masks an error."""
        for trials in [*self.in_flight.values(), *(w[0] for w in self.waiting.values())]:
            for t in trials:
                try:
                    self._fail(t.number)
                except Exception:
                    pass
        self.in_flight.clear()
        self.waiting.clear()
        if self.store is None or self.run_id is None:
            return
        try:
            if outcome in ("finished", "stopped"):
                self.summary.evaluated = self.store.count_trials(self.name, evaluated_only=True)
            self.store.end_run(self.run_id, outcome, note)
        except Exception:
            if outcome in ("finished", "stopped"):
                raise


class _Heartbeat:
    """Tells the store every HEARTBEAT_S that this run's process is alive (a daemon thread)."""

    def __init__(self, store, run_id: int | None) -> None:
        self._stop = threading.Event()
        self._thread = None
        if store is None or run_id is None:
            return
        from store.coord import HEARTBEAT_S

        def beat() -> None:
            while not self._stop.wait(HEARTBEAT_S):
                try:
                    store.heartbeat(run_id)
                except Exception:  # a missed beat is not worth stopping the search for
                    pass

        self._thread = threading.Thread(target=beat, name="gemmscape-heartbeat", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)


def _raise_interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def _sigterm_as_interrupt():
    """SIGTERM ends a search as Ctrl-C does (main thread only); returns what to restore."""
    if threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(signal.SIGTERM, _raise_interrupt)


def _restore_sigterm(old) -> None:
    if old is not None:
        signal.signal(signal.SIGTERM, old)


def _postfix(s: Summary) -> str:
    parts = []
    if s.best:
        parts.append(f"best {s.best['tflops']:.2f} TFLOP/s")
        if s.best.get("ratio", {}).get("cublas"):
            parts.append(f"{s.best['ratio']['cublas']:.2f}x cuBLAS")
    if s.failures:
        parts.append("fail " + ",".join(f"{k}:{v}" for k, v in sorted(s.failures.items())))
    return " ".join(parts)
