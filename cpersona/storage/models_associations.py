"""SQLAlchemy models of the association tables and the record nodes (spec storage.md §6.1, §6.2).

The DDL lives in migrations/versions/0003_associations.py and 0004_record_nodes.py
and is the 2.6 line's text exactly; these classes describe the same tables so the
ORM can read and write them and Alembic's drift check (tests/test_migrations.py)
sees one layout. The clean-up triggers are DDL only: SQLite runs them for every
writer, ours, an import's raw SQL and the reference's alike (LR-1, LR-2).

The tables reuse the base tables' conventions (see models.py): nullable integer
rowid-alias keys, AUTOINCREMENT so a deleted id is never handed out again (a
retracted relation id must not come back naming something else), server
defaults as SQL.
"""

from __future__ import annotations

from sqlalchemy import CheckConstraint, Index, Integer, LargeBinary, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from cpersona.storage.models import _AUTOINC, EMPTY, Base, IdType

# Who declared a row (spec A-18): our tools always write "agent"; "operator" is
# reserved for an operator console and accepted from imports.
DECLARED_BY_AGENT = "agent"


class Entity(Base):
    """A declared name in one scope (agent, project, channel)."""

    __tablename__ = "entities"
    __table_args__ = (UniqueConstraint("agent_id", "project_id", "channel", "normalized"), _AUTOINC)

    id: Mapped[int] = mapped_column(IdType, primary_key=True, autoincrement=True, nullable=True)
    agent_id: Mapped[str] = mapped_column(Text)
    project_id: Mapped[str] = mapped_column(Text, server_default=EMPTY)
    channel: Mapped[str] = mapped_column(Text, server_default=EMPTY)
    name: Mapped[str] = mapped_column(Text)
    normalized: Mapped[str] = mapped_column(Text)
    declared_by: Mapped[str] = mapped_column(Text)
    created_at: Mapped[str] = mapped_column(Text)


class EntityAlias(Base):
    """Another name for an entity. No scope columns: the writer keeps one alias per scope."""

    __tablename__ = "entity_aliases"
    __table_args__ = (Index("idx_entity_aliases_normalized", "normalized"),)

    entity_id: Mapped[int] = mapped_column(IdType, primary_key=True, autoincrement=False)
    alias: Mapped[str] = mapped_column(Text)
    normalized: Mapped[str] = mapped_column(Text, primary_key=True)


class EntityMention(Base):
    """Record ``ref`` (``mem:<id>`` / ``ep:<id>``) mentions entity ``entity_id``."""

    __tablename__ = "entity_mentions"
    __table_args__ = (Index("idx_entity_mentions_ref", "ref"),)

    entity_id: Mapped[int] = mapped_column(IdType, primary_key=True, autoincrement=False)
    ref: Mapped[str] = mapped_column(Text, primary_key=True)
    declared_by: Mapped[str] = mapped_column(Text)
    created_at: Mapped[str] = mapped_column(Text)


class Relation(Base):
    """Subject –predicate→ object; each end an entity id or a record id (``*_kind``)."""

    __tablename__ = "relations"
    __table_args__ = (
        UniqueConstraint(
            "agent_id",
            "project_id",
            "channel",
            "subject_kind",
            "subject_id",
            "predicate",
            "object_kind",
            "object_id",
            "anchor_ref",
        ),
        Index("idx_relations_subject", "subject_kind", "subject_id"),
        Index("idx_relations_object", "object_kind", "object_id"),
        Index("idx_relations_anchor", "anchor_ref"),
        _AUTOINC,
    )

    id: Mapped[int] = mapped_column(IdType, primary_key=True, autoincrement=True, nullable=True)
    agent_id: Mapped[str] = mapped_column(Text)
    project_id: Mapped[str] = mapped_column(Text, server_default=EMPTY)
    channel: Mapped[str] = mapped_column(Text, server_default=EMPTY)
    subject_kind: Mapped[str] = mapped_column(Text)
    subject_id: Mapped[int] = mapped_column(IdType)
    predicate: Mapped[str] = mapped_column(Text)
    object_kind: Mapped[str] = mapped_column(Text)
    object_id: Mapped[int] = mapped_column(IdType)
    anchor_ref: Mapped[str] = mapped_column(Text, server_default=EMPTY)
    declared_by: Mapped[str] = mapped_column(Text)
    declared_at: Mapped[str] = mapped_column(Text)


class RecordNode(Base):
    """One span ``[start_char, end_char)`` of a record's stored text, with its own vector."""

    __tablename__ = "record_nodes"

    parent_kind: Mapped[str] = mapped_column(Text, primary_key=True)
    parent_id: Mapped[int] = mapped_column(IdType, primary_key=True, autoincrement=False)
    node_index: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    start_char: Mapped[int] = mapped_column(Integer)
    end_char: Mapped[int] = mapped_column(Integer)
    token_count: Mapped[int] = mapped_column(Integer)
    # A keyword in SQL (window functions): always quoted.
    window: Mapped[int] = mapped_column("window", Integer, quote=True)
    embedding: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True)
    embedding_model: Mapped[str] = mapped_column(Text, server_default=EMPTY)


class EmbeddingIdentity(Base):
    """The one row naming the model that made the stored vectors (revision 0005)."""

    __tablename__ = "embedding_identity"
    __table_args__ = (CheckConstraint("id = 1"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    label: Mapped[str] = mapped_column(Text)
    dimension: Mapped[int | None] = mapped_column(Integer, nullable=True)
    recorded_at: Mapped[str] = mapped_column(Text)
