"""CPU tier: codegen.nn.tune runs all of a tuning's searches on one GPU worker where its measurer can
switch problems (search.measure.GpuMeasurer.switch), and a new measurer per search where it cannot
(a replay). run_search is REPLACED by a recorder and the measurers are stand-ins: no GPU here."""

from __future__ import annotations

import concurrent.futures as cf
from collections import deque

import pytest

from codegen.nn.tune import LayerShape, layer_problems, tune
from codegen.problem import DType
from codegen.spec import DeviceLimits

PROBLEMS = layer_problems({LayerShape(256, 512, 512, DType.fp32, False): ["layer"]})


class _Summary:
    best, stopped = {"kernel": "k", "tflops": 1.0, "ratio": {}}, "budget reached"


class Measurer:
    limits = DeviceLimits.for_arch(90)
    made: list = []

    def __init__(self, problem) -> None:
        self.problem, self.closed, self.seen = problem, 0, [problem]
        Measurer.made.append(self)

    def close(self) -> None:
        self.closed += 1


class Switching(Measurer):
    def switch(self, problem) -> None:
        self.problem = problem
        self.seen.append(problem)


@pytest.fixture
def searched(monkeypatch):
    from search import runner

    ran = []
    monkeypatch.setattr(runner, "run_search", lambda problem, space, measurer, **kw: ran.append(
        (problem, measurer._m.problem)) or _Summary())
    Measurer.made = []
    return ran


@pytest.mark.parametrize("kind,made", [(Switching, 1), (Measurer, 3)])
def test_one_worker_serves_every_search_where_the_measurer_can_switch(searched, kind, made):
    tune(PROBLEMS, "simt", kind, budget=2, progress=False, say=lambda line: None)
    assert [p for p, _ in searched] == list(PROBLEMS) and all(p == q for p, q in searched)
    assert len(Measurer.made) == made and all(m.closed == 1 for m in Measurer.made)
    assert [p for m in Measurer.made for p in m.seen] == list(PROBLEMS)


def test_a_failing_search_closes_the_shared_worker(monkeypatch):
    from search import runner

    def boom(*a, **kw):
        raise KeyboardInterrupt

    monkeypatch.setattr(runner, "run_search", boom)
    Measurer.made = []
    with pytest.raises(KeyboardInterrupt):
        tune(PROBLEMS, "simt", Switching, budget=2, progress=False, say=lambda line: None)
    assert [m.closed for m in Measurer.made] == [1]


def test_switch_drops_what_is_pending_and_starts_the_counters_again():
    from search.measure import GpuMeasurer

    m = GpuMeasurer.__new__(GpuMeasurer)  # no GPU here: only switch's own state
    waiting = cf.Future()
    first, other = list(PROBLEMS)[:2]
    m.problem, m.pending, m.compile_seconds, m.gpu_wait_seconds = first, deque([("tag", None, waiting, 0.0)]), 3.0, 4.0
    m.switch(other)
    assert m.problem == other and len(m.pending) == 0 and waiting.cancelled()
    assert m.compile_seconds == m.gpu_wait_seconds == 0.0
