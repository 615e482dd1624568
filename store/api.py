"""``Store``: the one door to the database. Nothing outside ``store`` writes SQL."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any, Self, TypeVar

from sqlalchemy import Engine, func, inspect, make_url, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from codegen import sparse
from codegen.problem import Problem as ProblemKey
from store import coord, queries
from store.db import ReadOnlyError, default_url, is_sqlite, make_engine, setup_lock, sqlite_path
from store.migrate import has_pattern_column, upgrade
from store.models import Base, Device, Kernel, Problem, Run, RunState, Trial
from store.models import Pattern as PatternRow
from store.records import (
    device_dict,
    kernel_dict,
    pattern_column,
    pattern_dict,
    pattern_of,
    pattern_row,
    problem_dict,
    result_dict,
)

T = TypeVar("T")
KERNEL_FIELDS = ("family", "spec", "source", "options", "report", "log")


class Store:
    """Results of every evaluation, the kernels behind them, and the searches that asked.

    ``Store()`` opens ``default_url()``; ``read_only=True`` (the dashboard) refuses every write
    and, for SQLite, opens the file with ``mode=ro`` (a missing file raises ``DatabaseMissing``).
    A kernel is (name, arch, source_hash): a trial is attached to the source it measured, and
    results are reused only for the same source. A store written by an older gemmscape is
    upgraded when opened for writing (``upgraded`` lists what changed; see store.migrate), and
    read as it is when opened read-only.

    A block-sparse problem is stored with its block, density and pattern hash; the pattern's
    structure goes to ``gs_patterns`` when this process knows it (``codegen.sparse.lookup``), and
    ``pattern(hash)`` gives it back to another process.
    """

    def __init__(self, url: str | None = None, read_only: bool = False) -> None:
        self.url = url or default_url()
        self.read_only = read_only
        self.engine: Engine = make_engine(self.url, read_only=read_only)
        self.upgraded: list[str] = []
        if not read_only:
            with self.setup_lock():  # processes starting together take turns at CREATE and upgrade
                self.upgraded = upgrade(self.engine)  # first, so that it reports the tables it adds
                Base.metadata.create_all(self.engine)
        # An older store opened read-only lacks the pattern column: its reads leave it out.
        no_pattern = not has_pattern_column(self.engine)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False,
                                      info={queries.NO_PATTERN_COLUMN: no_pattern})
        self._patterns_stored: set[str] = set()  # hashes whose structure this Store has seen stored

    # ---- plumbing ---------------------------------------------------------------------------
    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        mode = "read-only" if self.read_only else "read-write"
        return f"Store({self.location!r}, {mode})"

    @property
    def location(self) -> str:
        """The database URL as given, with any password hidden (safe to show)."""
        return make_url(self.url).render_as_string(hide_password=True)

    @property
    def ready(self) -> bool:
        """Whether the gemmscape tables exist (a read-only open of a foreign or empty file: False)."""
        return inspect(self.engine).has_table(Trial.__tablename__)

    def setup_lock(self):
        """A context manager held while tables or studies are created (see ``store.db.setup_lock``)."""
        return setup_lock(self.engine)

    @contextmanager
    def _read(self) -> Iterator[Session]:
        with self._sessions() as session:
            try:
                yield session
            finally:
                session.rollback()

    @contextmanager
    def _write(self) -> Iterator[Session]:
        if self.read_only:
            raise ReadOnlyError("this store was opened read-only; writes are refused")
        with self._sessions() as session, session.begin():
            yield session

    def _get_or_create(self, find: Callable[[Session], T | None], make: Callable[[], T]) -> T:
        """Find a row, else insert one; a concurrent insert of the same row is found on retry."""
        with self._write() as session:
            found = find(session)
            if found is not None:
                return found
        try:
            with self._write() as session:
                row = make()
                session.add(row)
                return row
        except IntegrityError:
            with self._write() as session:
                found = find(session)
                if found is None:
                    raise
                return found

    # ---- writes -----------------------------------------------------------------------------
    def device(self, info: dict[str, Any]) -> int:
        """Get or create a device from ``{"name", "sm", "driver", "nvrtc"}``; returns its id."""
        ident = {k: str(info.get(k) or "") for k in ("name", "sm", "driver", "nvrtc")}
        row = self._get_or_create(
            lambda s: s.scalar(select(Device).filter_by(**ident)),
            lambda: Device(**ident),
        )
        return row.id

    def problem(self, p: ProblemKey) -> int:
        """Get or create a problem by ``p.key``; returns its id.

        A dense problem is stored with ``block`` NULL, density 1 and no pattern; a 2:4 one with
        ``block`` NULL, density 0.5 and "2:4" where a pattern would be (store.records.pattern_column).
        A block-sparse one keeps its block, density (0 too) and pattern hash; the pattern's structure is stored once
        (``gs_patterns``) when this process knows it (``codegen.sparse.lookup``). One it does not
        know is stored with its hash alone, not refused: a process that rebuilt the problem from a
        stored row (export, the dashboard, a resumed search) has no need of the structure to read or
        add trials, and the first process that knows the pattern fills it in. ValueError: the known
        pattern is not the problem's (other shape, block or density), or another pattern's problem
        has the same key (its 8-character hash prefix collided)."""
        known = self._known_pattern(p) if p.sparse else None
        if known is not None and known.hash not in self._patterns_stored:
            self._get_or_create(lambda s: s.get(PatternRow, known.hash), lambda: pattern_row(known))
            self._patterns_stored.add(known.hash)
        row = self._get_or_create(
            lambda s: s.scalar(select(Problem).where(Problem.key == p.key)),
            lambda: Problem(
                key=p.key, m=p.m, n=p.n, k=p.k, dtype=p.dtype.value, layout=p.layout.value, bias=p.bias,
                density=p.density, block=p.block or None, pattern=pattern_column(p),
            ),
        )  # fmt: skip
        if row.pattern != pattern_column(p):
            raise ValueError(f"problem {p.key}: the store holds it with pattern {row.pattern!r}, not {p.pattern!r} "
                             "(two patterns share the key's hash prefix)")
        return row.id

    @staticmethod
    def _known_pattern(p: ProblemKey) -> sparse.Pattern | None:
        """The registered pattern of a sparse problem, checked against it; None when not registered."""
        try:
            pattern = sparse.lookup(p)
        except LookupError:
            return None
        if (pattern.n, pattern.k, pattern.block) != (*p.w_shape, p.block) or not math.isclose(  # W [out, in]
                pattern.density, p.density, rel_tol=1e-9, abs_tol=1e-12):
            raise ValueError(f"problem {p.key}: its pattern {pattern.hash} is {pattern.n}x{pattern.k} in "
                             f"{pattern.block}x{pattern.block} blocks at density {pattern.density:g}, not the problem's")
        return pattern

    def kernel(self, record: dict[str, Any]) -> int:
        """Upsert a kernel by (name, arch, source_hash); fields given later (source, report, log)
        fill it in. A record with ``source`` and no ``source_hash`` gets the hash of its source; a
        hash that is not its source's is refused (ValueError)."""
        spec = record.get("spec") or {}
        digest = record.get("source_hash") or None
        if record.get("source"):
            actual = hashlib.sha256(record["source"].encode()).hexdigest()  # as codegen.render.source_hash
            if digest is not None and digest != actual:
                raise ValueError(f"kernel {record['name']}: source_hash {digest} is not the hash of its source ({actual})")
            digest = actual
        kernel_id = self._kernel_id(
            record["name"], record.get("arch", ""), digest, record.get("family") or spec.get("family", ""), spec
        )
        updates = {k: record[k] for k in KERNEL_FIELDS if record.get(k) not in (None, "", [], {})}
        if updates:
            with self._write() as session:
                kernel = session.get_one(Kernel, kernel_id)
                for key, value in updates.items():
                    setattr(kernel, key, value)
        return kernel_id

    def _kernel_id(self, name: str, arch: str, source_hash: str | None, family: str, spec: dict[str, Any]) -> int:
        row = self._get_or_create(
            lambda s: s.scalar(queries.kernel_identity(name, arch, source_hash).order_by(Kernel.id).limit(1)),
            lambda: Kernel(name=name, arch=arch, source_hash=source_hash, family=family, spec=dict(spec)),
        )
        return row.id

    def start_run(
        self,
        problem: ProblemKey,
        device_id: int,
        family: str,
        sampler: str,
        seed: int | None,
        budget: int | None,
        study_name: str | None,
        versions: dict[str, Any],
        command: str,
    ) -> int:
        problem_id = self.problem(problem)
        with self._write() as session:
            run = Run(
                problem_id=problem_id, device_id=device_id, family=family, sampler=sampler, seed=seed,
                budget=budget, study_name=study_name, versions=dict(versions), command=command,
            )  # fmt: skip
            session.add(run)
            session.flush()
            coord.register(session, run.id)  # this process runs it (host, pid, heartbeat)
            return run.id

    def end_run(self, run_id: int, outcome: str = "finished", note: str = "") -> None:
        """Mark a run ended (outcome finished, interrupted or failed, with a line saying why);
        its claims that never got a trial are dropped so that other runs may take them."""
        with self._write() as session:
            coord.finish(session, run_id, outcome, note)

    def heartbeat(self, run_id: int) -> None:
        """Say that the run's process is alive (see store.coord)."""
        with self._write() as session:
            coord.heartbeat(session, run_id)

    def reap_dead_runs(self) -> list[int]:
        """Mark runs whose process died (killed, machine lost) ended, outcome "died"; their ids."""
        with self._write() as session:
            return coord.reap(session)

    def run_state(self, run_id: int) -> dict[str, Any] | None:
        """Who ran a run and how it ended: host, pid, heartbeat, outcome, note (None: not recorded)."""
        if not inspect(self.engine).has_table(RunState.__tablename__):
            return None
        with self._read() as session:
            state = session.get(RunState, run_id)
            if state is None:
                return None
            return {"run_id": run_id, "host": state.host, "pid": state.pid, "heartbeat": state.heartbeat,
                    "outcome": state.outcome, "note": state.note}

    def claim(self, run_id: int, problem: ProblemKey, device_id: int, kernel_name: str, arch: str, source_hash: str,
              *, study: str | None = None, budget: int | None = None) -> str:
        """Claim the measurement of a kernel (name, arch, source) on a problem and device for a run:
        ``"claimed"`` (measure it), ``"taken"`` (another run holds it or measured it) or
        ``"budget"`` (the study's budget is spent, counted across processes)."""
        problem_id = self.problem(problem)
        try:
            with self._write() as session:
                return coord.take(session, run_id, study, budget, problem_id, device_id, kernel_name, arch,
                                  source_hash)
        except IntegrityError:
            return coord.TAKEN

    def open_runs(self, study: str) -> set[int]:
        """Ids of the study's runs not ended (running, or dead and not yet reaped)."""
        if not self.ready:
            return set()
        with self._read() as session:
            return set(session.scalars(select(Run.id).where(Run.study_name == study, Run.ended.is_(None))))

    def used_budget(self, study: str) -> int:
        """What a study has spent, across processes: evaluated trials plus measurements in flight."""
        with self._read() as session:
            return coord.used_budget(session, study)

    def add_trial(
        self,
        run_id: int | None,
        kernel_name: str,
        arch: str,
        problem: ProblemKey,
        device_id: int,
        number: int | None,
        result: dict[str, Any],
        params: dict[str, Any],
        *,
        source_hash: str | None,
    ) -> int:
        """Record one evaluation. ``result`` is the runtime's result dict (status, evidence,
        median/p20/p80 ms, times_ms, tflops, gbps, rel_error, baselines, ratio); ``params`` is
        the spec dict; ``source_hash`` names the source that was measured (None: none was
        rendered, an invalid point). The trial is attached to the kernel (name, arch,
        source_hash), created from ``params`` if not yet recorded."""
        kernel_id = self._kernel_id(kernel_name, arch, source_hash or None, str(params.get("family", "")), params)
        problem_id = self.problem(problem)
        ratio = dict(result.get("ratio") or {})
        with self._write() as session:
            trial = Trial(
                run_id=run_id, kernel_id=kernel_id, problem_id=problem_id, device_id=device_id, number=number,
                status=result["status"], evidence=result.get("evidence") or "",
                median_ms=result.get("median_ms"), p20_ms=result.get("p20_ms"), p80_ms=result.get("p80_ms"),
                times_ms=list(result.get("times_ms") or []), tflops=result.get("tflops"), gbps=result.get("gbps"),
                rel_error=result.get("rel_error"), baselines=dict(result.get("baselines") or {}), ratios=ratio,
                ratio_cublas=ratio.get("cublas"), params=dict(params),
            )  # fmt: skip
            session.add(trial)
            session.flush()
            coord.settle(session, trial, kernel_name, arch, source_hash)
            return trial.id

    # ---- reads ------------------------------------------------------------------------------
    def known_result(
        self, problem: ProblemKey, device_id: int, kernel_name: str, source_hash: str
    ) -> dict[str, Any] | None:
        """The latest stored result of this kernel, built from this source, on this problem and
        device, or None. A result measured with other source is never answered."""
        if not self.ready or not source_hash:
            return None
        with self._read() as session:
            q = queries.filtered_trials(problem_key=problem.key, device_id=device_id, kernel_name=kernel_name,
                                        source_hash=source_hash)
            trial = session.scalar(q.order_by(Trial.id.desc()).limit(1))
            return result_dict(trial) if trial is not None else None

    def best(
        self,
        problem: ProblemKey | str | None = None,
        device_id: int | None = None,
        family: str | None = None,
        limit: int | None = None,
        per_problem: int = 1,
    ) -> list[dict[str, Any]]:
        """The fastest ok trial (by median_ms) per problem and device, as trial rows with a
        ``rank``; ``per_problem`` > 1 gives that many distinct kernels each; ``limit`` caps rows."""
        if not self.ready:
            return []
        key = problem if isinstance(problem, str) or problem is None else problem.key
        with self._read() as session:
            base = queries.filtered_trials(problem_key=key, device_id=device_id, family=family)
            return queries.best_rows(session, base, per_problem, limit)

    def best_similar(
        self,
        *,
        family: str,
        dtype: str,
        block: int = 0,
        device_ids: Iterable[int],
        per_problem: int = 1,
    ) -> list[dict[str, Any]]:
        """The fastest ok trials (``per_problem`` distinct kernels per problem and device, as ``best``
        gives them) of ``family`` on every problem of ``dtype`` with the same kind of W (``block`` 0:
        dense; else block-sparse in ``block``-sized blocks), on the devices ``device_ids``."""
        device_ids = list(device_ids)
        if not self.ready or not device_ids:
            return []
        with self._read() as session:
            base = queries.similar_trials(family=family, dtype=dtype, block=block, device_ids=device_ids)
            return queries.best_rows(session, base, per_problem, None)

    def best_for(
        self, problem: ProblemKey | str, device_id: int | None = None, family: str | None = None
    ) -> dict[str, Any] | None:
        """The single fastest ok trial for ``problem`` (across devices unless one is given), or None."""
        rows = self.best(problem, device_id=device_id, family=family)
        return min(rows, key=lambda r: (r["median_ms"], r["id"])) if rows else None

    def trials(
        self,
        *,
        run_id: int | None = None,
        problem: ProblemKey | str | Iterable[str] | None = None,
        device_id: int | None = None,
        family: str | Iterable[str] | None = None,
        status: str | Iterable[str] | None = None,
        kernel_name: str | None = None,
        source_hash: str | None = None,
        name_contains: str | None = None,
        study: str | None = None,
        params: dict[str, Any] | None = None,
        limit: int | None = None,
    ) -> list[dict[str, Any]]:
        """Trial rows matching every given filter; ``params`` matches spec values as text."""
        if not self.ready:
            return []
        key = problem.key if isinstance(problem, ProblemKey) else problem
        q = queries.filtered_trials(
            run_id=run_id, problem_key=key, device_id=device_id, family=family, status=status,
            kernel_name=kernel_name, source_hash=source_hash, name_contains=name_contains, study=study,
        )  # fmt: skip
        with self._read() as session:
            return queries.trial_rows(session, q, params, limit)

    def runs(self) -> list[dict[str, Any]]:
        """Every search run with its trial count, ok count and best median."""
        if not self.ready:
            return []
        with self._read() as session:
            return queries.run_rows(session)

    def kernel_record(
        self, name: str, arch: str | None = None, source_hash: str | None = None
    ) -> dict[str, Any] | None:
        """A kernel's spec, source, source hash, options, ptxas report and log; the newest
        recorded of that name if arch or source_hash are not given."""
        if not self.ready:
            return None
        q = select(Kernel).where(Kernel.name == name)
        if arch is not None:
            q = q.where(Kernel.arch == arch)
        if source_hash is not None:
            q = q.where(Kernel.source_hash == source_hash)
        with self._read() as session:
            kernel = session.scalar(q.order_by(Kernel.id.desc()).limit(1))
            return kernel_dict(kernel) if kernel is not None else None

    def measured_kernel(
        self,
        kernel_name: str,
        problem: ProblemKey | str | None = None,
        *,
        arch: str | None = None,
        source_hash: str | None = None,
        device_id: int | None = None,
    ) -> dict[str, Any] | None:
        """The fastest ok measurement of a kernel (on ``problem``, of ``arch`` and ``source_hash``,
        on ``device_id``, where given) as ``{"trial", "kernel", "device", "versions"}``: the trial
        row, the record of the kernel (the very source) it measured, its device and its run's
        versions; or None."""
        rows = [r for r in self.trials(kernel_name=kernel_name, status="ok", problem=problem, source_hash=source_hash,
                                       device_id=device_id)
                if r["median_ms"] is not None and (arch is None or r["arch"] == arch)]
        if not rows:
            return None
        best = min(rows, key=lambda r: (r["median_ms"], r["id"]))
        with self._read() as session:
            kernel = kernel_dict(session.get_one(Kernel, best["kernel_id"]))
            device = session.get(Device, best["device_id"])
            run = session.get(Run, best["run_id"]) if best["run_id"] is not None else None
            return {"trial": best, "kernel": kernel, "device": device_dict(device) if device else {},
                    "versions": dict(run.versions or {}) if run else {}}

    def export(
        self,
        kernel_name: str,
        problem: ProblemKey | None = None,
        *,
        arch: str | None = None,
        source_hash: str | None = None,
    ) -> tuple[str, str]:
        """``(<name>.cu, <name>.json)`` of the kernel's best measurement, from stored data only:
        the stored source of the measured kernel, never a re-render (codegen.export.ExportError,
        a KeyError, says why when it cannot)."""
        from codegen.export import export_kernel

        return export_kernel(self, kernel_name, problem, arch=arch, source_hash=source_hash, render_missing=False)

    def kernels(self, family: str | None = None) -> list[dict[str, Any]]:
        """Kernel summaries (no source text) with how many trials each has."""
        if not self.ready:
            return []
        q = select(Kernel).order_by(Kernel.name, Kernel.arch, Kernel.id)
        if family is not None:
            q = q.where(Kernel.family == family)
        with self._read() as session:
            counts = queries.kernel_trial_counts(session)
            return [
                {"id": k.id, "name": k.name, "family": k.family, "arch": k.arch, "source_hash": k.source_hash,
                 "trials": counts.get(k.id, 0), "compiled": k.source is not None}
                for k in session.scalars(q)
            ]  # fmt: skip

    def problems(self) -> list[dict[str, Any]]:
        """Every problem: key, m, n, k, dtype, layout, bias, density, block (None: dense) and
        pattern (the hash; None: dense, or a store from before block-sparse W)."""
        if not self.ready:
            return []
        with self._read() as session:
            return [problem_dict(p) for p in session.scalars(queries.problems(session))]

    def find_problem(self, key: str) -> ProblemKey | None:
        """The problem stored under ``key``, rebuilt (None: no such problem). A block-sparse one's
        pattern is registered in this process when the store keeps its structure, so that it can
        be evaluated again (``codegen.sparse.lookup`` finds it). ValueError: a row this version
        cannot rebuild."""
        found = [p for p in self.problems() if p["key"] == key]
        if not found:
            return None
        problem = ProblemKey.from_dict(found[0])
        if problem.sparse:
            self.pattern(problem.pattern, register=True)
        return problem

    def pattern(self, pattern_hash: str, register: bool = False) -> sparse.Pattern | None:
        """The block-sparse pattern stored under its hash (None: not stored, or a store from before
        block-sparse W); ``register`` also makes it known in this process (codegen.sparse.register).
        ValueError: the stored row does not rebuild into the pattern of its hash."""
        if not pattern_hash or not inspect(self.engine).has_table(PatternRow.__tablename__):
            return None
        with self._read() as session:
            row = session.get(PatternRow, pattern_hash)
            found = pattern_of(row) if row is not None else None
        if found is not None and register:
            sparse.register(found)
        return found

    def patterns(self) -> list[dict[str, Any]]:
        """Summaries of the stored patterns (hash, n, k, block, nnzb, density, created), by hash."""
        if not inspect(self.engine).has_table(PatternRow.__tablename__):
            return []
        with self._read() as session:
            return [pattern_dict(r) for r in session.scalars(select(PatternRow).order_by(PatternRow.hash))]

    def find_device(self, name_or_id: str) -> dict[str, Any] | None:
        """The device whose id (digits) or exact name is ``name_or_id``; else the one device whose
        name contains it (case-insensitive); None when none or several do."""
        devices = self.devices()
        text = name_or_id.strip()
        if text.isdigit():
            return next((d for d in devices if d["id"] == int(text)), None)
        exact = [d for d in devices if d["name"] == text]
        if exact:
            return exact[0]
        partial = [d for d in devices if text.lower() in d["name"].lower()]
        return partial[0] if len(partial) == 1 else None

    def devices(self) -> list[dict[str, Any]]:
        if not self.ready:
            return []
        with self._read() as session:
            return [device_dict(d) for d in session.scalars(select(Device).order_by(Device.id))]

    def count_trials(self, run: int | str, evaluated_only: bool = False) -> int:
        """Trials of a run (by id) or of every run of a study (by name); ``evaluated_only``
        leaves out ``invalid`` points, which cost no budget."""
        if not self.ready:
            return 0
        q = select(func.count(Trial.id))
        if isinstance(run, int):
            q = q.where(Trial.run_id == run)
        else:
            q = q.where(Trial.run_id.in_(select(Run.id).where(Run.study_name == run)))
        if evaluated_only:
            q = q.where(Trial.status != "invalid")
        with self._read() as session:
            return int(session.scalar(q) or 0)

    # ---- Optuna beside the results ----------------------------------------------------------
    def optuna_url(self) -> str:
        """The URL for Optuna's RDBStorage: this same database (its tables do not clash)."""
        path = sqlite_path(self.url)
        if path is not None:
            return f"sqlite:///{path.resolve()}"
        return self.engine.url.render_as_string(hide_password=False)

    def optuna_storage(self):
        """Optuna's RDBStorage on this database, its tables created under the setup lock."""
        import optuna

        with self.setup_lock():
            return optuna.storages.RDBStorage(self.optuna_url(), engine_kwargs=self.optuna_engine_kwargs())

    def optuna_engine_kwargs(self) -> dict[str, Any]:
        """``engine_kwargs`` for ``optuna.storages.RDBStorage`` (a busy timeout on SQLite)."""
        return {"connect_args": {"timeout": 30}} if is_sqlite(self.url) else {"pool_pre_ping": True}
