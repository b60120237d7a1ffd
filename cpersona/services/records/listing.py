"""Dashboard listings: ``list_memories`` and the budget both listings share.

Rows come newest first (spec LM-1). A listing is bounded two ways (§5.15.3):
a row cap (500 memories, 200 episodes; ``budget_rows`` says when it bit) and a
character budget over the text fields. No row is ever dropped for the budget:
once it is spent, each later field longer than the preview cap is cut to a
prefix and the row gains a ``ref`` that ``get_contents`` expands.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from cpersona.services.app import App
from cpersona.services.requests import Request
from cpersona.services.responses import ToolFailure, answers_refusals
from cpersona.services.sanitize import parse_stored_json
from cpersona.storage.repositories.base import Repository
from cpersona.storage.repositories.memories import MemoryRepository
from cpersona.storage.scope import Scope

MEMORY_ROW_CAP = 500
MEMORY_CHAR_BUDGET = 1_000_000


@dataclass(frozen=True, slots=True)
class ListBounds:
    """One listing's limits: how many rows, how many characters over which fields."""

    row_cap: int
    char_budget: int
    fields: tuple[str, ...]
    ref_prefix: str  # "mem" | "ep"

    @property
    def key(self) -> str:
        """The answer's list of rows."""
        return "memories" if self.ref_prefix == "mem" else "episodes"


MEMORY_BOUNDS = ListBounds(MEMORY_ROW_CAP, MEMORY_CHAR_BUDGET, ("content",), "mem")


@dataclass(frozen=True)
class ListArguments(Request):
    """``list_memories``' arguments in the types its schema declares; defaults are the schema's."""

    agent_id: str | None = None  # omitted or '': every agent
    limit: int = 100
    project_id: str | None = None


def answer_list_memories(app: App, args: ListArguments) -> dict[str, Any]:
    """The newest memories, every agent's when ``agent_id`` is omitted or ''."""
    # Newest first; same-second rows newest id first (spec §6 item 6: the
    # reference lists them oldest first, which is not "newest first").
    rows, capped = fetch_capped(app, MemoryRepository, listing_scope(args), args.limit, MEMORY_BOUNDS)
    memories = [_memory_row(row) for row in rows]
    return bounded_response("memories", memories, capped, MEMORY_BOUNDS, app.settings.recall_preview_chars)


@answers_refusals
def list_memories(app: App, *, agent_id: Any = None, limit: Any = 100, project_id: Any = None) -> dict[str, Any]:
    """:func:`answer_list_memories` for a library caller, whose arguments no schema has checked."""
    return answer_list_memories(app, checked_listing(ListArguments, MEMORY_BOUNDS, agent_id, limit, project_id))


def _memory_row(row: Any) -> dict[str, Any]:
    # The caller's msg_id is not part of a listed row (LM-5).
    return {
        "id": row.id,
        "agent_id": row.agent_id,
        "project_id": row.project_id,
        "content": row.content,
        "source": parse_stored_json(row.source),
        "timestamp": row.timestamp,
        "created_at": row.created_at,
        "locked": bool(row.locked),
        "channel": row.channel,
    }


# -- shared by list_memories and list_episodes ------------------------------------------------


def refused(bounds: ListBounds, message: str) -> ToolFailure:
    """A listing's refusal: the error, with the empty listing its callers read (``memories: [], count: 0``)."""
    return ToolFailure(message, **{bounds.key: [], "count": 0})


def checked_listing(
    kind: type[ListArguments], bounds: ListBounds, agent_id: Any, limit: Any, project_id: Any
) -> ListArguments:
    """A library caller's listing arguments checked as the tool's schema checks a tool call's."""
    if agent_id is not None and not isinstance(agent_id, str):
        raise refused(bounds, "agent_id must be a string")
    if project_id is not None and not isinstance(project_id, str):
        raise refused(bounds, "project_id must be a string")
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise refused(bounds, f"limit must be an integer, not {type(limit).__name__}")
    return kind(agent_id=agent_id, limit=limit, project_id=project_id)


def listing_scope(args: ListArguments) -> Scope:
    """The read scope of a listing: '' or omitted agent lists every agent (spec §3.9).

    The facade has already applied the operating context's Hard layer (the
    declaration's project axis) to ``project_id``.
    """
    return Scope(agent_id=args.agent_id or None, project_id=args.project_id)


def fetch_capped(
    app: App, repository: type[Repository], scope: Scope, limit: int, bounds: ListBounds
) -> tuple[list[Any], bool]:
    """Up to ``min(limit, row_cap)`` rows, and whether the cap hid more the caller asked for.

    One row past the cap is read only to learn whether it exists, so that
    ``budget_rows`` is reported exactly when a larger limit would have found more.
    """
    wanted = max(limit, 0)  # a negative limit lists nothing (LM-2)
    take = min(wanted, bounds.row_cap)
    probe = take + 1 if wanted > bounds.row_cap else take
    if probe == 0:
        return [], False
    with app.db.read() as session:
        rows = repository(session, scope).newest(probe)
    capped = len(rows) > take
    return rows[:take], capped


def apply_char_budget(rows: Sequence[dict[str, Any]], bounds: ListBounds, preview_chars: int) -> bool:
    """Degrade rows past the character budget in place; True if any row was cut (§5.15.3).

    Walking from the newest row, a row is admitted whole while the running
    total stays within the budget (the first row always is). From the first row
    that does not fit, every row's fields longer than the preview cap become
    their first ``preview_chars`` characters. A preview cap of 0 disables it all.
    """
    if preview_chars <= 0:
        return False
    used = 0
    spent = False
    degraded = False
    for index, row in enumerate(rows):
        cost = sum(len(row[name] or "") for name in bounds.fields)
        if not spent and (index == 0 or used + cost <= bounds.char_budget):
            used += cost
            continue
        spent = True
        cut = False
        for name in bounds.fields:
            text = row[name] or ""
            if len(text) > preview_chars:
                row[name] = text[:preview_chars]
                row[f"{name}_len"] = len(text)
                row[f"{name}_truncated"] = True
                cut = True
        if cut:
            row["ref"] = f"{bounds.ref_prefix}:{row['id']}"
            degraded = True
    return degraded


def bounded_response(
    key: str, rows: list[dict[str, Any]], capped: bool, bounds: ListBounds, preview_chars: int
) -> dict[str, Any]:
    """``{<key>: rows, count}`` plus ``budget_chars`` / ``budget_rows`` when they bit."""
    degraded = apply_char_budget(rows, bounds, preview_chars)
    response: dict[str, Any] = {key: rows, "count": len(rows)}
    if degraded:
        response["budget_chars"] = bounds.char_budget
    if capped:
        response["budget_rows"] = bounds.row_cap
    return response
