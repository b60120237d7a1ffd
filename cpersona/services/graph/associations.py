"""Declared associations: ``declare_associations`` and the ``associations`` rider of ``store``.

Spec associations-and-reconstruct.md §1–§4. The server records exactly what a
call names — entities with aliases, subject–predicate–object relations,
mentions of an evidence record — and infers nothing (A-10). A malformed item is
reported in ``dropped`` and skipped; the rest of the call proceeds (A-19, A-24).

One declaration, top to bottom (one write transaction, A-22):

    anchor_ref      checked first; a bad one is dropped once and the call goes
                    on without an anchor (A-12)
    entities        ≤ 64 items, each resolved in the visible scopes or registered,
                    ≤ 32 aliases each (A-5 … A-7, A-13, A-14); a mention of the
                    anchor for each (A-15)
    relations       ≤ 64 items, predicate then subject then object; insert-or-ignore
                    on the unique key (A-16, A-17)

then, in its own transaction, ``retract`` (A-20, A-21).

The read helpers at the end (:func:`resolve_visible`, :func:`readable_entities`,
:func:`relations_between_entities`, :func:`mentions_of`, :func:`entities_mentioned_by`,
:func:`record_relations`) are what ``traverse`` and ``reconstruct`` build on;
:func:`delete_agent_associations` is what ``delete_agent_data`` calls (CA-5).
"""

from __future__ import annotations

import logging
import unicodedata
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.orm import Session

from cpersona.services import refs as record_refs
from cpersona.services.app import App
from cpersona.services.refs import Ref, canonical_ref
from cpersona.services.requests import Request
from cpersona.services.responses import failure
from cpersona.services.sanitize import bucket_field, check_key_field, find_lone_surrogate, has_nul, nul_refusal
from cpersona.storage.models_associations import DECLARED_BY_AGENT
from cpersona.storage.repositories.associations import ENTITY_KIND, AssociationRepository, RelationRow
from cpersona.storage.repositories.episodes import EpisodeRepository
from cpersona.storage.repositories.memories import MemoryRepository
from cpersona.storage.scope import Scope

log = logging.getLogger(__name__)

MAX_ITEMS = 64  # entities, relations, retract.relations, retract.mentions
MAX_ALIASES = 32  # per entity item
MAX_TEXT = 256  # a name, alias, predicate or entity endpoint after trimming

# Declared text is trimmed before it is read, so a ref in it may be padded up
# to this many characters; a longer string is no ref (nor, once trimmed, text).
_MAX_DECLARED_REF_CHARS = MAX_TEXT + 64

# Drop reasons, worded as the reference words them (clients may match on them).
BEYOND_ITEMS = f"beyond the {MAX_ITEMS}-item bound"
BEYOND_ALIASES = f"beyond the {MAX_ALIASES}-alias bound"
NAME_INVALID = "name must be a nonempty string"
NONEMPTY = "must be a nonempty string"
EMPTY_NORMALIZED = "empty after normalization"
ALIAS_TAKEN = "already names another entity in this scope"
NOT_A_LIST = "must be a list"
NOT_AN_OBJECT = "must be an object"
PREDICATE_INVALID = "predicate must be a nonempty string"
BAD_ENDPOINT = "endpoint must be an entity name or a record ref"
BAD_RELATION_ID = "must be an integer id"
BAD_MENTION = "needs an integer entity and a record ref"
# Ours: NUL is refused in identity text as store refuses it in key fields
# (services/sanitize.py: PostgreSQL cannot hold it, SQLite's string functions stop at it).
HAS_NUL = "must not contain a NUL character"


# -- text and refs (A-1 … A-3, §0.3) ------------------------------------------------------


def normalize(value: str) -> str:
    """A-1: NFKC, full Unicode case fold, whitespace runs collapsed to one space, trimmed."""
    return " ".join(unicodedata.normalize("NFKC", value).casefold().split())


def declared_text(value: Any) -> str | None:
    """A-3: the value trimmed, when it is a string of 1 … 256 characters after trimming; else None."""
    if not isinstance(value, str):
        return None
    trimmed = value.strip()
    return trimmed if 0 < len(trimmed) <= MAX_TEXT else None


def parse_ref(value: Any) -> Ref | None:
    """A ref in declared text: trimmed (A-3), leading zeros read through (§0.3), any id.

    An overflowing id still makes the string a ref (never an entity name); it
    just names no record (``Ref.in_range``).
    """
    return record_refs.parse_ref(value, trim=True, max_chars=_MAX_DECLARED_REF_CHARS)


def record_of_agent(session: Session, ref: Ref, agent_id: str) -> bool:
    """A-8: ``ref`` names an existing record of ``agent_id`` (any project or channel)."""
    if not ref.in_range:
        return False
    repository = MemoryRepository if ref.kind == "mem" else EpisodeRepository
    return repository(session).owned_by(ref.id, agent_id)


def visible_scopes(project_id: str, channel: str) -> list[tuple[str, str]]:
    """A-5: the scopes a declaration in (P, C) resolves names in, nearest first."""
    ordered: list[tuple[str, str]] = []
    for scope in ((project_id, channel), (project_id, ""), ("", channel), ("", "")):
        if scope not in ordered:
            ordered.append(scope)
    return ordered


# -- the declaration -----------------------------------------------------------------------


@dataclass
class Report:
    """What one call declared; ``as_dict`` is the response body without ``ok`` / ``result``."""

    entities: list[dict[str, Any]] = field(default_factory=list)
    mentions: int = 0
    relations: list[int] = field(default_factory=list)
    dropped: list[dict[str, str]] = field(default_factory=list)
    retracted: dict[str, int] | None = None

    def drop(self, item: str, reason: str) -> None:
        self.dropped.append({"item": item, "reason": reason})

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "entities": self.entities,
            "mentions": self.mentions,
            "relations": self.relations,
            "dropped": self.dropped,
        }
        if self.retracted is not None:
            out["retracted"] = self.retracted
        return out


def empty_report() -> dict[str, Any]:
    return Report().as_dict()


class _Declaration:
    """One declaration inside one write transaction (A-22)."""

    def __init__(
        self, session: Session, report: Report, *, agent_id: str, project_id: str, channel: str, stamp: str
    ) -> None:
        self.session = session
        self.graph = AssociationRepository(session)
        self.report = report
        self.agent_id = agent_id
        self.project_id = project_id
        self.channel = channel
        self.stamp = stamp  # one timestamp for every row this call writes
        self.scopes = visible_scopes(project_id, channel)

    # -- resolving and registering names

    def resolve(self, normalized: str, *, exact_scope: bool = False) -> int | None:
        scopes = self.scopes[:1] if exact_scope else self.scopes
        return resolve_in_scopes(self.session, self.agent_id, scopes, normalized)

    def register(self, name: str, normalized: str) -> int:
        return self.graph.register_entity(
            {
                "agent_id": self.agent_id,
                "project_id": self.project_id,
                "channel": self.channel,
                "name": name,
                "normalized": normalized,
                "declared_by": DECLARED_BY_AGENT,
                "created_at": self.stamp,
            }
        )

    def entity_for(self, name: str, normalized: str, *, exact_scope: bool) -> tuple[int, bool]:
        found = self.resolve(normalized, exact_scope=exact_scope)
        if found is not None:
            return found, False
        return self.register(name, normalized), True

    # -- the anchor

    def anchor(self, anchor_ref: str) -> str:
        """The canonical anchor, or '' (a bad one is dropped once and the call goes on)."""
        given = anchor_ref.strip()
        if not given:
            return ""
        ref = parse_ref(given)
        if ref is None or not record_of_agent(self.session, ref, self.agent_id):
            self.report.drop("anchor_ref", f"{given} is not a record of this agent")
            return ""
        return ref.canonical

    # -- entities (A-13 … A-15)

    def items(self, items: Any, label: str) -> Iterator[tuple[str, Any]]:
        """``(where, item)`` of a declared list; a non-list and items past MAX_ITEMS are dropped."""
        if items is None:
            return
        if not isinstance(items, list):
            self.report.drop(label, NOT_A_LIST)
            return
        for index, item in enumerate(items):
            where = f"{label}[{index}]"
            if index >= MAX_ITEMS:
                self.report.drop(where, BEYOND_ITEMS)
                continue
            yield where, item

    def entities(self, items: Any, anchor: str) -> None:
        for where, item in self.items(items, "entities"):
            self.entity(where, item, anchor)

    def entity(self, where: str, item: Any, anchor: str) -> None:
        raw_name = item.get("name") if isinstance(item, dict) else None
        name = declared_text(raw_name)
        normalized = normalize(name) if name is not None else ""
        if not normalized:
            self.report.drop(where, NAME_INVALID)
            return
        if has_nul(name):
            self.report.drop(where, f"name {HAS_NUL}")
            return
        aliases = self.alias_candidates(where, item.get("aliases"))
        # a valid alias pins the entity to the declaring scope, so the alias
        # (which has no scope column) never leaks to readers of a wider scope.
        pinned = any(problem is None for _, _, _, problem in aliases)
        entity_id, created = self.entity_for(name, normalized, exact_scope=pinned)
        # Drops are reported in alias order, whichever check refused them.
        for alias_where, alias, alias_normalized, problem in aliases:
            if problem is None:
                owner = self.resolve(alias_normalized)
                if owner is not None and owner != entity_id:
                    problem = ALIAS_TAKEN
            if problem is not None:
                self.report.drop(alias_where, problem)
                continue
            self.graph.add_alias(entity_id, alias, alias_normalized)
        self.report.entities.append({"id": entity_id, "name": name, "created": created})
        if anchor:
            self.graph.add_mention(entity_id, anchor, DECLARED_BY_AGENT, self.stamp)
            self.report.mentions += 1  # counts declarations, not new rows

    def alias_candidates(self, where: str, aliases: Any) -> list[tuple[str, str, str, str | None]]:
        """Every alias of the item as (report path, alias, normalized, problem or None) (A-14)."""
        if aliases is None:
            return []
        if not isinstance(aliases, list):
            self.report.drop(f"{where}.aliases", NOT_A_LIST)
            return []
        checked = []
        for index, raw in enumerate(aliases):
            alias_where = f"{where}.aliases[{index}]"
            alias = declared_text(raw)
            alias_normalized = normalize(alias) if alias is not None else ""
            if index >= MAX_ALIASES:
                problem = BEYOND_ALIASES
            elif alias is None:
                problem = NONEMPTY
            elif has_nul(alias):
                problem = HAS_NUL
            elif not alias_normalized:
                problem = EMPTY_NORMALIZED
            else:
                problem = None
            checked.append((alias_where, alias or "", alias_normalized, problem))
        return checked

    # -- relations

    def relations(self, items: Any, anchor: str) -> None:
        for where, item in self.items(items, "relations"):
            if not isinstance(item, dict):
                self.report.drop(where, NOT_AN_OBJECT)
            else:
                self.relation(where, item, anchor)

    def relation(self, where: str, item: dict[str, Any], anchor: str) -> None:
        predicate_text = declared_text(item.get("predicate"))
        predicate = normalize(predicate_text) if predicate_text is not None else ""
        if not predicate:
            self.report.drop(where, PREDICATE_INVALID)
            return
        if has_nul(predicate):
            self.report.drop(where, f"predicate {HAS_NUL}")
            return
        ends = []
        for side in ("subject", "object"):
            end = self.endpoint(f"{where}.{side}", item.get(side))
            if end is None:
                return
            ends.append(end)
        (subject_kind, subject_id), (object_kind, object_id) = ends
        key = {
            "agent_id": self.agent_id,
            "project_id": self.project_id,
            "channel": self.channel,
            "subject_kind": subject_kind,
            "subject_id": subject_id,
            "predicate": predicate,
            "object_kind": object_kind,
            "object_id": object_id,
            "anchor_ref": anchor,
        }
        self.report.relations.append(self.graph.add_relation(key, DECLARED_BY_AGENT, self.stamp))

    def endpoint(self, where: str, value: Any) -> tuple[str, int] | None:
        """(kind, id) of one relation end, registering an entity name if new; None when dropped."""
        ref = parse_ref(value)
        if ref is not None:
            # A ref-shaped string is never a name, even when its id overflows.
            if record_of_agent(self.session, ref, self.agent_id):
                return ref.kind, ref.id
            self.report.drop(where, f"{value.strip()} is not a record of this agent")
            return None
        name = declared_text(value)
        normalized = normalize(name) if name is not None else ""
        if not normalized:
            self.report.drop(where, BAD_ENDPOINT)
            return None
        if has_nul(name):
            self.report.drop(where, f"endpoint {HAS_NUL}")
            return None
        # An endpoint carries no aliases, so the wider scopes are searched;
        # it gets no mention.
        entity_id, _ = self.entity_for(name, normalized, exact_scope=False)
        return ENTITY_KIND, entity_id


def _retract(session: Session, report: Report, agent_id: str, retract: Any) -> None:
    """A-20, A-21: relations by id and mentions by {entity, ref}, the caller's rows only."""
    counts = {"relations": 0, "mentions": 0}
    graph = AssociationRepository(session)
    report.retracted = counts
    if not isinstance(retract, dict):
        report.drop("retract", NOT_AN_OBJECT)
        return
    relation_ids = retract.get("relations")
    if relation_ids is not None and not isinstance(relation_ids, list):
        report.drop("retract.relations", NOT_A_LIST)
    elif relation_ids:
        for index, relation_id in enumerate(relation_ids):
            where = f"retract.relations[{index}]"
            if index >= MAX_ITEMS:
                report.drop(where, BEYOND_ITEMS)
            elif not _is_int(relation_id):
                report.drop(where, BAD_RELATION_ID)
            else:
                counts["relations"] += graph.delete_relation(relation_id, agent_id)
    mentions = retract.get("mentions")
    if mentions is not None and not isinstance(mentions, list):
        report.drop("retract.mentions", NOT_A_LIST)
    elif mentions:
        for index, item in enumerate(mentions):
            where = f"retract.mentions[{index}]"
            if index >= MAX_ITEMS:
                report.drop(where, BEYOND_ITEMS)
                continue
            entity_id = item.get("entity") if isinstance(item, dict) else None
            ref = parse_ref(item.get("ref")) if isinstance(item, dict) else None
            if not _is_int(entity_id) or ref is None:
                report.drop(where, BAD_MENTION)
                continue
            counts["mentions"] += graph.delete_mention(entity_id, ref.canonical, agent_id)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def declare(
    app: App,
    *,
    agent_id: str,
    associations: Any,
    anchor_ref: str = "",
    retract: Any = None,
    project_id: str = "",
    channel: str = "",
) -> Report:
    """Write one declaration and its retraction; arguments already validated. Raises on a database error."""
    report = Report()
    if associations is not None and not isinstance(associations, dict):
        report.drop("associations", NOT_AN_OBJECT)
    elif associations:
        with app.db.write() as session:
            declaration = _Declaration(
                session, report, agent_id=agent_id, project_id=project_id, channel=channel, stamp=app.now_iso()
            )
            anchor = declaration.anchor(anchor_ref)
            declaration.entities(associations.get("entities"), anchor)
            declaration.relations(associations.get("relations"), anchor)
    if retract is not None and retract != {}:
        with app.db.write() as session:
            _retract(session, report, agent_id, retract)
    return report


# -- the tool --------------------------------------------------------------------------------


def declare_refusal(message: str) -> dict[str, Any]:
    """``declare_associations``' failure shape (spec §0.2): the declared lists, empty."""
    return failure(message, result="rejected", entities=[], mentions=0, relations=[], dropped=[])


@dataclass(frozen=True)
class DeclareArguments(Request):
    """``declare_associations``' arguments in the types its schema declares; defaults are the schema's.

    ``associations`` and ``retract`` are objects for a tool call; whatever a
    library caller hands in goes to :func:`declare`, which reports a malformed
    one, as any malformed item, in ``dropped`` (A-24).
    """

    agent_id: str
    associations: Any = None
    anchor_ref: str = ""
    retract: Any = None
    channel: str = ""
    project_id: str = ""
    session_key: str = ""


def declare_associations(
    app: App,
    *,
    agent_id: Any = None,
    associations: Any = None,
    anchor_ref: Any = "",
    retract: Any = None,
    channel: Any = "",
    project_id: Any = "",
    session_key: Any = "",
) -> dict[str, Any]:
    """:func:`answer_declare_associations` for a library caller, whose arguments no schema has checked."""
    if not isinstance(agent_id, str):
        return declare_refusal("agent_id is required" if agent_id is None else "agent_id must be a string")
    # An anchor that is no string is no anchor.
    return answer_declare_associations(
        app,
        DeclareArguments(
            agent_id=agent_id,
            associations=associations,
            anchor_ref=anchor_ref if isinstance(anchor_ref, str) else "",
            retract=retract,
            channel=bucket_field(channel),
            project_id=bucket_field(project_id),
        ),
    )


def answer_declare_associations(app: App, args: DeclareArguments) -> dict[str, Any]:
    """Record entities, aliases, mentions and relations verbatim; retract by id (spec §3)."""
    agent_id, associations, anchor_ref, retract = args.agent_id, args.associations, args.anchor_ref, args.retract
    # The operating context's '@auto' and registry check (OC-7 … OC-11) were applied by the facade.
    project_id, channel = args.project_id, args.channel
    if problem := nul_refusal(agent_id=agent_id):
        return declare_refusal(problem)
    for name, value in (("channel", channel), ("project_id", project_id)):
        if problem := check_key_field(name, value):
            return declare_refusal(problem)
    if find_lone_surrogate(agent_id, associations, anchor_ref, retract, channel, project_id):
        return declare_refusal(
            "the arguments contain a lone UTF-16 surrogate, which is not valid text; nothing was declared"
        )
    report = declare(
        app,
        agent_id=agent_id,
        associations=associations,
        anchor_ref=anchor_ref,
        retract=retract,
        project_id=project_id,
        channel=channel,
    )
    return {"ok": True, "result": "declared", **report.as_dict()}


def declare_for_record(
    app: App,
    *,
    agent_id: str,
    project_id: str,
    channel: str,
    anchor: str,
    associations: Any,
) -> dict[str, Any]:
    """The ``store`` rider (AS-1 … AS-4): declare against the new memory, never failing the store.

    Runs after the memory committed, in its own transaction; whatever goes wrong
    here is reported in ``dropped`` and the memory stays stored.
    """
    try:
        return declare(
            app, agent_id=agent_id, associations=associations, anchor_ref=anchor, project_id=project_id, channel=channel
        ).as_dict()
    except Exception as exc:  # noqa: BLE001 — AS-4: the memory is stored whatever happens here
        log.warning("associations rider for %s failed", anchor, exc_info=True)
        body = empty_report()
        body["dropped"] = [{"item": "associations", "reason": f"declaration failed: {exc}"}]
        return body


# -- reads (traverse, reconstruct) -------------------------------------------------------


def resolve_in_scopes(
    session: Session, agent_id: str, scopes: Sequence[tuple[str, str]], normalized: str
) -> int | None:
    """The entity ``normalized`` names in the first of ``scopes`` that has one (lowest id); else None.

    Two indexed lookups rather than one OR'ed query (which SQLite answers by
    scanning every entity of the agent): names through the unique
    (agent, project, channel, normalized) key, one probe per scope; aliases
    through ``idx_entity_aliases_normalized``.
    """
    graph = AssociationRepository(session)
    rank = {scope: i for i, scope in enumerate(scopes)}
    found: list[tuple[int, int]] = []
    for (project, channel), position in rank.items():
        named = graph.named_in(agent_id, project, channel, normalized)
        if named is not None:
            found.append((position, named))
    for row in graph.aliased(normalized):
        if row.agent_id == agent_id and (row.project_id, row.channel) in rank:
            found.append((rank[(row.project_id, row.channel)], row.id))
    return min(found)[1] if found else None


def resolve_visible(
    session: Session, agent_id: str, name: str, *, project_id: str = "", channel: str = ""
) -> int | None:
    """A-5: the entity a declaration in (project_id, channel) would take ``name`` to mean."""
    normalized = normalize(name)
    if not normalized:
        return None
    return resolve_in_scopes(session, agent_id, visible_scopes(project_id, channel), normalized)


def readable_entities(session: Session, scope: Scope, name: str) -> list[int]:
    """TV-1: ids (ascending) of every entity ``scope`` can read whose name or alias matches ``name``.

    ``scope`` carries the caller's read semantics (agent exact; project and
    channel as recall reads them), applied to the entity's own scope columns.
    """
    normalized = normalize(name) if isinstance(name, str) else ""
    if not normalized:
        return []
    return AssociationRepository(session, scope).readable_named(normalized)


def relations_between_entities(session: Session, scope: Scope, entity_ids: Iterable[int]) -> list[RelationRow]:
    """TV-3: entity → entity relations touching any of ``entity_ids`` (either end).

    Only relations that ``scope`` can read and whose subject and object entities
    it can read too are returned, in id order.
    """
    return AssociationRepository(session, scope).relations_between_entities(entity_ids)


def record_relations(session: Session, scope: Scope, refs: Iterable[str]) -> list[RelationRow]:
    """Record → record relations readable by ``scope`` with either end among ``refs`` (id order)."""
    ends: dict[str, list[int]] = {"mem": [], "ep": []}
    for ref in refs:
        parsed = parse_ref(ref)
        if parsed is not None and parsed.in_range:
            ends[parsed.kind].append(parsed.id)
    return AssociationRepository(session, scope).record_relations(ends)


def entity_rows(session: Session, entity_ids: Iterable[int]) -> dict[int, tuple[str, list[str]]]:
    """id → (name, aliases as written, ordered by normalized form) for the given entities."""
    return AssociationRepository(session).names_and_aliases(entity_ids)


def mentions_of(session: Session, entity_id: int) -> list[str]:
    """Refs of every record declared to mention the entity (no readability filter; see traverse)."""
    return AssociationRepository(session).mentions_of(entity_id)


def entities_mentioned_by(session: Session, ref: str) -> list[int]:
    """Ids (ascending) of the entities a record is declared to mention."""
    parsed = parse_ref(ref)
    if parsed is None:
        return []
    return AssociationRepository(session).entities_mentioned_by(parsed.canonical)


# -- bulk removal ------------------------------------------------------------------------------


def delete_agent_associations(session: Session, agent_id: str) -> dict[str, int]:
    """CA-5: every entity of the agent (aliases and mentions go by trigger) and its relations.

    Run inside the caller's write transaction (``delete_agent_data``). Returns
    the rows removed directly: ``{entities, relations}``.
    """
    return AssociationRepository(session).delete_agent(agent_id)


__all__ = [
    "MAX_ALIASES",
    "MAX_ITEMS",
    "MAX_TEXT",
    "Ref",
    "RelationRow",
    "Report",
    "canonical_ref",
    "declare",
    "answer_declare_associations",
    "declare_associations",
    "declare_for_record",
    "declare_refusal",
    "declared_text",
    "delete_agent_associations",
    "empty_report",
    "entities_mentioned_by",
    "entity_rows",
    "mentions_of",
    "normalize",
    "parse_ref",
    "readable_entities",
    "record_of_agent",
    "record_relations",
    "relations_between_entities",
    "resolve_in_scopes",
    "resolve_visible",
    "visible_scopes",
]
