"""The declared graph in bulk: paged reads for export and merge, plain writes for import and carry.

Plain SQL over a Connection on the 2.6 table layout exactly (decision 8), so the
same statements read a 2.6 database and ours. The carrying rules (re-pointing
refs, dry runs, what is dropped) stay with the service
(services/portability/graph.py); this module only reads and writes rows.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from sqlalchemy import Connection, Row, bindparam, text

from cpersona.storage.scope import Scope, sql_fragment

PAGE_SIZE = 500

_ALIASES_OF = text(
    "SELECT entity_id, alias FROM entity_aliases WHERE entity_id IN :ids ORDER BY entity_id, normalized"
).bindparams(bindparam("ids", expanding=True))


class AssociationPages:
    """The declarations of one agent (None: every agent), page by page, in export order (JL-2)."""

    def __init__(self, conn: Connection, agent_id: str | None) -> None:
        self.conn = conn
        self._entities_where, self._params = sql_fragment(Scope(agent_id=agent_id), "e")
        self._relations_where, _ = sql_fragment(Scope(agent_id=agent_id), "r")

    def counts(self) -> tuple[int, int, int]:
        """(entities, mentions, relations)."""
        one = lambda sql: self.conn.execute(text(sql), self._params).scalar_one()  # noqa: E731
        return (
            one(f"SELECT count(*) FROM entities e WHERE {self._entities_where}"),
            one(
                "SELECT count(*) FROM entity_mentions m JOIN entities e ON e.id = m.entity_id "
                f"WHERE {self._entities_where}"
            ),
            one(f"SELECT count(*) FROM relations r WHERE {self._relations_where}"),
        )

    def entities(self) -> Iterator[tuple[Row[Any], list[str]]]:
        """Each entity row (ascending id) with its aliases as written, ordered by normalized form."""
        last = 0
        while True:
            page = self.conn.execute(
                text(
                    "SELECT e.id, e.agent_id, e.project_id, e.channel, e.name, e.declared_by, "
                    f"e.created_at FROM entities e WHERE {self._entities_where} AND e.id > :last "
                    "ORDER BY e.id LIMIT :n"
                ),
                {**self._params, "last": last, "n": PAGE_SIZE},
            ).all()
            aliases: dict[int, list[str]] = {row.id: [] for row in page}
            if page:
                for entity_id, alias in self.conn.execute(_ALIASES_OF, {"ids": list(aliases)}):
                    aliases[entity_id].append(alias)
            for row in page:
                yield row, aliases[row.id]
            if len(page) < PAGE_SIZE:
                return
            last = page[-1].id

    def mentions(self) -> Iterator[Row[Any]]:
        """(entity_id, ref, declared_by, created_at) by entity id, then ref."""
        after: tuple[int, str] = (0, "")
        while True:
            page = self.conn.execute(
                text(
                    "SELECT m.entity_id, m.ref, m.declared_by, m.created_at FROM entity_mentions m "
                    f"JOIN entities e ON e.id = m.entity_id WHERE {self._entities_where} "
                    "AND (m.entity_id > :e OR (m.entity_id = :e AND m.ref > :r)) "
                    "ORDER BY m.entity_id, m.ref LIMIT :n"
                ),
                {**self._params, "e": after[0], "r": after[1], "n": PAGE_SIZE},
            ).all()
            yield from page
            if len(page) < PAGE_SIZE:
                return
            after = (page[-1].entity_id, page[-1].ref)

    def relations(self) -> Iterator[Row[Any]]:
        """Every relation column, by id."""
        last = 0
        while True:
            page = self.conn.execute(
                text(
                    "SELECT r.id, r.agent_id, r.project_id, r.channel, r.subject_kind, "
                    "r.subject_id, r.predicate, r.object_kind, r.object_id, r.anchor_ref, "
                    f"r.declared_by, r.declared_at FROM relations r WHERE {self._relations_where} "
                    "AND r.id > :last ORDER BY r.id LIMIT :n"
                ),
                {**self._params, "last": last, "n": PAGE_SIZE},
            ).all()
            yield from page
            if len(page) < PAGE_SIZE:
                return
            last = page[-1].id


class AssociationWrites:
    """Rows a carry writes; mentions, aliases and relations are insert-or-ignore (carrying twice writes once)."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn

    def entity_named(self, agent_id: str, project_id: str, channel: str, normalized: str) -> int | None:
        return self.conn.execute(
            text(
                "SELECT id FROM entities WHERE agent_id = :a AND project_id = :p AND channel = :c AND normalized = :n"
            ),
            {"a": agent_id, "p": project_id, "c": channel, "n": normalized},
        ).scalar()

    def insert_entity(
        self,
        agent_id: str,
        project_id: str,
        channel: str,
        name: str,
        normalized: str,
        declared_by: str,
        created_at: str,
    ) -> int:
        return self.conn.execute(
            text(
                "INSERT INTO entities (agent_id, project_id, channel, name, normalized, "
                "declared_by, created_at) VALUES (:a, :p, :c, :name, :n, :by, :at) RETURNING id"
            ),
            {
                "a": agent_id,
                "p": project_id,
                "c": channel,
                "name": name,
                "n": normalized,
                "by": declared_by,
                "at": created_at,
            },
        ).scalar_one()

    def insert_alias(self, entity_id: int, alias: str, normalized: str) -> None:
        self.conn.execute(
            text(
                "INSERT INTO entity_aliases (entity_id, alias, normalized) "
                "VALUES (:e, :alias, :n) ON CONFLICT DO NOTHING"
            ),
            {"e": entity_id, "alias": alias, "n": normalized},
        )

    def visible_owner(self, agent_id: str, project_id: str, channel: str, normalized: str) -> int | None:
        """The lowest-id entity ``normalized`` names (by name or alias) from (project, channel) (A-4, A-5)."""
        return self.conn.execute(
            text(
                "SELECT min(id) FROM ("
                " SELECT e.id FROM entities e WHERE e.agent_id = :a AND e.project_id IN (:p, '')"
                "  AND e.channel IN (:c, '') AND e.normalized = :n"
                " UNION ALL"
                " SELECT e.id FROM entity_aliases x JOIN entities e ON e.id = x.entity_id"
                "  WHERE e.agent_id = :a AND e.project_id IN (:p, '') AND e.channel IN (:c, '')"
                "  AND x.normalized = :n) AS named"
            ),
            {"a": agent_id, "p": project_id, "c": channel, "n": normalized},
        ).scalar()

    def insert_mention(self, entity_id: int, ref: str, declared_by: str, created_at: str) -> None:
        self.conn.execute(
            text(
                "INSERT INTO entity_mentions (entity_id, ref, declared_by, created_at) "
                "VALUES (:e, :ref, :by, :at) ON CONFLICT DO NOTHING"
            ),
            {"e": entity_id, "ref": ref, "by": declared_by, "at": created_at},
        )

    def insert_relation(self, values: dict[str, Any]) -> None:
        """``values`` keyed a, p, c, sk, si, pred, ok, oi, anchor, by, at."""
        self.conn.execute(
            text(
                "INSERT INTO relations (agent_id, project_id, channel, subject_kind, "
                "subject_id, predicate, object_kind, object_id, anchor_ref, declared_by, "
                "declared_at) VALUES (:a, :p, :c, :sk, :si, :pred, :ok, :oi, :anchor, :by, :at) "
                "ON CONFLICT DO NOTHING"
            ),
            values,
        )
