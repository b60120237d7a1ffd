"""The reads a person's browser makes (``cpersona ui``): timelines, one record whole, activity counts.

Unlike recall these are exact filters, not a search: an agent is that agent,
a project or channel that value only (no union with the global bucket), a
date range compares the leading characters of ``created_at`` with the bound
(both stamp shapes the tables hold, ``YYYY-MM-DD HH:MM:SS`` and ISO-8601, start
with the day then the time of day, once the ISO ``T`` reads as a space), so a
bound may be a day or a UTC second. Every listing is bounded by the caller's
``limit``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import ColumnElement, Connection, Row, desc, func, literal, select, union_all
from sqlalchemy.orm import Session

from cpersona.storage.models import Episode, Memory
from cpersona.storage.models_associations import Entity, Relation

KINDS = ("mem", "ep")


@dataclass(frozen=True, slots=True)
class TimelineFilter:
    """Exact values; ``None`` (or '' for the dates) leaves that axis open."""

    agent_id: str | None = None
    project_id: str | None = None
    channel: str | None = None
    since: str = ""  # YYYY-MM-DD or YYYY-MM-DD HH:MM:SS (UTC), inclusive
    until: str = ""  # the same shapes, inclusive
    kinds: tuple[str, ...] = KINDS


def _day(column: Any) -> Any:
    return func.substr(column, 1, 10)


def _stamp_prefix(column: Any, bound: str) -> Any:
    """As much of the stored stamp as ``bound`` spells out, for a string comparison with it."""
    return func.substr(func.replace(column, "T", " "), 1, len(bound))


def _conditions(model: Any, wanted: TimelineFilter) -> list[ColumnElement[bool]]:
    out: list[ColumnElement[bool]] = []
    if wanted.agent_id is not None:
        out.append(model.agent_id == wanted.agent_id)
    if wanted.project_id is not None:
        out.append(model.project_id == wanted.project_id)
    if wanted.channel is not None:
        out.append(model.channel == wanted.channel)
    if wanted.since:
        out.append(_stamp_prefix(model.created_at, wanted.since) >= wanted.since)
    if wanted.until:
        out.append(_stamp_prefix(model.created_at, wanted.until) <= wanted.until)
    return out


class BrowseRepository:
    def __init__(self, session: Session | Connection) -> None:
        self.session = session

    def timeline(self, wanted: TimelineFilter, limit: int, offset: int = 0) -> list[Row[Any]]:
        """(kind, id, agent_id, project_id, channel, text, created_at, locked), newest first, ``limit`` rows
        after skipping ``offset``."""
        arms = []
        if "mem" in wanted.kinds:
            arms.append(
                select(
                    literal("mem").label("kind"),
                    Memory.id,
                    Memory.agent_id,
                    Memory.project_id,
                    Memory.channel,
                    Memory.content.label("text"),
                    Memory.created_at,
                    Memory.locked,
                ).where(*_conditions(Memory, wanted))
            )
        if "ep" in wanted.kinds:
            arms.append(
                select(
                    literal("ep").label("kind"),
                    Episode.id,
                    Episode.agent_id,
                    Episode.project_id,
                    Episode.channel,
                    Episode.summary.label("text"),
                    Episode.created_at,
                    literal(0).label("locked"),
                ).where(*_conditions(Episode, wanted))
            )
        if not arms:
            return []
        both = union_all(*arms).subquery() if len(arms) > 1 else arms[0].subquery()
        return list(
            self.session.execute(
                select(both).order_by(desc(both.c.created_at), desc(both.c.id), both.c.kind).limit(limit).offset(offset)
            ).all()
        )

    def facets(self, limit: int) -> dict[str, list[str]]:
        """The distinct agents, projects and channels of both tables (``limit`` each, sorted)."""
        out: dict[str, list[str]] = {}
        for axis in ("agent_id", "project_id", "channel"):
            both = union_all(select(getattr(Memory, axis).label("v")), select(getattr(Episode, axis).label("v")))
            sub = both.subquery()
            out[axis] = list(self.session.scalars(select(sub.c.v).distinct().order_by(sub.c.v).limit(limit)))
        return out

    def entity_names(self, agent_id: str | None, limit: int) -> list[str]:
        """Distinct entity names (of one agent, or all), sorted, ``limit`` of them."""
        where = [Entity.agent_id == agent_id] if agent_id is not None else []
        return list(
            self.session.scalars(select(Entity.name).where(*where).distinct().order_by(Entity.name).limit(limit))
        )

    def memory(self, memory_id: int) -> Row[Any] | None:
        """Every column of one memory but its vector (whether it has one instead)."""
        return self.session.execute(
            select(
                Memory.id,
                Memory.agent_id,
                Memory.project_id,
                Memory.channel,
                Memory.msg_id,
                Memory.content,
                Memory.source,
                Memory.timestamp,
                Memory.metadata_.label("metadata"),
                Memory.recall_count,
                Memory.last_recalled_at,
                Memory.locked,
                Memory.created_at,
                Memory.embedding.is_not(None).label("embedded"),
            ).where(Memory.id == memory_id)
        ).first()

    def episode(self, episode_id: int) -> Row[Any] | None:
        return self.session.execute(
            select(
                Episode.id,
                Episode.agent_id,
                Episode.project_id,
                Episode.channel,
                Episode.summary,
                Episode.keywords,
                Episode.start_time,
                Episode.end_time,
                Episode.resolved,
                Episode.created_at,
                Episode.embedding.is_not(None).label("embedded"),
            ).where(Episode.id == episode_id)
        ).first()

    def relations_anchored_at(self, ref: str) -> list[Row[Any]]:
        """(id, subject_kind, subject_id, predicate, object_kind, object_id) of relations declared with ``ref``."""
        return list(
            self.session.execute(
                select(
                    Relation.id,
                    Relation.subject_kind,
                    Relation.subject_id,
                    Relation.predicate,
                    Relation.object_kind,
                    Relation.object_id,
                )
                .where(Relation.anchor_ref == ref)
                .order_by(Relation.id)
            ).all()
        )

    # -- activity: what the charts draw

    def rows_per_day(self, kind: str, since: str) -> list[Row[Any]]:
        """(day, count) of each day from ``since`` (YYYY-MM-DD) on that has rows, oldest first."""
        model = Memory if kind == "mem" else Episode
        day = _day(model.created_at).label("day")
        return list(
            self.session.execute(
                select(day, func.count().label("n")).where(day >= since).group_by(day).order_by(day)
            ).all()
        )

    def rows_per_agent(self, kind: str, limit: int) -> list[Row[Any]]:
        """(agent_id, count), most rows first."""
        model = Memory if kind == "mem" else Episode
        n = func.count().label("n")
        return list(
            self.session.execute(
                select(model.agent_id, n).group_by(model.agent_id).order_by(desc(n), model.agent_id).limit(limit)
            ).all()
        )

    def recall_counts_per_agent(self, limit: int) -> list[Row[Any]]:
        """(agent_id, total recall_count), most recalled first."""
        total = func.coalesce(func.sum(Memory.recall_count), 0).label("n")
        return list(
            self.session.execute(
                select(Memory.agent_id, total)
                .group_by(Memory.agent_id)
                .order_by(desc(total), Memory.agent_id)
                .limit(limit)
            ).all()
        )

    def most_recalled(self, limit: int) -> list[Row[Any]]:
        """(id, agent_id, content, recall_count, last_recalled_at) of the most recalled memories."""
        return list(
            self.session.execute(
                select(Memory.id, Memory.agent_id, Memory.content, Memory.recall_count, Memory.last_recalled_at)
                .where(Memory.recall_count > 0)
                .order_by(desc(Memory.recall_count), Memory.id)
                .limit(limit)
            ).all()
        )
