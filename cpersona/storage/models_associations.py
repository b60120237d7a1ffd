"""ORM classes over the association tables and the record nodes (spec storage.md §6.1, §6.2).

The tables themselves are described in :mod:`cpersona.storage.tables`, with the
base tables' conventions; see there.
"""

from __future__ import annotations

from cpersona.storage import tables
from cpersona.storage.models import Base
from cpersona.storage.tables import DECLARED_BY_AGENT  # noqa: F401 - named here by the association services


class Entity(Base):
    """A declared name in one scope (agent, project, channel)."""

    __table__ = tables.entities


class EntityAlias(Base):
    """Another name for an entity. No scope columns: the writer keeps one alias per scope."""

    __table__ = tables.entity_aliases


class EntityMention(Base):
    """Record ``ref`` (``mem:<id>`` / ``ep:<id>``) mentions entity ``entity_id``."""

    __table__ = tables.entity_mentions


class Relation(Base):
    """Subject –predicate→ object; each end an entity id or a record id (``*_kind``)."""

    __table__ = tables.relations


class RecordNode(Base):
    """One span ``[start_char, end_char)`` of a record's stored text, with its own vector."""

    __table__ = tables.record_nodes


class EmbeddingIdentity(Base):
    """The one row naming the model that made the stored vectors (revision 0005)."""

    __table__ = tables.embedding_identity
