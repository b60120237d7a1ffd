"""SQLAlchemy models of the CPersona v13 tables (spec storage.md §4).

The layout is the one every CPersona 2.5 database has, so an adopted file and a
fresh one look alike to the ORM. Server defaults are SQL expressions rather than
Python callables because rows are also written by raw SQL, by migrations, by
imports and by the reference implementation itself (spec IMPL-4).

The FTS5 virtual tables and their triggers are not mapped: they are raw DDL in
the migrations and are kept in step by SQLite itself.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    BigInteger,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

NOW = text("(datetime('now'))")
EMPTY = text("''")
EMPTY_JSON = text("'{}'")
ZERO = text("0")

# SQLite's AUTOINCREMENT keeps deleted ids from being reused (spec VF-8); refs
# like mem:<id> rely on that.
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
# comparison of these models with a migrated database finds nothing (spec IMPL-4);
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


class Base(DeclarativeBase):
    metadata = MetaData()


class SchemaVersion(Base):
    __tablename__ = "schema_version"

    version: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False, nullable=True)
    applied_at: Mapped[str] = mapped_column(Text, server_default=NOW)


class Memory(Base):
    __tablename__ = "memories"
    __table_args__ = (
        Index("idx_memories_agent", "agent_id", "created_at"),
        Index("idx_memories_msg_id", "agent_id", "msg_id"),
        Index("idx_memories_agent_channel", "agent_id", "channel", "created_at"),
        Index("idx_memories_isolation", "agent_id", "project_id", "created_at"),
        Index(
            "idx_memories_dedup_content",
            "agent_id",
            "project_id",
            "channel",
            "content",
            unique=True,
        ),
        Index(
            "idx_memories_dedup_msg_id",
            "agent_id",
            "project_id",
            "msg_id",
            unique=True,
            **_partial("msg_id != ''"),
        ),
        # spec storage.md §6.7 (revision 0002)
        Index(
            "idx_memories_lost_embedding",
            "id",
            **_partial("embedding IS NULL"),
        ),
        Index("idx_memories_span", "agent_id", "timestamp", "project_id", "channel"),
        _AUTOINC,
    )

    id: Mapped[int] = mapped_column(IdType, primary_key=True, autoincrement=True, nullable=True)
    agent_id: Mapped[str] = mapped_column(Text)
    project_id: Mapped[str] = mapped_column(Text, server_default=EMPTY)
    msg_id: Mapped[str] = mapped_column(Text, server_default=EMPTY)
    content: Mapped[str] = mapped_column(Text)
    source: Mapped[str] = mapped_column(Text, server_default=EMPTY_JSON)
    timestamp: Mapped[str] = mapped_column(Text)
    metadata_: Mapped[str] = mapped_column("metadata", Text, server_default=EMPTY_JSON)
    embedding: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True)
    channel: Mapped[str] = mapped_column(Text, server_default=EMPTY)
    recall_count: Mapped[int] = mapped_column(Integer, server_default=ZERO)
    last_recalled_at: Mapped[str | None] = mapped_column(Text, nullable=True)
    locked: Mapped[int] = mapped_column(Integer, server_default=ZERO)
    created_at: Mapped[str] = mapped_column(Text, server_default=NOW)

    @property
    def ref(self) -> str:
        return f"mem:{self.id}"


class Episode(Base):
    __tablename__ = "episodes"
    __table_args__ = (
        Index("idx_episodes_agent", "agent_id", "created_at"),
        Index("idx_episodes_agent_channel", "agent_id", "channel", "created_at"),
        Index("idx_episodes_isolation", "agent_id", "project_id", "created_at"),
        # spec storage.md §6.7 (revision 0002)
        Index(
            "idx_episodes_lost_embedding",
            "id",
            **_partial("embedding IS NULL"),
        ),
        _AUTOINC,
    )

    id: Mapped[int] = mapped_column(IdType, primary_key=True, autoincrement=True, nullable=True)
    agent_id: Mapped[str] = mapped_column(Text)
    project_id: Mapped[str] = mapped_column(Text, server_default=EMPTY)
    summary: Mapped[str] = mapped_column(Text)
    keywords: Mapped[str] = mapped_column(Text, server_default=EMPTY)
    embedding: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True)
    start_time: Mapped[str | None] = mapped_column(Text, nullable=True)
    end_time: Mapped[str | None] = mapped_column(Text, nullable=True)
    resolved: Mapped[int] = mapped_column(Integer, server_default=ZERO)
    channel: Mapped[str] = mapped_column(Text, server_default=EMPTY)
    created_at: Mapped[str] = mapped_column(Text, server_default=NOW)

    @property
    def ref(self) -> str:
        return f"ep:{self.id}"


class Profile(Base):
    __tablename__ = "profiles"
    # project_id is deliberately not part of the key: one profile per agent and
    # user whatever the project (spec storage.md §4.4).
    __table_args__ = (UniqueConstraint("agent_id", "user_id"), _AUTOINC)

    id: Mapped[int] = mapped_column(IdType, primary_key=True, autoincrement=True, nullable=True)
    agent_id: Mapped[str] = mapped_column(Text)
    project_id: Mapped[str] = mapped_column(Text, server_default=EMPTY)
    user_id: Mapped[str] = mapped_column(Text, server_default=EMPTY)
    content: Mapped[str] = mapped_column(Text)
    updated_at: Mapped[str] = mapped_column(Text, server_default=NOW)


class PendingMemoryTask(Base):
    __tablename__ = "pending_memory_tasks"
    __table_args__ = (_AUTOINC,)

    id: Mapped[int] = mapped_column(IdType, primary_key=True, autoincrement=True, nullable=True)
    task_type: Mapped[str] = mapped_column(Text)
    agent_id: Mapped[str] = mapped_column(Text)
    project_id: Mapped[str] = mapped_column(Text, server_default=EMPTY)
    payload: Mapped[str] = mapped_column(Text)
    retries: Mapped[int] = mapped_column(Integer, server_default=ZERO)
    created_at: Mapped[str] = mapped_column(Text, server_default=NOW)


# Names of objects that live outside the ORM (raw DDL in migrations); the
# autogenerate filter and the drift test skip them and their shadow tables.
FTS_TABLES = ("memories_fts", "episodes_fts")

# The association tables and record nodes (revisions 0003/0004) join Base.metadata here.
from cpersona.storage import models_associations  # noqa: E402,F401
