"""Read queries. Every user-supplied value reaches the database as a bound parameter."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sqlalchemy import Select, case, func, or_, select
from sqlalchemy.orm import InstrumentedAttribute, Session, defer, joinedload
from sqlalchemy.orm.interfaces import LoaderOption

from store.models import Kernel, Problem, Run, Trial
from store.records import run_dict, trial_dict

#: ``Session.info`` key, set when the problems table has no ``pattern`` column (a store written
#: before block-sparse W, opened read-only): reads leave the column out, rows say None.
NO_PATTERN_COLUMN = "gemmscape_no_pattern_column"


def _joined_problem(session: Session, relationship: InstrumentedAttribute[Any]) -> LoaderOption:
    """Problem rows loaded along ``relationship`` in the same query, leaving out a column the store lacks."""
    load = joinedload(relationship)
    return load.defer(Problem.pattern, raiseload=True) if session.info.get(NO_PATTERN_COLUMN) else load


def problems(session: Session) -> Select[tuple[Problem]]:
    """Every problem row, by key."""
    q = select(Problem).order_by(Problem.key)
    return q.options(defer(Problem.pattern, raiseload=True)) if session.info.get(NO_PATTERN_COLUMN) else q


def _as_list(value: str | Iterable[str] | None) -> list[str] | None:
    if value is None:
        return None
    return [value] if isinstance(value, str) else list(value)


def filtered_trials(
    *,
    run_id: int | None = None,
    problem_key: str | Iterable[str] | None = None,
    problem_id: int | None = None,
    device_id: int | None = None,
    family: str | Iterable[str] | None = None,
    status: str | Iterable[str] | None = None,
    kernel_name: str | None = None,
    source_hash: str | None = None,
    name_contains: str | None = None,
    study: str | None = None,
) -> Select[tuple[Trial]]:
    """A SELECT of trials narrowed by the given filters (None means any)."""
    q = select(Trial).join(Trial.kernel).join(Trial.problem)
    if run_id is not None:
        q = q.where(Trial.run_id == run_id)
    if (keys := _as_list(problem_key)) is not None:
        q = q.where(Problem.key.in_(keys))
    if problem_id is not None:
        q = q.where(Trial.problem_id == problem_id)
    if device_id is not None:
        q = q.where(Trial.device_id == device_id)
    if (families := _as_list(family)) is not None:
        q = q.where(Kernel.family.in_(families))
    if (statuses := _as_list(status)) is not None:
        q = q.where(Trial.status.in_(statuses))
    if kernel_name is not None:
        q = q.where(Kernel.name == kernel_name)
    if source_hash is not None:
        q = q.where(Kernel.source_hash == source_hash)
    if name_contains:
        q = q.where(Kernel.name.contains(name_contains, autoescape=True))
    if study is not None:
        q = q.where(Trial.run_id.in_(select(Run.id).where(Run.study_name == study)))
    return q


def similar_trials(*, family: str, dtype: str, block: int, device_ids: Iterable[int]) -> Select[tuple[Trial]]:
    """Trials of one family on problems of one dtype and one kind of W (``block`` 0: dense; else
    block-sparse in ``block``-sized blocks), on the given devices: where a warm start looks."""
    q = filtered_trials(family=family).where(Problem.dtype == dtype, Trial.device_id.in_(list(device_ids)))
    if block:
        return q.where(Problem.block == block)
    return q.where(or_(Problem.block.is_(None), Problem.block == 0))


def kernel_identity(name: str, arch: str, source_hash: str | None) -> Select[tuple[Kernel]]:
    """The kernel row(s) of one identity; a None hash (never rendered) matches NULL."""
    q = select(Kernel).where(Kernel.name == name, Kernel.arch == arch)
    return q.where(Kernel.source_hash.is_(None) if source_hash is None else Kernel.source_hash == source_hash)


def _eager(session: Session, q: Select[tuple[Trial]]) -> Select[tuple[Trial]]:
    return q.options(joinedload(Trial.kernel), _joined_problem(session, Trial.problem),
                     joinedload(Trial.device))


def params_match(params: dict[str, Any], wanted: dict[str, Any]) -> bool:
    """Spec parameters equal to the wanted values, compared as text ("64" matches 64)."""
    return all(key in params and str(params[key]) == str(value) for key, value in wanted.items())


def trial_rows(
    session: Session, q: Select[tuple[Trial]], params: dict[str, Any] | None, limit: int | None
) -> list[dict[str, Any]]:
    q = _eager(session, q).order_by(Trial.run_id, Trial.number, Trial.id)
    if limit is not None and not params:
        q = q.limit(limit)
    rows = [trial_dict(t) for t in session.scalars(q).unique()]
    if params:
        rows = [r for r in rows if params_match(r["params"], params)]
        rows = rows[:limit] if limit is not None else rows
    return rows


def best_rows(
    session: Session, base: Select[tuple[Trial]], per_problem: int, limit: int | None
) -> list[dict[str, Any]]:
    """The fastest ok trial of each distinct kernel, ``per_problem`` kernels per problem and device."""
    ok = base.where(Trial.status == "ok", Trial.median_ms.is_not(None)).subquery()
    per_kernel = select(
        ok.c.id,
        ok.c.problem_id,
        ok.c.device_id,
        ok.c.median_ms,
        func.row_number()
        .over(partition_by=(ok.c.problem_id, ok.c.device_id, ok.c.kernel_id), order_by=(ok.c.median_ms, ok.c.id))
        .label("kernel_rank"),
    ).subquery()
    ranked = (
        select(
            per_kernel.c.id,
            func.row_number()
            .over(
                partition_by=(per_kernel.c.problem_id, per_kernel.c.device_id),
                order_by=(per_kernel.c.median_ms, per_kernel.c.id),
            )
            .label("rank"),
        )
        .where(per_kernel.c.kernel_rank == 1)
        .subquery()
    )
    q = (
        select(Trial, ranked.c.rank)
        .join(ranked, ranked.c.id == Trial.id)
        .join(Trial.problem)
        .where(ranked.c.rank <= per_problem)
        .order_by(Problem.key, Trial.device_id, ranked.c.rank)
    )
    q = _eager(session, q)
    if limit is not None:
        q = q.limit(limit)
    rows = []
    for trial, rank in session.execute(q).unique():
        row = trial_dict(trial)
        row["rank"] = rank
        rows.append(row)
    return rows


def run_rows(session: Session) -> list[dict[str, Any]]:
    stats = (
        select(
            Trial.run_id,
            func.count(Trial.id).label("trials"),
            func.sum(case((Trial.status == "ok", 1), else_=0)).label("ok"),
            func.min(case((Trial.status == "ok", Trial.median_ms))).label("best_ms"),
        )
        .where(Trial.run_id.is_not(None))
        .group_by(Trial.run_id)
    )
    counts = {row.run_id: row._asdict() for row in session.execute(stats)}
    load = (_joined_problem(session, Run.problem), joinedload(Run.device))
    runs = session.scalars(select(Run).options(*load).order_by(Run.id))
    return [run_dict(r, counts.get(r.id)) for r in runs]


def kernel_trial_counts(session: Session) -> dict[int, int]:
    q = select(Trial.kernel_id, func.count(Trial.id)).group_by(Trial.kernel_id)
    return {kernel_id: n for kernel_id, n in session.execute(q)}
