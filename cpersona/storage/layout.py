"""Which optional columns and tables a database has.

Our own tables are the v13 layout today; later revisions add the association
tables (spec storage.md §6.2) and perhaps the ``embedding_model`` labels (§6.4).
A 2.6 database being copied may have either. Export, import, merge and the
2.6 copier (services/portability) look here instead of assuming, so each of
those additions switches the matching code path on without touching them.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Connection, inspect

GRAPH_TABLES = ("entities", "entity_aliases", "entity_mentions", "relations")


def has_graph_tables(conn: Connection) -> bool:
    """Whether the association tables exist (a copied-in or hand-trimmed file may lack them)."""
    inspector = inspect(conn)
    return all(inspector.has_table(name) for name in GRAPH_TABLES)


@dataclass(frozen=True)
class Layout:
    memory_columns: frozenset[str]
    episode_columns: frozenset[str]
    tables: frozenset[str]

    @classmethod
    def of(cls, conn: Connection) -> Layout:
        inspector = inspect(conn)
        tables = frozenset(inspector.get_table_names())

        def columns(table: str) -> frozenset[str]:
            if table not in tables:
                return frozenset()
            return frozenset(col["name"] for col in inspector.get_columns(table))

        return cls(columns("memories"), columns("episodes"), tables)

    @property
    def has_graph(self) -> bool:
        return all(name in self.tables for name in GRAPH_TABLES)

    @property
    def memory_labels(self) -> bool:
        """Whether memories carry ``embedding_model`` (2.6 v18)."""
        return "embedding_model" in self.memory_columns

    @property
    def episode_labels(self) -> bool:
        return "embedding_model" in self.episode_columns
