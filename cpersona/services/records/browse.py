"""What the local web page (``cpersona ui``) shows beyond the tools: timelines, a record whole, activity.

Searching, profiles, the graph around an entity and health findings are the
tools' own answers (the page calls them through the MCP dispatcher, so every
rule of the tools applies). These three views have no tool: they read exact
rows for a person auditing the store, never change a row (a record viewed is
not "recalled": its counters stay as they are), and return plain dicts.
"""

from __future__ import annotations

from datetime import timedelta, timezone
from typing import Any

from cpersona.services.app import App
from cpersona.services.sanitize import parse_stored_json
from cpersona.storage.health_probes import db_size_bytes
from cpersona.storage.repositories.associations import ENTITY_KIND, AssociationRepository
from cpersona.storage.repositories.browse import BrowseRepository, TimelineFilter
from cpersona.storage.repositories.nodes import NodeRepository

TIMELINE_MAX_ROWS = 500
FACET_VALUES = 200
CHART_DAYS = 30
CHART_AGENTS = 20
NODE_PREVIEW_CHARS = 160


def timeline(
    app: App, wanted: TimelineFilter, limit: int = 100, offset: int = 0, *, with_facets: bool = True
) -> dict[str, Any]:
    """Rows matching ``wanted`` newest first (at most TIMELINE_MAX_ROWS, after ``offset``) and, for a page's
    filter choices, the values each filter offers. ``truncated`` says more rows follow this page."""
    limit = max(1, min(int(limit), TIMELINE_MAX_ROWS))
    offset = max(0, int(offset))
    with app.db.read() as session:
        repo = BrowseRepository(session)
        rows = repo.timeline(wanted, limit + 1, offset)
        facets = repo.facets(FACET_VALUES) if with_facets else {}
    return {
        "rows": [dict(row._mapping) for row in rows[:limit]],
        "truncated": len(rows) > limit,
        "limit": limit,
        "offset": offset,
        "facets": facets,
    }


def facets(app: App) -> dict[str, list[str]]:
    """The agents, projects and channels the tables hold, for a page's filter choices."""
    with app.db.read() as session:
        return BrowseRepository(session).facets(FACET_VALUES)


def entity_names(app: App, agent_id: str | None) -> list[str]:
    with app.db.read() as session:
        return BrowseRepository(session).entity_names(agent_id, FACET_VALUES)


def record(app: App, kind: str, record_id: int) -> dict[str, Any] | None:
    """One memory (``mem``) or episode (``ep``) with its ranges, entities, relations and recall history."""
    if kind not in ("mem", "ep"):
        return None
    ref = f"{kind}:{record_id}"
    with app.db.read() as session:
        browse = BrowseRepository(session)
        row = browse.memory(record_id) if kind == "mem" else browse.episode(record_id)
        if row is None:
            return None
        fields = dict(row._mapping)
        text = fields["content"] if kind == "mem" else fields["summary"]
        nodes = NodeRepository(session).of_record(kind, record_id)
        graph = AssociationRepository(session)
        mentioned = graph.entities_mentioned_by(ref)
        relations = {r.id: r for r in graph.record_relations({kind: [record_id]})}
        anchored = browse.relations_anchored_at(ref)
        entity_ids = set(mentioned) | {
            end_id
            for r in [*relations.values(), *anchored]
            for end_kind, end_id in ((r.subject_kind, r.subject_id), (r.object_kind, r.object_id))
            if end_kind == ENTITY_KIND
        }
        names = graph.names_and_aliases(entity_ids)
    for key in ("source", "metadata"):
        if key in fields:
            fields[key] = parse_stored_json(fields[key])

    def end(end_kind: str, end_id: int) -> dict[str, Any]:
        if end_kind == ENTITY_KIND:
            return {"kind": "entity", "id": end_id, "name": names.get(end_id, (f"#{end_id}", []))[0]}
        return {"kind": end_kind, "id": end_id, "ref": f"{end_kind}:{end_id}"}

    every = {r.id: r for r in anchored}
    every.update(relations)
    return {
        "kind": kind,
        "ref": ref,
        "fields": fields,
        "ranges": [
            {
                "index": n.index,
                "start": n.start,
                "end": n.end,
                "tokens": n.token_count,
                "window": n.window,
                "embedded": n.embedding is not None,
                "embedding_model": n.embedding_model,
                "text": text[n.start : n.end][:NODE_PREVIEW_CHARS],
            }
            for n in nodes
        ],
        "entities": [
            {"id": i, "name": names.get(i, (f"#{i}", []))[0], "aliases": names.get(i, ("", []))[1]} for i in mentioned
        ],
        "relations": [
            {
                "id": r.id,
                "subject": end(r.subject_kind, r.subject_id),
                "predicate": r.predicate,
                "object": end(r.object_kind, r.object_id),
            }
            for _, r in sorted(every.items())
        ],
        "recall": (
            {"count": fields["recall_count"], "last_recalled_at": fields["last_recalled_at"]} if kind == "mem" else None
        ),
    }


def activity(app: App) -> dict[str, Any]:
    """What the charts draw: rows per day (the last CHART_DAYS days) and per agent, recall counts, the size."""
    today = app.clock().astimezone(timezone.utc).date()
    days = [(today - timedelta(days=back)).isoformat() for back in range(CHART_DAYS - 1, -1, -1)]

    def per_day(rows: list[Any]) -> list[tuple[str, int]]:
        counts = {row.day: row.n for row in rows}
        return [(day, counts.get(day, 0)) for day in days]  # a quiet day is a zero, not a gap

    with app.db.read() as session:
        repo = BrowseRepository(session)
        return {
            "memories_per_day": per_day(repo.rows_per_day("mem", days[0])),
            "episodes_per_day": per_day(repo.rows_per_day("ep", days[0])),
            "memories_per_agent": [tuple(r) for r in repo.rows_per_agent("mem", CHART_AGENTS)],
            "episodes_per_agent": [tuple(r) for r in repo.rows_per_agent("ep", CHART_AGENTS)],
            "recalls_per_agent": [tuple(r) for r in repo.recall_counts_per_agent(CHART_AGENTS)],
            "most_recalled": [dict(r._mapping) for r in repo.most_recalled(CHART_AGENTS)],
            "db_size_bytes": db_size_bytes(session.connection()),
        }
