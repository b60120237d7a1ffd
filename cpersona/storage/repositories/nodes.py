"""Record nodes: the spans a long memory or episode is divided into, with their vectors (OV-2)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import delete, insert, select

# The table's columns, named as the mapped class names them: no ORM on this path.
from cpersona.storage.tables import RecordNodeColumns as RecordNode
from cpersona.storage.repositories.base import Repository


@dataclass(frozen=True, slots=True)
class NodeRow:
    index: int
    start: int
    end: int
    token_count: int
    window: int
    embedding: bytes | None
    embedding_model: str


class NodeRepository(Repository):
    model = RecordNode

    def of_record(self, kind: str, record_id: int) -> list[NodeRow]:
        """A record's node rows in index order (whatever state they are in)."""
        rows = self.session.execute(
            select(
                RecordNode.node_index,
                RecordNode.start_char,
                RecordNode.end_char,
                RecordNode.token_count,
                RecordNode.window,
                RecordNode.embedding,
                RecordNode.embedding_model,
            )
            .where(RecordNode.parent_kind == kind, RecordNode.parent_id == record_id)
            .order_by(RecordNode.node_index)
        ).all()
        return [NodeRow(*row) for row in rows]

    def replace(self, kind: str, record_id: int, nodes: Iterable[Mapping[str, Any]]) -> None:
        """Drop the record's nodes and write ``nodes`` (each without its parent columns) in their place."""
        self.session.execute(
            delete(RecordNode).where(RecordNode.parent_kind == kind, RecordNode.parent_id == record_id)
        )
        rows = [{"parent_kind": kind, "parent_id": record_id, **node} for node in nodes]
        if rows:
            self.session.execute(insert(RecordNode), rows)
