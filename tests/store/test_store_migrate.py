"""Stores written before kernels were identified by their source still open: read-only as they
are, and upgraded in place (unique (name, arch) -> (name, arch, source_hash)) when opened for writing."""

from __future__ import annotations

import gzip
import hashlib
import shutil
from pathlib import Path

import pytest
from sqlalchemy import MetaData, UniqueConstraint, create_engine, inspect
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from codegen.problem import Problem
from store import Store
from store.migrate import outdated, upgrade
from store.models import KERNEL_IDENTITY, Base, Device, Kernel, Trial
from store.models import Problem as ProblemRow

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"
OLD_DBS = sorted(RESULTS.glob("*.db.gz"))


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def old_schema() -> MetaData:
    """The tables as gemmscape created them before: kernels unique on (name, arch)."""
    meta = MetaData()
    for table in Base.metadata.sorted_tables:
        table.to_metadata(meta)
    kernels = meta.tables[Kernel.__tablename__]
    (identity,) = [c for c in kernels.constraints if c.name == KERNEL_IDENTITY]
    kernels.constraints.discard(identity)
    kernels.append_constraint(UniqueConstraint("name", "arch", name="uq_kernel_name_arch"))
    return meta


def write_old_store(url: str) -> tuple[int, int]:
    """An old store with one compiled kernel and one trial of it; returns (kernel id, trial id)."""
    engine = create_engine(url)
    old_schema().create_all(engine)
    with Session(engine) as session, session.begin():
        device = Device(name="NVIDIA H200", sm="sm_90", driver="580", nvrtc="13.0")
        problem = ProblemRow(key=Problem(64, 64, 64).key, m=64, n=64, k=64, dtype="fp32", layout="forward")
        kernel = Kernel(name="simt_k", family="simt", arch="sm_90", spec={"family": "simt"}, source="old text",
                        source_hash=sha("old text"), options=[])
        session.add_all([device, problem, kernel])
        session.flush()
        trial = Trial(kernel_id=kernel.id, problem_id=problem.id, device_id=device.id, status="ok", median_ms=1.0,
                      tflops=2.0)
        session.add(trial)
        session.flush()
        ids = kernel.id, trial.id
    engine.dispose()
    return ids


def test_an_old_store_is_upgraded_when_opened_for_writing(store_url: str) -> None:
    kernel_id, trial_id = write_old_store(store_url)
    engine = create_engine(store_url)
    assert outdated(engine) and "(name, arch, source_hash)" in outdated(engine)[0]
    engine.dispose()
    with Store(store_url) as store:
        assert store.upgraded and "uq_kernel_name_arch" in store.upgraded[0]
        (row,) = store.trials()
        assert (row["id"], row["kernel_id"], row["source_hash"]) == (trial_id, kernel_id, sha("old text"))
        assert store.known_result(Problem(64, 64, 64), row["device_id"], "simt_k", sha("old text"))["tflops"] == 2.0
        new = store.kernel({"name": "simt_k", "family": "simt", "arch": "sm_90", "source": "new text"})
        assert new != kernel_id  # the same name and arch with other source: impossible before
        assert store.known_result(Problem(64, 64, 64), row["device_id"], "simt_k", sha("new text")) is None
        uniques = inspect(store.engine).get_unique_constraints(Kernel.__tablename__)
        assert [tuple(u["column_names"]) for u in uniques] == [("name", "arch", "source_hash")]
        assert {ix["name"] for ix in inspect(store.engine).get_indexes(Kernel.__tablename__)} >= {
            "ix_gs_kernels_name", "ix_gs_kernels_family"}
    with Store(store_url) as again:
        assert again.upgraded == [] and len(again.kernels()) == 2
        assert upgrade(again.engine) == []


def test_a_new_store_needs_no_upgrade(store: Store) -> None:
    assert store.upgraded == [] and outdated(store.engine) == []
    store.kernel({"name": "k", "family": "simt", "arch": "sm_90", "source": "a"})
    with pytest.raises(IntegrityError), Session(store.engine) as session, session.begin():
        session.add(Kernel(name="k", family="simt", arch="sm_90", spec={}, options=[], source_hash=sha("a")))


def test_an_old_sqlite_store_reads_as_before_when_opened_read_only(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'old.db'}"
    write_old_store(url)
    with Store(url, read_only=True) as reader:
        assert reader.upgraded == [] and reader.trials()[0]["source_hash"] == sha("old text")
        assert reader.kernel_record("simt_k", "sm_90", sha("old text"))["source"] == "old text"
    assert outdated(create_engine(url))  # untouched


@pytest.mark.parametrize("path", OLD_DBS, ids=lambda p: p.name)
def test_the_committed_benchmark_stores_open_and_upgrade(path: Path, tmp_path: Path) -> None:
    db = tmp_path / path.name.removesuffix(".gz")
    with gzip.open(path) as src, db.open("wb") as dst:
        shutil.copyfileobj(src, dst)
    url = f"sqlite:///{db}"
    was_old = bool(outdated(create_engine(url)))  # stores written since the upgrade are current already
    with Store(url, read_only=True) as reader:
        before = (reader.trials(), reader.kernels(), reader.best(per_problem=3))
        assert before[0] and any(k["source_hash"] for k in before[1])
    with Store(url) as store:
        assert bool(store.upgraded) == was_old
        assert (store.trials(), store.kernels(), store.best(per_problem=3)) == before
        with store.engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA foreign_key_check").fetchall() == []
            assert conn.exec_driver_sql("PRAGMA integrity_check").scalar() == "ok"
        ok = next(t for t in before[0] if t["status"] == "ok")
        problem = Problem.from_dict(ok)
        assert store.known_result(problem, ok["device_id"], ok["kernel"], ok["source_hash"]) is not None
        assert store.known_result(problem, ok["device_id"], ok["kernel"], sha("other source")) is None
        export_cu, _ = store.export(ok["kernel"], problem)
        assert hashlib.sha256(export_cu.encode()).hexdigest() == store.measured_kernel(ok["kernel"], problem)["kernel"]["source_hash"]
