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

A file this process may not write (its mode, its folder's, a read-only mount)
is found when it is opened, by asking the kernel what this process may do
(``access(2)`` with the effective ids, which is what SQLite's own open will
meet): it is then opened ``mode=ro`` and every write is refused before SQLite
is asked, with one sentence (:class:`cpersona.storage.errors.ReadOnlyDatabase`).
Reads keep working. As root a 0444 file is writable (the kernel lets root
write it), so it is not read-only; a file on a read-only mount is.

PostgreSQL (``CPERSONA_DATABASE_URL``) keeps the same model across processes and
machines: readers run REPEATABLE READ (one snapshot per read session, like a WAL
read transaction); writers run READ COMMITTED and take one transaction-scoped
advisory lock first, so writers are serialised exactly as BEGIN IMMEDIATE
serialises them on SQLite. Because READ COMMITTED takes a fresh snapshot per
statement, every statement after the lock sees all earlier commits: a
read-modify-write inside ``write()`` cannot lose an update, whichever process
raced it. Unique indexes still enforce dedup underneath.

Waiting for the lock (issue 13 item 3): a writer waits up to
``lock_wait_seconds`` (CPERSONA_WRITE_LOCK_WAIT_SECONDS, 30 s) for the process
lock and the database's own lock together (SQLite's busy handler is stretched
for the BEGIN; PostgreSQL's lock_timeout bounds the advisory lock), then raises
:class:`DatabaseBusy`. Long bulk writes (import, merge) use
:meth:`Database.write_batches` so they hold the lock for one batch at a time
and other writers take turns between batches.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import quote

from sqlalchemy import Connection, Engine, RootTransaction, create_engine, event
from sqlalchemy.exc import OperationalError
from sqlalchemy.pool import QueuePool

from cpersona.storage.errors import DatabaseBusy, ReadOnlyDatabase  # noqa: F401 — DatabaseBusy is raised here, named there
from cpersona.storage.sessions import CoreSession
from cpersona.storage.workers import WorkerPool

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

log = logging.getLogger(__name__)

T = TypeVar("T")

BUSY_TIMEOUT_MS = 5000
# The serving connections' page cache (PRAGMAS below) pays for itself where recall reads the
# exact window's 10,000 float vectors (15 MB) from SQLite: every cut below 64 MiB cost 13-22%
# recall CPU at 100k rows then, and 16 MiB still cost ~12% for reach 0 (docs/benchmarks.md,
# Scale). Where the process holds the vector index (a reach past the window: it serves both
# vector lists, storage/vector_index_sqlite.py) the cache holds FTS5 pages and rows only, and
# at 1M rows the 64 MiB filled and were 48 MB of a server's ~365 MB against a 300 MB target.
# 32 MiB there: over MCP at 1M, 16 MiB cost ~9% recall CPU against 64, 32 MiB none that
# showed (two rounds each, serving_cache_kib).
# Background work (backfill, the
# coarse reconcile, calibration, the task queue, the recall counters' flush) walks tables once
# and needs no hot pages, so it runs on connections of its own with SQLite's default cache
# (Database.background): before, each of those threads took a serving connection and filled
# its cache, and the pool kept 3-5 of them warm (RSS 441 MB at 100k).
SERVING_CACHE_KIB = 65536
HELD_VECTORS_CACHE_KIB = 32768
BACKGROUND_CACHE_KIB = 2048
PRAGMAS = (
    "journal_mode=WAL",
    f"busy_timeout={BUSY_TIMEOUT_MS}",
    "synchronous=NORMAL",
    f"cache_size=-{SERVING_CACHE_KIB}",  # 64 MiB page cache (serving_cache_kib may set less)
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
        raise RuntimeError("no SQLite driver that can load extensions: install sqlean.py") from None


def _sqlite_vec_path() -> str | None:
    """Where sqlite-vec's loadable extension is (no file suffix, as ``load_extension`` wants), or None.

    Found without importing the ``sqlite_vec`` package: its ``__init__`` imports
    ``numpy.typing`` (for a helper we never call), which cost every start ~0.1 s
    CPU and 12 MiB. The path is the one ``sqlite_vec.loadable_path()`` returns:
    ``vec0`` beside the package's ``__init__``.
    """
    import importlib.util

    spec = importlib.util.find_spec("sqlite_vec")  # finds the package without running it
    if spec is None or not spec.submodule_search_locations:  # pragma: no cover - a hard dependency
        return None
    return os.path.normpath(os.path.join(list(spec.submodule_search_locations)[0], "vec0"))


def _load_sqlite_vec(dbapi_conn: Any) -> bool:
    extension = _sqlite_vec_path()
    if extension is None:  # pragma: no cover - sqlite-vec is a hard dependency
        return False
    dbapi_conn.enable_load_extension(True)
    try:
        dbapi_conn.load_extension(extension)
    finally:
        dbapi_conn.enable_load_extension(False)
    return True


def _may(path: Path, mode: int) -> bool:
    return os.access(path, mode, effective_ids=os.access in os.supports_effective_ids)


def _side_files(path: Path) -> list[Path]:
    return [path.with_name(path.name + suffix) for suffix in ("-wal", "-shm")]


def unwritable_reason(path: Path) -> str | None:
    """Why this process cannot write the SQLite database at ``path``, or None when it can.

    SQLite writes the file itself and, in WAL mode, its ``-wal`` and ``-shm``
    beside it: a folder that refuses new files is fatal unless both already
    exist and are writable.
    """
    if path.exists() and not _may(path, os.W_OK):
        return "the file is read-only for this user"
    folder = path.parent
    if folder.exists() and not _may(folder, os.W_OK | os.X_OK):
        if not all(side.exists() and _may(side, os.W_OK) for side in _side_files(path)):
            return f"its folder {folder} does not let this user create the -wal and -shm files SQLite needs"
    return None


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


# How long a writer waits for the write lock before it gives up (the setting's default).
DEFAULT_LOCK_WAIT_SECONDS = 30.0
# Rows a bulk write (import, merge) commits at a time: small enough that another
# writer waits well under a second, large enough that commits stay cheap.
BATCH_ROWS = 250
# The pause after each batch's commit: long enough for a waiting writer (a
# thread of this process, or another process polling every BUSY_SLICE) to take
# the lock; 32 batches of an 8,000-row import add about one second.
BATCH_PAUSE_SECONDS = 0.03
BUSY_SLICE_SECONDS = 0.05


def _is_lock_conflict(exc: OperationalError) -> bool:
    """SQLite's SQLITE_BUSY / locked, or PostgreSQL's lock_not_available (55P03)."""
    orig = exc.orig
    if getattr(orig, "sqlite_errorcode", None) in (5, 6) or getattr(orig, "sqlstate", None) == "55P03":
        return True
    return "database is locked" in str(orig) or "database table is locked" in str(orig)


# Worker threads per database: reads run concurrently (WAL snapshots); writes
# queue on one lock anyway, so a few threads keep it busy and the rest of the
# queued writers wait without a thread (storage/workers.py).
READ_THREADS = 24
WRITE_THREADS = 8


# The key of the cluster-wide writer lock (pg_advisory_xact_lock); any constant
# works as long as every cpersona process uses the same one ("cpersona" in ASCII).
PG_WRITER_LOCK_KEY = 0x63706572736F6E61


class Database:
    """One database: an engine plus the rules for reading and writing it."""

    def __init__(
        self,
        engine: Engine,
        *,
        path: Path | None = None,
        read_only: str | None = None,
        background_engine: Callable[[], Engine] | None = None,
    ) -> None:
        self.engine = engine
        self.path = path
        # Why this process may not write the database (see the module docstring), or None.
        self.read_only = read_only
        self._write_lock = threading.RLock()
        self.lock_wait_seconds = DEFAULT_LOCK_WAIT_SECONDS
        # The session of the snapshot() this thread is inside, if any.
        self._shared = threading.local()
        # Built on the first background() (SQLite only): small-cache connections for background threads.
        self._background_factory = background_engine
        self._background: Engine | None = None
        self._background_lock = threading.Lock()
        # The threads run() hands async callers' work to (no thread starts before the first call).
        self._readers = WorkerPool("db-read", READ_THREADS)
        self._writers = WorkerPool("db-write", WRITE_THREADS)

    @property
    def label(self) -> str:
        """Where the data lives, for messages: the file, or the URL without password."""
        if self.path is not None:
            return str(self.path)
        return self.engine.url.render_as_string(hide_password=True)

    def _bind(self) -> Engine:
        """The engine this thread reads and writes through: the background one inside background()."""
        if getattr(self._shared, "background", False) and self._background is not None:
            return self._background
        return self.engine

    @property
    def background_engine(self) -> Engine | None:
        """The background connections' engine once built, else None (for checks and tests)."""
        return self._background

    @contextmanager
    def background(self) -> Iterator[None]:
        """Every read and write of this thread inside runs on a background connection.

        For threads that walk tables once (see BACKGROUND_CACHE_KIB): their
        connections have a small page cache and at most one stays pooled, the
        rest are closed when returned, so background work never adds a serving-size
        cache to the process. The write lock is the same one (writes of both
        kinds stay serialised). Elsewhere (PostgreSQL, no factory) a no-op.
        """
        if self._background_factory is None or getattr(self._shared, "background", False):
            yield
            return
        with self._background_lock:
            if self._background is None:
                self._background = self._background_factory()
        self._shared.background = True
        try:
            yield
        finally:
            self._shared.background = False

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
            if not self.is_sqlite:
                _end_failed_transaction(shared)
            yield shared
            return
        bind: Engine | Connection = self._bind()
        if not self.is_sqlite:
            bind = self.engine.execution_options(isolation_level="REPEATABLE READ")
        session = CoreSession(bind)
        try:
            yield session  # type: ignore[misc] - Session's interface, the ORM only on demand
        finally:
            session.close()

    @contextmanager
    def snapshot(self) -> Iterator[None]:
        """Every read() this thread opens inside shares one session and one snapshot.

        A recall reads five or six times; opening a session each time (pool
        checkout, BEGIN, ROLLBACK) cost about as much as its cheaper statements.
        Writes inside still take their own connection, and a read after a write
        inside the block does not see it, so wrap only a read pipeline. The
        session starts lazily, at the first statement, so work before that
        (an embedding call) holds no snapshot open.

        A failed statement leaves a SQLite read transaction usable, while on
        PostgreSQL it aborts the transaction: there the next read of the block
        rolls it back first and goes on in a new transaction (a fresh snapshot,
        the same as reads outside a block get). On PostgreSQL each session cost
        three round trips of its own (the pool's ping, BEGIN, ROLLBACK), about
        6-10 ms of a recall's dozen reads under load.
        """
        if getattr(self._shared, "session", None) is not None:
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

    def _lock_writers(self, conn: Connection, deadline: float) -> None:
        # First statement of the transaction, so every later statement's
        # snapshot is taken after the previous writer committed.
        if not self.is_sqlite:
            wait_ms = max(1, int((deadline - time.monotonic()) * 1000))
            conn.exec_driver_sql(f"SET LOCAL lock_timeout = {wait_ms}")
            conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock({PG_WRITER_LOCK_KEY})")
            conn.exec_driver_sql("SET LOCAL lock_timeout = DEFAULT")

    def _acquire(self, conn: Connection, wait: float | None = None) -> RootTransaction:
        """Take the process lock, then the database's, within ``wait`` (default lock_wait_seconds).

        On SQLite the BEGIN IMMEDIATE itself waits: its busy handler is given
        whatever is left of the wait instead of the usual 5 s. ``wait=0`` only
        tries.
        """
        wait = self.lock_wait_seconds if wait is None else wait
        deadline = time.monotonic() + wait
        if not (self._write_lock.acquire(timeout=wait) if wait > 0 else self._write_lock.acquire(blocking=False)):
            raise DatabaseBusy(wait)
        try:
            trans = self._begin_waiting(conn, deadline) if self.is_sqlite else conn.begin()
            try:
                self._lock_writers(conn, deadline)
            except BaseException:
                trans.rollback()
                raise
        except OperationalError as exc:
            self._write_lock.release()
            if _is_lock_conflict(exc):
                raise DatabaseBusy(wait) from exc
            raise
        except BaseException:
            self._write_lock.release()
            raise
        return trans

    @staticmethod
    def _begin_waiting(conn: Connection, deadline: float) -> RootTransaction:
        """BEGIN IMMEDIATE, retried until ``deadline``.

        SQLite's busy handler backs off to 100 ms between looks at the lock, so
        a writer that has waited a while would miss the short gap a bulk write
        leaves between its batches. Short attempts restart that schedule (1, 2,
        5, 10 ms ...) and keep the look frequent.
        """
        while True:
            left = deadline - time.monotonic()
            conn.execution_options(sqlite_busy_ms=max(0, int(min(left, BUSY_SLICE_SECONDS) * 1000)))
            try:
                return conn.begin()
            except OperationalError as exc:
                if not _is_lock_conflict(exc) or time.monotonic() >= deadline:
                    raise

    def _refuse_if_read_only(self) -> None:
        if self.read_only is not None:
            raise ReadOnlyDatabase(self.label, self.read_only)

    @contextmanager
    def _transaction(self, wait: float | None = None) -> Iterator[Connection]:
        self._refuse_if_read_only()
        with self._bind().connect() as conn:
            conn = self._begin_write(conn)
            trans = self._acquire(conn, wait)
            try:
                yield conn
                trans.commit()
            except BaseException:
                if trans.is_active:
                    trans.rollback()
                raise
            finally:
                self._write_lock.release()

    @contextmanager
    def write(self, wait: float | None = None) -> Iterator[Session]:
        """A session holding the write lock; commits on success, rolls back on error.

        Raises :class:`DatabaseBusy` when the lock stays taken past ``wait``
        seconds (default lock_wait_seconds; 0: only if it is free right now).
        """
        with self._transaction(wait) as conn:
            session = CoreSession(conn)
            try:
                yield session  # type: ignore[misc] - Session's interface, the ORM only on demand
                session.flush()
            finally:
                session.close()

    @contextmanager
    def write_connection(self) -> Iterator[Connection]:
        """Like write(), for raw SQL (migrations, bulk maintenance)."""
        with self._transaction() as conn:
            yield conn

    @contextmanager
    def write_batches(self, rows: int = BATCH_ROWS) -> Iterator[WriteBatches]:
        """A connection for a long bulk write that commits every ``rows`` rows.

        Between batches the lock is released, so other writers (this process's
        and other processes') take turns. What was committed stays committed
        when a later batch fails: callers must write so that any committed
        prefix is consistent and a re-run completes it.
        """
        self._refuse_if_read_only()
        with self._bind().connect() as conn:
            batches = WriteBatches(self, self._begin_write(conn), rows)
            try:
                yield batches
                batches.commit()
            finally:
                batches.close()

    async def run(self, fn: Callable[..., T], *args: Any, writes: bool = True) -> T:
        """Run blocking database work off the event loop, on the readers' or the writers' threads.

        Writers waiting for the write lock must not take the threads readers
        need (issue 13 item 5): each side has its own pool of threads, and a
        writer past the writers' limit waits in its pool's queue, holding none.
        """
        return await (self._writers if writes else self._readers).run(fn, *args)

    def close(self) -> None:
        # Work still running finishes before the connections go (it holds one).
        self._readers.close()
        self._writers.close()
        self.engine.dispose()
        if self._background is not None:
            self._background.dispose()


class WriteBatches:
    """The open batch of :meth:`Database.write_batches`: one connection, one transaction at a time."""

    def __init__(self, db: Database, conn: Connection, rows: int) -> None:
        self.db = db
        self.connection = conn
        self.rows = rows
        self.commits = 0
        # Run inside the open batch just before it commits, and after each
        # commit outside the lock (network calls, bookkeeping of what is durable).
        self.before_commit: Callable[[], None] | None = None
        self.after_commit: Callable[[], None] | None = None
        self._pending = 0
        self._trans: RootTransaction | None = db._acquire(conn)

    def tick(self, n: int = 1) -> bool:
        """Count ``n`` records written; commit and start a new batch when the batch is full.

        True when this call committed. Call it only where the records written so
        far form a consistent whole (a record with all its derived rows).
        """
        self._pending += n
        if self._pending < self.rows:
            return False
        self.commit()
        time.sleep(BATCH_PAUSE_SECONDS)
        self._trans = self.db._acquire(self.connection)
        return True

    def commit(self) -> None:
        """Commit the open batch and release the lock (the last call of a run)."""
        if self._trans is None:
            return
        if self.before_commit is not None:
            self.before_commit()
        trans, self._trans = self._trans, None
        try:
            trans.commit()
            self.commits += 1
            self._pending = 0
        finally:
            self.db._write_lock.release()
        if self.after_commit is not None:
            self.after_commit()

    def close(self) -> None:
        """Roll back whatever is still open (an error ended the run)."""
        if self._trans is None:
            return
        trans, self._trans = self._trans, None
        try:
            if trans.is_active:
                trans.rollback()
        finally:
            self.db._write_lock.release()


def _end_failed_transaction(session: Session) -> None:
    """Roll back ``session``'s PostgreSQL transaction when a statement of it failed, so the next works."""
    if not session.in_transaction():
        return
    driver = session.connection().connection.driver_connection
    from psycopg.pq import TransactionStatus  # the only PostgreSQL driver the project uses (postgres_engine)

    if driver.info.transaction_status == TransactionStatus.INERROR:
        session.rollback()


def read_only_uri(path: Path) -> str:
    """A ``mode=ro`` URI for ``path``; immutable when SQLite could not read it otherwise.

    A WAL database needs its ``-shm`` index to be read. When neither side file
    exists and the folder refuses new ones, SQLite can only read the file as
    immutable, which is sound because no writer can exist there either: a
    writer would have to create those same files.
    """
    path = Path(path).resolve()
    uri = f"file:{quote(str(path))}?mode=ro"
    if not any(side.exists() for side in _side_files(path)) and not _may(path.parent, os.W_OK | os.X_OK):
        uri += "&immutable=1"
    return uri


def serving_cache_kib(settings: Any) -> int:
    """The serving page cache for these settings: smaller where the process holds the vector
    index (a vector reach past the exact window), see SERVING_CACHE_KIB."""
    reach, window = getattr(settings, "vector_reach", 0), getattr(settings, "max_memories", 0)
    return HELD_VECTORS_CACHE_KIB if reach > window else SERVING_CACHE_KIB


def sqlite_engine(
    path: Path | str,
    *,
    foreign_keys: bool = True,
    read_only: bool = False,
    background: bool = False,
    cache_kib: int = SERVING_CACHE_KIB,
) -> Engine:
    """An engine on a SQLite file with sqlite-vec loaded on every connection.

    ``read_only`` opens every connection ``mode=ro`` and leaves the journal
    mode alone (switching it is a write). ``mode=ro`` refuses every write to the
    file; ``query_only`` is not set because it also refuses ``VACUUM INTO``,
    which writes only the copy (``cpersona backup`` of a read-only database).

    The serving pool is LIFO: a sequential client is then served by the one
    connection whose cache is warm, and the others (opened when calls
    overlapped) stay cold instead of each filling its cache in turn.
    ``background`` builds the engine of :meth:`Database.background`: a small
    page cache, one pooled connection, any number more while background
    threads overlap, each closed when returned.
    """
    module = sqlite_module()
    # hide_parameters: a failed statement's text then never carries what was being stored.
    options: dict[str, Any] = {"module": module, "hide_parameters": True, "pool_use_lifo": True}
    options.update({"pool_size": 1, "max_overflow": -1} if background else {"pool_size": 8, "max_overflow": 8})
    if read_only:
        uri = read_only_uri(Path(path))
        # A creator with no file in the URL would get SQLite's one-connection pool; readers want the usual one.
        engine = create_engine(
            "sqlite+pysqlite://",
            creator=lambda: module.connect(uri, uri=True, check_same_thread=False),
            poolclass=QueuePool,
            **options,
        )
        pragmas = tuple(p for p in PRAGMAS if not p.startswith("journal_mode"))
    else:
        url = "sqlite+pysqlite:///" + (str(path) if str(path) == ":memory:" else str(Path(path)))
        engine = create_engine(url, **options)
        pragmas = PRAGMAS
    if not foreign_keys:
        pragmas = tuple("foreign_keys=OFF" if p == "foreign_keys=ON" else p for p in pragmas)
    cache_kib = BACKGROUND_CACHE_KIB if background else cache_kib
    pragmas = tuple(f"cache_size=-{int(cache_kib)}" if p.startswith("cache_size") else p for p in pragmas)

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        # The driver must not open transactions on its own: SQLAlchemy's begin
        # hook below issues the right BEGIN for readers and writers.
        dbapi_conn.isolation_level = None
        _load_sqlite_vec(dbapi_conn)
        for pragma in pragmas:
            dbapi_conn.execute(f"PRAGMA {pragma}")

    if not read_only:
        from cpersona.storage import coarse_sqlite

        @event.listens_for(engine, "checkout")
        def _on_checkout(dbapi_conn: Any, record: Any, _proxy: Any) -> None:
            # The coarse index's triggers call sqlite-vec, so they are TEMP: only connections
            # that load it (these) maintain the index, and the file stays writable without it.
            coarse_sqlite.refresh_triggers(dbapi_conn, record.info)

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        options = conn.get_execution_options()
        mode = options.get("sqlite_begin", "DEFERRED")
        wait_ms = options.get("sqlite_busy_ms")
        if wait_ms is None:
            conn.exec_driver_sql(f"BEGIN {mode}")
            return
        # A writer waits for the lock longer than a statement waits for a page.
        dbapi_conn = conn.connection.dbapi_connection
        dbapi_conn.execute(f"PRAGMA busy_timeout={int(wait_ms)}")
        try:
            conn.exec_driver_sql(f"BEGIN {mode}")
        finally:
            dbapi_conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")

    return engine


def open_sqlite(path: Path, *, cache_kib: int = SERVING_CACHE_KIB) -> Database:
    """Open (creating if needed) the SQLite database at ``path``; read-only when this process may not write it.

    ``cache_kib``: the serving connections' page cache (serving_cache_kib)."""
    path = Path(path).expanduser().resolve()
    read_only = unwritable_reason(path) if path.exists() else None
    if read_only is not None:
        return Database(
            sqlite_engine(path, read_only=True, cache_kib=cache_kib),
            path=path,
            read_only=read_only,
            background_engine=lambda: sqlite_engine(path, read_only=True, background=True),
        )
    prepare_db_file(path)
    return Database(
        sqlite_engine(path, cache_kib=cache_kib),
        path=path,
        background_engine=lambda: sqlite_engine(path, background=True),
    )


def postgres_engine(url: str) -> Engine:
    """An engine on a PostgreSQL database (psycopg 3)."""
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    if parsed.get_backend_name() != "postgresql":
        raise ValueError(f"CPERSONA_DATABASE_URL must be a postgresql URL, got {parsed.drivername!r}")
    if parsed.drivername == "postgresql":
        parsed = parsed.set(drivername="postgresql+psycopg")
    from cpersona.storage.models import Base, postgres_index_options

    postgres_index_options(Base.metadata)  # the models' partial indexes, as PostgreSQL declares them
    # pre_ping: a server restart must not surface as an error on the next call.
    return create_engine(parsed, pool_size=8, max_overflow=8, pool_pre_ping=True, hide_parameters=True)


def open_postgres(url: str) -> Database:
    """Open the PostgreSQL database named by ``url`` (nothing is created)."""
    return Database(postgres_engine(url))


def open_database(settings: Any) -> Database:
    """The database the settings name: PostgreSQL when database_url is set, else the SQLite file."""
    url = getattr(settings, "database_url", None)
    if url:
        return open_postgres(url)
    return open_sqlite(settings.db_file, cache_kib=serving_cache_kib(settings))


def trim_heap() -> None:
    """Give the C heap's free pages back to the system after a one-off walk of a large table.

    glibc keeps the memory Python and SQLite freed (the in-process vector index's load, a
    start-up calibration's sample and pseudo-query recalls) mapped in the process: ~30 MB of
    RSS at 1M rows that nothing would use again (docs/benchmarks.md, Scale). Elsewhere (musl,
    macOS, Windows) there is no such call and nothing is done.
    """
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
