"""Stage 4: structure each item — head, retained rows, claims newest first, roles, conflicts (RX-23 … RX-29)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from cpersona.services.graph.associations import RelationRow
from cpersona.services.reconstruct.bundle import Cluster, independence_reason
from cpersona.services.reconstruct.walk import ItemWalk
from cpersona.services.recall.service import parse_instant
from cpersona.storage.search import Record

ROLE_WORDS = frozenset({"supports", "supersedes", "corrects", "qualifies", "contradicts", "temporal_predecessor"})


@dataclass(slots=True)
class Row:
    """A retained row of an item: a cluster member or a walked record."""

    record: Record
    rank: int  # relevance; walked rows rank after every candidate, in walk order
    context: tuple[str, str] | None
    stamp: datetime | None
    span: tuple[datetime, datetime] | None = None
    why: str = "seed"
    hops: int | None = None
    roles: list[dict[str, str]] = field(default_factory=list)

    @property
    def ref(self) -> str:
        return self.record.ref


@dataclass(slots=True)
class Item:
    head: Row
    rows: list[Row]  # retained rows in claim order (newest first)
    independence: str
    held: bool
    claims_omitted: int = 0
    conflicts: list[dict[str, Any]] = field(default_factory=list)
    walk: ItemWalk | None = None

    def excerpt_rows(self) -> list[Row]:
        """The other retained rows, most relevant first (RX-32's excerpts)."""
        return sorted((r for r in self.rows if r is not self.head), key=lambda r: (r.rank, r.record.kind, r.record.id))


def _claim_order(row: Row) -> tuple[Any, ...]:
    """RX-25: dated first, later first, memories before episodes, relevance, then id."""
    stamp = row.stamp.timestamp() if row.stamp is not None else 0.0
    return (row.stamp is None, -stamp, row.record.kind != "mem", row.rank, row.record.id)


def _msg_key(row: Row) -> tuple[str, str] | None:
    if row.record.kind != "mem" or not row.record.msg_id or row.context is None:
        return None
    return (row.record.msg_id, row.context[0])


def structure(
    cluster: Cluster,
    walk: ItemWalk | None,
    walked_records: dict[str, Record],
    relations: list[RelationRow],
    candidate_refs: set[str],
    max_evidence: int,
    walk_base_rank: int,
) -> Item:
    members = [
        Row(c.record, c.rank, c.context, c.stamp, c.span, why=cluster.why.get(c.ref, "seed")) for c in cluster.members
    ]
    head = members[0]  # lowest rank; members are already in rank order (then kind, then id)
    key = _msg_key(head)
    if key is not None:  # RX-23: a newer version of the same record is the better head
        versions = [r for r in members if _msg_key(r) == key and r.stamp is not None]
        if versions and head.stamp is not None:
            newest = max(versions, key=lambda r: (r.stamp, r.record.id))
            if newest.stamp > head.stamp:
                head = newest
    walked: list[Row] = []
    for i, w in enumerate(walk.evidence if walk else []):
        record = walked_records.get(w.ref)
        if record is None:
            continue
        walked.append(
            Row(
                record,
                walk_base_rank + i,
                None,
                parse_instant(record.timestamp) if record.timestamp else None,
                why=f"relation:{w.predicate}",
                hops=w.hops,
            )
        )
    ordered = [head] + [r for r in members if r is not head] + walked  # RX-24 retention priority
    kept = ordered[:max_evidence]
    item = Item(
        head,
        sorted(kept, key=_claim_order),
        independence_reason(cluster),
        cluster.held,
        claims_omitted=len(ordered) - len(kept),
        walk=walk,
    )
    _roles(item, relations, candidate_refs)
    _conflicts(item)
    return item


def _roles(item: Item, relations: list[RelationRow], candidate_refs: set[str]) -> None:
    """RX-26: what each referenced row is to the claim, in the fixed order supersedes, supports, declared."""
    retained = {r.ref: r for r in item.rows}
    for row in item.rows:
        roles: list[dict[str, str]] = []
        key = _msg_key(row)
        if key is not None and row.stamp is not None:
            newer = [
                r
                for r in item.rows
                if r is not row and _msg_key(r) == key and r.stamp is not None and r.stamp > row.stamp
            ]
            if newer:
                successor = min(newer, key=lambda r: (r.stamp, r.record.id))
                roles.append({"ref": successor.ref, "role": "supersedes"})
        if row.record.kind == "mem" and row.stamp is not None and row.hops is None:
            for ep in item.rows:
                if (
                    ep.record.kind == "ep"
                    and ep.span is not None
                    and ep.context == row.context
                    and ep.span[0] <= row.stamp <= ep.span[1]
                ):
                    roles.append({"ref": ep.ref, "role": "supports"})
        if row.hops is None:  # walked rows never get declared roles
            for rel in relations:
                subject, obj = f"{rel.subject_kind}:{rel.subject_id}", f"{rel.object_kind}:{rel.object_id}"
                if obj != row.ref or subject not in retained or subject not in candidate_refs:
                    continue
                if rel.predicate in ROLE_WORDS:
                    entry = {"ref": subject, "role": rel.predicate}
                    if entry not in roles:
                        roles.append(entry)
        row.roles = roles


def _conflicts(item: Item) -> None:
    """RX-27: rows that share a caller id and a timestamp cannot be ordered; nothing else is judged."""
    groups: dict[tuple[tuple[str, str], str], list[str]] = {}
    for row in item.rows:
        key = _msg_key(row)
        if key is not None and row.record.timestamp:
            groups.setdefault((key, row.record.timestamp), []).append(row.ref)
    for (key, _), refs in groups.items():
        if len(refs) > 1:
            item.conflicts.append({"refs": sorted(refs), "reason": "same_msg_id_same_timestamp", "msg_id": key[0]})
