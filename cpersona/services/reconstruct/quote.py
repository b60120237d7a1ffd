"""Stage 5: quoting — which verbatim parts of a record an item shows (RX-30 … RX-32).

No block rows are built by this server, so head quotes divide the text at
read time and rank the passages lexically (``quote_basis: "lexical"``, spec
§12 point 8). Excerpts use a record's current node set when it has one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from sqlalchemy.orm import Session

from cpersona.embedding.vectors import VectorError, from_blob

from cpersona.services.records.contents import revision_of
from cpersona.services.records.nodes import current_nodes, node_rows

FORCE_CUT = 739  # longest read-time block (§7.4)
GOVERNING_MAX = 1478  # longest governing range (§7.4)
SEPARATOR = " \u2026 "
# Cut classes of §7.4: blank lines, line feeds, sentence ends. Every end of every class is a
# candidate, so a blank line cuts after each of its line feeds (the lone "\n" piece then joins
# the next block), as the reference divides.
_CUT_CLASSES = (re.compile(r"\n[ \t]*\n"), re.compile(r"\n"), re.compile(r"[。．！？]|[.!?](?=\s|\Z)"))
_WEAK = re.compile(r"[、，,;；:：]")
_SENTENCE_END = tuple("。！？．.!?…")
_QUALIFIERS_JA = (
    "ただし",
    "但し",
    "ただ、",
    "しかし",
    "しかしながら",
    "だが",
    "ですが",
    "でも、",
    "なお",
    "とはいえ",
    "一方",
    "他方",
    "その代わり",
    "代わりに",
)
_QUALIFIERS_EN = (
    "except",
    "however",
    "but ",
    "although",
    "though",
    "unless",
    "instead",
    "on the other hand",
    "that said",
    "caveat",
    "note that",
    "provided that",
    "in fact",
    "actually",
)


def _force_split(start: int, end: int, text: str) -> list[tuple[int, int]]:
    pieces = []
    while end - start > FORCE_CUT:
        window = text[start : start + FORCE_CUT]
        cut = 0
        for pattern in (_WEAK, re.compile(r"\s")):
            ends = [m.end() for m in pattern.finditer(window) if m.end() >= FORCE_CUT // 2]
            if ends:
                cut = ends[-1]
                break
        cut = cut or FORCE_CUT
        pieces.append((start, start + cut))
        start += cut
    pieces.append((start, end))
    return pieces


def divide(text: str) -> list[tuple[int, int]]:
    """§7.4's division at read time (no node cuts, no fences or brackets considered)."""
    cuts = sorted({m.end() for pattern in _CUT_CLASSES for m in pattern.finditer(text)} | {len(text)})
    spans, start = [], 0
    for cut in cuts:
        if cut > start:
            spans.extend(_force_split(start, cut, text))
            start = cut
    merged: list[tuple[int, int]] = []
    for span in spans:  # whitespace-only pieces join the next piece
        if merged and not text[merged[-1][0] : merged[-1][1]].strip() and span[1] - merged[-1][0] <= FORCE_CUT:
            span = (merged.pop()[0], span[1])
        merged.append(span)
    if len(merged) > 1 and not text[merged[-1][0] : merged[-1][1]].strip():
        last = merged.pop()
        merged[-1] = (merged[-1][0], last[1])
    return merged


def _ends_sentence(piece: str) -> bool:
    return piece.rstrip().endswith(_SENTENCE_END)


def _qualified(piece: str) -> bool:
    head = piece.lstrip()
    return head.startswith(_QUALIFIERS_JA) or head.lower().startswith(_QUALIFIERS_EN)


def governing(text: str, blocks: list[tuple[int, int]], i: int) -> tuple[int, int, bool]:
    """§7.4: grow block i to a self-contained range; False when the 1,478 limit stopped it."""
    first = last = i
    while True:
        start, end = blocks[first][0], blocks[last][1]
        if first > 0 and (
            not _ends_sentence(text[blocks[first - 1][0] : blocks[first - 1][1]]) or _qualified(text[start:end])
        ):
            if end - blocks[first - 1][0] > GOVERNING_MAX:
                return start, end, False
            first -= 1
        elif last + 1 < len(blocks) and (
            not _ends_sentence(text[start:end]) or _qualified(text[blocks[last + 1][0] :])
        ):
            if blocks[last + 1][1] - start > GOVERNING_MAX:
                return start, end, False
            last += 1
        else:
            return start, end, True


def _trigrams(text: str) -> set[str]:
    low = text.lower()
    return {low} if len(low) < 3 else {low[i : i + 3] for i in range(len(low) - 2)}


def _dense_rrf(values: list[float], rrf_k: int) -> list[float]:
    dense = {v: r for r, v in enumerate(sorted(set(values), reverse=True))}  # equal values share a rank
    return [1.0 / (rrf_k + 1 + dense[v]) for v in values]


def rank_spans(
    text: str, spans: list[tuple[int, int]], query: str, rrf_k: int, closeness: list[float] | None = None
) -> list[int]:
    """RX-30: distinct query trigrams found, fused with the spans' cosine when there is one; ties to the earlier span."""
    wanted = _trigrams(query) if query.strip() else set()
    fused = _dense_rrf([float(len(wanted & _trigrams(text[s:e]))) for s, e in spans], rrf_k)
    if closeness is not None:
        fused = [a + b for a, b in zip(fused, _dense_rrf(closeness, rrf_k))]
    return sorted(range(len(spans)), key=lambda i: (-fused[i], i))


def node_closeness(nodes: list[Any], query_vector: bytes | None) -> list[float] | None:
    """RX-30 (b) for nodes: the cosine of every node's embedding, when all have the query's width."""
    if query_vector is None or any(n.embedding is None or len(n.embedding) != len(query_vector) for n in nodes):
        return None
    try:
        q = from_blob(query_vector)
        q_norm = float(np.linalg.norm(q))
        out = []
        for n in nodes:
            v = from_blob(n.embedding)
            denom = q_norm * float(np.linalg.norm(v))
            out.append(float(np.dot(q, v) / denom) if denom else 0.0)
        return out
    except VectorError:  # a corrupt node vector: rank lexically rather than fail the call
        return None


@dataclass(slots=True)
class Quote:
    content: str
    fields: dict[str, Any] = field(default_factory=dict)  # content_len, ranges, expand, node, ...
    basis: str = "whole"
    lexical_only: bool = False  # a node set was ranked without a query vector (RX-33)
    node_order: list[int] | None = None  # node indices, best first, when quoted from nodes (trace, RX-43)


def head_quote(ref: str, text: str, query: str, cap: int, rrf_k: int) -> Quote:
    """RX-31: whole text when it fits, else the best passages in text order up to ``cap``."""
    if len(text) <= cap:
        return Quote(text, {"ranges": [[0, len(text)]]})
    blocks = divide(text)
    if len(blocks) <= 1:
        return Quote(
            text[:cap],
            {
                "content_len": len(text),
                "ranges": [[0, cap]],
                "expand": {"ref": ref, "span": [0, len(text)], "revision": revision_of(text)},
            },
            basis="start",
        )
    taken: list[tuple[int, int]] = []
    used = 0
    severed: tuple[int, int] | None = None
    incomplete = False
    for i in rank_spans(text, blocks, query, rrf_k):
        b = blocks[i]
        if any(s <= b[0] and b[1] <= e for s, e in taken):
            continue
        start, end, complete = governing(text, blocks, i)
        if any(start < e and s < end for s, e in taken):
            continue
        touches = any(start == e or end == s for s, e in taken)
        cost = (end - start) + (3 if taken and not touches else 0)
        if not taken and end - start > cap:
            severed, incomplete = (start, end), True
            taken.append((start, start + cap))
            break
        if used + cost > cap:
            break
        taken.append((start, end))
        used += cost
        incomplete = incomplete or not complete
    merged: list[list[int]] = []
    for s, e in sorted(taken):
        if merged and merged[-1][1] == s:
            merged[-1][1] = e
        else:
            merged.append([s, e])
    fields: dict[str, Any] = {"content_len": len(text)}
    if severed is not None:
        fields["expand"] = {"ref": ref, "span": [severed[0], severed[1]], "revision": revision_of(text)}
        fields["context_incomplete"] = True
    fields["ranges"] = merged
    return Quote(SEPARATOR.join(text[s:e] for s, e in merged), fields, basis="lexical")


def excerpt_quote(
    session: Session,
    kind: str,
    record_id: int,
    ref: str,
    text: str,
    shown: str,
    query: str,
    cap: int,
    rrf_k: int,
    query_vector: bytes | None = None,
) -> Quote:
    """RX-32 without blocks: the best node of a current node set, else the row as recall shows it, cut to cap."""
    nodes = current_nodes(session, kind, record_id, text)
    if nodes:
        spans = [(n.start, n.end) for n in nodes]
        ranked = rank_spans(text, spans, query, rrf_k, node_closeness(nodes, query_vector))
        node = nodes[ranked[0]]
        piece = text[node.start : node.end]
        fields: dict[str, Any] = {"node": {"index": node.index, "of": len(nodes), "span": [node.start, node.end]}}
        if len(piece) > cap:
            fields["node"]["span"] = [node.start, node.start + cap]
            fields["content_len"] = len(piece)
            fields["expand"] = {"ref": ref, "node": node.index}
            piece = piece[:cap]
        return Quote(
            piece, fields, basis="node", lexical_only=query_vector is None, node_order=[nodes[i].index for i in ranked]
        )
    if len(shown) <= cap:
        return Quote(shown)
    unavailable = "not_current" if node_rows(session, kind, record_id) else "no_nodes"
    return Quote(shown[:cap], {"content_len": len(shown), "node_unavailable": unavailable}, basis="start")
