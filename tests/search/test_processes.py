"""Searches as processes: Ctrl-C and SIGTERM, a search killed outright, and several searches on one
store at once (SQLite, and PostgreSQL when GEMMSCAPE_TEST_PG is set).

Each search here is the real ``codegen search`` in its own process, with the GPU measurer replaced
by a slowed replay of the recorded H200 sweep (tests/search/slow_search.py). Every wait is bounded.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from store import Store
from tests.pg import fresh_database

ROOT = Path(__file__).resolve().parents[2]
PROBLEM = ["--m", "4096", "--n", "4096", "--k", "4096", "--restricted"]


def start(db: str, budget: int, delay: float = 0.05, *extra: str) -> subprocess.Popen:
    """A search in a new session (its own process group, as a terminal's job is)."""
    env = dict(os.environ, GEMMSCAPE_TEST_DELAY=str(delay))
    return subprocess.Popen([sys.executable, "-m", "tests.search.slow_search", *PROBLEM, "--db", db,
                             "--budget", str(budget), "--quiet", *extra],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def wait_for_trials(db: str, n: int, proc: subprocess.Popen, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"the search ended early (exit {proc.returncode}):\n{out}\n{err[-4000:]}")
        try:
            with Store(db) as s:
                if len([r for r in s.trials() if r["status"] != "invalid"]) >= n:
                    return
        except Exception:  # the tables may not be there yet
            pass
        time.sleep(0.2)
    proc.kill()
    pytest.fail(f"no {n} trials within {timeout} s: {proc.communicate()}")


def finish(proc: subprocess.Popen, timeout: float = 120.0) -> tuple[int, str, str]:
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"search did not end within {timeout} s:\n{out}\n{err}")
    return proc.returncode, out, err


def measured(store: Store) -> list[str]:
    return [r["kernel"] for r in store.trials() if r["status"] != "invalid"]


@pytest.fixture(params=["sqlite", "postgresql"])
def db(request: pytest.FixtureRequest, tmp_path: Path):
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'search.db'}"
        return
    with fresh_database() as url:
        yield url


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_an_interrupted_search_says_how_to_resume_and_its_run_is_ended(tmp_path: Path, sig: int) -> None:
    db = f"sqlite:///{tmp_path / 'i.db'}"
    proc = start(db, 200, 0.2)
    wait_for_trials(db, 3, proc)
    if sig == signal.SIGINT:
        os.killpg(proc.pid, sig)  # Ctrl-C reaches the whole process group
    else:
        proc.send_signal(sig)
    rc, out, err = finish(proc, 60)
    assert rc == 130, (out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1, err  # one line, no traceback
    assert "run the same command again to resume" in lines[0] and "of 200 trials" in lines[0]
    with Store(db) as s:
        (run,) = s.runs()
        assert run["ended"] is not None
        assert s.run_state(run["id"])["outcome"] == "interrupted"
        done = len(measured(s))
        assert s.used_budget(run["study_name"]) == done  # no claim left in flight
    # Resuming: the same command goes on from where it stopped; nothing is measured twice.
    rc, out, err = finish(start(db, done + 5, 0.0))
    assert rc == 0, err
    assert f"{done + 5} of {done + 5} trials evaluated (5 now" in out
    with Store(db) as s:
        names = measured(s)
        assert len(names) == len(set(names)) == done + 5


def test_a_killed_search_is_marked_ended_by_the_next_run(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'k.db'}"
    proc = start(db, 200, 0.3)
    wait_for_trials(db, 3, proc)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=30)
    with Store(db) as s:
        (dead,) = s.runs()
        assert dead["ended"] is None and s.run_state(dead["id"])["outcome"] is None
        done = len(measured(s))
        assert s.used_budget(dead["study_name"]) >= done  # its claims in flight still hold budget
    rc, out, err = finish(start(db, done + 4, 0.0))
    assert rc == 0, err
    with Store(db) as s:
        first, second = s.runs()
        assert first["ended"] is not None and s.run_state(first["id"])["outcome"] == "died"
        assert "is gone" in s.run_state(first["id"])["note"]
        assert second["ended"] is not None and s.run_state(second["id"])["outcome"] == "finished"
        names = measured(s)
        assert len(names) == len(set(names)) == done + 4  # the dead run's claims were freed, none reused twice


def test_concurrent_searches_share_the_budget_and_never_measure_a_kernel_twice(db: str) -> None:
    """Three processes start together on a fresh database (so they also race to create the tables)."""
    budget = 30
    procs = [start(db, budget, 0.05) for _ in range(3)]
    results = [finish(p, 240) for p in procs]
    for rc, out, err in results:
        assert rc == 0, (out, err)
        assert "Traceback" not in err
    with Store(db) as s:
        names = measured(s)
        assert len(names) == budget, len(names)
        assert len(set(names)) == len(names), sorted(n for n in names if names.count(n) > 1)
        runs = s.runs()
        assert len(runs) == 3 and all(r["ended"] for r in runs)
        assert {s.run_state(r["id"])["outcome"] for r in runs} == {"finished"}
        assert s.used_budget(runs[0]["study_name"]) == budget
