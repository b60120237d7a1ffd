"""Episodes: ``archive_episode`` (spec §3.5) and ``list_episodes`` (spec §3.10).

An episode is a caller-computed summary of a finished conversation; the server
summarises nothing (AE-1, SH-3). Every successful archive adds a row: there is
no dedup (DD-6). The row is dated by the conversation's history: its earliest
and latest timestamps, stored as the caller sent them (AE-3).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cpersona.services.records import remote_vectors
from cpersona.services.app import App
from cpersona.services.records.listing import (
    ListArguments,
    ListBounds,
    bounded_response,
    checked_listing,
    fetch_capped,
    listing_scope,
)
from cpersona.services.records.memories import embed_text
from cpersona.services.records.nodes import QUEUED, queue_build, runs_past_window
from cpersona.services.requests import Request
from cpersona.services.responses import ToolFailure, answers_refusals
from cpersona.services.sanitize import bucket_field, check_key_field, find_lone_surrogate, nul_refusal, sanitize
from cpersona.services.timestamps import FuturePolicy, parse_iso, sql_stamp
from cpersona.storage.repositories.episodes import EpisodeRepository

EPISODE_ROW_CAP = 200
EPISODE_CHAR_BUDGET = 800_000
EPISODE_BOUNDS = ListBounds(EPISODE_ROW_CAP, EPISODE_CHAR_BUDGET, ("summary", "keywords"), "ep")

NO_SUMMARY = (
    "summary is required: server-side episode summarisation was removed; "
    "pre-compute summary (and keywords) before calling archive_episode"
)
EMPTY_SUMMARY = "summary is required to archive an episode"


@dataclass(frozen=True)
class EpisodeArchiveArguments(Request):
    """``archive_episode``'s arguments in the types its schema declares; defaults are the schema's."""

    agent_id: str
    summary: str
    history: Sequence[Mapping[str, Any]] = ()
    keywords: str = ""
    resolved: bool = False
    project_id: str = ""
    channel: str = ""
    session_key: str = ""


@answers_refusals
def archive_episode(
    app: App,
    *,
    agent_id: Any = None,
    summary: Any = None,
    history: Any = None,
    keywords: Any = "",
    resolved: Any = False,
    project_id: Any = "",
    channel: Any = "",
    session_key: Any = "",
) -> dict[str, Any]:
    """:func:`answer_archive_episode` for a library caller, whose arguments no schema has checked."""
    if not isinstance(agent_id, str):
        raise _refuse("agent_id is required" if agent_id is None else "agent_id must be a string")
    if summary is None:
        summary = ""  # refused below as missing (AE-1), as a tool call sending '' is
    if not isinstance(summary, str):
        raise _refuse(f"summary must be a string, not {type(summary).__name__}")
    if history is None:
        history = []
    if not isinstance(history, list):
        raise _refuse("history must be an array of message objects")
    if isinstance(resolved, bool):
        resolved_flag = resolved
    elif resolved in (0, 1) and not isinstance(resolved, float):
        resolved_flag = bool(resolved)
    else:
        raise _refuse("resolved must be true or false")
    # AE-2: keywords are optional colour; a wrong type is dropped, not fatal.
    return answer_archive_episode.raises(
        app,
        EpisodeArchiveArguments(
            agent_id=agent_id,
            summary=summary,
            history=history,
            keywords=keywords if isinstance(keywords, str) else "",
            resolved=resolved_flag,
            project_id=bucket_field(project_id),
            channel=bucket_field(channel),
        ),
    )


def _refuse(message: str) -> ToolFailure:
    return ToolFailure(message, episode_id=None)


@answers_refusals
def answer_archive_episode(app: App, args: EpisodeArchiveArguments) -> dict[str, Any]:
    """Store a caller-computed summary as a new episode row."""
    agent_id, summary, keywords, history = args.agent_id, args.summary, args.keywords, args.history
    # The operating context's Hard layer ('@auto', the project registry; OC-7..OC-11) was
    # applied by the facade.
    project_id, channel = args.project_id, args.channel
    if summary == "":
        raise _refuse(NO_SUMMARY)  # AE-1
    for name, value in (("channel", channel), ("project_id", project_id)):
        if problem := check_key_field(name, value):  # AE-7
            raise _refuse(problem)
    if find_lone_surrogate(agent_id, summary, keywords, channel, project_id, history):
        raise _refuse("the arguments contain a lone UTF-16 surrogate, which is not valid text; nothing was stored")
    if problem := nul_refusal(agent_id=agent_id, summary=summary, keywords=keywords, history=history):
        raise _refuse(problem)  # decision 11

    cap = app.settings.max_content_length
    clean_summary = sanitize(summary, cap)
    if clean_summary.empty:
        raise _refuse(EMPTY_SUMMARY)  # SAN-1, AE-2
    clean_keywords = sanitize(keywords, cap)

    start_time, end_time = history_span(history)
    policy = FuturePolicy.from_settings(app.settings)
    ahead = policy.judge([s for s in (end_time, start_time) if s], app.clock())  # AE-4: end, then start
    if ahead is not None and policy.rejects:
        raise _refuse(ahead.refusal("history timestamp"))

    embedding = embed_text(app, clean_summary.text)  # AE-5: the summary only, before the write lock
    long_text = runs_past_window(app, clean_summary.text)  # OV-4: a network ask too, so before the lock

    with app.db.write() as session:
        episode_id = EpisodeRepository(session).insert(
            agent_id=agent_id,
            project_id=project_id,
            summary=clean_summary.text,
            keywords=clean_keywords.text,
            embedding=embedding,
            start_time=start_time,
            end_time=end_time,
            resolved=1 if args.resolved else 0,
            channel=channel,
            created_at=sql_stamp(app.clock()),
        )
        nodes_queued = long_text and queue_build(
            app, session, "ep", episode_id, agent_id=agent_id, project_id=project_id
        )

    remote_vectors.push(app, agent_id, [(f"ep:{episode_id}", clean_summary.text)])  # after commit (EMB-6)
    response: dict[str, Any] = {"ok": True, "episode_id": episode_id}
    if clean_summary.truncated or clean_keywords.truncated:
        response["truncated"] = True
    if nodes_queued:
        response["nodes"] = dict(QUEUED)  # OV-3
    if ahead is not None:
        response["timestamp_ahead_of_clock"] = ahead.report()
    return response


def history_span(history: list[Any]) -> tuple[str | None, str | None]:
    """Earliest and latest history stamps, as sent (spec AE-3).

    Chosen by parsed instant; when none parses, by plain string order; with no
    usable stamp at all, both are None. Non-string and empty stamps are ignored.
    """
    stamps = [
        item["timestamp"]
        for item in history
        if isinstance(item, dict) and isinstance(item.get("timestamp"), str) and item["timestamp"]
    ]
    if not stamps:
        return None, None
    dated = [(moment, stamp) for stamp in stamps if (moment := parse_iso(stamp)) is not None]
    if dated:
        # min/max keep the first of equal instants, so ties resolve to the earliest-sent stamp.
        return min(dated, key=lambda pair: pair[0])[1], max(dated, key=lambda pair: pair[0])[1]
    return min(stamps), max(stamps)


# -- list_episodes ------------------------------------------------------------------------------


@dataclass(frozen=True)
class EpisodeListArguments(ListArguments):
    """``list_episodes``' arguments: a listing's, with its own default limit."""

    limit: int = 50


@answers_refusals
def list_episodes(app: App, *, agent_id: Any = None, limit: Any = 50, project_id: Any = None) -> dict[str, Any]:
    """:func:`answer_list_episodes` for a library caller, whose arguments no schema has checked."""
    return answer_list_episodes(app, checked_listing(EpisodeListArguments, EPISODE_BOUNDS, agent_id, limit, project_id))


def answer_list_episodes(app: App, args: EpisodeListArguments) -> dict[str, Any]:
    """The newest episodes, every agent's when ``agent_id`` is omitted or '' (spec §3.10)."""
    rows, capped = fetch_capped(app, EpisodeRepository, listing_scope(args), args.limit, EPISODE_BOUNDS)
    # No channel and no resolved flag in a listed episode (spec §3.10).
    episodes = [
        {
            "id": row.id,
            "agent_id": row.agent_id,
            "project_id": row.project_id,
            "summary": row.summary,
            "keywords": row.keywords,
            "start_time": row.start_time,
            "end_time": row.end_time,
            "created_at": row.created_at,
        }
        for row in rows
    ]
    return bounded_response("episodes", episodes, capped, EPISODE_BOUNDS, app.settings.recall_preview_chars)
