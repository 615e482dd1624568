"""Typed declarative models of what gemmscape records.

Tables carry a ``gs_`` prefix because Optuna's RDBStorage keeps its own ``trials`` and
``studies`` tables in the same database (see ``Store.optuna_url``).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, ClassVar

from sqlalchemy import (
    JSON,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

#: Name of the unique constraint that makes a kernel's identity (name, arch, source_hash).
KERNEL_IDENTITY = "uq_kernel_identity"


def utcnow() -> datetime:
    return datetime.now(UTC)


class Base(DeclarativeBase):
    type_annotation_map: ClassVar[dict[Any, Any]] = {dict[str, Any]: JSON, list[Any]: JSON}


class Device(Base):
    __tablename__ = "gs_devices"
    __table_args__ = (UniqueConstraint("name", "sm", "driver", "nvrtc", name="uq_device_identity"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    sm: Mapped[str] = mapped_column(String(32))
    driver: Mapped[str] = mapped_column(String(64), default="")
    nvrtc: Mapped[str] = mapped_column(String(64), default="")


class Problem(Base):
    """A problem as ``codegen.problem.Problem`` keys it. A dense W has ``block`` NULL, density 1 and no
    pattern; a block-sparse W has its block size, the density of kept blocks (0 allowed: an all-zero
    W) and the hash of its pattern, whose structure ``gs_patterns`` keeps when it was known; a 2:4 W
    has ``block`` NULL, density 0.5 and its sparsity, "2:4", in ``pattern`` (store.records)."""

    __tablename__ = "gs_problems"

    id: Mapped[int] = mapped_column(primary_key=True)
    key: Mapped[str] = mapped_column(String(200), unique=True)
    m: Mapped[int] = mapped_column(Integer)
    n: Mapped[int] = mapped_column(Integer)
    k: Mapped[int] = mapped_column(Integer)
    dtype: Mapped[str] = mapped_column(String(16))
    layout: Mapped[str] = mapped_column(String(32))
    bias: Mapped[bool] = mapped_column(Boolean, default=False)
    density: Mapped[float] = mapped_column(Float, default=1.0)
    block: Mapped[int | None] = mapped_column(Integer, nullable=True)
    #: codegen.sparse.Pattern.hash of the kept blocks, or the structured sparsity of a W ("2:4"); NULL for a
    #: dense W (added by store.migrate).
    pattern: Mapped[str | None] = mapped_column(String(64), nullable=True)


class Pattern(Base):
    """The structure of one block-sparse pattern (codegen.sparse.Pattern): which blocks of an
    ``n x k`` W are kept, in BSR form. ``indptr`` and ``indices`` are int32 little-endian arrays,
    zlib-compressed (store.records.pack_indices). Written when a sparse problem is first stored in
    a process that knows its pattern, so that another process can rebuild it (Store.pattern)."""

    __tablename__ = "gs_patterns"

    hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    n: Mapped[int] = mapped_column(Integer)
    k: Mapped[int] = mapped_column(Integer)
    block: Mapped[int] = mapped_column(Integer)
    nnzb: Mapped[int] = mapped_column(Integer)
    density: Mapped[float] = mapped_column(Float)
    indptr: Mapped[bytes] = mapped_column(LargeBinary)
    indices: Mapped[bytes] = mapped_column(LargeBinary)
    created: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class Kernel(Base):
    """A kernel is what was measured: its name, the target and the source it was built from.

    ``source_hash`` is the sha256 of the rendered source (None: never rendered, an invalid point).
    A template change gives the same name a new row; trials stay with the source they measured.
    """

    __tablename__ = "gs_kernels"
    __table_args__ = (UniqueConstraint("name", "arch", "source_hash", name=KERNEL_IDENTITY),)

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(400), index=True)
    family: Mapped[str] = mapped_column(String(32), index=True)
    arch: Mapped[str] = mapped_column(String(32))
    spec: Mapped[dict[str, Any]] = mapped_column(default=dict)
    source: Mapped[str | None] = mapped_column(Text, nullable=True)
    source_hash: Mapped[str | None] = mapped_column(String(128), nullable=True)
    options: Mapped[list[Any]] = mapped_column(default=list)
    report: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    log: Mapped[str | None] = mapped_column(Text, nullable=True)


class Run(Base):
    """One search: a sampler with a seed and a budget over one problem on one device."""

    __tablename__ = "gs_runs"

    id: Mapped[int] = mapped_column(primary_key=True)
    problem_id: Mapped[int] = mapped_column(ForeignKey("gs_problems.id"), index=True)
    device_id: Mapped[int] = mapped_column(ForeignKey("gs_devices.id"))
    family: Mapped[str] = mapped_column(String(32))
    sampler: Mapped[str] = mapped_column(String(32))
    seed: Mapped[int | None] = mapped_column(Integer, nullable=True)
    budget: Mapped[int | None] = mapped_column(Integer, nullable=True)
    study_name: Mapped[str | None] = mapped_column(String(400), nullable=True, index=True)
    versions: Mapped[dict[str, Any]] = mapped_column(default=dict)
    command: Mapped[str] = mapped_column(Text, default="")
    started: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    ended: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)

    problem: Mapped[Problem] = relationship()
    device: Mapped[Device] = relationship()


class Trial(Base):
    """One evaluation of one kernel on one problem and device; failures are results too."""

    __tablename__ = "gs_trials"
    __table_args__ = (
        Index("ix_trial_problem_device_status", "problem_id", "device_id", "status"),
        Index("ix_trial_kernel_problem_device", "kernel_id", "problem_id", "device_id"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int | None] = mapped_column(ForeignKey("gs_runs.id"), nullable=True, index=True)
    kernel_id: Mapped[int] = mapped_column(ForeignKey("gs_kernels.id"))
    problem_id: Mapped[int] = mapped_column(ForeignKey("gs_problems.id"))
    device_id: Mapped[int] = mapped_column(ForeignKey("gs_devices.id"))
    number: Mapped[int | None] = mapped_column(Integer, nullable=True)
    status: Mapped[str] = mapped_column(String(32), index=True)
    evidence: Mapped[str] = mapped_column(Text, default="")
    median_ms: Mapped[float | None] = mapped_column(Float, nullable=True)
    p20_ms: Mapped[float | None] = mapped_column(Float, nullable=True)
    p80_ms: Mapped[float | None] = mapped_column(Float, nullable=True)
    times_ms: Mapped[list[Any]] = mapped_column(default=list)
    tflops: Mapped[float | None] = mapped_column(Float, nullable=True)
    gbps: Mapped[float | None] = mapped_column(Float, nullable=True)
    rel_error: Mapped[float | None] = mapped_column(Float, nullable=True)
    baselines: Mapped[dict[str, Any]] = mapped_column(default=dict)
    ratios: Mapped[dict[str, Any]] = mapped_column(default=dict)
    ratio_cublas: Mapped[float | None] = mapped_column(Float, nullable=True)
    params: Mapped[dict[str, Any]] = mapped_column(default=dict)
    created: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)

    run: Mapped[Run | None] = relationship()
    kernel: Mapped[Kernel] = relationship()
    problem: Mapped[Problem] = relationship()
    device: Mapped[Device] = relationship()


class RunState(Base):
    """Who runs a search and whether it is alive: the process (host, pid) and its last heartbeat.

    A run whose process is gone (same host, pid not alive) or whose heartbeat is stale is dead:
    the next run marks it ended (``outcome`` "died") and frees its claims. Kept apart from
    ``gs_runs`` so that stores written before it read as they did.
    """

    __tablename__ = "gs_run_states"

    run_id: Mapped[int] = mapped_column(ForeignKey("gs_runs.id"), primary_key=True)
    host: Mapped[str] = mapped_column(String(255), default="")
    pid: Mapped[int] = mapped_column(Integer, default=0)
    heartbeat: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    #: None while running; then finished, interrupted, failed or died.
    outcome: Mapped[str | None] = mapped_column(String(32), nullable=True)
    note: Mapped[str] = mapped_column(Text, default="")


class Claim(Base):
    """A run's claim to measure one kernel (name, arch, source hash) on one problem and device.

    Taken atomically before the kernel is measured (the unique constraint refuses a second
    claimer), filled in with the trial once stored; a claim without a trial is a measurement in
    flight, and counts against its study's budget. Claims of a run that ended without storing
    their trial are dropped, so another run may take them.
    """

    __tablename__ = "gs_claims"
    __table_args__ = (
        UniqueConstraint("problem_id", "device_id", "name", "arch", "source_hash", name="uq_claim_identity"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    problem_id: Mapped[int] = mapped_column(ForeignKey("gs_problems.id"))
    device_id: Mapped[int] = mapped_column(ForeignKey("gs_devices.id"))
    name: Mapped[str] = mapped_column(String(400))
    arch: Mapped[str] = mapped_column(String(32))
    source_hash: Mapped[str] = mapped_column(String(128))
    run_id: Mapped[int | None] = mapped_column(ForeignKey("gs_runs.id"), nullable=True, index=True)
    trial_id: Mapped[int | None] = mapped_column(ForeignKey("gs_trials.id"), nullable=True)
    claimed: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
