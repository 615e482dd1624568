"""Schema upgrades, applied when a store is opened for writing (a read-only open changes nothing).

One so far: stores written before kernels were identified by their source keep kernels unique on
(name, arch). Opened for writing, such a store is upgraded in place to unique (name, arch,
source_hash); rows, ids and trials are kept as they are. SQLite cannot drop a constraint, so the
kernels table is rebuilt in one transaction (create, copy, drop, rename, indexes, foreign-key
check); PostgreSQL swaps the constraint. Opened read-only, an old store reads as before: the
columns are the same, only what may be written next differs.
"""

from __future__ import annotations

from sqlalchemy import Engine, MetaData, inspect
from sqlalchemy.schema import CreateIndex, CreateTable

from store.models import KERNEL_IDENTITY, Kernel

__all__ = ["outdated", "upgrade"]

OLD_KERNEL_IDENTITY = ("name", "arch")


def _old_constraint(engine: Engine) -> str | None:
    """The name of the old (name, arch) unique constraint on the kernels table, if it is there."""
    insp = inspect(engine)
    if not insp.has_table(Kernel.__tablename__):
        return None
    for uc in insp.get_unique_constraints(Kernel.__tablename__):
        if tuple(uc["column_names"]) == OLD_KERNEL_IDENTITY:
            return uc["name"] or "(unnamed)"
    return None


def outdated(engine: Engine) -> list[str]:
    """What upgrade() would change, in words (empty: the schema is current)."""
    name = _old_constraint(engine)
    if name is None:
        return []
    return [f"{Kernel.__tablename__}: unique {name} on (name, arch) becomes {KERNEL_IDENTITY} on "
            f"(name, arch, source_hash)"]


def upgrade(engine: Engine) -> list[str]:
    """Bring an older store's schema up to date; returns what was done (empty when nothing was)."""
    done = outdated(engine)
    if not done:
        return []
    if engine.dialect.name == "sqlite":
        _rebuild_sqlite_kernels(engine)
    else:
        _swap_constraint(engine, _old_constraint(engine) or "")
    return done


def _swap_constraint(engine: Engine, old_name: str) -> None:
    q = engine.dialect.identifier_preparer.quote
    table = q(Kernel.__tablename__)
    with engine.begin() as conn:
        conn.exec_driver_sql(f"ALTER TABLE {table} DROP CONSTRAINT {q(old_name)}")
        conn.exec_driver_sql(f"ALTER TABLE {table} ADD CONSTRAINT {q(KERNEL_IDENTITY)} "
                             f"UNIQUE (name, arch, source_hash)")


def _rebuild_sqlite_kernels(engine: Engine) -> None:
    """SQLite's documented way to change a table's constraints, in one IMMEDIATE transaction."""
    table = Kernel.__tablename__
    scratch = f"{table}_upgrade"
    create = str(CreateTable(Kernel.__table__.to_metadata(MetaData(), name=scratch)).compile(dialect=engine.dialect))
    indexes = [str(CreateIndex(ix).compile(dialect=engine.dialect)) for ix in Kernel.__table__.indexes]
    columns = ", ".join(c.name for c in Kernel.__table__.columns)
    raw = engine.raw_connection()
    try:
        db = raw.driver_connection
        isolation = db.isolation_level
        db.isolation_level = None  # explicit BEGIN/COMMIT below
        db.execute("PRAGMA foreign_keys = OFF")  # trials keep pointing at the same kernel ids
        try:
            db.execute("BEGIN IMMEDIATE")
            try:
                sql = db.execute("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = ?", (table,)).fetchone()
                if sql is None or KERNEL_IDENTITY in sql[0]:
                    db.execute("ROLLBACK")  # another process upgraded it meanwhile
                    return
                db.execute(create)
                db.execute(f"INSERT INTO {scratch} ({columns}) SELECT {columns} FROM {table}")
                db.execute(f"DROP TABLE {table}")
                db.execute(f"ALTER TABLE {scratch} RENAME TO {table}")
                for ddl in indexes:
                    db.execute(ddl)
                broken = db.execute("PRAGMA foreign_key_check").fetchall()
                if broken:
                    raise RuntimeError(f"upgrading {table} would break foreign keys: {broken[:5]}")
                db.execute("COMMIT")
            except BaseException:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise
        finally:
            db.execute("PRAGMA foreign_keys = ON")
            db.isolation_level = isolation
    finally:
        raw.close()
