"""One search across families: one budget, the seeds of every family first, then the budget goes
where the fast kernels are; resumable from the store. On a synthetic measurer (test data)."""

from __future__ import annotations

from pathlib import Path

import pytest

from codegen.problem import DType, Problem
from search.portfolio import OPENING, Member, run_portfolio
from search.runner import run_search
from search.space import seeds, space_for
from store import Store
from tests.search.synthetic import Synthetic

PROBLEM = Problem(2048, 6144, 4096, DType.bf16)


def members(families=("hopper", "tensorcore"), seeded=True):
    return [Member(f, space_for(f, PROBLEM.dtype), [dict(p) for p in seeds(f)] if seeded else None) for f in families]


def test_the_budget_is_shared_and_goes_to_the_faster_family():
    m = Synthetic({"hopper": 600.0, "tensorcore": 300.0})
    s = run_portfolio(PROBLEM, members(), m, sampler="random", seed=0, budget=60, progress=False)
    assert s.evaluated == len(m.measured) == 60
    assert len(set(m.measured)) == 60  # no kernel measured twice
    assert set(s.families) == {"hopper", "tensorcore"}
    hopper, tc = s.families["hopper"], s.families["tensorcore"]
    assert hopper.evaluated + tc.evaluated == 60
    assert tc.evaluated == max(len(seeds("tensorcore")), OPENING)  # its opening, then nothing: it is far behind
    assert hopper.evaluated > 40
    assert s.best["family"] == "hopper" and s.best["tflops"] == hopper.best["tflops"]
    assert s.history == sorted(s.history) and len(s.history) == 60 and s.history[-1] == s.best["tflops"]
    assert s.stopped == "budget reached"
    assert "hopper: " in "\n".join(s.describe()) and "(won)" in "\n".join(s.describe())


def test_a_close_runner_up_keeps_being_searched():
    m = Synthetic({"hopper": 500.0, "tensorcore": 490.0})
    s = run_portfolio(PROBLEM, members(), m, sampler="random", seed=0, budget=120, progress=False)
    counts = {f: x.evaluated for f, x in s.families.items()}
    assert sum(counts.values()) == 120
    assert min(counts.values()) >= 120 // 3  # neither starves while both are in contention


def test_unseeded_families_each_get_the_opening():
    m = Synthetic({"hopper": 100.0, "tensorcore": 100.0})
    s = run_portfolio(PROBLEM, members(seeded=False), m, sampler="random", seed=1, budget=10, progress=False)
    assert s.evaluated == 10
    assert {f: x.evaluated for f, x in s.families.items()} == {"hopper": 5, "tensorcore": 5}  # the equal share


def test_one_family_is_the_plain_search():
    problem = PROBLEM
    space = space_for("hopper", problem.dtype)
    a = run_search(problem, space, Synthetic({"hopper": 1.0}), sampler="local", seed=2, budget=30, progress=False,
                   seeds=seeds("hopper"))
    b = run_portfolio(problem, [Member("hopper", space, seeds("hopper"))], Synthetic({"hopper": 1.0}),
                      sampler="local", seed=2, budget=30, progress=False)
    assert a.history == b.history and a.study == b.study and b.best["family"] == "hopper"


def test_resumed_from_the_store_across_families(tmp_path: Path):
    store = Store(f"sqlite:///{tmp_path / 'p.db'}")
    first = run_portfolio(PROBLEM, members(), Synthetic({"hopper": 600.0, "tensorcore": 300.0}), sampler="random",
                          seed=0, budget=40, store=store, progress=False)
    m = Synthetic({"hopper": 600.0, "tensorcore": 300.0})
    again = run_portfolio(PROBLEM, members(), m, sampler="random", seed=0, budget=70, store=store, progress=False)
    assert first.evaluated == 40 and again.evaluated == 70 and again.evaluated_now == len(m.measured) == 30
    studies = {r["study_name"] for r in store.runs()}
    assert studies == {f"gemmscape:{PROBLEM.key}:{f}-full@hopper+tensorcore:random:seed0:synthetic GPU"
                       for f in ("hopper", "tensorcore")}
    assert all(r["ended"] is not None for r in store.runs())
    ok = [r for r in store.trials() if r["status"] == "ok"]
    assert len(ok) == len({r["kernel"] for r in ok}) == 70


def test_a_portfolio_reuses_a_single_family_search_without_spending_budget(tmp_path: Path):
    store = Store(f"sqlite:///{tmp_path / 'p.db'}")
    run_search(PROBLEM, space_for("tensorcore", PROBLEM.dtype), Synthetic({"tensorcore": 300.0}), sampler="random",
               seed=0, budget=10, store=store, progress=False, seeds=seeds("tensorcore"))
    m = Synthetic({"hopper": 600.0, "tensorcore": 300.0})
    s = run_portfolio(PROBLEM, members(), m, sampler="random", seed=0, budget=30, store=store, progress=False)
    assert s.evaluated == 30
    assert not set(m.measured) & {r["kernel"] for r in store.trials(study=store.runs()[0]["study_name"])}


def test_interrupted_runs_are_all_ended_with_one_resume_line(tmp_path: Path):
    class Stops(Synthetic):
        def next_done(self):
            if len(self.measured) == 12:
                raise KeyboardInterrupt
            return super().next_done()

    from search.runner import Interrupted

    store = Store(f"sqlite:///{tmp_path / 'p.db'}")
    with pytest.raises(Interrupted, match="run the same command again to resume"):
        run_portfolio(PROBLEM, members(), Stops({"hopper": 1.0, "tensorcore": 1.0}), sampler="random", seed=0,
                      budget=40, store=store, progress=False)
    runs = store.runs()
    assert len(runs) == 2 and all(store.run_state(r["id"])["outcome"] == "interrupted" for r in runs)
