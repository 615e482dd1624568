"""Coordination in the store, on every backend: claims, the budget across runs, run liveness, and
tables created by several processes at once."""

from __future__ import annotations

import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import update

from codegen.problem import Problem
from store import Store, coord
from store.models import RunState

H200 = {"name": "NVIDIA H200", "sm": "sm_90", "driver": "580.159.04", "nvrtc": "13.0"}
P = Problem(256, 512, 128)
ROOT = Path(__file__).resolve().parents[2]


def ok() -> dict:
    return {"status": "ok", "evidence": "", "median_ms": 1.0, "tflops": 1.0, "times_ms": [1.0], "baselines": {},
            "ratio": {}}


def run(store: Store, study: str = "s", budget: int = 3) -> int:
    return store.start_run(P, store.device(H200), "simt", "tpe", 0, budget, study, {}, "test")


def test_a_kernel_is_claimed_once_and_settled_by_its_trial(store: Store) -> None:
    dev = store.device(H200)
    a, b = run(store), run(store)
    assert store.claim(a, P, dev, "k1", "sm_90", "h1", study="s", budget=3) == "claimed"
    assert store.claim(b, P, dev, "k1", "sm_90", "h1", study="s", budget=3) == "taken"
    assert store.claim(b, P, dev, "k1", "sm_90", "h2", study="s", budget=3) == "claimed"  # other source
    assert store.used_budget("s") == 2
    store.add_trial(a, "k1", "sm_90", P, dev, 0, ok(), {"family": "simt"}, source_hash="h1")
    assert store.used_budget("s") == 2  # the trial replaced the claim in flight
    store.end_run(a)
    assert store.claim(b, P, dev, "k1", "sm_90", "h1", study="s", budget=3) == "taken"  # measured: stays


def test_the_budget_counts_every_run_of_the_study(store: Store) -> None:
    dev = store.device(H200)
    a, b, other = run(store), run(store), run(store, study="t")
    assert store.claim(a, P, dev, "k1", "sm_90", "h", study="s", budget=2) == "claimed"
    assert store.claim(b, P, dev, "k2", "sm_90", "h", study="s", budget=2) == "claimed"
    assert store.claim(b, P, dev, "k3", "sm_90", "h", study="s", budget=2) == "budget"
    assert store.claim(other, P, dev, "k3", "sm_90", "h", study="t", budget=2) == "claimed"


def test_ending_a_run_frees_its_claims_in_flight(store: Store) -> None:
    dev = store.device(H200)
    a, b = run(store), run(store)
    store.claim(a, P, dev, "k1", "sm_90", "h", study="s", budget=3)
    store.end_run(a, "interrupted", "Ctrl-C")
    assert store.run_state(a)["outcome"] == "interrupted" and store.used_budget("s") == 0
    assert store.claim(b, P, dev, "k1", "sm_90", "h", study="s", budget=3) == "claimed"


def test_a_run_whose_process_is_gone_is_reaped(store: Store) -> None:
    dev = store.device(H200)
    a, b = run(store), run(store)
    store.claim(a, P, dev, "k1", "sm_90", "h", study="s", budget=3)
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    with store._write() as session:
        session.execute(update(RunState).where(RunState.run_id == a).values(pid=int(gone.stdout)))
    assert store.open_runs("s") == {a, b}
    assert store.reap_dead_runs() == [a]  # b is this process: alive
    state = store.run_state(a)
    assert state["outcome"] == "died" and "is gone" in state["note"]
    assert store.open_runs("s") == {b} and store.used_budget("s") == 0


def test_a_run_with_a_stale_heartbeat_is_reaped(store: Store) -> None:
    a = run(store)
    store.heartbeat(a)
    assert store.reap_dead_runs() == []
    with store._write() as session:
        old = coord.utcnow() - timedelta(seconds=coord.STALE_S + 5)
        session.execute(update(RunState).where(RunState.run_id == a).values(host="elsewhere", heartbeat=old))
    assert store.reap_dead_runs() == [a]
    assert "no heartbeat from elsewhere" in store.run_state(a)["note"]


def test_pid_alive() -> None:
    import os

    assert coord.pid_alive(os.getpid()) and not coord.pid_alive(0)


def test_processes_creating_the_tables_together_do_not_fail(store_url: str, tmp_path: Path) -> None:
    """Six processes open one fresh database for writing at the same moment (tables, Optuna's too)."""
    if store_url.startswith("sqlite"):
        store_url = f"sqlite:///{tmp_path / 'fresh.db'}"
    else:  # the store fixture made the tables already: use another fresh database
        from tests.pg import fresh_database

        with fresh_database() as url:
            return _create_together(url)
    _create_together(store_url)


def _create_together(url: str) -> None:
    code = ("import sys, time; from store import Store; t = float(sys.argv[2]); time.sleep(max(0, t - time.time()));"
            "s = Store(sys.argv[1]); s.optuna_storage(); s.device({'name': 'x'}); print('ok')")
    import time

    at = str(time.time() + 3.0)
    procs = [subprocess.Popen([sys.executable, "-c", code, url, at], cwd=ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(6)]
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0 and out.strip() == "ok", err
    with Store(url) as s:
        assert len(s.devices()) == 1


@pytest.mark.parametrize("outcome", ["finished", "stopped"])
def test_end_run_records_the_outcome(store: Store, outcome: str) -> None:
    a = run(store)
    store.end_run(a, outcome, "budget reached")
    (r,) = store.runs()
    assert r["ended"] is not None and store.run_state(a)["outcome"] == outcome
