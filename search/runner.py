"""The study runner: a sampler proposes points of the space, a measurer evaluates them.

The sampler works on an in-memory Optuna study; the store (when there is one) is the record of
every measurement, and a resumed study is rebuilt from it. What the sampler is told is the truth:
a measured kernel's TFLOP/s; a point the rules refuse (invalid) or a kernel that failed is a
pruned trial carrying a constraint violation (samplers that take constraints learn the region to
avoid; the others ignore it), never a made-up objective; a proposal of a kernel already measured
or in flight is not told again (a failed trial). Such a proposal costs nothing and is replaced by
an unmeasured valid point, the one the sampler's strategy picks (``search.samplers``: the nearest
one, or a uniformly random one for random sampling). Each time ``CONVERGED`` proposals in a row
bring nothing new the strategy is told, and may restart or hand over its sampler. A search
therefore spends its budget unless the space has no unmeasured valid point left ("space
exhausted", one line).

Budget counts evaluated (compiled and run) trials, across runs of the same study. "Already
measured" means measured with the same source: a result is reused only for the (kernel name,
source hash) it was measured with, so a template change measures anew. Every evaluated trial is
written to the store as soon as it finishes. Several processes may share a study through the
store (``search.liveness``).

How a search ends: the budget, the space exhausted, a long run of proposals that bring nothing new,
N identical failures in a row (a message), Ctrl-C or SIGTERM (``Interrupted``: one line saying how
to resume; the run is marked ended), or an exception in gemmscape's own code (``InternalError``: a
bug, never stored as a kernel's failure). A run killed outright is marked ended by the next run on
its store. The summary (``search.summary``) says where the time went (sampler, checks, store,
compile wait, GPU) and what share of the sampler's proposals were valid.
"""

from __future__ import annotations

import collections
import contextlib
import random
import re
import time
import warnings

import optuna

from codegen.evaluate import InternalError, blank_result
from codegen.families import spec_from_dict
from codegen.problem import Problem
from search import DEFAULT_SAMPLER, samplers
from search.liveness import Claims, Heartbeat, restore_sigterm, sigterm_as_interrupt
from search.pool import DRAWS, Pool
from search.samplers import CONVERGED
from search.space import Space, point_of
from search.summary import Summary, Timer, progress_bar

__all__ = ["CONVERGED", "MAX_SAME_FAILURES", "Interrupted", "Summary", "failure_signature", "run_search",
           "study_name"]

#: Identical failures in a row (same status, same evidence but for numbers and kernel names)
#: after which a search stops: something other than the kernels is broken.
MAX_SAME_FAILURES = 10


class Interrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM ended the search; the message is one line saying how to resume."""


@contextlib.contextmanager
def guarded(searches: list[Search], bar):
    """Runs ``searches`` (their loops inside the ``with``) as one: a heartbeat for each run, SIGTERM as
    Ctrl-C, one progress ``bar``. However the loops end, every run is ended in the store with its
    outcome: Ctrl-C or SIGTERM raises ``Interrupted`` (one line saying how to resume), an exception
    in gemmscape's own code ``InternalError``."""
    started = time.monotonic()
    for search in searches:
        search.bar = bar
    outcome, note = "finished", ""
    beats = [Heartbeat(search.store, search.run_id) for search in searches]
    old_term = sigterm_as_interrupt()
    try:
        yield
        outcome = "finished"
    except KeyboardInterrupt:
        outcome, note = "interrupted", "Ctrl-C or SIGTERM"
        raise Interrupted(searches[0].resume_hint(searches)) from None
    except InternalError as e:
        outcome, note = "failed", str(e)[-500:]
        raise
    except Exception as e:
        outcome, note = "failed", f"{type(e).__name__}: {e}"[-500:]
        raise InternalError(f"gemmscape's own code failed ({type(e).__name__}: {e}); the search stopped. "
                            f"This is a bug, not a kernel's failure: nothing was stored for it") from e
    finally:
        restore_sigterm(old_term)
        for beat in beats:
            beat.stop()
        bar.close()
        for search in searches:
            s = search.summary
            s.wall_s = time.monotonic() - min(started, search.started)
            s.settle_times(getattr(search.measurer, "gpu_wait_seconds", 0.0))
            if outcome == "finished":
                search.close("finished" if s.stopped == "budget reached" else "stopped", s.stopped)
            else:
                search.close(outcome, note)


def study_name(problem: Problem, family: str, space_name: str, sampler: str, seed: int | None, device: str) -> str:
    """The study's name in the store (its runs share it, and the budget is counted over them): one
    per problem, family and space, sampler, seed and device, so searches of two families of one
    problem are two studies, each with its own budget."""
    return f"gemmscape:{problem.key}:{family}-{space_name}:{sampler}:seed{seed}:{device}"


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
    sampler: str = DEFAULT_SAMPLER,
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
    strategy = samplers.strategy(sampler, seed, space)  # an unknown name is a ValueError
    search = Search(problem, space, measurer, sampler=sampler, strategy=strategy, seed=seed, budget=budget,
                     space_name=space_name, store=store, lookahead=lookahead, max_idle=max_idle,
                     max_same_failures=max_same_failures, poll_s=poll_s, seeds=seeds, command=command,
                     versions=versions or {})
    return search.run(progress)


class Search:
    """One run of a study: the proposal loop and its bookkeeping (see run_search)."""

    def __init__(self, problem: Problem, space: Space, measurer, *, sampler: str, strategy: samplers.Strategy,
                 seed: int | None, budget: int, space_name: str, store, lookahead: int, max_idle: int,
                 max_same_failures: int, poll_s: float, seeds: list[dict] | None, command: str,
                 versions: dict) -> None:
        self.started = time.monotonic()
        self.problem, self.space, self.measurer, self.store = problem, space, measurer, store
        self.budget, self.max_idle, self.poll_s = budget, max_idle, poll_s
        self.lookahead = max(lookahead, getattr(measurer, "lookahead", 0) or 0)  # several GPUs want more
        self.max_same_failures = max_same_failures
        self.sampler, self.strategy = sampler, strategy
        self.name = study_name(problem, space.family, space_name, sampler, seed, measurer.device.get("name", "?"))
        self.limits = measurer.limits
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
        warnings.filterwarnings("ignore", message="Constraints have been set, but")  # CMA-ES, random: not used
        self.summary = s = Summary(self.name, budget, 0, 0, 0, None)
        self.timer = Timer(s.times)
        self.pool = Pool(space, problem, self.limits, random.Random(seed))
        self.dists = {k: optuna.distributions.IntDistribution(0, len(v) - 1) for k, v in space.dims.items()}
        self.study = optuna.create_study(sampler=samplers.make_sampler(sampler, seed, space), direction="maximize")
        self.order = strategy.order(self.pool.sizes)
        self.queue: collections.deque[tuple[tuple[int, ...], str]] = collections.deque()  # (point, origin) next
        self.known: dict[tuple[str, str], tuple[str, float]] = {}  # (kernel, source) -> (status, TFLOP/s)
        self.in_flight: dict[str, object] = {}  # kernel name -> the trial our measurement answers
        self.invalid_stored: set[str] = set()
        self.idle = 0  # proposals in a row that measured nothing
        self.ended = ""  # why proposing ended (space exhausted): the search ends once what is in flight is done
        self.stale = 0  # sampler proposals in a row that brought nothing new
        self.same: tuple[tuple[str, str] | None, int] = (None, 0)
        self.device_id = self.run_id = None
        fresh = True
        if store is not None:
            with self.timer("store"):
                self.device_id = store.device(measurer.device)
                with store.setup_lock():  # one process at a time reaps the dead and starts a run
                    store.reap_dead_runs()
                    fresh = self._resume()
                    self.run_id = store.start_run(problem, self.device_id, space.family, sampler, seed, budget,
                                                  self.name, versions, command)
        s.run_id = self.run_id
        self.claims = None if store is None else Claims(store, self.run_id, problem, self.device_id, measurer.arch,
                                                        self.name, budget, self.timer)
        if fresh:
            for point in seeds or []:
                indices = space.indices(point)
                if indices is not None:
                    self.queue.append((self.pool.key_of(indices), "seed"))
            s.seeded = len(self.queue)

    # ---- set-up ---------------------------------------------------------------------------------
    def _resume(self) -> bool:
        """Rebuild the study from what the store holds: this study's earlier trials are told to
        the sampler again; results of the same kernels and source on this problem and device (any
        study) are known and reused. Returns whether the study is new (no trials stored)."""
        s, store = self.summary, self.store
        for row in store.trials(problem=self.problem.key, device_id=self.device_id):
            if row["status"] != "invalid" and row["source_hash"]:
                self.known[(row["kernel"], row["source_hash"])] = (row["status"], row["tflops"] or 0.0)
        mine = store.trials(study=self.name)
        for row in mine:
            if row["status"] == "invalid":
                self.invalid_stored.add(row["kernel"])
                continue
            self.pool.taken.add(row["kernel"])
            if row["status"] == "ok" and (s.best is None or row["tflops"] > s.best["tflops"]):
                s.best = {"kernel": row["kernel"], "tflops": row["tflops"],
                          "ratio": {"cublas": row["ratio_cublas"]} if row.get("ratio_cublas") else {}}
            key = self._key_of(row["params"])
            if key is not None:
                self._add_told(key, row["kernel"], row["status"], row["tflops"])
        s.evaluated = store.count_trials(self.name, evaluated_only=True)
        return not mine

    def _key_of(self, params: dict) -> tuple[int, ...] | None:
        """The point (choice indices) of a stored spec, or None when it is not a point of this space."""
        try:
            indices = self.space.indices(point_of(spec_from_dict(params)))
        except (ValueError, TypeError, KeyError, AttributeError):
            return None
        return None if indices is None else self.pool.key_of(indices)

    def _add_told(self, key: tuple[int, ...], kernel: str, status: str, tflops: float | None) -> None:
        """Tell the sampler a result it did not propose (a resumed study's trial)."""
        params = dict(zip(self.pool.names, key, strict=True))
        attrs = {"kernel": kernel, "status": status}
        if status == "ok":
            trial = optuna.trial.create_trial(params=params, distributions=self.dists, value=tflops, user_attrs=attrs)
        else:
            trial = optuna.trial.create_trial(params=params, distributions=self.dists,
                                              state=optuna.trial.TrialState.PRUNED,
                                              user_attrs=attrs, system_attrs={"constraints:valid": 1.0})
        self.study.add_trial(trial)

    # ---- the loop -------------------------------------------------------------------------------
    def run(self, progress: bool) -> Summary:
        """The whole run: up to the budget, then ended (see ``guarded``)."""
        with guarded([self], progress_bar(self.summary, self.problem.key, progress)):
            self.advance(self.budget)
        return self.summary

    def advance(self, budget: int) -> None:
        """Search on until the study has ``budget`` evaluated trials (or stops for another
        reason); what is in flight is finished first. A run may be advanced again to a larger
        budget (a portfolio hands out its budget so)."""
        s = self.summary
        self.budget = s.budget = budget
        if self.claims is not None:
            self.claims.budget = budget
        if s.stopped == "budget reached":
            s.stopped = ""
        self._loop()

    @property
    def live(self) -> bool:
        """Whether advancing the run may measure more (it did not stop for a reason of its own)."""
        return self.summary.stopped in ("", "budget reached")

    def _loop(self) -> None:
        s = self.summary
        while True:
            self._propose()
            if self.claims is not None and self.claims.waiting:
                self._poll_waiting()
            if s.stopped:
                break
            if len(self.measurer) == 0:
                if self.claims is None or not self.claims.waiting:
                    break
                time.sleep(self.poll_s)
                continue
            with self.timer("gpu"):
                done = self.measurer.next_done()
            self._finish(done)
        if s.stopped:
            return
        if self.ended:
            s.stopped = self.ended
        elif self.idle >= self.max_idle:
            s.stopped = (f"stopped after {self.max_idle} proposals in a row that were invalid or already measured: "
                         f"the {self.sampler} sampler finds nothing new in this space")
        else:
            s.stopped = "budget reached"

    def _room(self) -> bool:
        """Whether our own count allows one more measurement. Across processes the store decides:
        a claim is refused once the study's budget is spent, and a measurement that takes no claim
        (its source unknown) asks the store first (``Claims.room``)."""
        return self.summary.evaluated + len(self.in_flight) < self.budget

    def _propose(self) -> None:
        s = self.summary
        while (len(self.measurer) < self.lookahead and self.idle < self.max_idle and not s.stopped and not self.ended
               and self._room()):
            if not self._propose_one():
                return

    def _ask(self) -> tuple[object, tuple[int, ...], str] | None:
        """The next trial and its point: a queued one (seed or replacement), the sampler's own
        order's next, or the study's proposal; None when the sampler's order is spent."""
        origin = "sampler"
        key = None
        if self.queue:
            key, origin = self.queue.popleft()
        elif self.order is not None:
            key = self.order.next()
            if key is None:
                return None
        with self.timer("sample"):
            if key is not None:
                self.study.enqueue_trial(dict(zip(self.pool.names, key, strict=True)))
            trial = self.study.ask()
            got = tuple(trial.suggest_int(n, 0, size - 1) for n, size in zip(self.pool.names, self.pool.sizes,
                                                                              strict=True))
        return trial, got, origin

    def _propose_one(self) -> bool:
        """Ask until one kernel is submitted for measurement; False when proposing should pause
        (the budget is spent elsewhere, or the search stopped)."""
        s = self.summary
        while not s.stopped and not self.ended and self.idle < self.max_idle:
            asked = self._ask()
            if asked is None:
                self.ended = self.pool.exhausted()
                return False
            trial, key, origin = asked
            s.proposals += 1
            by_sampler = origin == "sampler"
            s.sampler_proposals += by_sampler
            with self.timer("check"):
                p = self.pool.at(key)
            trial.set_user_attr("kernel", p.name)
            if p.reasons:
                self._refuse(trial, p)
                self._nothing_new(key, origin)
                continue
            s.valid_proposals += by_sampler
            if p.name in self.pool.taken:  # measured, known or in flight: not told again
                self._tell_state(trial, "repeat")
                self._nothing_new(key, origin)
                continue
            taken = self._take(trial, p, by_sampler)
            if taken is not None:
                return taken
        return False

    def _refuse(self, trial, p) -> None:
        """An invalid point: told as such, stored once per kernel."""
        self._tell(trial, "invalid", None, False)
        if self.store is not None and p.name not in self.invalid_stored:
            self.invalid_stored.add(p.name)
            with self.timer("store"):
                self.store.add_trial(self.run_id, p.name, self.measurer.arch, self.problem, self.device_id,
                                     trial.number, blank_result("invalid", "; ".join(p.reasons)), p.spec.to_dict(),
                                     source_hash=None)

    def _take(self, trial, p, by_sampler: bool) -> bool | None:
        """A valid kernel not taken yet: reuse a known result, wait for another run's, or submit
        it. True once submitted, False when the budget is spent elsewhere, None to ask again."""
        claims, m = self.claims, self.measurer
        with self.timer("check"):
            source = m.source_hash(p.spec)
        known = self.known.get((p.name, source)) if source else None
        if known is None and claims is not None and source:
            got = claims.claim(p.name, source)
            if got == "budget":
                self._tell_state(trial, "budget")
                return False
            if got == "taken":
                known = claims.known(p.name, source)
                if known is None:
                    self.pool.taken.add(p.name)
                    claims.wait_for(p.name, trial, source, p.spec)
                    self._new(by_sampler)
                    self.idle += 1
                    return None
        self.pool.taken.add(p.name)
        self._new(by_sampler)
        if known is not None:
            self._tell(trial, known[0], known[1], False, source=source)
            self.idle += 1
            return None
        if claims is not None and p.name not in claims.claimed and not claims.room(self.in_flight):
            self.pool.taken.discard(p.name)
            self._tell_state(trial, "budget")
            return False
        self.in_flight[p.name] = trial
        m.submit(trial, p.spec)
        self.idle = 0
        return True

    def _new(self, by_sampler: bool) -> None:
        if by_sampler:
            self.summary.new_proposals += 1
            self.stale = 0

    def _nothing_new(self, key: tuple[int, ...], origin: str) -> None:
        """A proposal that brought nothing new: count it, tell a converged sampler's strategy, and
        queue an unmeasured valid point in its place (seeds are not replaced)."""
        s = self.summary
        self.idle += 1
        if origin not in ("sampler", "replacement"):
            return
        if origin == "sampler":
            self.stale += 1
            if self.stale >= CONVERGED:
                self.stale = 0
                line = self.strategy.converged(self.study, s.sampler_proposals)
                if line:
                    s.handover = line
        with self.timer("check"):
            other = self.strategy.replacement(self.pool, key)
        if other is None:
            self.ended = self.pool.exhausted()
        elif other is False:
            self.ended = (f"stopped: {DRAWS} random draws of the space ({self.space.size} points) found no valid "
                          f"point not yet measured; the {self.sampler} sampler finds nothing new in this space")
        else:
            self.queue.append((other, "replacement"))
            s.replaced += 1

    def _poll_waiting(self) -> None:
        """Kernels another run was measuring: take its result, or the claim if it gave it up."""
        for name, trial, source, spec, outcome, known in self.claims.poll():
            if outcome == "budget":
                self._tell_state(trial, "budget")
            elif outcome == "mine":
                self.in_flight[name] = trial
                self.measurer.submit(trial, spec)
            else:
                self.known[(name, source)] = known
                self._tell(trial, known[0], known[1], False, source=source)

    def _finish(self, done) -> None:
        s = self.summary
        result = done.result
        status = result["status"]
        value = result["tflops"] if status == "ok" else 0.0
        measured = done.kernel.get("source_hash")
        trial = self.in_flight.pop(done.spec.name, done.tag)
        if self.claims is not None:
            self.claims.release(done.spec.name)
        if self.store is not None:  # stored first: a store failure must not leave a told trial unstored
            with self.timer("store"):
                self.store.kernel(done.kernel)
                self.store.add_trial(self.run_id, done.spec.name, done.kernel.get("arch", self.measurer.arch),
                                     self.problem, self.device_id, trial.number, result, done.spec.to_dict(),
                                     source_hash=measured)
        self._tell(trial, status, value, True, result.get("ratio"), source=measured)
        if measured:
            self.known[(done.spec.name, measured)] = (status, value)
        if status == "invalid":  # refused without running (a replay that did not record it): costs no budget
            return
        s.record(done.spec.name, status, value, result)
        self.bar.update(1)
        self.bar.set_postfix_str(s.postfix(), refresh=False)
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

    def _tell(self, trial, status: str, value: float | None, measured: bool, ratio: dict | None = None,
              source: str | None = None) -> None:
        """Tell the sampler a result: the TFLOP/s of a kernel that ran; a point that is invalid or
        whose kernel failed is a pruned trial with a constraint violation, not an objective."""
        trial.set_user_attr("status", status)
        if source:
            trial.set_user_attr("source_hash", source)
        trial.set_user_attr("evaluated", measured)
        if ratio:
            trial.set_user_attr("ratio", ratio)
        with self.timer("sample"):
            if status == "ok":
                self.study.tell(trial, value)
            else:
                trial.set_constraint("valid", 1.0)  # > 0: infeasible (samplers that take constraints)
                self.study.tell(trial, state=optuna.trial.TrialState.PRUNED)

    def _tell_state(self, trial, status: str) -> None:
        """A proposal that is not an observation (a repeat, or the budget spent elsewhere)."""
        trial.set_user_attr("status", status)
        with self.timer("sample"):
            self.study.tell(trial, state=optuna.trial.TrialState.FAIL)

    # ---- ending ---------------------------------------------------------------------------------
    def resume_hint(self, searches: list[Search]) -> str:
        """The line an interrupted run (of ``searches``, sharing one problem) ends with."""
        if self.store is None:
            return (f"interrupted after {sum(x.summary.evaluated_now for x in searches)} evaluated trials; nothing "
                    f"was stored, so a new run starts from the beginning")
        evaluated = {}
        for x in searches:
            evaluated[x.name] = x.summary.evaluated
            try:
                evaluated[x.name] = self.store.count_trials(x.name, evaluated_only=True)
            except Exception:  # the hint must not fail: the count in hand will do
                pass
        if len(searches) == 1:
            return (f"interrupted: {evaluated[self.name]} of {self.budget} trials of study {self.name} are stored; "
                    f"run the same command again to resume")
        return (f"interrupted: {sum(evaluated.values())} trials of studies {', '.join(evaluated)} are stored; "
                f"run the same command again to resume")

    def close(self, outcome: str, note: str) -> None:
        """Drop our proposals still open, count the study, mark the run ended; never masks an error."""
        self.in_flight.clear()
        if self.claims is not None:
            self.claims.waiting.clear()
        if self.store is None or self.run_id is None:
            return
        try:
            if outcome in ("finished", "stopped"):
                self.summary.evaluated = self.store.count_trials(self.name, evaluated_only=True)
            self.store.end_run(self.run_id, outcome, note)
        except Exception:
            if outcome in ("finished", "stopped"):
                raise
