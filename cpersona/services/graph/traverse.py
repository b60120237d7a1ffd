"""``traverse``: the declared neighbourhood of an entity, as a graph (spec associations §5).

Only what was declared comes back — entities, aliases, entity → entity
relations and the refs of mentioning records — never record text and never
anything inferred (TV-10). Read-only: no counters move, the no-persist pause
does not apply (TV-11).

    starts      every readable entity whose name or alias normalizes like
                ``entity``, at hops 0 (TV-1)
    walk        breadth first over entity → entity relations, either
                direction, up to max_hops; at most 256 entities get a
                distance (TV-3, TV-4)
    order       hops, then recency of the reaching relation, then id (TV-5)
    cut         the first ``limit`` entities (TV-6); their mentions, readable
                by this call, ``limit`` each (TV-7); relations between kept
                entities, newest first (TV-8); what was cut is named in
                ``bounds`` (TV-9)

Isolation: entities and relations are read through their own scope columns,
mentioning records through theirs plus the recall ``source_id`` rule, always
with cpersona.storage.scope (spec ISO-1 … ISO-4).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy.orm import Session

from cpersona.services.app import App
from cpersona.services.graph.associations import (
    RelationRow,
    entity_rows,
    readable_entities,
    relations_between_entities,
)
from cpersona.services.requests import Request
from cpersona.services.responses import failure
from cpersona.storage.repositories.associations import AssociationRepository
from cpersona.storage.scope import Scope

MAX_HOPS = 5  # schema bound (TV-2)
DEFAULT_HOPS = 1
MAX_LIMIT = 100
DEFAULT_LIMIT = 20
MAX_REACHED = 256  # entities ever given a distance, starts included (TV-4)
# Relations loaded per hop. A declaration call writes at most 64, so only a
# graph built over thousands of calls around one hub reaches this; past it the
# most recently declared are kept and the rest are reported as unfollowed.
MAX_RELATIONS_PER_HOP = 10_000

NO_SUCH_ENTITY = "no_such_entity"


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _recency_order(relation: RelationRow) -> tuple[Any, ...]:
    # Most recently declared first; ties by lower id. ISO-8601 stamps written
    # by one clock compare correctly as text.
    return (_Descending(relation.declared_at), relation.id)


@dataclass(frozen=True, slots=True)
class _Descending:
    """Wraps a string so that sorting ascending orders it descending."""

    value: str

    def __lt__(self, other: _Descending) -> bool:
        return self.value > other.value


@dataclass
class _Walk:
    distance: dict[int, int]
    loaded: dict[int, RelationRow]
    unfollowed: bool  # some loaded relation leads to an entity with no distance


def _walk(session: Session, scope: Scope, starts: list[int], max_hops: int) -> _Walk:
    """TV-3, TV-4: distances from the starts, and every relation loaded on the way."""
    distance = {entity: 0 for entity in starts[:MAX_REACHED]}
    loaded: dict[int, RelationRow] = {}
    frontier = list(distance)
    stop = len(starts) > MAX_REACHED  # a bound was hit: finish this hop, then expand no further
    hop = 0
    while frontier:
        found = relations_between_entities(session, scope, frontier)
        if len(found) > MAX_RELATIONS_PER_HOP:
            found = sorted(found, key=_recency_order)[:MAX_RELATIONS_PER_HOP]
            stop = True
        loaded.update((relation.id, relation) for relation in found)
        if hop == max_hops:
            break  # relations at the bound are loaded only so that the cut shows (TV-9)
        on_frontier = set(frontier)
        # Entities first reached on this hop, each with the relations that reach it.
        reached: dict[int, list[RelationRow]] = {}
        for relation in found:
            for near, far in ((relation.subject_id, relation.object_id), (relation.object_id, relation.subject_id)):
                if near in on_frontier and far not in distance:
                    reached.setdefault(far, []).append(relation)
        room = MAX_REACHED - len(distance)
        if len(reached) > room:
            reached = {entity: reached[entity] for entity in _most_recently_reached(reached, room)}
            stop = True
        hop += 1
        for entity in reached:
            distance[entity] = hop
        frontier = sorted(reached)
        if stop:
            break
    unfollowed = any(r.subject_id not in distance or r.object_id not in distance for r in loaded.values())
    return _Walk(distance, loaded, unfollowed)


def _most_recently_reached(reached: dict[int, list[RelationRow]], room: int) -> list[int]:
    """TV-4: the ``room`` entities reached by the most recently declared relations."""
    kept: list[int] = []
    if room <= 0:
        return kept
    ranked = sorted(
        (_recency_order(relation) + (entity,), entity)
        for entity, relations in reached.items()
        for relation in relations
    )
    for _, entity in ranked:
        if entity not in kept:
            kept.append(entity)
            if len(kept) == room:
                break
    return kept


def _entity_order(walk: _Walk) -> list[int]:
    """TV-5: by hops, then the recency rank of the best reaching relation, then id."""
    rank = {relation.id: i for i, relation in enumerate(sorted(walk.loaded.values(), key=_recency_order))}
    best: dict[int, int] = {}
    for relation in walk.loaded.values():
        for near, far in ((relation.subject_id, relation.object_id), (relation.object_id, relation.subject_id)):
            if far in walk.distance and near in walk.distance and walk.distance[near] == walk.distance[far] - 1:
                best[far] = min(best.get(far, len(rank)), rank[relation.id])
    return sorted(walk.distance, key=lambda e: (walk.distance[e], best.get(e, -1), e))


def _mentions(
    session: Session, scope: Scope, source_id: str, channel: str, entity_ids: list[int], limit: int
) -> dict[int, tuple[list[str], int]]:
    """TV-7: per entity, the first ``limit`` readable mentioning refs and how many readable ones exist."""
    if not entity_ids:
        return {}
    # ISO-4: episodes carry no per-user source, so a source-filtered read skips them.
    rows = AssociationRepository(session, scope).readable_mentions(
        source_id, not source_id or bool(channel), entity_ids, limit
    )
    out: dict[int, tuple[list[str], int]] = {}
    for entity_id, kind, record_id, total in rows:
        refs, _ = out.get(entity_id, ([], 0))
        refs.append(f"{kind}:{record_id}")
        out[entity_id] = (refs, total)
    return out


@dataclass(frozen=True)
class TraverseArguments(Request):
    """``traverse``'s arguments in the types its schema declares; defaults are the schema's."""

    agent_id: str
    entity: str
    max_hops: int = DEFAULT_HOPS
    limit: int = DEFAULT_LIMIT
    channel: str = ""
    project_id: str | None = None  # omitted: every project
    source_id: str = ""


def traverse(
    app: App,
    *,
    agent_id: Any = None,
    entity: Any = None,
    max_hops: Any = DEFAULT_HOPS,
    limit: Any = DEFAULT_LIMIT,
    channel: Any = "",
    project_id: Any = None,
    source_id: Any = "",
) -> dict[str, Any]:
    """:func:`answer_traverse` for a library caller, whose arguments no schema has checked."""
    if not isinstance(agent_id, str):
        return failure("agent_id is required" if agent_id is None else "agent_id must be a string")
    if not isinstance(entity, str):
        return failure("entity is required" if entity is None else "entity must be a string")
    # A bound of the wrong type is the default, and a filter of the wrong type no filter.
    return answer_traverse(
        app,
        TraverseArguments(
            agent_id=agent_id,
            entity=entity,
            max_hops=max_hops if _is_int(max_hops) else DEFAULT_HOPS,
            limit=limit if _is_int(limit) else DEFAULT_LIMIT,
            channel=channel if isinstance(channel, str) else "",
            project_id=project_id if isinstance(project_id, str) else None,
            source_id=source_id if isinstance(source_id, str) else "",
        ),
    )


def answer_traverse(app: App, args: TraverseArguments) -> dict[str, Any]:
    """The neighbourhood graph of ``entity`` (spec §5.2)."""
    entity, channel, source_id = args.entity, args.channel, args.source_id
    # The schema bounds both for a tool call (TV-2); a library caller's are brought into range.
    hops = max(0, min(MAX_HOPS, args.max_hops))
    cap = max(1, min(MAX_LIMIT, args.limit))
    # '@auto' and the registry warning (OC-7 … OC-11) were applied by the facade.
    scope = Scope(agent_id=args.agent_id, project_id=args.project_id, channel=channel or None)
    answer: dict[str, Any] = {"entity": entity, "max_hops": hops, "limit": cap}

    with app.db.read() as session:
        starts = readable_entities(session, scope, entity)
        if not starts:
            return {**answer, "entities": [], "relations": [], "reason": NO_SUCH_ENTITY}
        walk = _walk(session, scope, starts, hops)
        ordered = _entity_order(walk)
        kept = ordered[:cap]
        details = entity_rows(session, kept)
        mentions = _mentions(session, scope, source_id, channel, kept, cap)

    mentions_cut = False
    entities = []
    for entity_id in kept:
        name, aliases = details[entity_id]
        item: dict[str, Any] = {"id": entity_id, "name": name, "hops": walk.distance[entity_id]}
        if aliases:
            item["aliases"] = aliases
        refs, total = mentions.get(entity_id, ([], 0))
        if refs:
            item["mentions"] = refs
        if total > len(refs):
            item["mentions_omitted"] = total - len(refs)
            mentions_cut = True
        entities.append(item)

    on_page = set(kept)
    relations = [
        _relation_item(relation)
        for relation in sorted(walk.loaded.values(), key=_recency_order)
        if relation.subject_id in on_page and relation.object_id in on_page
    ]
    answer.update(entities=entities, relations=relations)
    if len(ordered) > cap:
        answer["entities_omitted"] = len(ordered) - cap
    omitted = [
        name for name, cut in (("max_hops", walk.unfollowed), ("limit", len(ordered) > cap or mentions_cut)) if cut
    ]
    if omitted:
        answer["bounds"] = {"omitted": omitted}
    return answer


def _relation_item(relation: RelationRow) -> dict[str, Any]:
    item: dict[str, Any] = {
        "id": relation.id,
        "subject": relation.subject_id,
        "predicate": relation.predicate,
        "object": relation.object_id,
        "declared_by": relation.declared_by,
        "declared_at": relation.declared_at,
    }
    if relation.anchor_ref:
        item["anchor_ref"] = relation.anchor_ref
    return item
