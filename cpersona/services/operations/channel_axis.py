"""``migrate_channel_axis``: re-file bridge-channel memories onto their real channel (spec admin-and-safety §12).

Older bridges stored Discord memories under the channel *type* ``discord``
instead of the channel id, so a channel-scoped recall could not match them.
The id survives in ``metadata.session_id`` (``<channel_id>:<user_id>:<chunk>``
or ``<channel_id>:shared``); this tool moves each such row to that channel.

    survey  (every ``discord`` row of the scope, read in id pages)
      recoverable    metadata is JSON, session_id starts with a digit and holds ':'
      unrecoverable  every other ``discord`` row (invalid JSON also listed apart)
    dry run → the survey only (the default)
    real run, one transaction →
      recoverable rows  → channel = the session id's prefix   (UPDATE OR IGNORE:
                          a row whose new bucket already holds the same text stays)
      globalize_unrecoverable → unrecoverable rows → channel ''
      declarations about moved rows follow them (CA-4)

Only the channel column changes; locked rows move too (MC-4). Re-running finds
nothing left to move.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection

from cpersona.services.app import App
from cpersona.services.requests import Request
from cpersona.services.responses import failure
from cpersona.storage.repositories.channel_move import BridgeDeclarations, bridge_pages, rechannel
from cpersona.storage.scope import Scope

BRIDGE_CHANNEL = "discord"
SAMPLE_LIMIT = 5  # MC-5
INVALID_IDS_LIMIT = 10  # MC-2
PAGE_SIZE = 1000


@dataclass(frozen=True, slots=True)
class _Row:
    id: int
    agent_id: str
    project_id: str
    session_id: str | None  # set when recoverable
    invalid_json: bool = False

    @property
    def recovered_channel(self) -> str | None:
        return self.session_id.split(":", 1)[0] if self.session_id is not None else None


@dataclass
class _Survey:
    """What the scope holds, counted before anything moves (MC-5)."""

    recoverable: Counter[str] = field(default_factory=Counter)
    unrecoverable: int = 0
    invalid_total: int = 0
    invalid_ids: list[int] = field(default_factory=list)
    samples: list[dict[str, Any]] = field(default_factory=list)

    def add(self, row: _Row) -> None:
        channel = row.recovered_channel
        if channel is not None:
            self.recoverable[channel] += 1
            if len(self.samples) < SAMPLE_LIMIT:
                self.samples.append({"id": row.id, "recovered_channel": channel, "session_id": row.session_id})
            return
        self.unrecoverable += 1
        if row.invalid_json:
            self.invalid_total += 1
            if len(self.invalid_ids) < INVALID_IDS_LIMIT:
                self.invalid_ids.append(row.id)

    def by_channel(self) -> list[dict[str, Any]]:
        # Most rows first; Counter keeps first-seen (lowest id) order among equal counts.
        return [{"channel": channel, "count": count} for channel, count in self.recoverable.most_common()]


def classify(row_id: int, agent_id: str, project_id: str, metadata: Any) -> _Row:
    """Recoverable or not (MC-1, MC-2): malformed metadata is a finding, never an error."""
    try:
        doc = json.loads(metadata, parse_constant=_no_constants)
    except (TypeError, ValueError):
        return _Row(row_id, agent_id, project_id, None, invalid_json=True)
    session_id = doc.get("session_id") if isinstance(doc, dict) else None
    if isinstance(session_id, str) and session_id[:1].isascii() and session_id[:1].isdigit() and ":" in session_id[1:]:
        return _Row(row_id, agent_id, project_id, session_id)
    return _Row(row_id, agent_id, project_id, None)


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


@dataclass(frozen=True)
class ChannelAxisArguments(Request):
    """``migrate_channel_axis``'s arguments in the types its schema declares; defaults are the schema's."""

    agent_id: str = ""  # '' = every agent
    dry_run: bool = True
    globalize_unrecoverable: bool = False
    session_key: str = ""  # selects the pause bucket; the facade's pause gate reads it


def migrate_channel_axis(
    app: App,
    *,
    agent_id: Any = "",
    dry_run: Any = True,
    globalize_unrecoverable: Any = False,
    session_key: Any = "",
) -> dict[str, Any]:
    """:func:`answer_migrate_channel_axis` for a library caller, whose arguments no schema has checked."""
    if agent_id is None:
        agent_id = ""
    if not isinstance(agent_id, str):
        return failure("agent_id must be a string")
    for name, value in (("dry_run", dry_run), ("globalize_unrecoverable", globalize_unrecoverable)):
        if not isinstance(value, bool):
            return failure(f"{name} must be true or false")
    return answer_migrate_channel_axis(
        app, ChannelAxisArguments(agent_id=agent_id, dry_run=dry_run, globalize_unrecoverable=globalize_unrecoverable)
    )


def answer_migrate_channel_axis(app: App, args: ChannelAxisArguments) -> dict[str, Any]:
    """Survey the ``discord`` rows of one agent ('' = every agent) and, unless dry, move them."""
    scope = Scope(agent_id=args.agent_id or None)

    survey = _Survey()
    migrated = globalized = 0
    if args.dry_run:
        with app.db.read() as session:
            for page in _pages(session.connection(), scope):
                for row in page:
                    survey.add(row)
    else:
        with app.db.write() as session:
            conn = session.connection()
            graph = _Declarations.of(conn, app)
            for page in _pages(conn, scope):
                for row in page:
                    survey.add(row)
                moved = _move_recoverable(conn, page)
                migrated += len(moved)
                if graph is not None:
                    graph.follow(moved)
                if args.globalize_unrecoverable:
                    globalized += _globalize(conn, [r.id for r in page if r.session_id is None])

    return {
        "agent_id": args.agent_id,
        "dry_run": args.dry_run,
        "recoverable_total": sum(survey.recoverable.values()),
        "recoverable_by_channel": survey.by_channel(),
        "unrecoverable_total": survey.unrecoverable,
        "invalid_metadata_total": survey.invalid_total,
        "invalid_metadata_ids": survey.invalid_ids,
        "globalize_unrecoverable": args.globalize_unrecoverable,
        "migrated": migrated,
        "globalized": globalized,
        "samples": survey.samples,
    }


def _pages(conn: Connection, scope: Scope) -> Iterator[list[_Row]]:
    """The scope's ``discord`` rows in id order, a page at a time (bounded memory)."""
    for page in bridge_pages(conn, scope, BRIDGE_CHANNEL, PAGE_SIZE):
        yield [classify(r.id, r.agent_id, r.project_id, r.metadata) for r in page]


def _rechannel(conn: Connection, ids: Sequence[int], channel: str) -> list[int]:
    """Move ``discord`` rows to ``channel``; returns the ids that moved.

    A row whose target bucket already holds the same text keeps its place
    (the dedup index forbids the move; it is skipped, not failed: MC-3).
    """
    return rechannel(conn, ids, channel, BRIDGE_CHANNEL)


def _move_recoverable(conn: Connection, page: list[_Row]) -> list[tuple[_Row, str]]:
    by_channel: dict[str, list[_Row]] = {}
    for row in page:
        if (channel := row.recovered_channel) is not None:
            by_channel.setdefault(channel, []).append(row)
    moved: list[tuple[_Row, str]] = []
    for channel, rows in by_channel.items():
        ok = set(_rechannel(conn, [r.id for r in rows], channel))
        moved.extend((r, channel) for r in rows if r.id in ok)
    return moved


def _globalize(conn: Connection, ids: list[int]) -> int:
    return len(_rechannel(conn, ids, "")) if ids else 0


# -- declarations follow their memories (associations-and-reconstruct CA-4) -------------------------


class _Declarations:
    """Carries mentions and relations filed in ``discord`` about a moved memory to its new channel.

    Entities they name are copied (with aliases) into the new channel's scope,
    or matched there by normalized name. An original declaration is removed
    once its copy exists; an original entity is removed once nothing in the
    bridge channel refers to it any more. Without the association tables
    there is nothing to carry (:meth:`of` answers None).
    """

    def __init__(self, conn: Connection, now: str) -> None:
        self.rows = BridgeDeclarations(conn, BRIDGE_CHANNEL)
        self.now = now
        self._copies: dict[tuple[int, str], int] = {}  # (bridge entity id, channel) → copy id

    @classmethod
    def of(cls, conn: Connection, app: App) -> _Declarations | None:
        if not BridgeDeclarations.available(conn):
            return None
        return cls(conn, app.now_iso())

    def follow(self, moved: list[tuple[_Row, str]]) -> None:
        touched: set[int] = set()
        for row, channel in moved:
            ref = f"mem:{row.id}"
            touched |= self._carry_mentions(row, channel, ref)
            touched |= self._carry_relations(row, channel, ref)
        for entity_id in sorted(touched):
            self.rows.drop_if_orphaned(entity_id)

    def _carry_mentions(self, row: _Row, channel: str, ref: str) -> set[int]:
        mentions = self.rows.mentions_of(ref, row.agent_id, row.project_id)
        for entity_id, declared_by, created_at in mentions:
            copy = self._entity_copy(entity_id, channel)
            self.rows.move_mention(entity_id, copy, ref, declared_by, created_at)
        return {m.entity_id for m in mentions}

    def _carry_relations(self, row: _Row, channel: str, ref: str) -> set[int]:
        relations = self.rows.relations_about(row.agent_id, row.project_id, row.id, ref)
        touched: set[int] = set()
        for rel in relations:
            values = dict(rel)
            for end in ("subject", "object"):
                if values[f"{end}_kind"] == "entity":
                    touched.add(values[f"{end}_id"])
                    values[f"{end}_id"] = self._entity_copy(values[f"{end}_id"], channel)
            values["channel"] = channel
            # The same declaration may already exist there: then the original simply goes.
            self.rows.replace_relation(rel["id"], values)
        return touched

    def _entity_copy(self, entity_id: int, channel: str) -> int:
        key = (entity_id, channel)
        if key in self._copies:
            return self._copies[key]
        original = self.rows.entity(entity_id)
        if original["channel"] != BRIDGE_CHANNEL:
            self._copies[key] = entity_id  # an entity of another channel (e.g. global) is named as is
            return entity_id
        found = self.rows.copy_entity(original, channel)
        self._copies[key] = found
        return found
