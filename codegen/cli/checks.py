"""Places on disk, the store and the GPU, checked before anything is written: a bad one is a
UsageError (exit 2) that says why, and a store that is not there to read is a Failure (exit 1).
No GPU to run on is one line for every command that needs one (``no_gpu_line``, exit 2)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from codegen.cli.errors import Failure, UsageError

SQLITE_HEADER = b"SQLite format 3\x00"


def url_problem(url: str) -> str | None:
    """Why ``url`` is not a database URL gemmscape can take (None: it looks like one)."""
    from sqlalchemy import make_url
    from sqlalchemy.exc import ArgumentError

    if "://" not in url:
        path = Path(url).expanduser()
        return (f"{url!r} is a path, not a database URL; for a SQLite file write "
                f"sqlite:///{path.resolve() if not path.is_absolute() else path}")
    try:
        parsed = make_url(url)
    except ArgumentError:
        return f"{url!r} is not a database URL (e.g. sqlite:////abs/path/gemmscape.db or postgresql+psycopg://...)"
    if parsed.get_backend_name() not in ("sqlite", "postgresql"):
        return f"{url!r}: gemmscape stores in SQLite or PostgreSQL, not {parsed.get_backend_name()}"
    return None


def _nearest_existing(path: Path) -> Path:
    while not path.exists() and path.parent != path:
        path = path.parent
    return path


def _can_create_in(folder: Path) -> str | None:
    """None when a file can be created in ``folder`` (tried with a temporary file, then removed)."""
    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as e:
        return e.strerror or str(e)
    return None


def check_writable(path: Path, what: str, folder: bool) -> None:
    """``path`` (a folder when ``folder``, else a file) can be created or written; UsageError why not."""
    path = path.expanduser()
    if path.exists():
        if folder and not path.is_dir():
            raise UsageError(f"{what} {path} is a file, not a folder")
        if not folder and path.is_dir():
            raise UsageError(f"{what} {path} is a folder, not a file")
        where = path if folder else path.parent
    else:
        where = _nearest_existing(path.parent)
        if not where.is_dir():
            raise UsageError(f"{what} {path} is under {where}, which is a file, not a folder")
    reason = _can_create_in(where)
    if reason:
        raise UsageError(f"{what} {path} cannot be written: {where} is not writable ({reason})")
    if path.exists() and not folder and not os.access(path, os.W_OK):
        raise UsageError(f"{what} {path} is read-only")


def check_cache() -> None:
    """``$GEMMSCAPE_CACHE``, when set, must name a folder that can be written."""
    value = os.environ.get("GEMMSCAPE_CACHE")
    if value is None:
        return
    if not value.strip():
        raise UsageError("GEMMSCAPE_CACHE is set but empty: unset it (the cache is then ~/.cache/gemmscape) "
                         "or name a folder")
    check_writable(Path(value), "GEMMSCAPE_CACHE", folder=True)


def store_url(url: str | None) -> str:
    """The URL the store opens: ``--db``, else ``$GEMMSCAPE_DB``, else the default file (checked)."""
    from store.db import ENV_VAR, default_url

    if url:
        return url
    chosen = default_url()
    reason = url_problem(chosen)
    if reason:
        raise UsageError(f"{ENV_VAR}: {reason}")
    return chosen


def check_store(url: str | None, read_only: bool = False) -> str:
    """Check what ``url`` names before anything opens it: a SQLite file must be a SQLite database
    and, to write, writable, or creatable in a folder that exists (the default store's folder
    excepted, which the store creates: store.db.folder_problem). Returns the URL to open."""
    from store.db import folder_problem, missing_message, sqlite_path

    url = store_url(url)
    path = sqlite_path(url)
    if path is None:
        return url
    if path.is_dir():
        raise UsageError(f"the store {path} is a folder, not a database file")
    if path.exists():
        try:
            with path.open("rb") as f:
                head = f.read(len(SQLITE_HEADER))
        except OSError as e:
            raise UsageError(f"cannot read the store {path}: {e.strerror or e}") from None
        if head and head != SQLITE_HEADER:
            raise UsageError(f"{path} is not a SQLite database, so not a gemmscape store")
    elif read_only:
        raise Failure(missing_message(path))
    if not read_only:
        check_writable(path, "the store", folder=False)
        reason = None if path.exists() else folder_problem(path)
        if reason:
            raise UsageError(reason)
    return url


def open_store(url: str | None, read_only: bool = False):
    """The store, opened after ``check_store``; a database that cannot be opened is a UsageError."""
    from sqlalchemy.exc import SQLAlchemyError

    from store import Store, StoreError

    url = check_store(url, read_only)
    try:
        store = Store(url, read_only=read_only)
        _ = store.ready  # connect now: an unreachable server is found here
    except ModuleNotFoundError as e:
        raise UsageError(f"no database driver for {safe_url(url)} ({e.name} is not installed; for PostgreSQL: "
                         f"pip install 'gemmscape[postgres]')") from None
    except (StoreError, SQLAlchemyError, OSError) as e:
        raise UsageError(f"cannot open the store {safe_url(url)}: {one_line(e)}") from None
    return store


def safe_url(url: str) -> str:
    """``url`` as it may be shown: its password hidden."""
    from sqlalchemy import make_url

    return make_url(url).render_as_string(hide_password=True)


def one_line(e: BaseException) -> str:
    """An exception as one line: a database error's own message, without SQLAlchemy's trailer."""
    orig = getattr(e, "orig", None)
    text = str(orig if orig is not None else e).strip() or type(e).__name__
    return " ".join(line.strip() for line in text.splitlines()
                    if line.strip() and not line.strip().startswith("(Background on this error"))



#: What a command that runs kernels on the GPU can do without one: the end of its no-GPU line.
WITHOUT_GPU = {
    "bench": "`codegen compile` renders and compiles a variant without one",
    "search": "to search recorded H200 measurements without one use --replay FILE (see README)",
    "tune-linear": "to tune from a recording without one use --replay FILE",
    "tune-model": "to tune from a recording without one use --replay FILE",
}


def no_gpu_line(e: BaseException, command: str | None) -> str:
    """The one line of every command that needs a GPU and finds none it can use (codegen.worker.NoGpu,
    or a GPU worker that cannot start): what is missing, that the command needs a GPU, and what it
    can do without one."""
    reason = one_line(e).rstrip(".")
    alternative = WITHOUT_GPU.get(command or "")
    return f"{reason}: it needs an NVIDIA GPU and its driver" + (f"; {alternative}" if alternative else "")
