"""Entities, aliases, mentions and relations: every statement of the declared graph.

The services (graph/associations.py, graph/traverse.py, reconstruct) decide
what to declare and what a name means; this module reads and writes the rows.
Reads that take a :class:`~cpersona.storage.scope.Scope` apply it to the
entity's and relation's own scope columns (and, for mentions, the record's).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    Connection,
    Row,
    TextClause,
    and_,
    bindparam,
    delete,
    func,
    inspect,
    literal,
    or_,
    select,
    text,
    union_all,
)

from cpersona.storage.models_associations import Entity, EntityAlias, EntityMention, Relation
from cpersona.storage.repositories.base import Repository, chunks
from cpersona.storage.scope import sql_fragment

ENTITY_KIND = "entity"
RECORD_KINDS = ("mem", "ep")


@dataclass(frozen=True, slots=True)
class RelationRow:
    id: int
    subject_kind: str
    subject_id: int
    predicate: str
    object_kind: str
    object_id: int
    anchor_ref: str
    declared_by: str
    declared_at: str


_RELATION_COLUMNS = (
    Relation.id,
    Relation.subject_kind,
    Relation.subject_id,
    Relation.predicate,
    Relation.object_kind,
    Relation.object_id,
    Relation.anchor_ref,
    Relation.declared_by,
    Relation.declared_at,
)

# The two lookups every name resolution makes; plain SQL text, built once, because a
# large declaration runs them a few thousand times.
_NAMED_IN_SCOPE = text(
    "SELECT id FROM entities WHERE agent_id = :agent AND project_id = :project AND channel = :channel "
    "AND normalized = :normalized"
)
_ALIAS_OWNERS = text("SELECT entity_id FROM entity_aliases WHERE normalized = :normalized")


# Declarations an agent owns outright, deleted by agent_id when their tables
# exist (DAD-1). The association and folder revisions add these tables; their
# triggers take aliases, mentions and memberships along.
AGENT_DECLARATION_TABLES = ("relations", "entities", "folders")


def delete_agent_declarations(conn: Connection, agent_id: str) -> None:
    """Every declaration of ``agent_id`` in whichever of those tables this database has."""
    present = set(inspect(conn).get_table_names())
    for table in AGENT_DECLARATION_TABLES:
        if table in present:
            conn.execute(text(f"DELETE FROM {table} WHERE agent_id = :agent"), {"agent": agent_id})


@functools.lru_cache(maxsize=16)
def _insert_ignore_sql(table: str, columns: tuple[str, ...]) -> TextClause:
    # INSERT … ON CONFLICT DO NOTHING reads the same on SQLite (3.24+) and PostgreSQL.
    names = ", ".join(f'"{c}"' for c in columns)
    marks = ", ".join(f":{c}" for c in columns)
    return text(f"INSERT INTO {table} ({names}) VALUES ({marks}) ON CONFLICT DO NOTHING")


class AssociationRepository(Repository):
    """The declared graph of every agent; scoped reads use the repository's scope."""

    model = Entity

    # -- writes (one declaration's transaction)

    def _insert_ignore(self, model: Any, values: Mapping[str, Any]) -> int:
        """Insert unless the row's unique key is taken; returns rows inserted (0 or 1)."""
        return self.session.execute(_insert_ignore_sql(model.__tablename__, tuple(values)), dict(values)).rowcount

    def register_entity(self, values: Mapping[str, Any]) -> int:
        return self.session.execute(Entity.__table__.insert().values(**values)).inserted_primary_key[0]

    def add_alias(self, entity_id: int, alias: str, normalized: str) -> int:
        return self._insert_ignore(EntityAlias, {"entity_id": entity_id, "alias": alias, "normalized": normalized})

    def add_mention(self, entity_id: int, ref: str, declared_by: str, stamp: str) -> int:
        return self._insert_ignore(
            EntityMention, {"entity_id": entity_id, "ref": ref, "declared_by": declared_by, "created_at": stamp}
        )

    def add_relation(self, key: Mapping[str, Any], declared_by: str, stamp: str) -> int:
        """Insert-or-ignore on the relation's unique key; the id of the row holding it."""
        self._insert_ignore(Relation, {**key, "declared_by": declared_by, "declared_at": stamp})
        return self.session.scalar(
            select(Relation.id).where(*(getattr(Relation, column) == value for column, value in key.items()))
        )

    def delete_relation(self, relation_id: int, agent_id: str) -> int:
        return self.session.execute(
            delete(Relation).where(Relation.id == relation_id, Relation.agent_id == agent_id)
        ).rowcount

    def delete_mention(self, entity_id: int, ref: str, agent_id: str) -> int:
        """One mention, only when its entity belongs to ``agent_id``."""
        owned = select(Entity.id).where(Entity.agent_id == agent_id)
        return self.session.execute(
            delete(EntityMention).where(
                EntityMention.entity_id == entity_id,
                EntityMention.ref == ref,
                EntityMention.entity_id.in_(owned),
            )
        ).rowcount

    def delete_agent(self, agent_id: str) -> dict[str, int]:
        """Every entity of the agent (aliases and mentions go by trigger) and its relations."""
        relations = self.session.execute(delete(Relation).where(Relation.agent_id == agent_id)).rowcount
        entities = self.session.execute(delete(Entity).where(Entity.agent_id == agent_id)).rowcount
        return {"entities": entities, "relations": relations}

    def owned_counts(self, agent_id: str) -> dict[str, int]:
        """How many entities and relations ``agent_id`` still owns."""
        return {
            name: self.session.execute(
                select(func.count()).select_from(model).where(model.agent_id == agent_id)
            ).scalar_one()
            for name, model in (("entities", Entity), ("relations", Relation))
        }

    # -- name resolution (unscoped: the caller names the buckets)

    def named_in(self, agent_id: str, project_id: str, channel: str, normalized: str) -> int | None:
        """The entity registered under ``normalized`` in exactly (agent, project, channel)."""
        return self.session.execute(
            _NAMED_IN_SCOPE, {"agent": agent_id, "project": project_id, "channel": channel, "normalized": normalized}
        ).scalar()

    def aliased(self, normalized: str) -> list[Any]:
        """(id, agent_id, project_id, channel) of every entity holding alias ``normalized``.

        Looked up alias first, then by primary key: joined in one statement, SQLite
        prefers walking all of an agent's entities (its covering unique index) to
        the alias index.
        """
        owners = list(self.session.execute(_ALIAS_OWNERS, {"normalized": normalized}).scalars())
        return self.select_by_ids(owners, Entity.id, Entity.agent_id, Entity.project_id, Entity.channel, scoped=False)

    # -- scoped reads

    def readable_named(self, normalized: str) -> list[int]:
        """Ids (ascending) of readable entities whose name or alias normalizes to ``normalized``."""
        ids = set(self.session.scalars(select(Entity.id).where(self.scoped(), Entity.normalized == normalized)))
        aliased = [row.id for row in self.aliased(normalized)]
        ids.update(row.id for row in self.select_by_ids(aliased))
        return sorted(ids)

    def relations_between_entities(self, entity_ids: Iterable[int]) -> list[RelationRow]:
        """Readable entity → entity relations touching any of ``entity_ids``, both ends readable, id order."""
        readable = select(Entity.id).where(self.scoped())
        found: dict[int, RelationRow] = {}
        for chunk in chunks(sorted(set(entity_ids))):
            rows = self.session.execute(
                select(*_RELATION_COLUMNS).where(
                    self.scoped(Relation),
                    Relation.subject_kind == ENTITY_KIND,
                    Relation.object_kind == ENTITY_KIND,
                    or_(Relation.subject_id.in_(chunk), Relation.object_id.in_(chunk)),
                    Relation.subject_id.in_(readable),
                    Relation.object_id.in_(readable),
                )
            ).all()
            found.update((row.id, RelationRow(*row)) for row in rows)
        return [found[key] for key in sorted(found)]

    def record_relations(self, ends: Mapping[str, Sequence[int]]) -> list[RelationRow]:
        """Readable record → record relations with either end among ``ends`` (kind → ids), id order."""
        side_clauses = []
        for kind, ids in ends.items():
            if ids:
                side_clauses.append(and_(Relation.subject_kind == kind, Relation.subject_id.in_(ids)))
                side_clauses.append(and_(Relation.object_kind == kind, Relation.object_id.in_(ids)))
        if not side_clauses:
            return []
        rows = self.session.execute(
            select(*_RELATION_COLUMNS)
            .where(
                self.scoped(Relation),
                Relation.subject_kind.in_(RECORD_KINDS),
                Relation.object_kind.in_(RECORD_KINDS),
                or_(*side_clauses),
            )
            .order_by(Relation.id)
        ).all()
        return [RelationRow(*row) for row in rows]

    def names_and_aliases(self, entity_ids: Iterable[int]) -> dict[int, tuple[str, list[str]]]:
        """id → (name, aliases as written, ordered by normalized form); unscoped."""
        out: dict[int, tuple[str, list[str]]] = {}
        for chunk in chunks(sorted(set(entity_ids))):
            names = dict(self.session.execute(select(Entity.id, Entity.name).where(Entity.id.in_(chunk))).all())
            aliases: dict[int, list[str]] = {i: [] for i in names}
            for entity_id, alias in self.session.execute(
                select(EntityAlias.entity_id, EntityAlias.alias)
                .where(EntityAlias.entity_id.in_(chunk))
                .order_by(EntityAlias.entity_id, EntityAlias.normalized)
            ):
                aliases.setdefault(entity_id, []).append(alias)
            out.update((i, (names[i], aliases[i])) for i in names)
        return out

    def mentions_of(self, entity_id: int) -> list[str]:
        """Refs of every record declared to mention the entity (no readability filter)."""
        return list(self.session.scalars(select(EntityMention.ref).where(EntityMention.entity_id == entity_id)))

    def entities_mentioned_by(self, canonical_ref: str) -> list[int]:
        return list(
            self.session.scalars(
                select(EntityMention.entity_id)
                .where(EntityMention.ref == canonical_ref)
                .order_by(EntityMention.entity_id)
            )
        )

    def names_in(self, folded: str, limit: int) -> list[Row[Any]]:
        """(term, entity_id) of readable names and aliases occurring in ``folded``: longest first, ``limit`` rows.

        The substring test runs in SQL so only matches leave the database.
        instr() on SQLite, strpos() on PostgreSQL: a plain position test, no LIKE wildcards.
        """
        readable = self.scoped()
        from cpersona.storage.dialect import is_sqlite  # dialect loads both backends: not on every start

        position = func.instr if is_sqlite(self.session) else func.strpos
        names = select(Entity.normalized.label("term"), Entity.id.label("entity_id")).where(
            readable, position(literal(folded), Entity.normalized) > 0
        )
        aliases = (
            select(EntityAlias.normalized.label("term"), EntityAlias.entity_id.label("entity_id"))
            .join(Entity, Entity.id == EntityAlias.entity_id)
            .where(readable, position(literal(folded), EntityAlias.normalized) > 0)
        )
        both = union_all(names, aliases).subquery()
        return list(
            self.session.execute(
                select(both.c.term, both.c.entity_id)
                .where(func.length(both.c.term) > 0)
                .order_by(func.length(both.c.term).desc(), both.c.term, both.c.entity_id)
                .limit(limit)
            ).all()
        )

    def readable_mentions_of(self, refs: list[str]) -> list[Row[Any]]:
        """(ref, entity_id) of each readable entity mentioning one of ``refs``, by entity id."""
        return list(
            self.session.execute(
                select(EntityMention.ref, EntityMention.entity_id)
                .join(Entity, Entity.id == EntityMention.entity_id)
                .where(EntityMention.ref.in_(refs), self.scoped())
                .order_by(EntityMention.entity_id)
            ).all()
        )

    def readable_mentions(
        self, source_id: str, with_episodes: bool, entity_ids: list[int], limit: int
    ) -> list[tuple[int, str, int, int]]:
        """(entity_id, kind, record_id, total) of each entity's first ``limit`` readable mentioning records.

        Records are read through their own scope columns plus the recall
        ``source_id`` rule; record id ascending, at equal id 'ep' before 'mem'.
        """
        m_where, params = sql_fragment(self.scope, "m")
        e_where, _ = sql_fragment(self.scope, "e")
        from cpersona.storage.dialect import source_filter

        by_source, source_params = source_filter(self.session, source_id, "m")
        arms = [
            "SELECT em.entity_id AS entity_id, 'mem' AS kind, m.id AS record_id FROM entity_mentions em "
            "JOIN memories m ON m.id = "
            "CASE WHEN substr(em.ref, 1, 4) = 'mem:' THEN CAST(substr(em.ref, 5) AS BIGINT) END "
            f"WHERE em.entity_id IN :entities AND substr(em.ref, 1, 4) = 'mem:' AND {m_where} AND {by_source}"
        ]
        if with_episodes:
            arms.append(
                "SELECT em.entity_id, 'ep', e.id FROM entity_mentions em "
                "JOIN episodes e ON e.id = "
                "CASE WHEN substr(em.ref, 1, 3) = 'ep:' THEN CAST(substr(em.ref, 4) AS BIGINT) END "
                f"WHERE em.entity_id IN :entities AND substr(em.ref, 1, 3) = 'ep:' AND {e_where}"
            )
        sql = text(
            "SELECT entity_id, kind, record_id, total FROM ("
            " SELECT entity_id, kind, record_id,"
            "  ROW_NUMBER() OVER (PARTITION BY entity_id ORDER BY record_id, kind) AS position,"
            "  COUNT(*) OVER (PARTITION BY entity_id) AS total"
            f" FROM ({' UNION '.join(arms)}) readable"
            ") ranked WHERE position <= :limit ORDER BY entity_id, position"
        ).bindparams(bindparam("entities", expanding=True))
        rows = self.session.execute(sql, {**params, **source_params, "entities": entity_ids, "limit": limit})
        return [tuple(row) for row in rows]
