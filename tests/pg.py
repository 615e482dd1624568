"""PostgreSQL for tests: a fresh database per test on the server ``GEMMSCAPE_TEST_PG`` names.

``GEMMSCAPE_TEST_PG`` is a SQLAlchemy URL (``postgresql+psycopg://user@127.0.0.1:port/db``);
.ci/run starts a server on loopback and sets it. Each test gets its own database (created and
dropped here), so Optuna's tables and studies never leak from one test into another; a role that
may not create databases gets the named database, emptied after the test.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from sqlalchemy import MetaData, create_engine, make_url, text
from sqlalchemy.exc import SQLAlchemyError

ENV = "GEMMSCAPE_TEST_PG"


def server_url() -> str:
    url = os.environ.get(ENV)
    if not url and os.environ.get("GEMMSCAPE_REQUIRE_PG"):
        pytest.fail(f"{ENV} is not set, and GEMMSCAPE_REQUIRE_PG says PostgreSQL tests must run")
    if not url:
        pytest.skip(f"{ENV} is not set (a PostgreSQL URL to run the store suite against)")
    return url


@contextmanager
def fresh_database() -> Iterator[str]:
    """The URL of a new, empty database on the test server; dropped afterwards."""
    base = make_url(server_url())
    name = f"gemmscape_test_{uuid.uuid4().hex[:12]}"
    admin = create_engine(base, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
    except SQLAlchemyError:  # no CREATEDB: use the named database and empty it after
        admin.dispose()
        yield base.render_as_string(hide_password=False)
        _empty(base.render_as_string(hide_password=False))
        return
    try:
        yield base.set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def _empty(url: str) -> None:
    engine = create_engine(url)
    meta = MetaData()
    meta.reflect(engine)
    meta.drop_all(engine)
    engine.dispose()
