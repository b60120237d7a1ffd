"""Opening the database: driver choice, sqlite-vec, PRAGMAs, the writer lock.

SQLite is driven through sqlean.py when it is installed (the stdlib ``sqlite3``
of many Python builds cannot load extensions, and sqlite-vec is an extension).
Where the stdlib module can load extensions it is used instead. Only one of the
two is ever loaded into a process: mixing them crashes the interpreter at exit.

Concurrency model (spec PG-4): reads run on pooled connections and see committed
data only (WAL snapshots); writes are serialised by a process-wide lock held from
``BEGIN IMMEDIATE`` to commit, so two writers of this process never contend on
SQLite's own lock and a writer of another process waits up to busy_timeout.
No network call may run while the lock is held: callers embed first, then write.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import anyio.to_thread
from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.orm import Session

log = logging.getLogger(__name__)

T = TypeVar("T")

PRAGMAS = (
    "journal_mode=WAL",
    "busy_timeout=5000",
    "synchronous=NORMAL",
    "cache_size=-65536",  # 64 MiB page cache
    "foreign_keys=ON",
)


def sqlite_module() -> Any:
    """The DB-API module that can load sqlite-vec on this interpreter."""
    try:
        import sqlean

        return sqlean
    except ImportError:  # pragma: no cover - depends on the platform's wheels
        import sqlite3

        if hasattr(sqlite3.Connection, "enable_load_extension"):
            return sqlite3
        raise RuntimeError(
            "no SQLite driver that can load extensions: install sqlean.py"
        ) from None


def _load_sqlite_vec(dbapi_conn: Any) -> bool:
    try:
        import sqlite_vec
    except ImportError:  # pragma: no cover - sqlite-vec is a hard dependency
        return False
    dbapi_conn.enable_load_extension(True)
    try:
        sqlite_vec.load(dbapi_conn)
    finally:
        dbapi_conn.enable_load_extension(False)
    return True


def prepare_db_file(path: Path) -> None:
    """Create the parent folder (0700) and an empty file (0600) if missing.

    Creating the file before SQLite opens it gives the WAL and SHM files the
    same owner-only mode (spec FS-4). An existing file's mode is left alone.
    """
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    if not path.exists():
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        os.close(fd)
    elif path.stat().st_mode & 0o077:
        log.warning("database %s is readable by group or others", path)


class Database:
    """One database: an engine plus the rules for reading and writing it."""

    def __init__(self, engine: Engine, *, path: Path | None = None) -> None:
        self.engine = engine
        self.path = path
        self._write_lock = threading.RLock()

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    @property
    def is_sqlite(self) -> bool:
        return self.dialect == "sqlite"

    @contextmanager
    def read(self) -> Iterator[Session]:
        """A session over one read snapshot; nothing it does is committed."""
        with Session(self.engine, autoflush=False, expire_on_commit=False) as session:
            try:
                yield session
            finally:
                session.rollback()

    @contextmanager
    def write(self) -> Iterator[Session]:
        """A session holding the write lock; commits on success, rolls back on error."""
        with self._write_lock:
            with self.engine.connect() as conn:
                if self.is_sqlite:
                    conn = conn.execution_options(sqlite_begin="IMMEDIATE")
                with conn.begin():
                    with Session(bind=conn, autoflush=False, expire_on_commit=False) as session:
                        yield session
                        session.flush()

    @contextmanager
    def write_connection(self) -> Iterator[Connection]:
        """Like write(), for raw SQL (migrations, bulk maintenance)."""
        with self._write_lock:
            with self.engine.connect() as conn:
                if self.is_sqlite:
                    conn = conn.execution_options(sqlite_begin="IMMEDIATE")
                with conn.begin():
                    yield conn

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """Run blocking database work off the event loop."""
        return await anyio.to_thread.run_sync(fn, *args)

    def close(self) -> None:
        self.engine.dispose()


def sqlite_engine(path: Path | str, *, foreign_keys: bool = True) -> Engine:
    """An engine on a SQLite file with sqlite-vec loaded on every connection."""
    module = sqlite_module()
    url = "sqlite+pysqlite:///" + (str(path) if str(path) == ":memory:" else str(Path(path)))
    engine = create_engine(url, module=module, pool_size=8, max_overflow=8)
    pragmas = PRAGMAS if foreign_keys else PRAGMAS[:-1] + ("foreign_keys=OFF",)

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        # The driver must not open transactions on its own: SQLAlchemy's begin
        # hook below issues the right BEGIN for readers and writers.
        dbapi_conn.isolation_level = None
        _load_sqlite_vec(dbapi_conn)
        for pragma in pragmas:
            dbapi_conn.execute(f"PRAGMA {pragma}")

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        mode = conn.get_execution_options().get("sqlite_begin", "DEFERRED")
        conn.exec_driver_sql(f"BEGIN {mode}")

    return engine


def open_sqlite(path: Path) -> Database:
    """Open (creating if needed) the SQLite database at ``path``."""
    path = Path(path).expanduser().resolve()
    prepare_db_file(path)
    return Database(sqlite_engine(path), path=path)
