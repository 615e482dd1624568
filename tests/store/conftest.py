"""One store suite, run against every backend at hand: a SQLite file always, PostgreSQL when
``GEMMSCAPE_TEST_PG`` names a database URL."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from store import Store
from store.models import Base

BACKENDS = ["sqlite", "postgresql"]


def _url(backend: str, tmp_path: Path) -> str:
    if backend == "sqlite":
        return f"sqlite:///{tmp_path / 'store.db'}"
    url = os.environ.get("GEMMSCAPE_TEST_PG")
    if not url:
        pytest.skip("GEMMSCAPE_TEST_PG is not set (a PostgreSQL URL to run the store suite against)")
    return url


@pytest.fixture(params=BACKENDS)
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    url = _url(request.param, tmp_path)
    yield url
    if request.param == "postgresql":
        cleanup = Store(url)
        Base.metadata.drop_all(cleanup.engine)
        cleanup.close()


@pytest.fixture
def store(store_url: str) -> Iterator[Store]:
    s = Store(store_url)
    yield s
    s.close()
