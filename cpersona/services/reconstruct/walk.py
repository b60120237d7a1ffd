"""Stage 3: the bounded relation walk — declared entity relations add evidence inside items (RX-20 … RX-22).

Walked rows never become items and never reorder them (RX-51): the item
order is fixed before the walk runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sqlalchemy.orm import Session

from cpersona.services.graph.associations import RelationRow
from cpersona.services.reconstruct.bundle import Cluster
from cpersona.services.graph.traverse import MAX_REACHED, _mentions, _recency_order, _walk
from cpersona.services.refs import ref_key
from cpersona.storage.scope import Scope
from cpersona.storage.repositories.associations import AssociationRepository


@dataclass(slots=True)
class Walked:
    ref: str
    hops: int
    predicate: str


@dataclass(slots=True)
class ItemWalk:
    evidence: list[Walked] = field(default_factory=list)
    hops_cut: bool = False
    evidence_reached: bool = False


def _mentioned(session: Session, scope: Scope, refs: list[str]) -> dict[str, list[int]]:
    """ref → readable entities it mentions (ascending)."""
    out: dict[str, list[int]] = {}
    if not refs:
        return out
    for ref, entity_id in AssociationRepository(session, scope).readable_mentions_of(refs):
        out.setdefault(ref, []).append(entity_id)
    return out


def walk_items(
    session: Session,
    scope: Scope,
    items: list[Cluster],
    *,
    max_hops: int,
    max_evidence: int,
    source_id: str,
    channel: str,
) -> list[ItemWalk]:
    """RX-20/RX-21: per item (in item order) the records reached through declared relations."""
    candidate_refs = {c.ref for item in items for c in item.members}
    mentioned = _mentioned(session, scope, sorted(candidate_refs))
    starts = sorted({e for ents in mentioned.values() for e in ents})
    results = [ItemWalk() for _ in items]
    if not starts:
        return results  # nothing declared about these rows: a no-op (RX-51)
    graph = _walk(session, scope, starts, max_hops)
    relations = sorted(graph.loaded.values(), key=_recency_order)
    recency = {rel.id: i for i, rel in enumerate(relations)}
    adjacency: dict[int, list[RelationRow]] = {}
    for rel in relations:
        if rel.subject_id == rel.object_id:
            continue  # a self-relation reaches nothing new
        adjacency.setdefault(rel.subject_id, []).append(rel)
        adjacency.setdefault(rel.object_id, []).append(rel)
    # Every entity some relation reaches — a start included: an entity one item's rows
    # mention can be another item's first hop (RX-20 reads records for all of them).
    reachable = sorted(e for e in graph.distance if e in adjacency)
    # Per reached entity: readable records mentioning it, candidates excluded, lowest id first.
    limit = max_evidence + 1 + len(candidate_refs)
    records = _mentions(session, scope, source_id, channel, reachable, limit)
    per_entity: dict[int, tuple[list[str], bool]] = {}
    for entity_id, (refs, total) in records.items():
        outside = [r for r in refs if r not in candidate_refs]
        others = total - (len(refs) - len(outside))
        per_entity[entity_id] = (outside[:max_evidence], others > max_evidence)
    taken: set[str] = set()
    for item, result in zip(items, results):
        own = {e for c in item.members for e in mentioned.get(c.ref, [])}
        if not own:
            continue
        distance = {e: 0 for e in own}
        via: dict[int, RelationRow] = {}
        frontier = sorted(own)
        for hop in range(1, max_hops + 1):
            nxt: dict[int, RelationRow] = {}
            for entity in frontier:
                for rel in adjacency.get(entity, []):
                    far = rel.object_id if rel.subject_id == entity else rel.subject_id
                    if far in distance:
                        continue
                    if far not in graph.distance:
                        result.hops_cut = True  # the 256-entity bound left it unexpanded (RX-22)
                        continue
                    best = nxt.get(far)
                    if best is None or recency[rel.id] < recency[best.id]:
                        nxt[far] = rel
            for entity, rel in nxt.items():
                distance[entity], via[entity] = hop, rel
            frontier = sorted(nxt)
            if not frontier:
                break
        else:
            # RX-22: a relation leaves the last frontier towards an entity this item did not reach.
            result.hops_cut = result.hops_cut or any(
                (rel.object_id if rel.subject_id == e else rel.subject_id) not in distance
                for e in frontier
                for rel in adjacency.get(e, [])
            )
        if len(graph.distance) >= MAX_REACHED:
            result.hops_cut = True
        best_key: dict[str, tuple[int, int, int, str, str]] = {}
        for entity, hop in distance.items():
            if hop == 0:
                continue  # sharing an entity with a candidate is not a reason (RX-21)
            rel = via[entity]
            refs, cut = per_entity.get(entity, ([], False))
            result.evidence_reached = result.evidence_reached or cut
            for ref in refs:
                if ref in taken:
                    continue
                kind, ident = ref_key(ref)
                key = (hop, recency[rel.id], ident, kind, rel.predicate)
                if ref not in best_key or key < best_key[ref]:
                    best_key[ref] = key
        for ref, key in sorted(best_key.items(), key=lambda kv: kv[1]):
            result.evidence.append(Walked(ref, key[0], key[4]))
            taken.add(ref)
    return results
