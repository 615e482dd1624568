"""One store suite, run against every backend at hand: a SQLite file always, PostgreSQL when
``GEMMSCAPE_TEST_PG`` names a server (a fresh database per test, see tests/pg.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from store import Store
from tests.pg import fresh_database

BACKENDS = ["sqlite", "postgresql"]


@pytest.fixture(params=BACKENDS)
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'store.db'}"
        return
    with fresh_database() as url:
        yield url


@pytest.fixture
def store(store_url: str) -> Iterator[Store]:
    s = Store(store_url)
    yield s
    s.close()
