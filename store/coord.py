"""Coordination of searches that share one database: run liveness and measurement claims.

Every run records who runs it (host, pid) and beats a heartbeat. A run that is not ended and
whose process is gone (same host, pid no longer alive) or whose heartbeat is older than
``STALE_S`` is dead: ``reap`` marks it ended and drops its claims that never got a trial.

Before a kernel is measured its run claims it: one row per (problem, device, kernel name, arch,
source hash), unique, so a second process is refused. The claim is taken in a transaction that
first writes the problem's row, which serializes claimers of one problem on SQLite and
PostgreSQL alike; inside it the study's budget is checked against what the store holds
(evaluated trials of the study's runs plus claims still in flight), so concurrent processes
never spend more than the budget together.
"""

from __future__ import annotations

import os
import socket
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import and_, delete, func, select, update
from sqlalchemy.orm import Session

from store.models import Claim, Problem, Run, RunState, Trial, utcnow

#: Seconds between heartbeats of a running search, and the age after which one counts as dead.
HEARTBEAT_S = 15.0
STALE_S = 120.0

CLAIMED, TAKEN, NO_BUDGET = "claimed", "taken", "budget"


def this_host() -> str:
    return socket.gethostname()


def pid_alive(pid: int) -> bool:
    """Whether a process of this id runs on this host (a zombie counts as gone)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def _aware(value: datetime | None) -> datetime | None:
    """SQLite hands back naive datetimes: they were written in UTC."""
    if value is not None and value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value


def register(session: Session, run_id: int) -> None:
    session.add(RunState(run_id=run_id, host=this_host(), pid=os.getpid(), heartbeat=utcnow()))


def heartbeat(session: Session, run_id: int) -> None:
    session.execute(update(RunState).where(RunState.run_id == run_id).values(heartbeat=utcnow()))


def finish(session: Session, run_id: int, outcome: str, note: str, when: datetime | None = None) -> None:
    """Mark a run ended with ``outcome``; drop its claims that have no trial."""
    run = session.get_one(Run, run_id)
    if run.ended is None:
        run.ended = when or utcnow()
    state = session.get(RunState, run_id)
    if state is None:
        session.add(RunState(run_id=run_id, host="", pid=0, outcome=outcome, note=note))
    elif state.outcome is None:
        state.outcome, state.note = outcome, note
    session.execute(delete(Claim).where(Claim.run_id == run_id, Claim.trial_id.is_(None)))


def dead_runs(session: Session, now: datetime | None = None) -> list[tuple[int, datetime, str]]:
    """Runs not ended whose process is gone: (run id, last sign of life, why)."""
    now = now or utcnow()
    stale = now - timedelta(seconds=STALE_S)
    host = this_host()
    found = []
    rows = session.execute(select(Run, RunState).outerjoin(RunState, RunState.run_id == Run.id)
                           .where(Run.ended.is_(None))).all()
    for run, state in rows:
        if state is None:  # a run of a gemmscape from before run states: judged by its last trial
            last = session.scalar(select(func.max(Trial.created)).where(Trial.run_id == run.id))
            last = max(filter(None, (_aware(last), _aware(run.started))), default=now)
            if last < stale:
                found.append((run.id, last, f"no sign of life since {last:%Y-%m-%d %H:%M:%S} UTC"))
            continue
        beat = _aware(state.heartbeat) or now
        if state.host == host and not pid_alive(state.pid):
            found.append((run.id, beat, f"process {state.pid} on {host} is gone"))
        elif beat < stale:
            found.append((run.id, beat, f"no heartbeat from {state.host} pid {state.pid} since "
                                        f"{beat:%Y-%m-%d %H:%M:%S} UTC"))
    return found


def reap(session: Session) -> list[int]:
    """Mark dead runs ended (outcome "died", ended at their last sign of life); their ids."""
    dead = dead_runs(session)
    for run_id, last, why in dead:
        finish(session, run_id, "died", why, when=last)
    return [run_id for run_id, _, _ in dead]


def used_budget(session: Session, study: str) -> int:
    """Evaluated trials of the study's runs plus its claims still in flight, counted in ONE statement:
    under PostgreSQL's read-committed isolation each statement sees its own snapshot, so two queries
    could miss a trial stored (and its claim settled) between them and undercount by one."""
    runs = select(Run.id).where(Run.study_name == study)
    evaluated = select(func.count(Trial.id)).where(Trial.run_id.in_(runs), Trial.status != "invalid")
    flying = select(func.count(Claim.id)).where(Claim.run_id.in_(runs), Claim.trial_id.is_(None))
    both = session.execute(select(evaluated.scalar_subquery(), flying.scalar_subquery())).one()
    return int(both[0] or 0) + int(both[1] or 0)


def claim_filter(problem_id: int, device_id: int, name: str, arch: str, source_hash: str) -> Any:
    return and_(Claim.problem_id == problem_id, Claim.device_id == device_id, Claim.name == name,
                Claim.arch == arch, Claim.source_hash == source_hash)


def take(session: Session, run_id: int, study: str | None, budget: int | None, problem_id: int, device_id: int,
         name: str, arch: str, source_hash: str) -> str:
    """CLAIMED, TAKEN (another run holds it or measured it) or NO_BUDGET; call in a write transaction."""
    # Writing the problem's row first makes this transaction the problem's only claimer until it
    # commits: SQLite takes its write lock here, PostgreSQL a row lock.
    session.execute(update(Problem).where(Problem.id == problem_id).values(key=Problem.key))
    if session.scalar(select(Claim.id).where(claim_filter(problem_id, device_id, name, arch, source_hash))):
        return TAKEN
    if study is not None and budget is not None and used_budget(session, study) >= budget:
        return NO_BUDGET
    session.add(Claim(problem_id=problem_id, device_id=device_id, name=name, arch=arch, source_hash=source_hash,
                      run_id=run_id))
    session.flush()  # an IntegrityError here (a claimer that did not take the lock) means TAKEN
    return CLAIMED


def settle(session: Session, trial: Trial, name: str, arch: str, source_hash: str | None) -> None:
    """Attach a stored trial to the claim it fulfils (there is none outside a search)."""
    if not source_hash or trial.run_id is None:
        return
    session.execute(update(Claim).where(claim_filter(trial.problem_id, trial.device_id, name, arch, source_hash),
                                        Claim.trial_id.is_(None)).values(trial_id=trial.id))
