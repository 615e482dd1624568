"""Schema upgrades, applied when a store is opened for writing (a read-only open changes nothing).

1. Stores written before kernels were identified by their source keep kernels unique on
   (name, arch). Opened for writing, such a store is upgraded in place to unique (name, arch,
   source_hash); rows, ids and trials are kept as they are. SQLite cannot drop a constraint, so the
   kernels table is rebuilt in one transaction (create, copy, drop, rename, indexes, foreign-key
   check); PostgreSQL swaps the constraint. Opened read-only, such a store reads as before: the
   columns are the same, only what may be written next differs.
2. Stores written before block-sparse W have no ``pattern`` column on ``gs_problems`` and no
   ``gs_patterns`` table. Opened for writing, the column is added (NULL: every existing problem is
   dense, or was stored without its pattern) and the table created; no row changes. Opened
   read-only, such a store reads as before with ``pattern`` None on every problem: the reads leave
   the missing column out (``has_pattern_column``), and ``Store.pattern`` finds no table.
"""

from __future__ import annotations

from sqlalchemy import Engine, MetaData, inspect
from sqlalchemy.schema import CreateIndex, CreateTable

from store.models import KERNEL_IDENTITY, Kernel, Pattern, Problem

__all__ = ["has_pattern_column", "outdated", "upgrade"]

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


def has_pattern_column(engine: Engine) -> bool:
    """Whether the problems table has its ``pattern`` column (True when there is no such table yet:
    nothing to leave out of a read)."""
    insp = inspect(engine)
    if not insp.has_table(Problem.__tablename__):
        return True
    return any(c["name"] == "pattern" for c in insp.get_columns(Problem.__tablename__))


def _kernel_change(engine: Engine) -> str | None:
    name = _old_constraint(engine)
    if name is None:
        return None
    return (f"{Kernel.__tablename__}: unique {name} on (name, arch) becomes {KERNEL_IDENTITY} on "
            f"(name, arch, source_hash)")


def _sparse_changes(engine: Engine) -> list[str]:
    insp = inspect(engine)
    if not insp.has_table(Problem.__tablename__):
        return []  # not a gemmscape store (yet): create_all makes the tables as they are now
    changes = []
    if not has_pattern_column(engine):
        changes.append(f"{Problem.__tablename__}: new column pattern (the hash of a block-sparse W's pattern)")
    if not insp.has_table(Pattern.__tablename__):
        changes.append(f"{Pattern.__tablename__}: new table (the structure of each block-sparse pattern)")
    return changes


def outdated(engine: Engine) -> list[str]:
    """What upgrade() would change, in words (empty: the schema is current)."""
    kernels = _kernel_change(engine)
    return ([kernels] if kernels else []) + _sparse_changes(engine)


def upgrade(engine: Engine) -> list[str]:
    """Bring an older store's schema up to date; returns what was done (empty when nothing was).
    Called under the setup lock (store.db.setup_lock), so processes opening one store take turns."""
    done = outdated(engine)
    if not done:
        return []
    if _kernel_change(engine) is not None:
        if engine.dialect.name == "sqlite":
            _rebuild_sqlite_kernels(engine)
        else:
            _swap_constraint(engine, _old_constraint(engine) or "")
    if _sparse_changes(engine):
        _add_sparse(engine)
    return done


def _add_sparse(engine: Engine) -> None:
    """The pattern column and the patterns table. PostgreSQL and SQLite both add a nullable column
    in place (no row is rewritten). Each step checks first, so a store upgraded halfway (a process
    killed between the two) is finished by the next open for writing."""
    q = engine.dialect.identifier_preparer.quote
    column = Problem.__table__.c.pattern
    ddl = (f"ALTER TABLE {q(Problem.__tablename__)} ADD COLUMN {q(column.name)} "
           f"{column.type.compile(dialect=engine.dialect)}")
    with engine.begin() as conn:
        if not any(c["name"] == column.name for c in inspect(conn).get_columns(Problem.__tablename__)):
            conn.exec_driver_sql(ddl)
        Pattern.__table__.create(conn, checkfirst=True)


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
