"""SQL spellings that differ between SQLite and PostgreSQL, for storage's raw SQL.

Repositories and probes write dialect-neutral SQL wherever SQLAlchemy allows;
where a raw statement needs a function that only one engine has (JSON access,
time arithmetic, substring position), it asks here by the dialect of the session
or connection it runs on, so no statement branches on the engine itself.
Isolation predicates are not here: they live in storage/scope.py.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from sqlalchemy import text

from cpersona.storage import errors, search_sqlite


def dialect_name(bind: Any) -> str:
    """ "sqlite" or "postgresql" for a Session, Connection, Engine or Database."""
    if hasattr(bind, "get_bind"):  # Session
        bind = bind.get_bind()
    if hasattr(bind, "engine") and not hasattr(bind, "dialect"):  # Database
        bind = bind.engine
    return bind.dialect.name


def is_sqlite(bind: Any) -> bool:
    return dialect_name(bind) == "sqlite"


def source_filter(bind: Any, source_id: str, alias: str = "m") -> tuple[str, dict[str, Any]]:
    """The per-user ``source_id`` predicate of spec ISO-3 on ``alias``'s row, as SQL and parameters."""
    if is_sqlite(bind):
        return search_sqlite.source_filter(source_id, alias)
    # Imported on PostgreSQL only: it brings the pgvector scans, with numpy and SQLAlchemy's
    # PostgreSQL dialect (~15 MiB), which the health registry on SQLite never runs.
    from cpersona.storage import search_postgres

    return search_postgres.source_filter(source_id, alias)


def instant(bind: Any, column: str) -> str:
    """An SQL expression ordering stamps in ``column`` by instant; NULL when unreadable.

    SQLite's julianday() and cpersona_instant() (revision 0001) read the same
    spellings: SQLite-style and ISO-8601 stamps, UTC when no offset is given.
    """
    return f"julianday({column})" if is_sqlite(bind) else f"cpersona_instant({column})"


# julianday() of 1970-01-01T00:00:00Z: SQLite's instants are days since the Julian epoch.
UNIX_EPOCH_JULIAN_DAY = 2440587.5


def instant_value(value: Any) -> datetime | None:
    """What :func:`instant` selected (julianday() number or timestamptz) as an aware UTC datetime."""
    if value is None:
        return None
    if isinstance(value, datetime):
        return value.astimezone(timezone.utc)
    seconds = round((float(value) - UNIX_EPOCH_JULIAN_DAY) * 86400.0, 3)  # julianday() keeps milliseconds
    return datetime.fromtimestamp(seconds, tz=timezone.utc)


def sqlite_seconds(stamp: str) -> float | None:
    """Unix seconds of ``stamp`` as SQLite's julianday() reads it, or None.

    Only the date parser is wanted, so a throwaway in-memory database of the
    standard library is enough (it coexists with the driver the engine uses). Imported
    here, as a second SQLite (1.2 MiB) only the timestamp checks need.
    """
    import sqlite3

    try:
        with sqlite3.connect(":memory:") as conn:
            julian_day = conn.execute("SELECT julianday(?)", (stamp,)).fetchone()[0]
    except (sqlite3.Error, ValueError, OverflowError):
        return None
    if julian_day is None:
        return None
    return (float(julian_day) - UNIX_EPOCH_JULIAN_DAY) * 86400.0


def position(bind: Any, haystack: str, needle: str) -> str:
    """1-based position of ``needle`` in ``haystack`` (0 when absent), no wildcards."""
    if is_sqlite(bind):
        return f"instr({haystack}, {needle})"
    return f"strpos({haystack}, {needle})"


def error_message(exc: BaseException) -> str:
    """One line for a failed statement, for answers: see :func:`cpersona.storage.errors.reason`."""
    return errors.reason(exc)


def count_if(condition: str) -> str:
    """How many rows satisfy ``condition`` (SUM over a boolean is SQLite-only)."""
    return f"SUM(CASE WHEN {condition} THEN 1 ELSE 0 END)"


# The characters SQL's trim() strips for "blank" text: space, tab, LF, VT, FF, CR.
BLANK_CHARS = " \t\n\x0b\x0c\r"


def has_object(conn: Any, kind: str, name: str) -> bool:
    """Whether the database holds a table / index / trigger / view called ``name``."""
    if is_sqlite(conn):
        sql = "SELECT 1 FROM sqlite_master WHERE type = :k AND name = :n"
    else:
        sql = {
            "table": "SELECT 1 FROM pg_tables WHERE schemaname = current_schema() AND tablename = :n",
            "index": "SELECT 1 FROM pg_indexes WHERE schemaname = current_schema() AND indexname = :n",
            "view": "SELECT 1 FROM pg_views WHERE schemaname = current_schema() AND viewname = :n",
            "trigger": "SELECT 1 FROM pg_trigger WHERE NOT tgisinternal AND tgname = :n",
        }[kind]
    return conn.execute(text(sql), {"k": kind, "n": name}).first() is not None


# PostgreSQL 15 has no total JSON validity test (IS JSON arrives in 16), and a
# failed ::jsonb cast aborts the statement. This helper answers NULL instead.
# It lives in pg_temp: created inside the caller's transaction, gone with it,
# never part of the schema.
_PG_JSON_HELPER = """CREATE OR REPLACE FUNCTION pg_temp.cpersona_jsonb(doc text) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
  RETURN doc::jsonb;
EXCEPTION WHEN others THEN
  RETURN NULL;
END $$"""

# json_type() names (SQLite) → jsonb_typeof() names (PostgreSQL), for the kinds asked about.
_PG_JSON_KIND = {"object": "object", "null": "null", "text": "string"}


class JsonSql:
    """Predicates over JSON text columns, spelled for one engine.

    On PostgreSQL call :meth:`prepare` once in the transaction first.
    """

    def __init__(self, bind: Any) -> None:
        self.sqlite = is_sqlite(bind)

    def prepare(self, conn: Any) -> None:
        if not self.sqlite:
            conn.exec_driver_sql(_PG_JSON_HELPER)

    def _doc(self, column: str) -> str:
        return f"pg_temp.cpersona_jsonb({column})"

    def valid(self, column: str) -> str:
        return f"json_valid({column})" if self.sqlite else f"({self._doc(column)} IS NOT NULL)"

    def type_is(self, column: str, kind: str, key: str | None = None) -> str:
        if self.sqlite:
            path = f", '$.{key}'" if key else ""
            return f"(json_type({column}{path}) = '{kind}')"
        member = f" -> '{key}'" if key else ""
        return f"(jsonb_typeof({self._doc(column)}{member}) = '{_PG_JSON_KIND[kind]}')"

    def type_is_not(self, column: str, kind: str, key: str | None = None) -> str:
        """NULL-safe: a missing member is "not" any kind."""
        if self.sqlite:
            path = f", '$.{key}'" if key else ""
            return f"(json_type({column}{path}) IS NOT '{kind}')"
        member = f" -> '{key}'" if key else ""
        return f"(jsonb_typeof({self._doc(column)}{member}) IS DISTINCT FROM '{_PG_JSON_KIND[kind]}')"

    def text_at(self, column: str, key: str) -> str:
        if self.sqlite:
            return f"json_extract({column}, '$.{key}')"
        return f"({self._doc(column)} ->> '{key}')"

    def key_count(self, column: str) -> str:
        """Members of a JSON object (NULL for anything else on PostgreSQL)."""
        if self.sqlite:
            return f"(SELECT COUNT(*) FROM json_each({column}))"
        doc = self._doc(column)
        return f"(CASE WHEN jsonb_typeof({doc}) = 'object' THEN (SELECT COUNT(*) FROM jsonb_object_keys({doc})) END)"
