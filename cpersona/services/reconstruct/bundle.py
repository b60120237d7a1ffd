"""Stage 2: bundle candidates into clusters and fix the item order (RX-14 … RX-19).

Keys are applied in a fixed order; the first key that joins a row names why
it is in its item. Meaning is never compared: rows bundle only on stored
facts (caller id, episode span, source and time, a declared relation).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cpersona.services.graph.associations import RelationRow
from cpersona.services.reconstruct.pool import Candidate

MSG_ID, EPISODE, ADJACENT, RELATION = "cluster:msg_id", "cluster:episode", "cluster:adjacent", "cluster:relation"
KEY_ORDER = (MSG_ID, EPISODE, ADJACENT, RELATION)


@dataclass(slots=True)
class Cluster:
    members: list[Candidate]  # rank order
    why: dict[str, str] = field(default_factory=dict)  # ref → label of the key that first joined it
    held: bool = False  # a held item (RX-19)

    @property
    def best_rank(self) -> int:
        return self.members[0].rank


class _UnionFind:
    def __init__(self, size: int) -> None:
        self.parent = list(range(size))

    def find(self, i: int) -> int:
        while self.parent[i] != i:
            self.parent[i] = self.parent[self.parent[i]]
            i = self.parent[i]
        return i

    def join(self, a: int, b: int) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:  # the lower candidate index represents the set
            self.parent[max(ra, rb)] = min(ra, rb)


def _relation_ref(kind: str, ident: int) -> str:
    return f"{kind}:{ident}"


def bundle(candidates: list[Candidate], relations: list[RelationRow], adjacency_seconds: int) -> list[Cluster]:
    """Every candidate in exactly one cluster; clusters ordered by their best member's rank."""
    uf = _UnionFind(len(candidates))
    why: dict[int, str] = {}

    def join(a: int, b: int, label: str) -> None:
        for i in (a, b):
            why.setdefault(i, label)
        uf.join(a, b)

    mems = [c for c in candidates if c.kind == "mem"]
    # RX-14: the same caller id in the same stored project (unknown context never matches).
    by_msg: dict[tuple[str, str], int] = {}
    for c in mems:
        if c.record.msg_id and c.context is not None:
            key = (c.record.msg_id, c.context[0])
            if key in by_msg:
                join(by_msg[key], c.rank, MSG_ID)
            else:
                by_msg[key] = c.rank
    # RX-15: an episode candidate joins the memories of its context stamped inside its span.
    for ep in candidates:
        if ep.kind != "ep" or ep.span is None or ep.context is None:
            continue
        for c in mems:
            if c.context == ep.context and c.stamp is not None and ep.span[0] <= c.stamp <= ep.span[1]:
                join(ep.rank, c.rank, EPISODE)
    # RX-16: bursts from one source in one context, anchored at each burst's first row.
    if adjacency_seconds > 0:
        groups: dict[tuple[object, ...], list[Candidate]] = {}
        for c in mems:
            source = c.source_key()
            if source is not None and c.context is not None and c.stamp is not None:
                groups.setdefault((source, c.context), []).append(c)
        for rows in groups.values():
            rows.sort(key=lambda c: (c.stamp, c.kind, c.record.id))
            anchor = rows[0]
            for c in rows[1:]:
                if (c.stamp - anchor.stamp).total_seconds() <= adjacency_seconds:
                    join(anchor.rank, c.rank, ADJACENT)
                else:
                    anchor = c
    # RX-17: a declared record → record relation between two distinct candidates.
    by_ref = {c.ref: c.rank for c in candidates}
    for rel in relations:
        a = by_ref.get(_relation_ref(rel.subject_kind, rel.subject_id))
        b = by_ref.get(_relation_ref(rel.object_kind, rel.object_id))
        if a is not None and b is not None and a != b:
            join(a, b, f"relation:{rel.predicate}")
    groups_by_root: dict[int, list[Candidate]] = {}
    for c in candidates:
        groups_by_root.setdefault(uf.find(c.rank), []).append(c)
    clusters = [
        Cluster(sorted(members, key=lambda c: c.rank), {c.ref: why[c.rank] for c in members if c.rank in why})
        for members in groups_by_root.values()
    ]
    clusters.sort(key=lambda cl: cl.best_rank)
    return clusters


def choose_items(clusters: list[Cluster], effective_count: int) -> list[Cluster]:
    """RX-19: the window (clusters with an admitted row), then held clusters after it."""
    window: list[Cluster] = []
    rest: list[Cluster] = []
    for cluster in clusters:
        admitted = any(not c.held for c in cluster.members)
        if admitted and len(window) < effective_count:
            window.append(cluster)
        else:
            rest.append(cluster)
    if effective_count <= 0:
        return window
    held = [cl for cl in rest if any(c.held for c in cl.members)]
    for cl in held:
        cl.held = True
    return window + held


def independence_reason(cluster: Cluster) -> str:
    """RX-28: the strongest key some cluster row's ``why`` names, else singleton."""
    labels = set(cluster.why.values())
    for key in KEY_ORDER:
        if key in labels or (key == RELATION and any(label.startswith("relation:") for label in labels)):
            return key
    return "singleton"
