"""The statements of ``migrate_channel_axis``: bridge-channel memories paged and re-filed, their declarations carried.

The rules (which rows are recoverable, what follows a moved memory) are the
service's (services/operations/channel_axis.py); these only read and write rows.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from sqlalchemy import Connection, Row, RowMapping, bindparam, inspect, select, text
from sqlalchemy.exc import IntegrityError

from cpersona.storage.models import Memory
from cpersona.storage.scope import Scope, predicates

GRAPH_TABLES = {"entities", "entity_aliases", "entity_mentions", "relations"}


def bridge_pages(conn: Connection, scope: Scope, bridge: str, page_size: int) -> Iterator[list[Row[Any]]]:
    """(id, agent_id, project_id, metadata) of the scope's ``bridge`` rows in id order, a page at a time."""
    last = 0
    while True:
        page = conn.execute(
            select(Memory.id, Memory.agent_id, Memory.project_id, Memory.metadata_)
            .where(predicates(Memory, scope), Memory.channel == bridge, Memory.id > last)
            .order_by(Memory.id)
            .limit(page_size)
        ).all()
        if not page:
            return
        yield page
        last = page[-1].id


def rechannel(conn: Connection, ids: Sequence[int], channel: str, bridge: str) -> list[int]:
    """Move ``bridge`` rows among ``ids`` to ``channel``; the ids that moved.

    A row whose target bucket already holds the same text keeps its place (the
    dedup index forbids the move; it is skipped, not failed).
    """
    if not ids:
        return []
    params = {"channel": channel, "ids": list(ids), "bridge": bridge}
    if conn.dialect.name == "sqlite":
        # One statement per page and channel; OR IGNORE skips exactly the clashing rows.
        conn.execute(
            text("UPDATE OR IGNORE memories SET channel = :channel WHERE id IN :ids AND channel = :bridge").bindparams(
                bindparam("ids", expanding=True)
            ),
            params,
        )
        return list(
            conn.execute(
                text("SELECT id FROM memories WHERE id IN :ids AND channel = :channel ORDER BY id").bindparams(
                    bindparam("ids", expanding=True)
                ),
                params,
            ).scalars()
        )
    moved: list[int] = []
    for row_id in ids:  # elsewhere: a savepoint per row turns a clash into a skip
        try:
            with conn.begin_nested():
                changed = conn.execute(
                    text("UPDATE memories SET channel = :channel WHERE id = :id AND channel = :bridge"),
                    {"channel": channel, "id": row_id, "bridge": bridge},
                ).rowcount
        except IntegrityError:
            changed = 0
        if changed:
            moved.append(row_id)
    return moved


class BridgeDeclarations:
    """Mentions, relations and entities filed in the ``bridge`` channel, and their copies elsewhere."""

    def __init__(self, conn: Connection, bridge: str) -> None:
        self.conn = conn
        self.bridge = bridge

    @staticmethod
    def available(conn: Connection) -> bool:
        """Whether this database has the association tables at all."""
        return GRAPH_TABLES <= set(inspect(conn).get_table_names())

    def mentions_of(self, ref: str, agent_id: str, project_id: str) -> list[Row[Any]]:
        """(entity_id, declared_by, created_at) of bridge-channel entities mentioning ``ref``."""
        return list(
            self.conn.execute(
                text(
                    "SELECT m.entity_id, m.declared_by, m.created_at FROM entity_mentions m "
                    "JOIN entities e ON e.id = m.entity_id "
                    "WHERE m.ref = :ref AND e.agent_id = :agent AND e.project_id = :project AND e.channel = :bridge"
                ),
                {"ref": ref, "agent": agent_id, "project": project_id, "bridge": self.bridge},
            ).all()
        )

    def move_mention(self, entity_id: int, copy_id: int, ref: str, declared_by: str, created_at: str) -> None:
        """The mention of ``ref`` by ``entity_id`` becomes one by ``copy_id`` (kept once if it exists)."""
        self.conn.execute(
            text(
                "INSERT INTO entity_mentions (entity_id, ref, declared_by, created_at) "
                "VALUES (:entity, :ref, :by, :at) ON CONFLICT DO NOTHING"
            ),
            {"entity": copy_id, "ref": ref, "by": declared_by, "at": created_at},
        )
        self.conn.execute(
            text("DELETE FROM entity_mentions WHERE entity_id = :entity AND ref = :ref"),
            {"entity": entity_id, "ref": ref},
        )

    def relations_about(self, agent_id: str, project_id: str, memory_id: int, ref: str) -> list[RowMapping]:
        """Every bridge-channel relation with the memory at an end or as its anchor, by id."""
        return list(
            self.conn.execute(
                text(
                    "SELECT * FROM relations WHERE agent_id = :agent AND project_id = :project AND channel = :bridge "
                    "AND ((subject_kind = 'mem' AND subject_id = :id) OR (object_kind = 'mem' AND object_id = :id) "
                    "OR anchor_ref = :ref) ORDER BY id"
                ),
                {"agent": agent_id, "project": project_id, "bridge": self.bridge, "id": memory_id, "ref": ref},
            )
            .mappings()
            .all()
        )

    def replace_relation(self, relation_id: int, values: Mapping[str, Any]) -> None:
        """Write ``values`` as a relation (kept once if it exists) and delete relation ``relation_id``."""
        self.conn.execute(
            text(
                "INSERT INTO relations (agent_id, project_id, channel, subject_kind, subject_id, "
                "predicate, object_kind, object_id, anchor_ref, declared_by, declared_at) VALUES (:agent_id, "
                ":project_id, :channel, :subject_kind, :subject_id, :predicate, :object_kind, :object_id, "
                ":anchor_ref, :declared_by, :declared_at) ON CONFLICT DO NOTHING"
            ),
            dict(values),
        )
        self.conn.execute(text("DELETE FROM relations WHERE id = :id"), {"id": relation_id})

    def entity(self, entity_id: int) -> RowMapping:
        return self.conn.execute(text("SELECT * FROM entities WHERE id = :id"), {"id": entity_id}).mappings().one()

    def copy_entity(self, original: Mapping[str, Any], channel: str) -> int:
        """The entity of ``original``'s name in ``channel`` (registered if new), holding its aliases too."""
        found = self.conn.execute(
            text(
                "SELECT id FROM entities WHERE agent_id = :agent AND project_id = :project AND channel = :channel "
                "AND normalized = :normalized"
            ),
            {
                "agent": original["agent_id"],
                "project": original["project_id"],
                "channel": channel,
                "normalized": original["normalized"],
            },
        ).scalar()
        if found is None:
            found = self.conn.execute(
                text(
                    "INSERT INTO entities (agent_id, project_id, channel, name, normalized, declared_by, created_at) "
                    "VALUES (:agent, :project, :channel, :name, :normalized, :by, :at) RETURNING id"
                ),
                {
                    "agent": original["agent_id"],
                    "project": original["project_id"],
                    "channel": channel,
                    "name": original["name"],
                    "normalized": original["normalized"],
                    "by": original["declared_by"],
                    "at": original["created_at"],
                },
            ).scalar_one()
        self.conn.execute(
            text(
                "INSERT INTO entity_aliases (entity_id, alias, normalized) "
                "SELECT :copy, alias, normalized FROM entity_aliases WHERE entity_id = :original "
                "ON CONFLICT DO NOTHING"
            ),
            {"copy": found, "original": original["id"]},
        )
        return found

    def drop_if_orphaned(self, entity_id: int) -> None:
        """Delete the bridge-channel entity once no mention or relation refers to it."""
        still_used = self.conn.execute(
            text(
                "SELECT 1 FROM entity_mentions WHERE entity_id = :id UNION ALL "
                "SELECT 1 FROM relations WHERE (subject_kind = 'entity' AND subject_id = :id) "
                "OR (object_kind = 'entity' AND object_id = :id) LIMIT 1"
            ),
            {"id": entity_id},
        ).first()
        if still_used is None:
            self.conn.execute(
                text("DELETE FROM entities WHERE id = :id AND channel = :bridge"),
                {"id": entity_id, "bridge": self.bridge},
            )
