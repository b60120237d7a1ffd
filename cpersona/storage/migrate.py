"""Bringing a database to our head: fresh files, adopted CPersona files, refusals.

Every start goes through ``upgrade(db)`` (or ``open_and_upgrade(path)``, which
first makes sure the file is one we may touch). What happens depends on what
the file holds:

- nothing of ours (a new file): Alembic creates the v13 layout (revision
  ``0001_v13``) and our later revisions;
- a CPersona database from before Alembic (``schema_version`` and/or the base
  tables, no ``alembic_version``) at version 0..13: the reference's own boot
  procedure brings it to v13 (spec storage.md §5.3, MV-13, IMPL-2), Alembic is
  stamped at ``0001_v13`` and upgraded to head;
- a database that is already ours (``alembic_version`` present): upgraded to head;
- a database of the 2.6 line (``schema_version`` 14..21) or newer: refused with
  ``TooNewDatabase``, untouched (spec README decision 9).

On every start the reference's repair-on-boot also runs on our own files: the
FTS preparation and rebuild (MV-7, MV-9) and the best-effort indexes (MV-10), so
a database created with FTS disabled gets its index when FTS is turned on (MV-12).

Everything runs in ONE write transaction: either the file reaches head or it is
left as it was. That is why the reference's "commit the pending bit before the
rebuild" (MV-7) is not needed here: a crash rolls the whole boot back and the
next start redoes it. The pending bit is still honoured when another build left
it set, and set when our own rebuild fails (MV-9).
"""

from __future__ import annotations

import importlib
import importlib.resources
import logging
import os
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING
from urllib.parse import quote

from sqlalchemy import Connection, text
from sqlalchemy.exc import DBAPIError

from cpersona.storage.engine import Database, open_database, open_sqlite, serving_cache_kib, sqlite_module
from cpersona.storage import errors as storage_errors

if TYPE_CHECKING:
    from alembic.config import Config
    from alembic.script import ScriptDirectory

log = logging.getLogger(__name__)

V13_REVISION = "0001_v13"
WORD_REVISION = "0006_word_index"
COARSE_REVISION = "0007_coarse_index"
COARSE_LOG_REVISION = "0008_coarse_change_log"
VECTOR_LOG_REVISION = "0009_vector_change_log"
# The newest revision this build ships. A database already stamped with it is
# opened without loading Alembic at all (the common start: Alembic's import and
# its script directory cost more than everything else the start does). Checked
# against the migration scripts by tests/test_startup.py: a new revision must
# move it, or that test fails.
HEAD_REVISION = VECTOR_LOG_REVISION
# The module holding the v13 DDL, imported directly for the same reason.
V13_MODULE = "cpersona.migrations.versions.0001_v13_base"
WORD_MODULE = "cpersona.migrations.versions.0006_word_index"
REFERENCE_VERSION = 13  # the schema_version our databases carry, forever (decision 8)
FTS_REBUILD_PENDING = 1  # bit 0 of PRAGMA user_version (spec PG-3)


def copy_target_for(source: Path | str) -> Path:
    """Where ``cpersona import-db`` should copy a database this build will not open in place."""
    source = Path(source)
    return source.with_name(f"{source.stem}-cpersona.db")


def import_db_command(source: Path | str, target: Path | str | None = None) -> str:
    """The exact shell command that copies ``source`` into a new database (``target`` or its default)."""
    target = copy_target_for(source) if target is None else target
    return f"CPERSONA_DB_PATH={shlex.quote(str(target))} cpersona import-db {shlex.quote(str(source))}"


class MigrationError(RuntimeError):
    """The database could not be brought to head; nothing was changed."""


class TooNewDatabase(MigrationError):
    """The database was written by a newer schema than this build knows.

    Raised before anything is written: the file is left byte-for-byte as it was.
    """

    def __init__(self, version: int | str, path: Path | str | None = None) -> None:
        self.version = version
        self.path = path
        where = f"{path} " if path else "the database "
        if isinstance(version, int):
            what = f"is at CPersona schema version {version}"
            if 14 <= version <= 21:
                what += " (written by the CPersona 2.6 line)"
        else:
            what = f"was written by a newer cpersona (migration revision {version})"
        if isinstance(version, int) and path and "://" not in str(path):  # a file, not a server label
            target = copy_target_for(path)
            hint = (
                f"copy its data into a new database with `{import_db_command(path, target)}`, "
                f"then serve it with CPERSONA_DB_PATH={shlex.quote(str(target))}"
            )
        elif isinstance(version, int):
            hint = "copy its data into a new database with `CPERSONA_DB_PATH=NEW.db cpersona import-db PATH`"
        else:
            hint = "run the cpersona that wrote it, or export_memories there and import_memories here"
        super().__init__(
            f"{where}{what}, newer than the version {REFERENCE_VERSION} this server "
            f"can open; it was not modified. To use it, {hint}"
        )


# ---------------------------------------------------------------------------
# Alembic plumbing


def script_location() -> str:
    """The migrations folder, wherever the package is installed."""
    return str(importlib.resources.files("cpersona.migrations"))


def alembic_config(connection: Connection | None = None, *, fts_enabled: bool = True) -> Config:
    """An Alembic Config without alembic.ini, bound to ``connection``."""
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", script_location())
    cfg.attributes["connection"] = connection
    cfg.attributes["fts_enabled"] = fts_enabled
    return cfg


# Indexes of the PostgreSQL schema the models do not state, hidden from the
# drift check (spec IMPL-4): the pg_trgm and tsvector GIN indexes stand in for FTS5 (which
# the models do not describe either), and the content dedup index is over
# md5(content) there, an expression the models cannot state per dialect.
PG_UNMODELLED_INDEXES = frozenset(
    {
        "idx_memories_content_trgm",
        "idx_episodes_summary_trgm",
        "idx_episodes_keywords_trgm",
        "idx_memories_dedup_content",
        "idx_memories_words",
        "idx_episodes_words",
    }
)


def include_object_for(dialect: str):
    """Alembic's include_object hook for ``dialect`` (None: compare everything)."""
    if dialect != "postgresql":
        return None

    from cpersona.storage.search_words_postgres import WORD_VECTOR_COLUMN
    from cpersona.storage.vector_near_postgres import CHANGE_LOG, CHANGE_STATE
    from cpersona.storage.vectors_postgres import VECTOR_COLUMN, is_vector_index

    def include_object(obj, name, type_, reflected, compare_to):
        # Derived columns and their indexes, outside the history (vectors_postgres, search_words_postgres).
        if type_ == "column" and name in (VECTOR_COLUMN, WORD_VECTOR_COLUMN):
            return False
        # Revision 0009's change log (raw DDL, PostgreSQL only: vector_near_postgres), as the
        # SQLite coarse tables are not modelled either.
        if type_ == "table" and name in (CHANGE_LOG, CHANGE_STATE):
            return False
        return not (type_ == "index" and (name in PG_UNMODELLED_INDEXES or is_vector_index(name)))

    return include_object


def fts_setting(config: Config | None) -> bool:
    """Whether a migration run keeps full-text objects (spec DB-4).

    The server passes its setting in ``config.attributes["fts_enabled"]``; the
    alembic CLI falls back to the environment variable.
    """
    setting = config.attributes.get("fts_enabled") if config is not None else None
    if setting is None:
        raw = os.environ.get("CPERSONA_FTS_ENABLED", "true").strip().lower()
        setting = raw not in ("0", "false", "no", "off")
    return bool(setting)


def _script() -> ScriptDirectory:
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(alembic_config())


def head_revision() -> str:
    head = _script().get_current_head()
    assert head is not None
    return head


def _v13_ddl() -> ModuleType:
    """The v13 revision module: the single copy of the v13 DDL."""
    return importlib.import_module(V13_MODULE)


def _word_ddl() -> ModuleType:
    """The word-index revision module: the single copy of its DDL."""
    return importlib.import_module(WORD_MODULE)


# ---------------------------------------------------------------------------
# Looking at a file without touching it


@dataclass(frozen=True)
class Probe:
    """What a database file holds, as far as choosing a path is concerned."""

    tables: frozenset[str]
    version: int | None  # MAX(schema_version); None without the table; 0 if empty
    alembic_revision: str | None

    @property
    def is_ours(self) -> bool:
        return "alembic_version" in self.tables

    @property
    def is_legacy(self) -> bool:
        """A CPersona database from before Alembic (any version, even 0)."""
        return not self.is_ours and bool({"schema_version", "memories", "episodes"} & self.tables)


_TABLES_SQL = {
    "sqlite": "SELECT name FROM sqlite_master WHERE type = 'table'",
    "postgresql": "SELECT tablename FROM pg_catalog.pg_tables WHERE schemaname = current_schema()",
}


def _probe_rows(execute: Callable[[str], list[tuple]], dialect: str = "sqlite") -> Probe:
    tables = frozenset(row[0] for row in execute(_TABLES_SQL[dialect]))
    version = None
    if "schema_version" in tables:
        version = int(execute("SELECT COALESCE(MAX(version), 0) FROM schema_version")[0][0])
    revision = None
    if "alembic_version" in tables:
        rows = execute("SELECT version_num FROM alembic_version")
        revision = rows[0][0] if rows else None
    return Probe(tables=tables, version=version, alembic_revision=revision)


def probe(path: Path | str) -> Probe | None:
    """Read a file's layout through a read-only connection; None if there is no database yet.

    The connection is opened with ``mode=ro`` so nothing, not even the WAL switch
    every engine connection makes, reaches the file. When no ``-wal`` / ``-shm``
    file exists no connection has the database open in WAL mode, and it is read
    as immutable so that not even those side files get created; otherwise they
    hold committed data and must be read through. ``upgrade`` checks again
    inside its write transaction, so a writer racing this probe is still caught.
    """
    path = Path(path).expanduser()
    if path.is_dir():
        raise MigrationError(f"{path} is a folder, not a database file")
    if not path.exists() or path.stat().st_size == 0:
        return None
    resolved = path.resolve()
    side_files = any(resolved.with_name(resolved.name + suffix).exists() for suffix in ("-wal", "-shm"))
    uri = f"file:{quote(str(resolved))}?mode=ro" + ("" if side_files else "&immutable=1")
    # The engine's own driver: the standard library's sqlite3 would load a second SQLite.
    driver = sqlite_module()
    try:
        conn = driver.connect(uri, uri=True)
    except driver.Error as exc:
        raise MigrationError(
            f"cannot open {path} read-only to check its version: {storage_errors.reason(exc, str(path))}"
        ) from exc
    try:
        return _probe_rows(lambda sql: conn.execute(sql).fetchall())
    except driver.DatabaseError as exc:
        raise MigrationError(storage_errors.reason(exc, str(path))) from exc
    finally:
        conn.close()


def probe_version(path: Path | str) -> int | None:
    """``MAX(schema_version)`` of the file, 0 with an empty table, None without one/file."""
    found = probe(path)
    return None if found is None else found.version


def _refuse_if_too_new(found: Probe, path: Path | str | None) -> None:
    if found.is_ours and found.alembic_revision == HEAD_REVISION:
        return
    if found.is_ours:
        known = {rev.revision for rev in _script().walk_revisions()}
        if found.alembic_revision is not None and found.alembic_revision not in known:
            raise TooNewDatabase(found.alembic_revision, path)
        return
    if found.version is not None and found.version > REFERENCE_VERSION:
        raise TooNewDatabase(found.version, path)


# ---------------------------------------------------------------------------
# Entry points


def open_and_upgrade(path: Path | str, *, fts_enabled: bool = True, cache_kib: int | None = None) -> Database:
    """Open the SQLite database at ``path`` and bring it to head.

    The file is probed read-only first; a database that is too new raises
    ``TooNewDatabase`` before any connection that could write is opened.
    """
    found = probe(path)
    if found is not None:
        _refuse_if_too_new(found, path)
    db = open_sqlite(Path(path)) if cache_kib is None else open_sqlite(Path(path), cache_kib=cache_kib)
    try:
        upgrade(db, fts_enabled=fts_enabled)
    except BaseException:
        db.close()
        raise
    return db


def upgrade(db: Database, *, fts_enabled: bool = True, vector_index: bool = False) -> None:
    """Bring ``db`` to our head revision in one transaction (see module docstring).

    ``vector_index``: PostgreSQL with pgvector also gets the HNSW indexes the
    vector channel's far list uses (vectors_postgres.ensure_hnsw_indexes).
    """
    if db.read_only is not None:
        _check_read_only_at_head(db)
        return
    try:
        with db.write_connection() as conn:
            if db.is_sqlite:
                _upgrade_in_transaction(conn, db.path, fts_enabled=fts_enabled)
            else:
                _upgrade_postgres(conn, db.label, vector_index=vector_index)
    except MigrationError:
        raise
    except DBAPIError as exc:
        raise MigrationError(f"could not upgrade {db.path or db.label}: {exc.orig}; nothing was changed") from exc


def _check_read_only_at_head(db: Database) -> None:
    """A database this process cannot write is served as it is, if it is already at head.

    The boot repairs (MV-12) are writes and are skipped; anything older than
    head would need a migration, which a read-only file cannot take.
    """
    with db.read() as session:
        conn = session.connection()
        found = _probe_rows(lambda sql: [tuple(r) for r in conn.exec_driver_sql(sql).fetchall()])
    _refuse_if_too_new(found, db.path)
    if not (found.is_ours and found.alembic_revision == head_revision()):
        raise MigrationError(
            f"the database {db.label} is read-only ({db.read_only}) and must be upgraded before it can be "
            "served; make it writable for one start, then it can be served read-only"
        )


def open_database_and_upgrade(settings) -> Database:
    """The database the settings name (PostgreSQL URL or SQLite file), at head."""
    if not getattr(settings, "database_url", None):
        db = open_and_upgrade(settings.db_file, fts_enabled=settings.fts_enabled, cache_kib=serving_cache_kib(settings))
    else:
        db = open_database(settings)
        try:
            # The HNSW indexes cost every vector write (docs/benchmarks.md): built only
            # where the far list they serve is asked for (CPERSONA_VECTOR_REACH).
            upgrade(db, fts_enabled=settings.fts_enabled, vector_index=settings.vector_reach > settings.max_memories)
        except BaseException:
            db.close()
            raise
    db.lock_wait_seconds = settings.write_lock_wait_seconds
    return db


def _upgrade_postgres(conn: Connection, label: str, *, vector_index: bool = False) -> None:
    """PostgreSQL databases are only ever ours: no adoption ladder, no FTS repair.

    The writer lock the connection holds also serialises several processes
    starting at once against one database: the second sees the first's head.
    """
    found = _probe_rows(lambda sql: [tuple(r) for r in conn.exec_driver_sql(sql).fetchall()], "postgresql")
    _refuse_if_too_new(found, label)
    if found.is_legacy:
        raise MigrationError(
            f"{label} holds CPersona tables without cpersona's migration history; "
            "move memories into PostgreSQL with export_memories / import_memories"
        )
    if found.alembic_revision != HEAD_REVISION:
        from alembic import command

        command.upgrade(alembic_config(conn), "head")
    from cpersona.storage.search_words_postgres import ensure_word_columns
    from cpersona.storage.vectors_postgres import ensure_vector_columns, ensure_width_statistics

    ensure_vector_columns(conn, hnsw=vector_index)
    ensure_word_columns(conn)
    ensure_width_statistics(conn)


def _upgrade_in_transaction(conn: Connection, path: Path | None, *, fts_enabled: bool) -> None:
    found = _probe_rows(lambda sql: [tuple(r) for r in conn.exec_driver_sql(sql).fetchall()])
    _refuse_if_too_new(found, path)
    if found.is_ours and (found.version or 0) > REFERENCE_VERSION:
        # Ours, but a 2.6 build has since stamped it; its extra tables are left alone.
        log.warning(
            "schema_version of %s is %s: a CPersona 2.6 build has opened this database",
            path or "the database",
            found.version,
        )
    if not (found.is_ours and found.alembic_revision == HEAD_REVISION):
        from alembic import command

        cfg = alembic_config(conn, fts_enabled=fts_enabled)
        if found.is_legacy:
            adopt_legacy(conn, found.version or 0, fts_enabled=fts_enabled)
            command.stamp(cfg, V13_REVISION)
            log.info("adopted CPersona database at schema version %s", found.version or 0)
        command.upgrade(cfg, "head")
    if found.is_ours or found.is_legacy:
        # The reference repairs FTS and indexes on every boot; so do we (MV-12).
        repair_on_boot(conn, fts_enabled=fts_enabled)


# ---------------------------------------------------------------------------
# The reference's boot procedure (spec storage.md §5.3), used for adoption


def adopt_legacy(conn: Connection, current: int, *, fts_enabled: bool = True) -> None:
    """Bring a pre-Alembic CPersona database from ``current`` to v13 (MV-5 … MV-11).

    Raises (and so rolls the whole boot back) where the reference would withhold
    its version stamp: a database we could not fully adopt is not served.
    """
    ddl = _v13_ddl()
    for statement in ddl.BASE_TABLES_DDL:  # MV-6
        conn.exec_driver_sql(statement)
    rebuild = _prepare_fts(conn, ddl) if fts_enabled else False  # MV-7
    for version, fts_only, step in _LADDER:  # MV-8
        if version > current and (fts_enabled or not fts_only):
            try:
                step(conn, ddl)
            except DBAPIError as exc:
                raise MigrationError(
                    f"adopting the CPersona database failed in the v{version} step: {exc.orig}; nothing was changed"
                ) from exc
    if rebuild:
        _rebuild_fts(conn)  # MV-9
    _post_ladder_indexes(conn, ddl)  # MV-10
    if current < REFERENCE_VERSION:  # MV-11
        conn.exec_driver_sql(
            f"INSERT OR REPLACE INTO schema_version (version, applied_at) VALUES ({REFERENCE_VERSION}, datetime('now'))"
        )


def repair_on_boot(conn: Connection, *, fts_enabled: bool = True) -> None:
    """The every-boot part of §5.3 on a database already at v13 (MV-7, MV-9, MV-10)."""
    ddl = _v13_ddl()
    if fts_enabled and _prepare_fts(conn, ddl):
        _rebuild_fts(conn)
    if fts_enabled:
        _prepare_words(conn)
    _post_ladder_indexes(conn, ddl)


def _prepare_words(conn: Connection) -> None:
    """The word indexes of revision 0006, created and filled when a boot finds them missing.

    A database migrated while full-text search was off has none; the first boot
    with it on builds them from the rows, as MV-7/MV-9 do for the trigram ones.
    Triggers come back too when only they were lost.
    """
    words = _word_ddl()
    missing = [name for name in words.WORD_TABLE_NAMES if not _exists(conn, "table", name)]
    for statement in (*words.WORD_TABLES_DDL, *words.WORD_TRIGGERS_DDL):
        conn.exec_driver_sql(statement)
    for name in missing:
        conn.exec_driver_sql(f"INSERT INTO {name} ({name}) VALUES ('rebuild')")


def _user_version(conn: Connection) -> int:
    return int(conn.exec_driver_sql("PRAGMA user_version").scalar() or 0)


def _set_user_version(conn: Connection, value: int) -> None:
    conn.exec_driver_sql(f"PRAGMA user_version = {int(value)}")


def _exists(conn: Connection, kind: str, name: str) -> bool:
    row = conn.execute(
        text("SELECT 1 FROM sqlite_master WHERE type = :kind AND name = :name"),
        {"kind": kind, "name": name},
    ).first()
    return row is not None


def _prepare_fts(conn: Connection, ddl: ModuleType) -> bool:
    """MV-7: find out whether the FTS index needs a rebuild; create missing FTS objects."""
    created = not _exists(conn, "table", "memories_fts")
    pending = bool(_user_version(conn) & FTS_REBUILD_PENDING)
    stale = False
    if not created:
        trigger_sql = conn.execute(
            text("SELECT sql FROM sqlite_master WHERE type = 'trigger' AND name = 'memories_fts_au'")
        ).scalar()
        if trigger_sql is None or "AFTER UPDATE OF content" not in trigger_sql:
            stale = True
            conn.exec_driver_sql("DROP TRIGGER IF EXISTS memories_fts_au")
            conn.exec_driver_sql("DROP TRIGGER IF EXISTS episodes_au")
    needs_rebuild = created or pending or stale
    if needs_rebuild:
        _set_user_version(conn, _user_version(conn) | FTS_REBUILD_PENDING)
    for statement in (*ddl.FTS_TABLES_DDL, *ddl.FTS_TRIGGERS_DDL):
        conn.exec_driver_sql(statement)
    return needs_rebuild


def _rebuild_fts(conn: Connection) -> None:
    """MV-9: full rebuild of both FTS indexes; a failure leaves the pending bit set."""
    try:
        with conn.begin_nested():
            conn.exec_driver_sql("INSERT INTO memories_fts (memories_fts) VALUES ('rebuild')")
            conn.exec_driver_sql("INSERT INTO episodes_fts (episodes_fts) VALUES ('rebuild')")
    except DBAPIError as exc:
        log.error("FTS rebuild failed, will retry on next start: %s", exc.orig)
        _set_user_version(conn, _user_version(conn) | FTS_REBUILD_PENDING)
        return
    _set_user_version(conn, _user_version(conn) & ~FTS_REBUILD_PENDING)


def _best_effort(conn: Connection, statement: str) -> bool:
    """Run one CREATE INDEX in a savepoint; log and go on when it fails (DB-6)."""
    try:
        with conn.begin_nested():
            conn.exec_driver_sql(statement)
    except DBAPIError as exc:
        log.warning("could not create index (%s): %s", statement.split(" ON ")[0], exc.orig)
        return False
    return True


def _post_ladder_indexes(conn: Connection, ddl: ModuleType) -> None:
    """MV-10: isolation indexes, and the dedup indexes again as the 2.6 line does."""
    for statement in (*ddl.ISOLATION_INDEXES_DDL, *ddl.DEDUP_INDEXES_DDL):
        _best_effort(conn, statement)


# ---------------------------------------------------------------------------
# The ladder of spec storage.md §5.1 (each step idempotent, MV-8)


def _columns(conn: Connection, table: str) -> set[str]:
    return {row[1] for row in conn.exec_driver_sql(f"PRAGMA table_info({table})")}


def _add_column(conn: Connection, table: str, column: str, decl: str) -> None:
    if column not in _columns(conn, table):
        conn.exec_driver_sql(f"ALTER TABLE {table} ADD COLUMN {column} {decl}")


def _step_v3(conn: Connection, ddl: ModuleType) -> None:
    _add_column(conn, "episodes", "resolved", "INTEGER NOT NULL DEFAULT 0")


def _step_v4(conn: Connection, ddl: ModuleType) -> None:
    conn.exec_driver_sql("INSERT OR IGNORE INTO memories_fts (rowid, content) SELECT id, content FROM memories")


def _step_v5(conn: Connection, ddl: ModuleType) -> None:
    # Trigram tokenizer: the FTS tables are recreated, so their triggers go first.
    for trigger in ("episodes_ai", "episodes_ad", "episodes_au", "memories_fts_ai", "memories_fts_ad"):
        conn.exec_driver_sql(f"DROP TRIGGER IF EXISTS {trigger}")
    conn.exec_driver_sql("DROP TABLE IF EXISTS memories_fts")
    conn.exec_driver_sql("DROP TABLE IF EXISTS episodes_fts")
    for statement in (*ddl.FTS_TABLES_DDL, *ddl.FTS_TRIGGERS_DDL):
        conn.exec_driver_sql(statement)
    conn.exec_driver_sql(
        "INSERT INTO episodes_fts (rowid, summary, keywords) SELECT id, summary, keywords FROM episodes"
    )
    conn.exec_driver_sql("INSERT INTO memories_fts (rowid, content) SELECT id, content FROM memories")


def _step_v6(conn: Connection, ddl: ModuleType) -> None:
    _add_column(conn, "memories", "channel", "TEXT NOT NULL DEFAULT ''")
    conn.exec_driver_sql(ddl.CHANNEL_INDEXES_DDL[0])


def _step_v7(conn: Connection, ddl: ModuleType) -> None:
    _add_column(conn, "memories", "recall_count", "INTEGER NOT NULL DEFAULT 0")
    _add_column(conn, "memories", "last_recalled_at", "TEXT")


def _step_v8(conn: Connection, ddl: ModuleType) -> None:
    _add_column(conn, "memories", "locked", "INTEGER NOT NULL DEFAULT 0")


def _step_v9(conn: Connection, ddl: ModuleType) -> None:
    # Existing rows join the global pool ('').
    for table in ("memories", "episodes", "profiles", "pending_memory_tasks"):
        _add_column(conn, table, "project_id", "TEXT NOT NULL DEFAULT ''")


def _step_v10(conn: Connection, ddl: ModuleType) -> None:
    _add_column(conn, "episodes", "channel", "TEXT NOT NULL DEFAULT ''")
    conn.exec_driver_sql(ddl.CHANNEL_INDEXES_DDL[1])


def _step_v11(conn: Connection, ddl: ModuleType) -> None:
    for statement in (*ddl.FTS_TABLES_DDL, *ddl.FTS_TRIGGERS_DDL):
        conn.exec_driver_sql(statement)
    # Purge postings left stale by the missing update trigger.
    conn.exec_driver_sql("INSERT INTO memories_fts (memories_fts) VALUES ('rebuild')")


def _step_v12(conn: Connection, ddl: ModuleType) -> None:
    """MV-4: collapse exact duplicates and msg_id collisions; locked rows untouched."""
    deleted = conn.exec_driver_sql(
        "DELETE FROM memories WHERE locked = 0 AND id NOT IN ("
        " SELECT MIN(id) FROM memories GROUP BY agent_id, project_id, channel, content)"
    ).rowcount
    blanked = conn.exec_driver_sql(
        "UPDATE memories SET msg_id = '' WHERE locked = 0 AND msg_id != '' AND id NOT IN ("
        " SELECT MAX(id) FROM memories WHERE msg_id != '' GROUP BY agent_id, project_id, msg_id)"
    ).rowcount
    if deleted or blanked:
        log.warning("v12 dedup: deleted %d duplicate memories, blanked %d msg_ids", deleted, blanked)
    for statement in ddl.DEDUP_INDEXES_DDL:
        _best_effort(conn, statement)


def _step_v13(conn: Connection, ddl: ModuleType) -> None:
    conn.exec_driver_sql("DROP TRIGGER IF EXISTS memories_fts_au")
    conn.exec_driver_sql("DROP TRIGGER IF EXISTS episodes_au")
    for statement in ddl.FTS_TRIGGERS_DDL:
        conn.exec_driver_sql(statement)


# (version, FTS-only, step) in order; versions 0..2 have no step (MV-3).
_LADDER: tuple[tuple[int, bool, Callable[[Connection, ModuleType], None]], ...] = (
    (3, False, _step_v3),
    (4, True, _step_v4),
    (5, True, _step_v5),
    (6, False, _step_v6),
    (7, False, _step_v7),
    (8, False, _step_v8),
    (9, False, _step_v9),
    (10, False, _step_v10),
    (11, True, _step_v11),
    (12, False, _step_v12),
    (13, True, _step_v13),
)
