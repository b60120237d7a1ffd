"""The two statements of a memory store: the dedup probe and the insert that a unique index may refuse.

They sit here rather than in the write path because both depend on how the
engine plans and fails: the probe's shape is tuned to the indexes, and the
insert has to leave the transaction usable on an engine that aborts it.
"""

from __future__ import annotations

from collections import namedtuple
from functools import lru_cache
from typing import Any

from sqlalchemy import TextClause, insert, text
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError, IntegrityError

from cpersona.storage.dialect import is_sqlite
from cpersona.storage.models import Memory
from cpersona.storage.scope import Scope, sql_fragment

_INSERT_MEMORY = insert(Memory.__table__)


def dedup_candidates(
    conn: Connection, *, agent_id: str, project_id: str | None, channel: str, content: str, msg_id: str
) -> list[Any]:
    """Rows a new memory could duplicate: same caller id first (``same_id`` 1), then same content, by id.

    The project axis reads like a recall in the write's project: bucket P plus
    the global pool (DD-3). Channel is narrower than a read's: a write to ''
    is answered only by channel-less rows. Rows carry ``id, source,
    project_id, channel`` so the caller can apply the source and bucket rules.
    """
    scope_sql, params = sql_fragment(Scope(agent_id=agent_id, project_id=project_id))
    params["content"] = content
    if msg_id:
        params["msg_id"] = msg_id
    if channel:
        params["channel"] = channel
    statement = _probe_statement(scope_sql, bool(msg_id), bool(channel))
    if not is_sqlite(conn):
        return conn.execute(statement, params).all()
    # Read off the driver's cursor inside the write transaction, as the SQLite
    # search statements are (storage/search_sqlite.py): SQLAlchemy's execution
    # path (compiled-cache look-up, result metadata, Row objects) cost ~0.1 ms of
    # a store's ~1.4 ms thread CPU at 10k rows, for a plain-text statement whose
    # five columns need no type processing.
    dbapi = conn.connection.driver_connection
    try:
        return [_Candidate._make(row) for row in dbapi.execute(statement.text, params)]
    except conn.dialect.dbapi.Error as exc:
        raise DBAPIError.instance(statement.text, params, exc, conn.dialect.dbapi.Error) from exc


# One dedup candidate as dedup_candidates reads it on SQLite (``row.same_id`` as from a Row).
_Candidate = namedtuple("_Candidate", "same_id id source project_id channel")


@lru_cache(maxsize=32)
def _probe_statement(scope_sql: str, by_msg_id: bool, in_channel: bool) -> TextClause:
    """One statement for both look-ups (a UNION ALL of two index probes), built once per shape."""
    channels = "(:channel, '')" if in_channel else "('')"
    by_content = (
        f"SELECT 0 AS same_id, id, source, project_id, channel FROM memories"
        f" WHERE {scope_sql} AND channel IN {channels} AND content = :content"
    )
    if not by_msg_id:
        return text(by_content + " ORDER BY id")
    # `msg_id != ''` (always true here) lets SQLite use the partial unique index
    # on (agent, project, msg_id); without it the planner walked the scope's index.
    by_id = (
        f"SELECT 1 AS same_id, id, source, project_id, channel FROM memories"
        f" WHERE {scope_sql} AND msg_id = :msg_id AND msg_id != ''"
    )
    return text(f"{by_id} UNION ALL {by_content} ORDER BY same_id DESC, id")


@lru_cache(maxsize=1)
def _insert_with_vector() -> Any:
    """The memory insert on PostgreSQL with pgvector's column (vectors_postgres), built once."""
    from sqlalchemy import column, table

    from cpersona.storage.vectors_postgres import VECTOR_COLUMN, PgVectorType

    columns = [column(c.name, c.type) for c in Memory.__table__.columns]
    memories = table("memories", *columns, column(VECTOR_COLUMN, PgVectorType()))
    return memories.insert().returning(memories.c.id)


def insert_memory(conn: Connection, values: dict[str, Any]) -> int | None:
    """Insert one memory row and return its id, or None when a unique index refused it (DD-5).

    A Core insert: the ORM's unit of work (identity map, flush plan, state
    bookkeeping) cost more than the statement itself for one plain row.
    PostgreSQL aborts the whole transaction on a failed statement, so there the
    insert runs in a savepoint; SQLite undoes only the failed statement, and a
    savepoint's release there made FTS5 flush its pending terms once more per row.
    """
    if is_sqlite(conn):
        return _insert_sqlite(conn, values)
    from cpersona.storage.vectors_postgres import VECTOR_COLUMN, sends_vectors, vector_value

    statement = _INSERT_MEMORY
    if sends_vectors(conn):  # the vector with the row: no decode in the trigger
        statement = _insert_with_vector()
        values = {**values, VECTOR_COLUMN: vector_value(values.get("embedding"))}
    try:
        with conn.begin_nested():
            result = conn.execute(statement, values)
    except IntegrityError as exc:
        if refused_by_memories_unique_index(exc.orig):
            return None
        raise
    return result.inserted_primary_key[0] if statement is _INSERT_MEMORY else result.scalar_one()


def _insert_sqlite(conn: Connection, values: dict[str, Any]) -> int | None:
    # On the driver's cursor, as the probe above: SQLAlchemy's execution of the
    # compiled Core insert (cache look-up, bind processing, result set-up) cost
    # ~0.2 ms of a keyword-only store's ~0.6 ms in-process at 10k rows; the row's
    # columns are plain text, integers and one blob, and every column left out
    # has a server default, so the statement below writes the same row. A failed
    # statement is undone on its own on SQLite (see insert_memory).
    statement = _sqlite_insert_text(tuple(values))
    dbapi = conn.connection.driver_connection
    try:
        return dbapi.execute(statement, values).lastrowid
    except conn.dialect.dbapi.IntegrityError as exc:
        if refused_by_memories_unique_index(exc):
            return None
        raise DBAPIError.instance(statement, values, exc, conn.dialect.dbapi.Error, hide_parameters=True) from exc
    except conn.dialect.dbapi.Error as exc:
        raise DBAPIError.instance(statement, values, exc, conn.dialect.dbapi.Error, hide_parameters=True) from exc


def refused_by_memories_unique_index(error: BaseException | None) -> bool:
    """Whether a driver's integrity error is one of ``memories``' own unique indexes refusing the row.

    Only that is a lost dedup race (DD-5). Any other refusal inside the insert
    (a NOT NULL or CHECK, or a unique key of a table a trigger writes, such as
    a change log) is a fault: answering it "skipped, duplicate" would drop the
    memory while telling the caller it was already stored.
    """
    diag = getattr(error, "diag", None)
    if diag is not None:  # psycopg: the server names the violated constraint's table
        return getattr(error, "sqlstate", None) == "23505" and diag.table_name == "memories"
    message = str(error)
    # SQLite names the columns of a plain index ("memories.agent_id, ...") and an expression index by name.
    return message.startswith("UNIQUE constraint failed: memories.") or "index 'idx_memories_" in message


@lru_cache(maxsize=8)
def _sqlite_insert_text(columns: tuple[str, ...]) -> str:
    known = Memory.__table__.columns
    for name in columns:
        if name not in known:
            raise ValueError(f"memories has no column {name!r}")
    return f"INSERT INTO memories ({', '.join(columns)}) VALUES ({', '.join(':' + c for c in columns)})"
