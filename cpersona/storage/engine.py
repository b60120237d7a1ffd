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

PostgreSQL (``CPERSONA_DATABASE_URL``) keeps the same model across processes and
machines: readers run REPEATABLE READ (one snapshot per read session, like a WAL
read transaction); writers run READ COMMITTED and take one transaction-scoped
advisory lock first, so writers are serialised exactly as BEGIN IMMEDIATE
serialises them on SQLite. Because READ COMMITTED takes a fresh snapshot per
statement, every statement after the lock sees all earlier commits: a
read-modify-write inside ``write()`` cannot lose an update, whichever process
raced it. Unique indexes still enforce dedup underneath.
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


# The key of the cluster-wide writer lock (pg_advisory_xact_lock); any constant
# works as long as every cpersona process uses the same one ("cpersona" in ASCII).
PG_WRITER_LOCK_KEY = 0x63706572736F6E61


class Database:
    """One database: an engine plus the rules for reading and writing it."""

    def __init__(self, engine: Engine, *, path: Path | None = None) -> None:
        self.engine = engine
        self.path = path
        self._write_lock = threading.RLock()
        # The session of the snapshot() this thread is inside, if any.
        self._shared = threading.local()

    @property
    def label(self) -> str:
        """Where the data lives, for messages: the file, or the URL without password."""
        if self.path is not None:
            return str(self.path)
        return self.engine.url.render_as_string(hide_password=True)

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    @property
    def is_sqlite(self) -> bool:
        return self.dialect == "sqlite"

    @contextmanager
    def read(self) -> Iterator[Session]:
        """A session over one read snapshot; nothing it does is committed.

        Inside :meth:`snapshot` on the same thread, the snapshot's session.
        """
        shared = getattr(self._shared, "session", None)
        if shared is not None:
            yield shared
            return
        bind: Engine | Connection = self.engine
        if not self.is_sqlite:
            bind = self.engine.execution_options(isolation_level="REPEATABLE READ")
        with Session(bind, autoflush=False, expire_on_commit=False) as session:
            try:
                yield session
            finally:
                session.rollback()

    @contextmanager
    def snapshot(self) -> Iterator[None]:
        """Every read() this thread opens inside shares one session and one snapshot.

        A recall reads five or six times; opening a session each time (pool
        checkout, BEGIN, ROLLBACK) cost about as much as its cheaper statements.
        Writes inside still take their own connection, and a read after a write
        inside the block does not see it, so wrap only a read pipeline. The
        session starts lazily, at the first statement, so work before that
        (an embedding call) holds no snapshot open.

        SQLite only: a failed statement leaves a SQLite read transaction usable,
        while on PostgreSQL it aborts the transaction, and every later read of
        the block would fail with it; there each read keeps its own session.
        """
        if not self.is_sqlite or getattr(self._shared, "session", None) is not None:
            yield
            return
        with self.read() as session:
            self._shared.session = session
            try:
                yield
            finally:
                self._shared.session = None

    def _begin_write(self, conn: Connection) -> Connection:
        if self.is_sqlite:
            return conn.execution_options(sqlite_begin="IMMEDIATE")
        return conn.execution_options(isolation_level="READ COMMITTED")

    def _lock_writers(self, conn: Connection) -> None:
        # First statement of the transaction, so every later statement's
        # snapshot is taken after the previous writer committed.
        if not self.is_sqlite:
            conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock({PG_WRITER_LOCK_KEY})")

    @contextmanager
    def write(self) -> Iterator[Session]:
        """A session holding the write lock; commits on success, rolls back on error."""
        with self._write_lock:
            with self.engine.connect() as conn:
                conn = self._begin_write(conn)
                with conn.begin():
                    self._lock_writers(conn)
                    with Session(bind=conn, autoflush=False, expire_on_commit=False) as session:
                        yield session
                        session.flush()

    @contextmanager
    def write_connection(self) -> Iterator[Connection]:
        """Like write(), for raw SQL (migrations, bulk maintenance)."""
        with self._write_lock:
            with self.engine.connect() as conn:
                conn = self._begin_write(conn)
                with conn.begin():
                    self._lock_writers(conn)
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


def postgres_engine(url: str) -> Engine:
    """An engine on a PostgreSQL database (psycopg 3)."""
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    if parsed.get_backend_name() != "postgresql":
        raise ValueError(f"CPERSONA_DATABASE_URL must be a postgresql URL, got {parsed.drivername!r}")
    if parsed.drivername == "postgresql":
        parsed = parsed.set(drivername="postgresql+psycopg")
    # pre_ping: a server restart must not surface as an error on the next call.
    return create_engine(parsed, pool_size=8, max_overflow=8, pool_pre_ping=True)


def open_postgres(url: str) -> Database:
    """Open the PostgreSQL database named by ``url`` (nothing is created)."""
    return Database(postgres_engine(url))


def open_database(settings: Any) -> Database:
    """The database the settings name: PostgreSQL when database_url is set, else the SQLite file."""
    url = getattr(settings, "database_url", None)
    if url:
        return open_postgres(url)
    return open_sqlite(settings.db_file)
