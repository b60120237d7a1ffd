"""get_contents: the way back from a preview to a record's exact text (spec §3.4, ranges §7).

A caller hands in up to 20 refs, each a string (``mem:<id>`` / ``ep:<id>``) or
an object naming part of its record (``{ref, span}``, ``{ref, node}``,
``{ref, block}``, optionally with ``revision``). Every entry ends in exactly
one of four lists, in the order it was given:

    items        served: the whole row, or exactly the slice asked for
    missing      the ref names no row this agent owns (malformed, absent,
                 another agent's: indistinguishable on purpose, GC-2/GC-3)
    unresolved   the row is the caller's but the range cannot be served
                 exactly ({ref, reason}); never widened to the whole row (GR-1)
    deferred     the 40,000-character batch budget ran out; echoed as sent

Per entry the checks run in the order of spec GR-2: shape, ref and ownership,
range validity, revision, range resolution, budget.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cpersona.services import refs as record_refs
from cpersona.services.app import App
from cpersona.services.records.nodes import current_nodes
from cpersona.services.requests import Request
from cpersona.services.responses import ToolFailure, answers_refusals
from cpersona.services.sanitize import parse_stored_json
from cpersona.storage.scope import Scope
from cpersona.storage.repositories.episodes import EpisodeRepository
from cpersona.storage.repositories.memories import MemoryRepository
from cpersona.storage.search import Record, RowKey

MAX_REFS = 20  # spec GC-1
BATCH_BUDGET = 40_000  # characters per call, whatever CPERSONA_MAX_CONTENT_LENGTH says (spec GC-4)
REVISION_CHARS = 12  # a revision is this many hex digits of SHA-256 (spec GR-7)

RANGE_KINDS = ("node", "span", "block")

# Reasons a range is not served (spec §7.2).
INVALID_RANGE = "invalid_range"
SPAN_OUT_OF_RANGE = "span_out_of_range"
STALE_REVISION = "stale_revision"
NO_CURRENT_NODES = "no_current_nodes"
NODE_OUT_OF_RANGE = "node_out_of_range"
NO_CURRENT_BLOCKS = "no_current_blocks"


def parse_ref(value: Any) -> RowKey | None:
    """``("mem" | "ep", id)`` for a ref as sent, else None (spec GC-3).

    Not trimmed; leading zeros read through (mem:007 is mem:7, associations
    §0.3); an id of 0 or beyond signed 64-bit is malformed, like any other.
    """
    ref = record_refs.parse_ref(value)
    return ref.key if ref is not None and ref.in_range else None


def revision_of(text: str) -> str:
    """The digest a range's offsets are tied to: 12 hex digits of SHA-256 of the UTF-8 text.

    Equal texts share it (it is not a version counter). ``surrogatepass`` keeps
    a legacy row holding a lone surrogate digestible instead of crashing.
    """
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:REVISION_CHARS]


# -- one entry ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Wanted:
    """One ``refs`` entry, read but not yet resolved."""

    raw: Any  # as sent: echoed in ``deferred``
    ref: Any  # the ref as sent (a string unless the caller bypassed the schema)
    key: RowKey | None  # None: malformed, so missing
    kind: str | None = None  # "node" | "span" | "block"; None = the whole row
    bounds: tuple[int, int] | None = None  # first/last (node, block) or start/end (span)
    revision: str | None = None
    invalid: bool = False  # the shape is wrong: unresolved invalid_range (after ownership)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _bounds(kind: str, value: Any) -> tuple[int, int] | None:
    """The pair a range value names, or None when it is malformed (spec GR-3)."""
    if kind != "span" and _is_int(value):
        return (value, value) if value >= 0 else None
    if not isinstance(value, list) or len(value) != 2 or not all(_is_int(v) for v in value):
        return None
    first, last = value
    if first < 0:
        return None
    if kind == "span":
        return (first, last) if last > first else None  # [start, end): an empty span serves nothing
    return (first, last) if last >= first else None  # inclusive node/block indices


def read_entry(raw: Any) -> Wanted:
    """Step 1 of GR-2: what one entry asks for, without touching the database."""
    if not isinstance(raw, Mapping):
        return Wanted(raw, raw, parse_ref(raw))
    ref = raw.get("ref")
    key = parse_ref(ref)
    kinds = [k for k in RANGE_KINDS if k in raw]
    revision = raw.get("revision")
    if len(kinds) > 1 or ("revision" in raw and not isinstance(revision, str)):
        return Wanted(raw, ref, key, invalid=True)
    if not kinds:
        return Wanted(raw, ref, key, revision=revision)
    bounds = _bounds(kinds[0], raw[kinds[0]])
    return Wanted(raw, ref, key, kinds[0], bounds, revision, invalid=bounds is None)


# -- rows --------------------------------------------------------------------------


def load_rows(app: App, agent_id: str, keys: Iterable[RowKey]) -> dict[RowKey, Record]:
    """The caller's own rows among ``keys``; anything else is simply not returned.

    Ownership is the agent axis alone (spec GC-2): a ref from a recall under a
    project or channel filter must still expand without repeating the filter.
    """
    ids: dict[str, set[int]] = {"mem": set(), "ep": set()}
    for kind, row_id in keys:
        ids[kind].add(row_id)
    scope = Scope(agent_id=agent_id)
    found: dict[RowKey, Record] = {}
    with app.db.read() as session:
        for row in MemoryRepository(session, scope).content_rows(sorted(ids["mem"])):
            found[("mem", row.id)] = Record(
                "mem", row.id, row.content or "", row.source or "", row.timestamp or "", msg_id=row.msg_id or ""
            )
        for row in EpisodeRepository(session, scope).content_rows(sorted(ids["ep"])):
            found[("ep", row.id)] = Record(
                "ep", row.id, row.summary or "", "", row.start_time or row.created_at or "",
                resolved=bool(row.resolved),
            )  # fmt: skip
    return found


def item_for(ref: Any, record: Record, content: str | None = None) -> dict[str, Any]:
    """The answer for one row: its full display text, or ``content`` when a slice was asked for."""
    item: dict[str, Any] = {"ref": ref, "content": record.content if content is None else content}
    if record.kind == "ep":
        item["source"] = {"System": "episode"}
    elif record.source:
        item["source"] = parse_stored_json(record.source)
    if record.timestamp:
        item["timestamp"] = record.timestamp
    if record.msg_id:
        item["id"] = record.msg_id
    if record.kind == "ep":
        item["resolved"] = record.resolved
    return item


def item_cost(item: Mapping[str, Any]) -> int:
    """Characters an item spends from the batch budget (spec GC-4, GR-9).

    The content plus every other field: a string by its length, anything else
    by its JSON text as the answer would spell it (non-ASCII kept).
    """
    cost = 0
    for value in item.values():
        cost += len(value) if isinstance(value, str) else len(json.dumps(value, ensure_ascii=False))
    return cost


# -- ranges ------------------------------------------------------------------------


def node_span(app: App, record: Record, first: int, last: int) -> tuple[int, int, int] | str:
    """(start, end, node count) covered by overflow-tree nodes ``first..last``, or a refusal reason.

    The node rows must partition the current stored text (GR-5); the embedding
    model is not checked, offsets depend on the text alone. Short records never
    have nodes and a new long one has none until its build ran (GR-10).
    """
    with app.db.read() as session:
        rows = current_nodes(session, record.kind, record.id, record.text)
    if rows is None:
        return NO_CURRENT_NODES
    if last >= len(rows):
        return NODE_OUT_OF_RANGE
    return rows[first].start, rows[last].end, len(rows)


def block_span(app: App, record: Record, first: int, last: int) -> tuple[int, int, int] | str:
    """Characters covered by blocks ``first..last``; no block index exists here (spec decision 6)."""
    return NO_CURRENT_BLOCKS


def serve(wanted: Wanted, record: Record, app: App) -> dict[str, Any] | str:
    """Steps 3-5 of GR-2 for an owned row: the item, or the reason it is refused."""
    if wanted.invalid:
        return INVALID_RANGE
    text = record.text  # offsets count in the stored text: no '[Episode] ' label (GR-8)
    # A revision pins the text the caller measured against, so it is checked for
    # the whole-row form too: a rewritten record must not come back as if unchanged.
    if wanted.revision is not None and wanted.revision != revision_of(text):
        return STALE_REVISION
    if wanted.kind is None:
        return item_for(wanted.ref, record)
    assert wanted.bounds is not None
    first, last = wanted.bounds
    extra: dict[str, Any] = {}
    if wanted.kind == "span":
        if first >= len(text):
            return SPAN_OUT_OF_RANGE
        span = (first, min(last, len(text)))
    else:
        resolved = (node_span if wanted.kind == "node" else block_span)(app, record, first, last)
        if isinstance(resolved, str):
            return resolved
        span = resolved[:2]
        extra = {wanted.kind: [first, last], "of": resolved[2]}
    item = item_for(wanted.ref, record, text[span[0] : span[1]])
    item["range"] = {"span": list(span), **extra, "content_len": len(text)}
    return item


# -- the tool ----------------------------------------------------------------------


@dataclass(frozen=True)
class ContentsArguments(Request):
    """``get_contents``' arguments in the types its schema declares (each entry a ref or a range object)."""

    agent_id: str
    refs: Sequence[str | Mapping[str, Any]]


@answers_refusals
def get_contents(app: App, *, agent_id: Any = None, refs: Any = None) -> dict[str, Any]:
    """:func:`answer_get_contents` for a library caller, whose arguments no schema has checked."""
    if agent_id is None:
        agent_id = ""  # refused below as missing
    if not isinstance(agent_id, str):
        raise ToolFailure("agent_id must be a string")
    if not isinstance(refs, list):
        refs = []  # refused below: the refusal names the list it wants
    return answer_get_contents.raises(app, ContentsArguments(agent_id=agent_id, refs=refs))


@answers_refusals
def answer_get_contents(app: App, args: ContentsArguments) -> dict[str, Any]:
    """The ``get_contents`` tool: ``{items, missing, count}`` plus the optional keys of GC-5."""
    agent_id, refs = args.agent_id, args.refs
    if agent_id == "":
        raise ToolFailure("agent_id is required")
    if not refs:
        raise ToolFailure("refs must be a non-empty list of 'mem:<id>' / 'ep:<id>' refs or range objects")
    if len(refs) > MAX_REFS:  # the schema's maxItems for a tool call; a library caller meets it here
        raise ToolFailure(f"too many refs ({len(refs)}; max {MAX_REFS}); split them over several calls")
    wanted = [read_entry(raw) for raw in refs]
    rows = load_rows(app, agent_id, {w.key for w in wanted if w.key is not None})
    # A preview cap of 0 is the operator's choice never to hold text back, so the
    # batch budget goes with it (configuration seed, CPERSONA_RECALL_PREVIEW_CHARS).
    budget = BATCH_BUDGET if app.settings.recall_preview_chars > 0 else None

    items: list[dict[str, Any]] = []
    missing: list[Any] = []
    unresolved: list[dict[str, Any]] = []
    deferred: list[Any] = []
    used = 0
    for position, entry in enumerate(wanted):
        record = rows.get(entry.key) if entry.key is not None else None
        if record is None:
            missing.append(entry.ref)
            continue
        served = serve(entry, record, app)
        if isinstance(served, str):
            unresolved.append({"ref": entry.ref, "reason": served})
            continue
        cost = item_cost(served)
        # The first served item always goes out whole: this tool is the only way
        # back to a row's complete text, however long it is (spec GC-4).
        if budget is not None and items and used + cost > budget:
            deferred = [w.raw for w in wanted[position:]]
            break
        items.append(served)
        used += cost

    response: dict[str, Any] = {"items": items, "missing": missing, "count": len(items)}
    if unresolved:
        response["unresolved"] = unresolved
    if deferred:
        response["deferred"] = deferred
        response["budget_chars"] = BATCH_BUDGET
    return response
