"""The CPersona v13 tables (spec storage.md §4, §6) as SQLAlchemy Core tables.

The layout is the one every CPersona 2.5 database has, so an adopted file and a
fresh one look alike. Server defaults are SQL expressions rather than Python
callables because rows are also written by raw SQL, by migrations, by imports
and by the reference implementation itself (spec IMPL-4).

Core, not the ORM: every statement the services run is built from these
columns, and a stdio start answers ``initialize`` and its first ``recall``
without importing ``sqlalchemy.orm`` (~0.15 s CPU and 6 MiB, with the mapped
classes' set-up; tests/test_startup.py keeps it off). :mod:`cpersona.storage.models`
maps classes onto these same tables for the few writes that use ORM objects and
for Alembic's comparison.

The FTS5 virtual tables and their triggers are not described here: they are raw
DDL in the migrations and are kept in step by SQLite itself. The clean-up
triggers of the association tables are DDL only too: SQLite runs them for
every writer, ours, an import's raw SQL and the reference's alike (LR-1, LR-2).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    Column,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    Table,
    Text,
    UniqueConstraint,
    text,
)

NOW = text("(datetime('now'))")
EMPTY = text("''")
EMPTY_JSON = text("'{}'")
ZERO = text("0")

# SQLite's AUTOINCREMENT keeps deleted ids from being reused (spec VF-8); refs
# like mem:<id> rely on that, and a retracted relation id must not come back
# naming something else.
# implicit_returning is off because the primary keys are declared nullable (see
# below): SQLAlchemy's batched INSERT..RETURNING needs a NOT NULL "sentinel"
# column and refuses to flush several new rows at once otherwise. Ids then come
# from the cursor's lastrowid, one statement per row, which is what SQLite does
# underneath anyway; Core inserts may still ask for .returning() explicitly.
_AUTOINC = {"sqlite_autoincrement": True, "implicit_returning": False}

# INTEGER (not BIGINT) on SQLite so the primary key is the rowid alias that FTS5's
# content_rowid and AUTOINCREMENT require; BIGINT elsewhere.
IdType = BigInteger().with_variant(Integer(), "sqlite")

# Two deliberate differences from the v13 DDL text, both so that Alembic's
# comparison of these tables with a migrated database finds nothing (spec IMPL-4);
# the DDL itself lives in migrations/versions/0001_v13_base.py and is exact:
# - indexes on "created_at DESC" are declared on plain "created_at": SQLite's
#   reflection does not report the direction, so a DESC here always reads as drift;
# - integer primary keys are nullable=True because the v13 DDL says
#   "INTEGER PRIMARY KEY" without NOT NULL (a rowid alias can never be NULL anyway).


def _partial(where: str) -> dict[str, Any]:
    """A partial index's predicate, said once for both backends.

    Only SQLite's option is declared here: declaring a ``postgresql_*`` option makes
    SQLAlchemy import its whole PostgreSQL dialect (with the asyncpg, psycopg and
    pg8000 modules) to check the name, ~40 ms CPU and 2.4 MiB on every SQLite
    start. :func:`postgres_index_options` gives PostgreSQL the same predicate when
    a PostgreSQL engine is made, before anything compares or runs DDL there.
    """
    return {"sqlite_where": text(where)}


def postgres_index_options(metadata: MetaData) -> None:
    """Give every partial index its ``postgresql_where`` (the SQLite predicate); idempotent."""
    for table in metadata.tables.values():
        for index in table.indexes:
            where = index.dialect_options["sqlite"]["where"]
            if where is not None and index.dialect_options["postgresql"]["where"] is None:
                index.dialect_options["postgresql"]["where"] = where


def _id() -> Column[Any]:
    return Column("id", IdType, primary_key=True, autoincrement=True, nullable=True)


def _text(name: str, **kw: Any) -> Column[Any]:
    return Column(name, Text, nullable=kw.pop("nullable", False), **kw)


def _int(name: str, **kw: Any) -> Column[Any]:
    return Column(name, Integer, nullable=kw.pop("nullable", False), **kw)


metadata = MetaData()

schema_version = Table(
    "schema_version",
    metadata,
    Column("version", Integer, primary_key=True, autoincrement=False, nullable=True),
    _text("applied_at", server_default=NOW),
)

memories = Table(
    "memories",
    metadata,
    _id(),
    _text("agent_id"),
    _text("project_id", server_default=EMPTY),
    _text("msg_id", server_default=EMPTY),
    _text("content"),
    _text("source", server_default=EMPTY_JSON),
    _text("timestamp"),
    _text("metadata", server_default=EMPTY_JSON),
    Column("embedding", LargeBinary, nullable=True),
    _text("channel", server_default=EMPTY),
    _int("recall_count", server_default=ZERO),
    _text("last_recalled_at", nullable=True),
    _int("locked", server_default=ZERO),
    _text("created_at", server_default=NOW),
    Index("idx_memories_agent", "agent_id", "created_at"),
    Index("idx_memories_msg_id", "agent_id", "msg_id"),
    Index("idx_memories_agent_channel", "agent_id", "channel", "created_at"),
    Index("idx_memories_isolation", "agent_id", "project_id", "created_at"),
    Index("idx_memories_dedup_content", "agent_id", "project_id", "channel", "content", unique=True),
    Index("idx_memories_dedup_msg_id", "agent_id", "project_id", "msg_id", unique=True, **_partial("msg_id != ''")),
    # spec storage.md §6.7 (revision 0002)
    Index("idx_memories_lost_embedding", "id", **_partial("embedding IS NULL")),
    Index("idx_memories_span", "agent_id", "timestamp", "project_id", "channel"),
    **_AUTOINC,
)

episodes = Table(
    "episodes",
    metadata,
    _id(),
    _text("agent_id"),
    _text("project_id", server_default=EMPTY),
    _text("summary"),
    _text("keywords", server_default=EMPTY),
    Column("embedding", LargeBinary, nullable=True),
    _text("start_time", nullable=True),
    _text("end_time", nullable=True),
    _int("resolved", server_default=ZERO),
    _text("channel", server_default=EMPTY),
    _text("created_at", server_default=NOW),
    Index("idx_episodes_agent", "agent_id", "created_at"),
    Index("idx_episodes_agent_channel", "agent_id", "channel", "created_at"),
    Index("idx_episodes_isolation", "agent_id", "project_id", "created_at"),
    # spec storage.md §6.7 (revision 0002)
    Index("idx_episodes_lost_embedding", "id", **_partial("embedding IS NULL")),
    **_AUTOINC,
)

# project_id is deliberately not part of the key: one profile per agent and
# user whatever the project (spec storage.md §4.4).
profiles = Table(
    "profiles",
    metadata,
    _id(),
    _text("agent_id"),
    _text("project_id", server_default=EMPTY),
    _text("user_id", server_default=EMPTY),
    _text("content"),
    _text("updated_at", server_default=NOW),
    UniqueConstraint("agent_id", "user_id"),
    **_AUTOINC,
)

pending_memory_tasks = Table(
    "pending_memory_tasks",
    metadata,
    _id(),
    _text("task_type"),
    _text("agent_id"),
    _text("project_id", server_default=EMPTY),
    _text("payload"),
    _int("retries", server_default=ZERO),
    _text("created_at", server_default=NOW),
    **_AUTOINC,
)

# -- the association tables and the record nodes (spec storage.md §6.1, §6.2; revisions 0003/0004):
# the DDL in migrations/versions/0003_associations.py and 0004_record_nodes.py is the 2.6 line's text exactly.

# Who declared a row (spec A-18): our tools always write "agent"; "operator" is
# reserved for an operator console and accepted from imports.
DECLARED_BY_AGENT = "agent"

# A declared name in one scope (agent, project, channel).
entities = Table(
    "entities",
    metadata,
    _id(),
    _text("agent_id"),
    _text("project_id", server_default=EMPTY),
    _text("channel", server_default=EMPTY),
    _text("name"),
    _text("normalized"),
    _text("declared_by"),
    _text("created_at"),
    UniqueConstraint("agent_id", "project_id", "channel", "normalized"),
    **_AUTOINC,
)

# Another name for an entity. No scope columns: the writer keeps one alias per scope.
entity_aliases = Table(
    "entity_aliases",
    metadata,
    Column("entity_id", IdType, primary_key=True, autoincrement=False, nullable=False),
    _text("alias"),
    Column("normalized", Text, primary_key=True, nullable=False),
    Index("idx_entity_aliases_normalized", "normalized"),
)

# Record ``ref`` (``mem:<id>`` / ``ep:<id>``) mentions entity ``entity_id``.
entity_mentions = Table(
    "entity_mentions",
    metadata,
    Column("entity_id", IdType, primary_key=True, autoincrement=False, nullable=False),
    Column("ref", Text, primary_key=True, nullable=False),
    _text("declared_by"),
    _text("created_at"),
    Index("idx_entity_mentions_ref", "ref"),
)

# The relations' unique key (storage.md §6.2).
RELATION_KEY = (
    "agent_id",
    "project_id",
    "channel",
    "subject_kind",
    "subject_id",
    "predicate",
    "object_kind",
    "object_id",
    "anchor_ref",
)

# Subject –predicate→ object; each end an entity id or a record id (``*_kind``).
relations = Table(
    "relations",
    metadata,
    _id(),
    _text("agent_id"),
    _text("project_id", server_default=EMPTY),
    _text("channel", server_default=EMPTY),
    _text("subject_kind"),
    Column("subject_id", IdType, nullable=False),
    _text("predicate"),
    _text("object_kind"),
    Column("object_id", IdType, nullable=False),
    _text("anchor_ref", server_default=EMPTY),
    _text("declared_by"),
    _text("declared_at"),
    UniqueConstraint(*RELATION_KEY),
    Index("idx_relations_subject", "subject_kind", "subject_id"),
    Index("idx_relations_object", "object_kind", "object_id"),
    Index("idx_relations_anchor", "anchor_ref"),
    **_AUTOINC,
)

# One span ``[start_char, end_char)`` of a record's stored text, with its own vector.
record_nodes = Table(
    "record_nodes",
    metadata,
    Column("parent_kind", Text, primary_key=True, nullable=False),
    Column("parent_id", IdType, primary_key=True, autoincrement=False, nullable=False),
    Column("node_index", Integer, primary_key=True, autoincrement=False, nullable=False),
    _int("start_char"),
    _int("end_char"),
    _int("token_count"),
    # A keyword in SQL (window functions): always quoted.
    Column("window", Integer, nullable=False, quote=True),
    Column("embedding", LargeBinary, nullable=True),
    _text("embedding_model", server_default=EMPTY),
)

# The one row naming the model that made the stored vectors (revision 0005).
embedding_identity = Table(
    "embedding_identity",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=False, nullable=False),
    _text("label"),
    _int("dimension", nullable=True),
    _text("recorded_at"),
    CheckConstraint("id = 1"),
)

# Names of objects that live outside these tables (raw DDL in migrations); the
# autogenerate filter and the drift test skip them and their shadow tables.
FTS_TABLES = ("memories_fts", "episodes_fts")


class Columns:
    """A table read the way a mapped class reads: ``MemoryColumns.content`` is ``memories.c.content``.

    Statements name columns as ``Model.column`` throughout the storage layer;
    these stand in for the mapped classes on paths that must not load the ORM.
    ``renamed`` maps an attribute to its column where the two differ (the ORM
    class calls ``metadata`` ``metadata_``, a name ``DeclarativeBase`` keeps for
    itself). ``delete(MemoryColumns)`` and ``select(...).select_from(MemoryColumns)`` take
    the table through ``__clause_element__``.
    """

    def __init__(self, table: Table, **renamed: str) -> None:
        self.__table__ = table
        self.__tablename__ = table.name
        self._renamed = renamed

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        try:
            return self.__table__.c[self._renamed.get(name, name)]
        except KeyError:
            raise AttributeError(f"table {self.__tablename__!r} has no column {name!r}") from None

    def __clause_element__(self) -> Table:
        return self.__table__


MemoryColumns = Columns(memories, metadata_="metadata")
EpisodeColumns = Columns(episodes)
ProfileColumns = Columns(profiles)
PendingMemoryTaskColumns = Columns(pending_memory_tasks)
RecordNodeColumns = Columns(record_nodes)
EmbeddingIdentityColumns = Columns(embedding_identity)
