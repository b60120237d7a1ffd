"""ORM classes over the tables of :mod:`cpersona.storage.tables` (spec storage.md §4, §6).

The tables are described once, in Core, there; these classes map them for the
writes that add ORM objects and for Alembic, whose comparison of
``Base.metadata`` with a migrated database must find nothing (spec IMPL-4).
Importing this module imports ``sqlalchemy.orm``: the stdio start's path
(initialize, the first recall) does not, and builds its statements from
:mod:`cpersona.storage.tables`.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import DeclarativeBase

from cpersona.storage import tables
from cpersona.storage.tables import (  # noqa: F401 - named here by migrations and tests
    _AUTOINC,
    EMPTY,
    EMPTY_JSON,
    FTS_TABLES,
    NOW,
    ZERO,
    IdType,
    _partial,
    postgres_index_options,
)


class Base(DeclarativeBase):
    metadata = tables.metadata

    def __init_subclass__(cls, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        # A class declared over an existing table gets no ``__tablename__``; the
        # storage layer names a class's table by it (raw SQL) as it always has.
        cls.__tablename__ = cls.__table__.name


class SchemaVersion(Base):
    __table__ = tables.schema_version


class Memory(Base):
    __table__ = tables.memories
    metadata_ = tables.memories.c.metadata  # DeclarativeBase keeps the name ``metadata`` for itself

    @property
    def ref(self) -> str:
        return f"mem:{self.id}"


class Episode(Base):
    __table__ = tables.episodes

    @property
    def ref(self) -> str:
        return f"ep:{self.id}"


class Profile(Base):
    __table__ = tables.profiles


class PendingMemoryTask(Base):
    __table__ = tables.pending_memory_tasks


# The association tables and record nodes (revisions 0003/0004).
from cpersona.storage import models_associations  # noqa: E402,F401
