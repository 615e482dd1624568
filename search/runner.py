"""The study runner: a sampler proposes points of the space, a measurer evaluates them.

The sampler works on an in-memory Optuna study; the store (when there is one) is the record of
every measurement, and a resumed study is rebuilt from it. What the sampler is told is the truth:
a measured kernel's TFLOP/s; a point the rules refuse (invalid) or a kernel that failed is a
pruned trial carrying a constraint violation (samplers that take constraints learn the region to
avoid; the others ignore it), never a made-up objective; a proposal of a kernel already measured
or in flight is not told again (a failed trial). Such a proposal costs nothing and is replaced by
an unmeasured valid point: the nearest one for the model-based samplers (TPE, CMA-ES, GP), a
uniformly random one for random sampling (so that random sampling stays uniform over the valid
points). Once CMA-ES converges (``CONVERGED`` proposals in a row that bring nothing new) it
restarts from the best point with a fresh optimizer; GP hands over to TPE; grid visits every point
once in a seeded order. A search therefore spends its
budget unless the space has no unmeasured valid point left ("space exhausted", one line).

Budget counts evaluated (compiled and run) trials, across runs of the same study. "Already
measured" means measured with the same source: a result is reused only for the (kernel name,
source hash) it was measured with, so a template change measures anew. Every evaluated trial is
written to the store as soon as it finishes.

Several processes may run one study (or overlapping ones) against one database: each kernel is
claimed in the store before it is measured (store.coord), so none is measured twice for a problem
and device, and the budget is counted from the store, so together they spend no more than it. A
kernel another process is measuring is waited for and its result reused.

How a search ends: the budget, the space exhausted, a long run of proposals that bring nothing new,
N identical failures in a row (a message), Ctrl-C or SIGTERM (``Interrupted``: one line saying how
to resume; the run is marked ended), or an exception in gemmscape's own code (``InternalError``: a
bug, never stored as a kernel's failure). A run killed outright is marked ended by the next run on
its store. The summary says where the time went (sampler, checks, store, compile wait, GPU) and
what share of the sampler's proposals were valid.
"""

from __future__ import annotations

import collections
import random
import re
import signal
import threading
import time
import warnings
from dataclasses import dataclass, field

import optuna
from tqdm import tqdm

from codegen.evaluate import InternalError, blank_result
from codegen.families import spec_from_dict
from codegen.problem import Problem
from search import DEFAULT_SAMPLER, SAMPLERS
from search.cmaes import CmaEs
from search.space import Space, point_of

#: Identical failures in a row (same status, same evidence but for numbers and kernel names)
#: after which a search stops: something other than the kernels is broken.
MAX_SAME_FAILURES = 10
#: Sampler proposals in a row that bring nothing new (invalid, or a kernel already measured)
#: after which CMA-ES counts as converged and restarts, or GP hands over to TPE.
CONVERGED = 16
#: Spaces with at most this many points are enumerated (once, when first needed) to find an
#: unmeasured valid point or to say that none is left; larger ones are sampled.
ENUMERABLE = 50_000
#: Random draws to find an unmeasured valid point of a space too large to enumerate.
DRAWS = 4000
#: Time buckets of a run (seconds), in Summary.times.
TIME_BUCKETS = ("sample", "check", "store", "compile_wait", "gpu")


class Interrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM ended the search; the message is one line saying how to resume."""


def make_sampler(name: str, seed: int | None, space: Space) -> optuna.samplers.BaseSampler:
    """The Optuna sampler behind ``name``. Grid's order is the runner's own (every point once,
    seeded); the sampler it is given only answers the study's bookkeeping."""
    if name == "tpe":
        return optuna.samplers.TPESampler(seed=seed, multivariate=True, constant_liar=True, n_startup_trials=16)
    if name in ("random", "grid"):
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "cmaes":
        return CmaEs(seed=seed, warn_independent_sampling=False)
    if name == "local":
        from search.local import LocalSampler

        return LocalSampler(CmaEs(seed=seed, warn_independent_sampling=False), seed=seed)
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
    proposals: int  # points asked of the study this run (the sampler's, seeds and replacements)
    best: dict | None
    failures: collections.Counter = field(default_factory=collections.Counter)
    wall_s: float = 0.0
    gpu_wait_s: float = 0.0
    stopped: str = ""
    history: list[float] = field(default_factory=list)  # best-so-far TFLOP/s per evaluated trial
    run_id: int | None = None
    sampler_proposals: int = 0  # proposals the sampler made (not seeds, not replacements)
    valid_proposals: int = 0  # of those, valid points (measured, known or duplicate)
    new_proposals: int = 0  # of those, kernels not measured before (what the sampler added)
    replaced: int = 0  # invalid or repeated proposals replaced by an unmeasured valid point
    seeded: int = 0  # seeds tried first (0: an unseeded search)
    handover: str = ""  # a converged sampler that restarted or handed over to another, and when
    times: dict[str, float] = field(default_factory=lambda: dict.fromkeys(TIME_BUCKETS, 0.0))

    @property
    def valid_fraction(self) -> float | None:
        """The share of the sampler's proposals that were valid points (None: it proposed none)."""
        return self.valid_proposals / self.sampler_proposals if self.sampler_proposals else None

    def describe(self) -> list[str]:
        """Lines for the end of a run: proposals, replacements, hand-over, where the time went."""
        lines = []
        if self.sampler_proposals:
            lines.append(f"proposals: {self.sampler_proposals} by the sampler, {self.valid_fraction:.0%} valid, "
                         f"{self.new_proposals} new; {self.replaced} replaced by an unmeasured valid point; "
                         + (f"{self.seeded} seeds tried first" if self.seeded else "unseeded"))
        if self.handover:
            lines.append(self.handover)
        total = sum(self.times.values())
        other = max(0.0, self.wall_s - total)
        lines.append("time: " + ", ".join(f"{k.replace('_', ' ')} {v:.1f} s" for k, v in self.times.items())
                     + f", other {other:.1f} s")
        return lines


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
    if sampler not in SAMPLERS:
        raise ValueError(f"unknown sampler {sampler!r}; choose from {', '.join(SAMPLERS)}")
    search = _Search(problem, space, measurer, sampler=sampler, seed=seed, budget=budget, space_name=space_name,
                     store=store, lookahead=lookahead, max_idle=max_idle, max_same_failures=max_same_failures,
                     poll_s=poll_s, seeds=seeds, command=command, versions=versions or {})
    return search.run(progress)


class _Timer:
    """Adds the seconds spent inside ``with timer(bucket):`` to the summary's bucket."""

    def __init__(self, times: dict[str, float]) -> None:
        self.times = times
        self.bucket = ""
        self.t0 = 0.0

    def __call__(self, bucket: str) -> _Timer:
        self.bucket = bucket
        return self

    def __enter__(self) -> None:
        self.t0 = time.perf_counter()

    def __exit__(self, *exc) -> None:
        self.times[self.bucket] += time.perf_counter() - self.t0


@dataclass
class _Point:
    """What the runner knows of one point of the space (by choice indices)."""

    key: tuple[int, ...]
    spec: object
    reasons: list[str]
    name: str


class _Points:
    """The space's points as the runner sees them: checked once each, with the kernels measured
    so far, the nearest unmeasured valid point to a proposal, or a uniformly random one."""

    def __init__(self, space: Space, problem: Problem, limits, rng: random.Random) -> None:
        self.space, self.problem, self.limits, self.rng = space, problem, limits, rng
        self.names = list(space.dims)
        self.sizes = [len(space.dims[n]) for n in self.names]
        self.cache: dict[tuple[int, ...], _Point] = {}
        self.taken: set[str] = set()  # kernels measured, known or in flight in this study
        self._left: list[tuple[int, ...]] | None = None  # one valid point per kernel not yet seen taken
        self._valid_kernels: int | None = None  # enumerable spaces: how many kernels are valid

    def at(self, key: tuple[int, ...]) -> _Point:
        p = self.cache.get(key)
        if p is None:
            point = {n: self.space.dims[n][i] for n, i in zip(self.names, key, strict=True)}
            spec = self.space.spec(point, self.problem)
            p = self.cache[key] = _Point(key, spec, spec.check(self.problem, self.limits), spec.name)
        return p

    def open(self, key: tuple[int, ...]) -> bool:
        """Whether the point is valid and its kernel not yet taken."""
        p = self.at(key)
        return not p.reasons and p.name not in self.taken

    def nearest(self, key: tuple[int, ...], rings: int = 2) -> tuple[int, ...] | None:
        """An open point that differs from ``key`` in the fewest dimensions (at most ``rings``),
        by as few choice steps as possible, chosen at random among equals."""
        dims = range(len(key))
        for ring in range(1, rings + 1):
            found = []
            for changed in _combinations(dims, ring):
                for values in _products([[v for v in range(self.sizes[d]) if v != key[d]] for d in changed]):
                    other = list(key)
                    for d, v in zip(changed, values, strict=True):
                        other[d] = v
                    other = tuple(other)
                    if self.open(other):
                        found.append((sum(abs(other[d] - key[d]) for d in changed), other))
            if found:
                least = min(f[0] for f in found)
                return self.rng.choice(sorted(o for s, o in found if s == least))
        return None

    def any_open(self) -> tuple[int, ...] | None | bool:
        """A uniformly random open point; None when the space has none left (enumerable spaces),
        False when ``DRAWS`` random draws found none (a space too large to enumerate)."""
        if self.space.size <= ENUMERABLE:
            if self._left is None:  # one point per kernel, so that every unmeasured kernel is equally likely
                by_name: dict[str, tuple[int, ...]] = {}
                for k in _products([range(s) for s in self.sizes]):
                    p = self.at(k)
                    if not p.reasons:
                        by_name.setdefault(p.name, k)
                self._left, self._valid_kernels = list(by_name.values()), len(by_name)
            left = self._left
            while left:  # taken ones are dropped as they are met (swap with the last)
                i = self.rng.randrange(len(left))
                key = left[i]
                if self.cache[key].name not in self.taken:
                    return key
                left[i] = left[-1]
                left.pop()
            return None
        for _ in range(DRAWS):
            key = tuple(self.rng.randrange(s) for s in self.sizes)
            if self.open(key):
                return key
        return False

    def valid_count(self) -> int | None:
        """How many valid kernels the space has (None: not enumerated)."""
        return self._valid_kernels


def _combinations(items, r):
    import itertools

    return itertools.combinations(items, r)


def _products(lists):
    import itertools

    return itertools.product(*lists)


class _Grid:
    """Every point of the space once, in a seeded order (an affine permutation of the point
    indices, so that nothing is enumerated up front)."""

    def __init__(self, sizes: list[int], seed: int | None) -> None:
        import math

        self.sizes, self.total = sizes, math.prod(sizes)
        rng = random.Random(seed)
        self.step = rng.randrange(1, self.total) if self.total > 1 else 1
        while math.gcd(self.step, self.total) != 1:
            self.step = rng.randrange(1, self.total)
        self.offset = rng.randrange(self.total)
        self.i = 0

    def next(self) -> tuple[int, ...] | None:
        if self.i >= self.total:
            return None
        n = (self.offset + self.step * self.i) % self.total
        self.i += 1
        key = []
        for s in reversed(self.sizes):
            n, r = divmod(n, s)
            key.append(r)
        return tuple(reversed(key))


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
        self.sampler, self.seed = sampler, seed
        self.name = study_name(problem, space.family, space_name, sampler, seed, measurer.device.get("name", "?"))
        self.limits = measurer.limits
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
        warnings.filterwarnings("ignore", message="Constraints have been set, but")  # CMA-ES, random: not used
        self.summary = s = Summary(self.name, budget, 0, 0, 0, None)
        self.timer = _Timer(s.times)
        self.points = _Points(space, problem, self.limits, random.Random(seed))
        self.dists = {k: optuna.distributions.IntDistribution(0, len(v) - 1) for k, v in space.dims.items()}
        self.study = optuna.create_study(sampler=make_sampler(sampler, seed, space), direction="maximize")
        self.grid = _Grid(self.points.sizes, seed) if sampler == "grid" else None
        self.queue: collections.deque[tuple[tuple[int, ...], str]] = collections.deque()  # (point, origin) next
        self.known: dict[tuple[str, str], tuple[str, float]] = {}  # (kernel, source) -> (status, TFLOP/s)
        self.in_flight: dict[str, object] = {}  # kernel name -> the trial our measurement answers
        self.waiting: dict[str, tuple[object, str, object]] = {}  # kernel -> (trial, source, spec): another run measures it
        self.invalid_stored: set[str] = set()
        self.claimed: set[str] = set()  # kernels in flight under a claim (counted by the store's budget)
        self.idle = 0  # proposals in a row that measured nothing
        self.ended = ""  # why proposing ended (space exhausted): the search ends once what is in flight is done
        self.stale = 0  # sampler proposals in a row that brought nothing new
        self.restarts = 0  # CMA-ES restarts
        self.same: tuple[tuple[str, str] | None, int] = (None, 0)
        self.last_reap = time.monotonic()
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
        if fresh:
            for point in seeds or []:
                indices = space.indices(point)
                if indices is not None:
                    self.queue.append((tuple(indices[n] for n in self.points.names), "seed"))
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
            self.points.taken.add(row["kernel"])
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
        return None if indices is None else tuple(indices[n] for n in self.points.names)

    def _add_told(self, key: tuple[int, ...], kernel: str, status: str, tflops: float | None) -> None:
        """Tell the sampler a result it did not propose (a resumed study's trial)."""
        params = dict(zip(self.points.names, key, strict=True))
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
        s = self.summary
        self.bar = tqdm(total=self.budget, initial=min(s.evaluated, self.budget), desc=self.problem.key,
                        unit="trial", disable=not progress, dynamic_ncols=True)
        outcome, note = "finished", ""
        beat = _Heartbeat(self.store, self.run_id)
        old_term = _sigterm_as_interrupt()
        try:
            self._loop()
            outcome, note = ("finished" if s.stopped == "budget reached" else "stopped"), s.stopped
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
            s.times["compile_wait"] = min(s.gpu_wait_s, s.times["gpu"])
            s.times["gpu"] -= s.times["compile_wait"]
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
        (its source unknown) asks the store first (``_store_room``)."""
        return self.summary.evaluated + len(self.in_flight) < self.budget

    def _store_room(self) -> bool:
        """Whether the store's count (every process, and our measurements that hold no claim)
        allows one more measurement that takes no claim."""
        unclaimed = sum(1 for name in self.in_flight if name not in self.claimed)
        with self.timer("store"):
            return self.store.used_budget(self.name) + unclaimed < self.budget

    def _propose(self) -> None:
        s = self.summary
        while (len(self.measurer) < self.lookahead and self.idle < self.max_idle and not s.stopped and not self.ended
               and self._room()):
            if not self._propose_one():
                return

    def _ask(self) -> tuple[object, tuple[int, ...], str] | None:
        """The next trial and its point: a queued one (seed or replacement), grid's next, or the
        sampler's proposal; None when grid has visited every point."""
        origin = "sampler"
        key = None
        if self.queue:
            key, origin = self.queue.popleft()
        elif self.grid is not None:
            key = self.grid.next()
            if key is None:
                return None
        with self.timer("sample"):
            if key is not None:
                self.study.enqueue_trial(dict(zip(self.points.names, key, strict=True)))
            trial = self.study.ask()
            got = tuple(trial.suggest_int(n, 0, size - 1) for n, size in zip(self.points.names, self.points.sizes,
                                                                              strict=True))
        return trial, got, origin

    def _propose_one(self) -> bool:
        """Ask until one kernel is submitted for measurement; False when proposing should pause
        (the budget is spent elsewhere, or the search stopped)."""
        s, store, m = self.summary, self.store, self.measurer
        while not s.stopped and not self.ended and self.idle < self.max_idle:
            asked = self._ask()
            if asked is None:
                self._exhausted()
                return False
            trial, key, origin = asked
            s.proposals += 1
            by_sampler = origin == "sampler"
            s.sampler_proposals += by_sampler
            with self.timer("check"):
                p = self.points.at(key)
            trial.set_user_attr("kernel", p.name)
            if p.reasons:
                self._tell(trial, "invalid", None, False)
                if store is not None and p.name not in self.invalid_stored:
                    self.invalid_stored.add(p.name)
                    with self.timer("store"):
                        store.add_trial(self.run_id, p.name, m.arch, self.problem, self.device_id, trial.number,
                                        blank_result("invalid", "; ".join(p.reasons)), p.spec.to_dict(),
                                        source_hash=None)
                self._nothing_new(key, origin)
                continue
            s.valid_proposals += by_sampler
            if p.name in self.points.taken:  # measured, known or in flight: not told again
                self._tell_state(trial, "repeat")
                self._nothing_new(key, origin)
                continue
            with self.timer("check"):
                source = m.source_hash(p.spec)
            known = self.known.get((p.name, source)) if source else None
            if known is None and store is not None and source:
                with self.timer("store"):
                    got = store.claim(self.run_id, self.problem, self.device_id, p.name, m.arch, source,
                                      study=self.name, budget=self.budget)
                if got == "budget":
                    self._tell_state(trial, "budget")
                    return False
                if got == "taken":
                    known = self._known_in_store(p.name, source)
                    if known is None:
                        self.points.taken.add(p.name)
                        self.waiting[p.name] = (trial, source, p.spec)
                        self._new(by_sampler)
                        self.idle += 1
                        continue
                else:
                    self.claimed.add(p.name)
            self.points.taken.add(p.name)
            self._new(by_sampler)
            if known is not None:
                self._tell(trial, known[0], known[1], False, source=source)
                self.idle += 1
                continue
            if store is not None and p.name not in self.claimed and not self._store_room():
                self.points.taken.discard(p.name)
                self._tell_state(trial, "budget")
                return False
            self.in_flight[p.name] = trial
            m.submit(trial, p.spec)
            self.idle = 0
            return True
        return False

    def _new(self, by_sampler: bool) -> None:
        if by_sampler:
            self.summary.new_proposals += 1
            self.stale = 0

    def _nothing_new(self, key: tuple[int, ...], origin: str) -> None:
        """A proposal that brought nothing new: count it, hand a converged sampler over, and queue
        an unmeasured valid point in its place (seeds and grid points are not replaced)."""
        s = self.summary
        self.idle += 1
        if origin not in ("sampler", "replacement"):
            return
        if origin == "sampler":
            self.stale += 1
            if self.sampler in ("cmaes", "local") and self.stale >= CONVERGED:
                self._restart_cmaes()
            elif self.sampler == "gp" and self.stale >= CONVERGED and not s.handover:
                self.study.sampler = make_sampler("tpe", self.seed, self.space)
                s.handover = (f"gp converged after {s.sampler_proposals} proposals ({CONVERGED} in a row brought "
                              f"nothing new): TPE took over the study")
        with self.timer("check"):
            if self.sampler == "random":  # uniform over what is left, so random sampling stays uniform
                other = self.points.any_open()
            else:
                other = self.points.nearest(key) or self.points.any_open()
        if other is None:
            self._exhausted()
        elif other is False:
            self.ended = (f"stopped: {DRAWS} random draws of the space ({self.space.size} points) found no valid "
                         f"point not yet measured; the {self.sampler} sampler finds nothing new in this space")
        else:
            self.queue.append((other, "replacement"))
            s.replaced += 1

    def _restart_cmaes(self) -> None:
        """A converged CMA-ES starts again from the best point so far with a fresh optimizer
        (its state is kept under another prefix of the trials' attributes), so its cost per
        proposal stays flat as the study grows. For ``local`` it is the fallback that restarts."""
        s = self.summary
        self.restarts += 1
        self.stale = 0
        try:
            x0 = dict(self.study.best_trial.params)
        except ValueError:  # nothing ran yet
            x0 = None
        seed = None if self.seed is None else self.seed + self.restarts
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # x0 is deprecated since Optuna 4.9
            try:
                sampler = CmaEs(seed=seed, x0=x0, warn_independent_sampling=False)
            except TypeError:  # an Optuna without x0: restart from the middle of the space
                sampler = CmaEs(seed=seed, warn_independent_sampling=False)
        if not isinstance(getattr(sampler, "_attr_prefix", None), str):  # an Optuna that keeps its state elsewhere
            if self.sampler == "local":
                self.study.sampler.fallback = make_sampler("tpe", self.seed, self.space)
                s.handover = f"the local sampler's CMA-ES converged after {s.sampler_proposals} proposals: TPE took over"
                return
            self.study.sampler = make_sampler("tpe", self.seed, self.space)
            s.handover = (f"cmaes converged after {s.sampler_proposals} proposals ({CONVERGED} in a row brought "
                          f"nothing new): TPE took over the study")
            self.sampler = "tpe"
            return
        sampler._attr_prefix = f"cma{self.restarts}:"  # not the converged optimizer's state
        if self.sampler == "local":
            self.study.sampler.fallback = sampler
        else:
            self.study.sampler = sampler
        who = "the local sampler's cmaes" if self.sampler == "local" else "cmaes"
        s.handover = (f"{who} converged {self.restarts} time{'s' if self.restarts > 1 else ''} "
                      f"({CONVERGED} proposals in a row that brought nothing new) and restarted from the best "
                      f"point; last restart after {s.sampler_proposals} proposals")

    def _exhausted(self) -> None:
        if self.space.size <= ENUMERABLE:
            self.points.any_open()  # enumerates the valid points once
        valid = self.points.valid_count()
        if valid == 0:
            self.ended = "space exhausted: no point of the space is valid for this problem on this device"
        elif valid is not None:
            self.ended = f"space exhausted: all {valid} valid kernels of the space are measured"
        else:
            self.ended = f"space exhausted: every one of its {self.space.size} points was proposed"

    def _known_in_store(self, name: str, source: str) -> tuple[str, float] | None:
        with self.timer("store"):
            stored = self.store.known_result(self.problem, self.device_id, name, source)
        if stored is None:
            return None
        return stored["status"], stored["tflops"] or 0.0

    def _poll_waiting(self) -> None:
        """Kernels another run was measuring: take its result, or the claim if it gave it up."""
        if time.monotonic() - self.last_reap > 5.0:
            with self.timer("store"):
                self.store.reap_dead_runs()
            self.last_reap = time.monotonic()
        for name, (trial, source, spec) in list(self.waiting.items()):
            known = self._known_in_store(name, source)
            if known is None:
                with self.timer("store"):
                    got = self.store.claim(self.run_id, self.problem, self.device_id, name, self.measurer.arch,
                                           source, study=self.name, budget=self.budget)
                if got == "taken":
                    continue
                del self.waiting[name]
                if got == "budget":
                    self._tell_state(trial, "budget")
                    continue
                self.in_flight[name] = trial
                self.claimed.add(name)
                self.measurer.submit(trial, spec)
                continue
            del self.waiting[name]
            self.known[(name, source)] = known
            self._tell(trial, known[0], known[1], False, source=source)

    def _finish(self, done) -> None:
        s, m = self.summary, self.measurer
        result = done.result
        status = result["status"]
        value = result["tflops"] if status == "ok" else 0.0
        measured = done.kernel.get("source_hash")
        trial = self.in_flight.pop(done.spec.name, done.tag)
        self.claimed.discard(done.spec.name)
        if self.store is not None:  # stored first: a store failure must not leave a told trial unstored
            with self.timer("store"):
                self.store.kernel(done.kernel)
                self.store.add_trial(self.run_id, done.spec.name, done.kernel.get("arch", m.arch), self.problem,
                                     self.device_id, trial.number, result, done.spec.to_dict(), source_hash=measured)
        self._tell(trial, status, value, True, result.get("ratio"), source=measured)
        if measured:
            self.known[(done.spec.name, measured)] = (status, value)
        if status == "invalid":  # refused without running (a replay that did not record it): costs no budget
            return
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
        """Drop our proposals still open, count the study, mark the run ended; never masks an error."""
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
