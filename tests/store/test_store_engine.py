"""Engine set-up: default location, WAL, read-only opening, clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy.exc import OperationalError

from codegen.problem import Problem
from store import DatabaseMissing, ReadOnlyError, Store, StoreError, default_url
from store.models import Device

H200 = {"name": "NVIDIA H200", "sm": "sm_90", "driver": "580.159.04", "nvrtc": "13.0"}


def test_default_url_follows_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("GEMMSCAPE_DB", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert default_url() == f"sqlite:///{tmp_path}/.local/share/gemmscape/gemmscape.db"
    store = Store()  # creates the default store's own folder
    assert (tmp_path / ".local/share/gemmscape/gemmscape.db").exists()
    store.close()
    monkeypatch.setenv("GEMMSCAPE_DB", f"sqlite:///{tmp_path}/elsewhere/x.db")
    assert default_url().endswith("elsewhere/x.db")
    (tmp_path / "elsewhere").mkdir()
    with Store() as s:
        assert s.url.endswith("elsewhere/x.db") and (tmp_path / "elsewhere" / "x.db").exists()


def test_a_named_store_in_a_missing_folder_is_refused_and_nothing_is_created(tmp_path: Path) -> None:
    """Only the default store's folder is created; a folder a user names (a typo, a path meant for
    another machine) must exist: StoreError saying so, and no folder, file or lock appears."""
    for url in (f"sqlite:///{tmp_path}/no/such/dir/x.db", f"sqlite:///{tmp_path}/no/x.db"):
        with pytest.raises(StoreError, match=r"does not exist: create it first \(mkdir -p "):
            Store(url)
        assert list(tmp_path.iterdir()) == []


def test_sqlite_runs_in_wal_mode(tmp_path: Path) -> None:
    with Store(f"sqlite:///{tmp_path / 'w.db'}") as s, s.engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() >= 1000


def test_read_only_refuses_writes(store_url: str) -> None:
    with Store(store_url) as writer:
        dev = writer.device(H200)
    with Store(store_url, read_only=True) as reader:
        assert reader.devices()[0]["id"] == dev
        with pytest.raises(ReadOnlyError):
            reader.device({**H200, "name": "other"})
        with pytest.raises(ReadOnlyError):
            reader.problem(Problem(8, 8, 8))
        with pytest.raises(ReadOnlyError):
            reader.add_trial(None, "k", "sm_90", Problem(8, 8, 8), dev, 0, {"status": "ok"}, {}, source_hash=None)
    assert len(Store(store_url).devices()) == 1


def test_read_only_sqlite_file_refuses_writes_below_the_api(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'ro.db'}"
    Store(url).close()
    with Store(url, read_only=True) as reader, reader._sessions() as session:
        session.add(Device(name="x", sm="sm_90", driver="", nvrtc=""))
        with pytest.raises(OperationalError, match="readonly"):
            session.commit()


def test_read_only_missing_file_says_what_to_do(tmp_path: Path) -> None:
    missing = tmp_path / "none.db"
    with pytest.raises(DatabaseMissing, match="codegen search") as err:
        Store(f"sqlite:///{missing}", read_only=True)
    assert str(missing) in str(err.value)
    assert not missing.exists()
    with pytest.raises(StoreError):
        Store("sqlite://", read_only=True)


def test_read_only_file_without_our_tables_reads_as_empty(tmp_path: Path) -> None:
    path = tmp_path / "empty.db"
    path.touch()
    with Store(f"sqlite:///{path}", read_only=True) as reader:
        assert not reader.ready
        assert reader.trials() == [] and reader.best() == [] and reader.runs() == []
        assert reader.problems() == [] and reader.devices() == [] and reader.kernels() == []
        assert reader.kernel_record("k") is None and reader.count_trials(1) == 0
