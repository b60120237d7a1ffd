"""The one-row record of which model made the stored vectors (revision 0005).

The rule for a change of model is the service's (records/vector_identity.py);
these are its statements.
"""

from __future__ import annotations

from typing import Any

from cpersona.storage.sql_text import text

_VECTOR_TABLES = ("memories", "episodes")


class EmbeddingIdentityRepository:
    """Reads and writes ``embedding_identity`` on one session or connection."""

    def __init__(self, session: Any) -> None:
        self.session = session

    def recorded(self) -> tuple[str, int | None] | None:
        row = self.session.execute(text("SELECT label, dimension FROM embedding_identity WHERE id = 1")).first()
        return None if row is None else (row.label, row.dimension)

    def record(self, label: str, dimension: int | None, at: str) -> None:
        self.session.execute(
            text(
                "INSERT INTO embedding_identity (id, label, dimension, recorded_at) VALUES (1, :label, :dimension, :at)"
            ),
            {"label": label, "dimension": dimension, "at": at},
        )

    def set_dimension(self, dimension: int) -> None:
        self.session.execute(
            text("UPDATE embedding_identity SET dimension = :dimension WHERE id = 1"), {"dimension": dimension}
        )

    def replace(self, label: str, dimension: int | None, at: str) -> None:
        self.session.execute(
            text(
                "UPDATE embedding_identity SET label = :label, dimension = :dimension, recorded_at = :at WHERE id = 1"
            ),
            {"label": label, "dimension": dimension, "at": at},
        )

    def clear_vectors(self) -> int:
        """Drop every stored memory and episode vector; how many were dropped."""
        return sum(
            self.session.execute(text(f"UPDATE {table} SET embedding = NULL WHERE embedding IS NOT NULL")).rowcount or 0
            for table in _VECTOR_TABLES
        )
