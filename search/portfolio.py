"""One search across kernel families: a portfolio of per-family studies under one budget.

Each family is searched in a study of its own (its own space, sampler and seeds; the runner's
``Search``), so resume, warm start, the store and the app see ordinary studies. With more than
one family their names carry the portfolio (space ``full@hopper+tensorcore``, say), so a
portfolio's budget is not spent by an earlier single-family search of the problem; that search's
measurements are reused all the same (a result known for the same kernel and source costs no
budget).

How the budget is shared:
1. The opening: every family gets its seeds, and at least ``OPENING`` trials, up to an equal share
   of the budget.
2. Then rounds of ``ROUND`` trials. A round goes to the leader, the family with the fastest kernel
   so far, unless a family within ``CONTENTION`` of the leader's best has had fewer than half the
   leader's trials: then that one gets it, so a close runner-up keeps being searched. A family
   further behind gets no more trials; one whose study stops (space exhausted, failures) leaves.

Why a portfolio and not ``family`` as a dimension of one study: the families' spaces share no
dimension, the samplers that do best here (local, CMA-ES) need one space of ordered integer
dimensions, and a family's seeds already place it near its family's best (docs/search.md), so the
first trials show where the budget pays.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass

from codegen.problem import Problem
from search import DEFAULT_SAMPLER, samplers
from search.runner import MAX_SAME_FAILURES, Search, guarded, study_name
from search.space import Space
from search.summary import Summary, progress_bar

__all__ = ["CONTENTION", "Member", "OPENING", "ROUND", "portfolio_space_name", "run_portfolio"]

#: Trials each family gets first (its seeds count; fewer where the budget's equal share is smaller).
OPENING = 8
#: Trials handed out at a time after the opening.
ROUND = 12
#: A family whose best is at least this share of the leader's best is still in contention.
CONTENTION = 0.9


@dataclass
class Member:
    """One family of a portfolio: its space and the points its study tries first."""

    family: str
    space: Space
    seeds: list[dict] | None = None


def portfolio_space_name(space_name: str, families: list[str]) -> str:
    """The space name of a family's study in a portfolio of ``families`` (one family: unchanged)."""
    return space_name if len(families) < 2 else f"{space_name}@{'+'.join(families)}"


def run_portfolio(problem: Problem, members: list[Member], measurer, *, sampler: str = DEFAULT_SAMPLER,
                  seed: int | None = 0, budget: int = 200, space_name: str = "full", store=None, lookahead: int = 4,
                  max_idle: int = 2000, progress: bool = True, command: str = "", versions: dict | None = None,
                  max_same_failures: int = MAX_SAME_FAILURES, poll_s: float = 0.2) -> Summary:
    """Search ``members`` for ``problem`` with ``budget`` evaluated trials in all (see the module).
    Returns a summary over the families (``families``: each one's summary; ``best["family"]``: the
    winner's). Raises as ``search.runner.run_search`` does."""
    if budget < 1:
        raise ValueError("budget must be >= 1")
    if not members:
        raise ValueError("a search needs at least one family")
    names = [m.family for m in members]
    member_space = portfolio_space_name(space_name, names)
    searches = [Search(problem, m.space, measurer, sampler=sampler, strategy=samplers.strategy(sampler, seed, m.space),
                       seed=seed, budget=budget, space_name=member_space, store=store, lookahead=lookahead,
                       max_idle=max_idle, max_same_failures=max_same_failures, poll_s=poll_s, seeds=m.seeds,
                       command=command, versions=versions or {}) for m in members]
    device = measurer.device.get("name", "?")
    total = Summary(study_name(problem, "+".join(names), space_name, sampler, seed, device) if len(names) > 1
                    else searches[0].name, budget, 0, 0, 0, None)
    bar = progress_bar(Summary("", budget, sum(s.summary.evaluated for s in searches), 0, 0, None), problem.key,
                       progress)
    history: list[float] = []
    with guarded(searches, bar):
        _share(searches, budget, history)
    return _combine(total, dict(zip(names, searches, strict=True)), history, measurer)


def _evaluated(search: Search) -> int:
    return search.summary.evaluated


def _best(search: Search) -> float:
    return search.summary.best["tflops"] if search.summary.best else 0.0


def _share(searches: list[Search], budget: int, history: list[float]) -> None:
    """Hand the budget out: the opening, then rounds (see the module)."""
    spent = lambda: sum(_evaluated(s) for s in searches)  # noqa: E731

    def advance(search: Search, to: int) -> bool:
        before, seen = _evaluated(search), len(search.summary.history)
        search.advance(min(to, _evaluated(search) + budget - spent()))
        for value in search.summary.history[seen:]:
            history.append(max(value, history[-1]) if history else value)
        return _evaluated(search) > before

    if len(searches) == 1:
        advance(searches[0], budget)
        return
    share = max(1, budget // len(searches))
    for search in searches:
        opening = min(max(search.summary.seeded, OPENING), share)
        if spent() < budget and _evaluated(search) < opening:
            advance(search, opening)
    stuck: set[int] = set()
    while spent() < budget:
        live = [s for s in searches if s.live and id(s) not in stuck]
        if not live:
            return
        leader = max(live, key=lambda s: (_best(s), -_evaluated(s)))
        close = [s for s in live if _best(s) >= CONTENTION * _best(leader)]
        behind = min(close, key=_evaluated)
        pick = behind if _evaluated(behind) < _evaluated(leader) / 2 else leader
        if not advance(pick, _evaluated(pick) + ROUND):
            stuck.add(id(pick))  # it could measure nothing more (its budget taken elsewhere): leave it


def _combine(total: Summary, runs: dict[str, Search], history: list[float], measurer) -> Summary:
    """The portfolio's summary from its families' runs."""
    members = {family: search.summary for family, search in runs.items()}
    total.families = members
    for family, s in members.items():
        total.evaluated += s.evaluated
        total.evaluated_now += s.evaluated_now
        total.proposals += s.proposals
        total.failures += s.failures
        total.wall_s = max(total.wall_s, s.wall_s)
        for name in ("sampler_proposals", "valid_proposals", "new_proposals", "replaced", "seeded"):
            setattr(total, name, getattr(total, name) + getattr(s, name))
        for bucket in total.times:
            total.times[bucket] += s.times[bucket]
        if s.best and (total.best is None or s.best["tflops"] > total.best["tflops"]):
            total.best = {**s.best, "family": family}
    if len(members) == 1:
        (total.run_id,) = (s.run_id for s in members.values())
    # every run shares the measurer: its compile wait is counted once, out of the GPU time of all
    gpu = total.times["gpu"] + total.times["compile_wait"]
    total.gpu_wait_s = getattr(measurer, "gpu_wait_seconds", 0.0)
    total.times["compile_wait"] = min(total.gpu_wait_s, gpu)
    total.times["gpu"] = gpu - total.times["compile_wait"]
    total.history = history
    total.handover = "; ".join(f"{f}: {s.handover}" if len(members) > 1 else s.handover
                               for f, s in members.items() if s.handover)
    stops = collections.OrderedDict((f, s.stopped) for f, s in members.items() if s.stopped != "budget reached")
    if total.evaluated >= total.budget:
        total.stopped = "budget reached"
    elif len(members) == 1:
        total.stopped = next(iter(members.values())).stopped
    else:
        total.stopped = "every family stopped: " + "; ".join(f"{f}: {why or 'nothing more to measure'}"
                                                             for f, why in stops.items())
    return total
