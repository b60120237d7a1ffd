"""SQL spellings that differ between SQLite and PostgreSQL, for services' raw SQL.

Services write dialect-neutral SQL wherever SQLAlchemy allows; where a raw
statement needs a function that only one engine has (JSON access, time
arithmetic, substring position), it asks here by the dialect of the session or
connection it runs on, so no service branches on the engine itself. Isolation
predicates are not here: they live in storage/scope.py.
"""

from __future__ import annotations

from typing import Any

from cpersona.storage import search_postgres, search_sqlite


def dialect_name(bind: Any) -> str:
    """"sqlite" or "postgresql" for a Session, Connection, Engine or Database."""
    if hasattr(bind, "get_bind"):  # Session
        bind = bind.get_bind()
    if hasattr(bind, "engine") and not hasattr(bind, "dialect"):  # Database
        bind = bind.engine
    return bind.dialect.name


def is_sqlite(bind: Any) -> bool:
    return dialect_name(bind) == "sqlite"


def source_filter(bind: Any, source_id: str, alias: str = "m") -> tuple[str, dict[str, Any]]:
    """The per-user ``source_id`` predicate of spec ISO-3 on ``alias``'s row, as SQL and parameters."""
    module = search_sqlite if is_sqlite(bind) else search_postgres
    return module.source_filter(source_id, alias)


def instant(bind: Any, column: str) -> str:
    """An SQL expression ordering stamps in ``column`` by instant; NULL when unreadable.

    SQLite's julianday() and cpersona_instant() (revision 0001) read the same
    spellings: SQLite-style and ISO-8601 stamps, UTC when no offset is given.
    """
    return f"julianday({column})" if is_sqlite(bind) else f"cpersona_instant({column})"


def position(bind: Any, haystack: str, needle: str) -> str:
    """1-based position of ``needle`` in ``haystack`` (0 when absent), no wildcards."""
    if is_sqlite(bind):
        return f"instr({haystack}, {needle})"
    return f"strpos({haystack}, {needle})"


def error_message(exc: BaseException) -> str:
    """The database's own one-line reason for a failed statement, for answers.

    SQLite's driver says just the reason; psycopg appends CONTEXT / HINT lines
    (which PL/pgSQL function raised, where) that only a log should carry.
    """
    orig = getattr(exc, "orig", None) or exc
    diag = getattr(orig, "diag", None)
    primary = getattr(diag, "message_primary", None)
    return primary if primary else str(orig)
