"""Another SQLite database (a 2.6 file to copy, one to report on), opened so that it cannot be written.

Opened read-only (``mode=ro`` URI, or immutable where SQLite could not read the
file otherwise, plus ``query_only``) and read in one snapshot (spec README
decision 9: a 2.6 database is never opened for writing).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, create_engine, event, text
from sqlalchemy.pool import NullPool

from cpersona.storage.engine import read_only_uri, sqlite_module


@contextmanager
def read_only_snapshot(path: Path) -> Iterator[Connection]:
    """A connection that cannot write to ``path``, inside one read transaction."""
    uri = read_only_uri(path)  # immutable where SQLite could not read the file otherwise
    engine = create_engine(
        "sqlite+pysqlite://",
        module=sqlite_module(),
        creator=lambda: sqlite_module().connect(uri, uri=True, check_same_thread=False),
        poolclass=NullPool,
    )

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None  # our BEGIN below, not the driver's
        dbapi_conn.execute("PRAGMA query_only = ON")
        dbapi_conn.execute("PRAGMA busy_timeout = 5000")

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        conn.exec_driver_sql("BEGIN")

    try:
        with engine.connect() as conn, conn.begin() as txn:
            yield conn
            txn.rollback()
    finally:
        engine.dispose()


def schema_version(conn: Connection) -> int | None:
    """The file's ``schema_version`` (its highest), or None when it has no such row."""
    return conn.execute(text("SELECT max(version) FROM schema_version")).scalar()


def row_count(conn: Connection, table: str) -> int:
    """Rows in ``table`` (a name the caller took from the file's own table list)."""
    return conn.execute(text(f"SELECT count(*) FROM {table}")).scalar_one()
