"""Where the database lives and how an engine for it is opened.

The default is a SQLite file at ``~/.local/share/gemmscape/gemmscape.db``; the environment
variable ``GEMMSCAPE_DB`` (a SQLAlchemy URL) overrides it. SQLite files are opened in WAL
mode with a busy timeout, so a dashboard can read while a search writes. Any other URL
(PostgreSQL) is passed to SQLAlchemy as it is.

The default file's folder is created when missing (it is gemmscape's own place); the folder of
any other SQLite file must exist already (``folder_problem``): a folder a user names, or a typo
in it, is never made for them.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import quote

from sqlalchemy import URL, Engine, create_engine, event, make_url, text

ENV_VAR = "GEMMSCAPE_DB"
BUSY_TIMEOUT_S = 30
#: PostgreSQL advisory-lock key under which gemmscape creates and upgrades tables and studies.
SETUP_LOCK_KEY = 0x67656D6D  # "gemm"


class StoreError(RuntimeError):
    """A problem with the database that the user can act on; the message says how."""


class DatabaseMissing(StoreError):
    """Read-only open of a SQLite file that does not exist."""


class ReadOnlyError(StoreError):
    """A write was attempted through a store opened read-only."""


def default_path() -> Path:
    return Path.home() / ".local" / "share" / "gemmscape" / "gemmscape.db"


def default_url() -> str:
    """``$GEMMSCAPE_DB`` if set, else the SQLite file under ``~/.local/share/gemmscape``."""
    return os.environ.get(ENV_VAR) or f"sqlite:///{default_path()}"


def folder_problem(path: Path) -> str | None:
    """Why a new SQLite file at ``path`` cannot be created for want of its folder (None: the folder
    is there, or ``path`` is the default store's, whose folder gemmscape creates)."""
    path = path.expanduser()
    folder = path.parent
    if folder.exists() or path.absolute() == default_path():
        return None
    return (f"the folder of the store {path} does not exist: create it first (mkdir -p {folder}), or name a "
            f"store in a folder that exists")


def sqlite_path(url: str | URL) -> Path | None:
    """The file behind a SQLite URL; None for in-memory SQLite or another backend."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite":
        return None
    database = parsed.database or ""
    if database in ("", ":memory:") or database.startswith("file:"):
        return None
    return Path(database).expanduser()


def is_sqlite(url: str | URL) -> bool:
    return make_url(url).get_backend_name() == "sqlite"


def _sqlite_pragmas(engine: Engine, read_only: bool) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection, _record) -> None:  # type: ignore[no-untyped-def]
        cursor = dbapi_connection.cursor()
        cursor.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_S * 1000}")
        cursor.execute("PRAGMA foreign_keys = ON")
        if not read_only:
            cursor.execute("PRAGMA journal_mode = WAL")
        cursor.close()


def missing_message(path: Path) -> str:
    """What to say where a store is to be read and there is none: the one message of the command
    line (``codegen results``, ``export``, ``app``...), the store and the dashboard."""
    return (f"no gemmscape database at {path}: run a search first (`codegen search ...`), or name one with "
            f"--db URL or the {ENV_VAR} environment variable")


def _read_only_sqlite_url(path: Path) -> URL:
    if not path.exists():
        raise DatabaseMissing(missing_message(path))
    return URL.create("sqlite", database=f"file:{quote(str(path.resolve()))}", query={"mode": "ro", "uri": "true"})


def make_engine(url: str, read_only: bool = False) -> Engine:
    """An engine for ``url``; read-only SQLite opens the file with ``mode=ro``."""
    if not is_sqlite(url):
        engine = create_engine(url, pool_pre_ping=True)
        if read_only and engine.dialect.name == "postgresql":
            engine = engine.execution_options(postgresql_readonly=True)
        return engine
    path = sqlite_path(url)
    if path is None:
        if read_only:
            raise StoreError(f"read-only mode needs a SQLite file, not {url!r}")
        engine = create_engine(url)
    elif read_only:
        engine = create_engine(_read_only_sqlite_url(path), connect_args={"timeout": BUSY_TIMEOUT_S})
    else:
        reason = folder_problem(path)
        if reason:
            raise StoreError(reason)
        path.parent.mkdir(parents=True, exist_ok=True)  # the default store's own folder
        engine = create_engine(URL.create("sqlite", database=str(path)), connect_args={"timeout": BUSY_TIMEOUT_S})
    _sqlite_pragmas(engine, read_only)
    return engine


@contextmanager
def setup_lock(engine: Engine) -> Iterator[None]:
    """Held while tables, schema upgrades and Optuna studies are created, so that processes
    starting together on one database take turns instead of failing on each other's CREATE.

    PostgreSQL: a session advisory lock on its own connection. A SQLite file: an exclusive
    ``flock`` on ``<file>.lock`` beside it (never on the database file itself: closing another
    descriptor of that file would drop the POSIX locks SQLite holds on it in this process).
    In-memory SQLite: nothing to share, no lock.
    """
    if engine.dialect.name == "postgresql":
        with engine.connect() as conn:
            conn.execute(text("SELECT pg_advisory_lock(:key)"), {"key": SETUP_LOCK_KEY})
            conn.commit()
            try:
                yield
            finally:
                conn.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": SETUP_LOCK_KEY})
                conn.commit()
        return
    path = sqlite_path(engine.url) if engine.dialect.name == "sqlite" else None
    if path is None:
        yield
        return
    with open(path.with_name(path.name + ".lock"), "ab") as handle:  # beside the file: its folder exists
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
