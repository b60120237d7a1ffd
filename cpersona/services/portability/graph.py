"""Declared associations (entities, aliases, mentions, relations) in bulk operations.

Spec storage.md §6.2 (tables), §8.1 (records), associations-and-reconstruct.md
§10 CA-1/CA-2. The tables use the 2.6 layout exactly (decision 8), so the same
SQL reads a 2.6 database and — once our association revision exists — ours.
While our database has no association tables every entry point here still
counts what it was handed, and callers report those records as not supported.

Carrying rules (CA-2): every ``mem:<id>`` / ``ep:<id>`` of the source is
re-pointed through a :class:`RefMap` to the row that now holds that record; an
entity is re-resolved or registered in its own exact scope under the target
agent; an alias that already names another entity visible from that scope is
refused; mentions and relations are insert-or-ignore, so carrying twice writes
once. In a dry run nothing is written and new ids are stand-ins (negative), so
the counts are those a real run reports.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection

from cpersona.services import refs as record_refs
from cpersona.services.graph.associations import MAX_TEXT, normalize
from cpersona.services.portability import coerce
from cpersona.services.portability.coerce import LineRefused
from cpersona.services.refs import Ref, canonical_ref
from cpersona.storage.repositories.association_transfer import AssociationPages, AssociationWrites

KINDS = ("entity", "mention", "relation")


def parse_ref(ref: Any) -> Ref | None:
    """A ref of a graph record: canonical only (VF-7), any id (the file's own record ids)."""
    return record_refs.parse_ref(ref, leading_zeros=False, max_chars=None)


class RefMap:
    """Source record ids → ids of the rows that now hold those records (JL-7).

    Only ids some graph record points at are remembered, so restoring a large
    file keeps a mapping the size of its graph, not of its records.
    """

    def __init__(self) -> None:
        self._wanted: dict[str, set[int]] = {"mem": set(), "ep": set()}
        self._found: dict[str, dict[int, int]] = {"mem": {}, "ep": {}}

    def want_from(self, record: dict[str, Any]) -> None:
        """Note the record ids a mention or relation record refers to."""
        self._want_ref(record.get("ref"))
        self._want_ref(record.get("anchor_ref"))
        for side in ("subject", "object"):
            kind, ident = record.get(f"{side}_kind"), record.get(f"{side}_id")
            if kind in self._wanted and type(ident) is int:
                self._wanted[kind].add(ident)

    def _want_ref(self, ref: Any) -> None:
        parsed = parse_ref(ref)
        if parsed is not None:
            self._wanted[parsed.kind].add(parsed.id)

    def wants(self, kind: str, ident: Any) -> bool:
        return type(ident) is int and ident in self._wanted[kind]

    def record(self, kind: str, ident: Any, new_id: int) -> None:
        if self.wants(kind, ident):
            self._found[kind][ident] = new_id

    def lookup(self, kind: str, ident: Any) -> int | None:
        return self._found[kind].get(ident) if type(ident) is int else None

    def repoint(self, ref: Any) -> str | None:
        parsed = parse_ref(ref)
        if parsed is None:
            return None
        new_id = self.lookup(parsed.kind, parsed.id)
        return None if new_id is None else canonical_ref(parsed.kind, new_id)


@dataclass
class GraphCounts:
    entities: int = 0
    mentions: int = 0
    relations: int = 0

    def add(self, kind: str, n: int = 1) -> None:
        setattr(self, _FIELD[kind], getattr(self, _FIELD[kind]) + n)

    def get(self, kind: str) -> int:
        return getattr(self, _FIELD[kind])

    def total(self) -> int:
        return self.entities + self.mentions + self.relations

    def as_dict(self) -> dict[str, int]:
        return {"entities": self.entities, "mentions": self.mentions, "relations": self.relations}


_FIELD = {"entity": "entities", "mention": "mentions", "relation": "relations"}


# --- reading (export, merge, the 2.6 copier) -------------------------------


class GraphReader:
    """The declarations of one agent (None: every agent), as export records."""

    def __init__(self, conn: Connection, agent_id: str | None) -> None:
        self._pages = AssociationPages(conn, agent_id)

    def counts(self) -> GraphCounts:
        entities, mentions, relations = self._pages.counts()
        return GraphCounts(entities=entities, mentions=mentions, relations=relations)

    def records(self) -> Iterator[dict[str, Any]]:
        """Entities (ascending id), mentions (entity id, ref), relations (id): JL-2."""
        for row, aliases in self._pages.entities():
            yield {
                "_type": "entity",
                "id": row.id,
                "agent_id": row.agent_id,
                "project_id": row.project_id,
                "channel": row.channel,
                "name": row.name,
                "declared_by": row.declared_by,
                "created_at": row.created_at,
                "aliases": aliases,
            }
        for row in self._pages.mentions():
            yield {
                "_type": "mention",
                "entity": row.entity_id,
                "ref": row.ref,
                "declared_by": row.declared_by,
                "created_at": row.created_at,
            }
        for row in self._pages.relations():
            yield {"_type": "relation", **row._asdict()}


# --- carrying (import, merge, the 2.6 copier) -------------------------------


@dataclass
class _Entity:
    source_id: Any
    agent_id: str
    project_id: str
    channel: str
    name: str
    declared_by: str
    created_at: str
    aliases: list[str]


@dataclass
class CarryResult:
    carried: GraphCounts = field(default_factory=GraphCounts)
    dropped: GraphCounts = field(default_factory=GraphCounts)
    aliases_dropped: int = 0
    # Present only while this database has no association tables.
    not_supported: GraphCounts | None = None

    @property
    def not_carried(self) -> int:
        return self.dropped.total() + self.aliases_dropped

    def summary_line(self) -> str | None:
        """One error line for everything that could not be carried (IM-9)."""
        if self.not_supported is not None:
            if not self.not_supported.total():
                return None
            n = self.not_supported
            return (
                f"{n.total()} association records ({n.entities} entities, {n.mentions} "
                f"mentions, {n.relations} relations) were not restored: this server has "
                "no association tables yet"
            )
        if not self.not_carried:
            return None
        d = self.dropped
        return (
            f"{self.not_carried} association items were not carried ({d.entities} entities, "
            f"{d.mentions} mentions, {d.relations} relations, {self.aliases_dropped} aliases): "
            "they name a record or entity that was not restored, are malformed, or the alias "
            "already names another entity in scope"
        )

    def response(self) -> dict[str, Any]:
        out: dict[str, Any] = self.carried.as_dict()
        if self.not_supported is not None:
            out["not_supported"] = self.not_supported.as_dict()
        return out


class GraphCarrier:
    """Collects graph records while records are restored, then writes them through a RefMap."""

    def __init__(self, conn: Connection, *, supported: bool, dry_run: bool, now: str) -> None:
        self.rows = AssociationWrites(conn)
        self.supported = supported
        self.dry_run = dry_run
        self.now = now
        self.result = CarryResult(not_supported=None if supported else GraphCounts())
        self._entities: list[_Entity] = []
        self._mentions: list[dict[str, Any]] = []
        self._relations: list[dict[str, Any]] = []
        self._entity_ids: dict[Any, int] = {}
        # What this run registered, so a dry run sees its own earlier items.
        self._names: dict[tuple[str, str, str, str], int] = {}
        self._aliases: dict[tuple[str, str, str, str], int] = {}
        self._stand_in = 0

    def collect(self, record: dict[str, Any], kind: str, agent_id: str | None) -> None:
        """Keep one graph record for later. ``agent_id`` overrides the record's (a target)."""
        if not self.supported:
            self.result.not_supported.add(kind)  # type: ignore[union-attr]
            return
        try:
            if kind == "entity":
                self._entities.append(self._entity(record, agent_id))
            elif kind == "mention":
                self._mentions.append(record)
            else:
                self._relations.append({**record, "agent_id": self._agent(record, agent_id)})
        except LineRefused:
            self.result.dropped.add(kind)

    @staticmethod
    def _agent(record: dict[str, Any], agent_id: str | None) -> str:
        if agent_id:
            return agent_id
        if not isinstance(record.get("agent_id"), str):
            raise LineRefused("agent_id is missing")
        return record["agent_id"]

    def _entity(self, record: dict[str, Any], agent_id: str | None) -> _Entity:
        aliases = record.get("aliases") or []
        if not isinstance(aliases, list):
            raise LineRefused("aliases is not a list")
        return _Entity(
            source_id=record.get("id"),
            agent_id=self._agent(record, agent_id),
            project_id=coerce.text(record, "project_id"),
            channel=coerce.text(record, "channel"),
            name=coerce.text(record, "name").strip(),
            declared_by=coerce.text(record, "declared_by") or "agent",
            created_at=coerce.text(record, "created_at") or self.now,
            aliases=aliases,
        )

    def apply(self, refs: RefMap, tick: Callable[[], Any] | None = None) -> CarryResult:
        """Carry everything still collected; an item naming a record not restored is dropped.

        ``tick`` runs after each item: a batched run may commit there, since
        every item is written whole and carrying again writes it once.
        """
        if self.supported:
            self._carry_entities(tick)
            mentions, self._mentions = self._mentions, []
            relations, self._relations = self._relations, []
            for mention in mentions:
                self._carry_mention(mention, refs)
                if tick is not None:
                    tick()
            for relation in relations:
                self._carry_relation(relation, refs)
                if tick is not None:
                    tick()
        return self.result

    def carry_ready(self, refs: RefMap) -> None:
        """Carry the entities, and every mention and relation whose records are all restored by now.

        A batched move calls this before each commit, so the declarations on the
        rows it is about to delete at the source are already at the target.
        The rest waits for a later batch or :meth:`apply`.
        """
        if not self.supported:
            return
        self._carry_entities(None)
        mentions, self._mentions = self._mentions, []
        for mention in mentions:
            if self._waits(refs, mention.get("ref")):
                self._mentions.append(mention)
            else:
                self._carry_mention(mention, refs)
        relations, self._relations = self._relations, []
        for relation in relations:
            if self._relation_waits(relation, refs):
                self._relations.append(relation)
            else:
                self._carry_relation(relation, refs)

    def waiting_on(self) -> set[tuple[str, int]]:
        """(kind, source id) of every record a mention or relation still waiting names."""
        named: set[tuple[str, int]] = set()
        for mention in self._mentions:
            if (parsed := parse_ref(mention.get("ref"))) is not None:
                named.add((parsed.kind, parsed.id))
        for relation in self._relations:
            if (parsed := parse_ref(relation.get("anchor_ref"))) is not None:
                named.add((parsed.kind, parsed.id))
            for side in ("subject", "object"):
                kind, ident = relation.get(f"{side}_kind"), relation.get(f"{side}_id")
                if kind in ("mem", "ep") and type(ident) is int:
                    named.add((kind, ident))
        return named

    @staticmethod
    def _waits(refs: RefMap, ref: Any) -> bool:
        parsed = parse_ref(ref)
        return parsed is not None and refs.lookup(parsed.kind, parsed.id) is None

    def _relation_waits(self, record: dict[str, Any], refs: RefMap) -> bool:
        if record.get("anchor_ref") and self._waits(refs, record.get("anchor_ref")):
            return True
        return any(
            record.get(f"{side}_kind") in ("mem", "ep")
            and refs.lookup(record[f"{side}_kind"], record.get(f"{side}_id")) is None
            for side in ("subject", "object")
        )

    def _carry_entities(self, tick: Callable[[], Any] | None) -> None:
        entities, self._entities = self._entities, []
        for entity in entities:
            self._carry_entity(entity)
            if tick is not None:
                tick()

    # -- entities and aliases

    def _carry_entity(self, item: _Entity) -> None:
        norm = normalize(item.name)
        if not norm or len(item.name) > MAX_TEXT:
            self.result.dropped.add("entity")
            return
        key = (item.agent_id, item.project_id, item.channel, norm)
        entity_id = self._names.get(key)
        if entity_id is None:
            entity_id = self.rows.entity_named(*key)
        if entity_id is None:
            if self.dry_run:
                self._stand_in -= 1
                entity_id = self._stand_in
            else:
                entity_id = self.rows.insert_entity(*key[:3], item.name, norm, item.declared_by, item.created_at)
        self._names[key] = entity_id
        if item.source_id is not None:
            self._entity_ids[item.source_id] = entity_id
        self.result.carried.add("entity")
        for alias in item.aliases:
            self._carry_alias(item, entity_id, alias)

    def _carry_alias(self, item: _Entity, entity_id: int, alias: Any) -> None:
        written = alias.strip() if isinstance(alias, str) else ""
        norm = normalize(written)
        if not norm or len(written) > MAX_TEXT:
            self.result.aliases_dropped += 1
            return
        owner = self._alias_owner(item, norm)
        if owner is not None and owner != entity_id:
            self.result.aliases_dropped += 1
            return
        # An alias that already names this entity (its own name, say) is still a
        # row of the source: written insert-or-ignore, as declare_associations
        # writes it, so export -> import keeps every alias.
        if not self.dry_run:
            self.rows.insert_alias(entity_id, written, norm)
        self._aliases[(item.agent_id, item.project_id, item.channel, norm)] = entity_id

    def _alias_owner(self, item: _Entity, norm: str) -> int | None:
        """The entity this normalized string already names from the item's scope (A-4, A-5)."""
        stored = self.rows.visible_owner(item.agent_id, item.project_id, item.channel, norm)
        if stored is not None:
            return stored
        # A dry run wrote nothing: what this run registered lives only here.
        for project in (item.project_id, ""):
            for channel in (item.channel, ""):
                key = (item.agent_id, project, channel, norm)
                if key in self._names:
                    return self._names[key]
                if key in self._aliases:
                    return self._aliases[key]
        return None

    # -- mentions and relations

    def _carry_mention(self, record: dict[str, Any], refs: RefMap) -> None:
        entity_id = self._entity_ids.get(record.get("entity"))
        ref = refs.repoint(record.get("ref"))
        if entity_id is None or ref is None:
            self.result.dropped.add("mention")
            return
        try:
            by = coerce.text(record, "declared_by") or "agent"
            at = coerce.text(record, "created_at") or self.now
        except LineRefused:
            self.result.dropped.add("mention")
            return
        if not self.dry_run:
            self.rows.insert_mention(entity_id, ref, by, at)
        self.result.carried.add("mention")

    def _endpoint(self, kind: Any, ident: Any, refs: RefMap) -> int | None:
        if kind == "entity":
            return self._entity_ids.get(ident)
        if kind in ("mem", "ep"):
            return refs.lookup(kind, ident)
        return None

    def _carry_relation(self, record: dict[str, Any], refs: RefMap) -> None:
        subject = self._endpoint(record.get("subject_kind"), record.get("subject_id"), refs)
        obj = self._endpoint(record.get("object_kind"), record.get("object_id"), refs)
        anchor = record.get("anchor_ref") or ""
        anchor = refs.repoint(anchor) if anchor else ""
        try:
            predicate = normalize(coerce.text(record, "predicate"))
            values = {
                "a": record["agent_id"],
                "p": coerce.text(record, "project_id"),
                "c": coerce.text(record, "channel"),
                "sk": record.get("subject_kind"),
                "si": subject,
                "pred": predicate,
                "ok": record.get("object_kind"),
                "oi": obj,
                "anchor": anchor,
                "by": coerce.text(record, "declared_by") or "agent",
                "at": coerce.text(record, "declared_at") or self.now,
            }
        except LineRefused:
            self.result.dropped.add("relation")
            return
        if subject is None or obj is None or anchor is None or not predicate:
            self.result.dropped.add("relation")
            return
        if not self.dry_run:
            self.rows.insert_relation(values)
        self.result.carried.add("relation")
