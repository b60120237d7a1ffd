"""recall_with_context: one chronological list of recalled rows and the caller's own turns (spec §3.3).

The caller already holds its recent conversation. It sends those turns along;
every turn's text keeps recall from answering with a row the caller already has
(RWC-1, through recall's exclusion list), and the user/assistant turns come
back merged with the recalled rows, oldest first (RWC-4). Other roles (system,
tool, ...) only filter; the answer names them in ``context_filter_only``.

Each entry declares five string fields. A field that holds anything else is
read as absent; ``CPERSONA_EXTERNAL_CONTEXT_MODE`` decides whether that is
reported (``warn``), refused before any search (``reject``) or passed over in
silence (``off``) (RWC-6).

The recall itself is :func:`cpersona.services.recall.service.recalled`, recall's own
(one read snapshot; ``@auto`` is resolved by the facade for both tools); the preview
tier and the full-content budget are applied to the merged list, so the budget
is spent from its chronological end (RWC-9).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cpersona.services.app import App
from cpersona.services.recall.preview import FULL_CONTENT_BUDGET, apply_full_content_budget, apply_preview_tier
from cpersona.services.recall.service import (
    RecallArguments,
    check_arguments,
    parse_instant,
    recalled,
    resolve_request,
)
from cpersona.services.requests import Request
from cpersona.services.responses import ToolFailure, answers_refusals
from cpersona.services.sanitize import find_lone_surrogate

DECLARED_FIELDS = ("role", "content", "name", "user_id", "timestamp")
MERGED_ROLES = ("user", "assistant")
UNSET_ROLE = "(unset)"  # how context_filter_only names an entry without a role
NOT_AN_OBJECT = "<entry>"  # the field list of an entry that is not an object at all
DEFAULT_USER_NAME = "User"
# Recall keys the merged answer does not carry: depth describes recall's own
# list, which no longer exists as such once conversation turns are merged in.
_NOT_FORWARDED = frozenset({"depth"})

FILTER_ONLY_NOTE = (
    "entries with these roles were used to keep matching rows out of the recall, but are not part of messages"
)
ISSUES_NOTE_KEPT = (
    "these fields were not strings, so they were treated as absent; each entry was still merged without them"
)
ISSUES_NOTE_DROPPED = (
    "these entries had no usable text once their non-string fields were treated as absent, so they were dropped: "
    "they are not in messages and did not filter the recall"
)
ISSUES_NOTE_MIXED = (
    "these fields were not strings, so they were treated as absent; entries left without usable text were dropped "
    "(not in messages, not used to filter the recall), the others were merged without the named fields"
)


@dataclass(frozen=True, slots=True)
class ContextEntry:
    """One ``external_context`` entry as read: non-string fields already absent."""

    index: int
    role: str | None
    content: str  # trimmed; '' when absent, not a string, or blank
    name: str | None
    user_id: str | None
    timestamp: str | None
    bad_fields: tuple[str, ...]  # declared fields that held something other than a string

    @property
    def usable(self) -> bool:
        return bool(self.content)

    @property
    def merged(self) -> bool:
        return self.usable and self.role in MERGED_ROLES


def read_entry(index: int, raw: Any) -> ContextEntry:
    if not isinstance(raw, Mapping):
        return ContextEntry(index, None, "", None, None, None, (NOT_AN_OBJECT,))
    fields: dict[str, str | None] = {}
    bad: list[str] = []
    for name in DECLARED_FIELDS:
        value = raw.get(name)
        if name in raw and not isinstance(value, str):
            bad.append(name)
            value = None
        fields[name] = value
    return ContextEntry(
        index=index,
        role=fields["role"],
        content=(fields["content"] or "").strip(),
        name=fields["name"],
        user_id=fields["user_id"],
        timestamp=fields["timestamp"],
        bad_fields=tuple(sorted(bad)),
    )


def read_entries(external_context: Any) -> list[ContextEntry]:
    if external_context is None:
        return []
    if not isinstance(external_context, list):
        raise ToolFailure("external_context must be a list of {role, content, ...} entries", messages=[])
    return [read_entry(i, raw) for i, raw in enumerate(external_context)]


# -- what the answer says about the entries ---------------------------------------


def filter_only_roles(entries: Sequence[ContextEntry]) -> dict[str, Any] | None:
    """``context_filter_only``: roles whose entries filtered the recall but were not merged (RWC-2)."""
    roles = sorted({e.role if e.role is not None else UNSET_ROLE for e in entries if e.usable and not e.merged})
    return {"roles": roles, "note": FILTER_ONLY_NOTE} if roles else None


def field_issues(entries: Sequence[ContextEntry]) -> dict[str, Any] | None:
    """``context_field_issues`` in warn mode (RWC-6), its note saying which case applied (RWC-7)."""
    flagged = [e for e in entries if e.bad_fields]
    if not flagged:
        return None
    kept = sum(1 for e in flagged if e.usable)
    note = ISSUES_NOTE_KEPT if kept == len(flagged) else ISSUES_NOTE_DROPPED if kept == 0 else ISSUES_NOTE_MIXED
    return {"entries": [{"index": e.index, "fields": list(e.bad_fields)} for e in flagged], "note": note}


def rejection(entries: Sequence[ContextEntry]) -> str | None:
    """The refusal of reject mode, naming every entry and field, or None when all are strings."""
    flagged = [e for e in entries if e.bad_fields]
    if not flagged:
        return None
    listed = "; ".join(f"[{e.index}] {', '.join(e.bad_fields)}" for e in flagged)
    return (
        f"external_context has fields that are not strings: {listed}. Each of role, content, name, user_id and "
        "timestamp must be a string when present; nothing was searched. CPERSONA_EXTERNAL_CONTEXT_MODE=warn "
        "accepts such entries, reading those fields as absent."
    )


# -- merging -----------------------------------------------------------------------


def conversation_message(entry: ContextEntry) -> dict[str, Any]:
    """A merged turn (RWC-3): no ref, so the preview tier never cuts it."""
    if entry.role == "assistant":
        source: dict[str, Any] = {"type": "Agent", "id": "self"}
    else:
        name = entry.name if entry.name is not None else DEFAULT_USER_NAME
        source = {"type": "User", "id": f"discord:{entry.user_id if entry.user_id is not None else name}", "name": name}
    return {"content": entry.content, "source": source, "timestamp": entry.timestamp or "",
            "context_type": "conversation"}  # fmt: skip


def chronological(messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Oldest first by the instant each timestamp names; undated messages lead (RWC-4).

    The sort is stable, so equal instants (and the undated group) keep the
    order they were merged in: recalled rows first, then the caller's turns.
    """

    def key(numbered: tuple[int, dict[str, Any]]) -> tuple[Any, ...]:
        position, message = numbered
        stamp = message.get("timestamp")
        moment = parse_instant(stamp) if isinstance(stamp, str) and stamp else None
        return (0, position) if moment is None else (1, moment, position)

    return [message for _, message in sorted(enumerate(messages), key=key)]


# -- the tool ----------------------------------------------------------------------


@dataclass(frozen=True)
class ContextArguments(Request):
    """``recall_with_context``'s arguments in the types its schema declares; defaults are the schema's.

    The recall ones mean what they mean to recall; the turns are its exclusion list (RWC-1).
    """

    agent_id: str
    query: str
    external_context: Any = None  # read leniently, entry by entry (RWC-6)
    limit: int = 10
    channel: str = ""
    deep: bool = False
    project_id: str | None = None
    source_id: str = ""
    full_content: bool = False
    session_key: str = ""


def answer_with_context(app: App, args: ContextArguments) -> dict[str, Any]:
    """The ``recall_with_context`` tool: ``{messages}`` oldest → newest, plus optional keys.

    A refused recall is the answer (spec RWC-10): its ToolFailure is answered by
    the facade in the tool's shape.
    """
    mode = app.settings.external_context_mode
    entries = read_entries(args.external_context)
    if mode == "reject" and (refusal := rejection(entries)) is not None:
        raise ToolFailure(refusal, messages=[])
    req = resolve_request(app, RecallArguments(
        agent_id=args.agent_id, query=args.query, limit=args.limit, deep=args.deep, channel=args.channel,
        session_key=args.session_key, project_id=args.project_id, source_id=args.source_id,
        full_content=args.full_content, exclude_contents=tuple(e.content for e in entries if e.usable),
    ))  # fmt: skip
    outcome = recalled(app, req)

    merged = [*outcome.messages, *(conversation_message(e) for e in entries if e.merged)]
    messages = chronological(merged)
    settings = app.settings
    cut = {"preview_chars": settings.recall_preview_chars, "excerpt_chars": settings.recall_excerpt_chars,
           "query": req.query}  # fmt: skip
    response: dict[str, Any] = {"messages": messages}
    if (roles := filter_only_roles(entries)) is not None:
        response["context_filter_only"] = roles
    if mode == "warn" and (issues := field_issues(entries)) is not None:
        response["context_field_issues"] = issues
    response.update((k, v) for k, v in outcome.extras.items() if k not in _NOT_FORWARDED)
    if not req.full_content:
        apply_preview_tier(messages, **cut)
    elif apply_full_content_budget(messages, **cut):
        response["full_content_budget_chars"] = FULL_CONTENT_BUDGET
    return response


@answers_refusals
def recall_with_context(
    app: App,
    *,
    agent_id: Any = None,
    query: Any = None,
    external_context: Any = None,
    limit: Any = 10,
    channel: Any = "",
    deep: Any = False,
    project_id: Any = None,
    source_id: Any = "",
    full_content: Any = False,
    session_key: Any = "",
) -> dict[str, Any]:
    """:func:`answer_with_context` for a library caller, whose arguments no schema has checked."""
    if find_lone_surrogate(external_context):
        raise ToolFailure("external_context contains an unpaired UTF-16 surrogate, which is not valid text",
                          messages=[])  # fmt: skip
    checked = check_arguments(dict(
        agent_id=agent_id, query=query, limit=limit, deep=deep, channel=channel, session_key=session_key,
        project_id=project_id, source_id=source_id, full_content=full_content,
    ))  # fmt: skip
    return answer_with_context(app, ContextArguments(
        agent_id=checked.agent_id, query=checked.query, external_context=external_context, limit=checked.limit,
        channel=checked.channel, deep=checked.deep, project_id=checked.project_id, source_id=checked.source_id,
        full_content=checked.full_content, session_key=checked.session_key,
    ))  # fmt: skip
