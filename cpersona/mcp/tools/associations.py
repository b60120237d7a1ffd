"""Associative memory: ``declare_associations`` and ``traverse``.

The schemas are CPersona 2.6.14's, key for key (tests/test_facade.py checks),
so the nested item shapes of ``declare_associations`` are enforced by the MCP
layer: an entity without ``name`` or a relation without ``predicate`` refuses
the whole call there, as the reference does; every other malformed item (empty,
too long, a ref that is not the caller's, ...) reaches the service and is
dropped item by item. The descriptions are ours.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import dataclasses

from cpersona.mcp.demands import WRITE_AGENT
from cpersona.mcp.pause_gate import Skip, const
from cpersona.mcp.registry import READ_ONLY, READ_PROJECT, WRITE_PROJECT, Annotations, Ref, ServiceRef, ToolSpec
from cpersona.mcp.tools.common import AGENT_ID, SESSION_KEY, object_schema, prop

_AUTO = (
    " '@auto' asks for this agent's default project from the server's operating context and is echoed as "
    "resolved_project_id; an agent the context does not map gets '' with operating_context_warning (no warning "
    "when enforce='off'; enforce='reject' refuses writes). With no operating context configured, or one that "
    "cannot be parsed, '@auto' is not resolved but used literally as a project called '@auto', and "
    "resolved_project_id says so. Check resolved_project_id before relying on it."
)

DECLARE_DESCRIPTION = (
    "Record associative memory after the fact: entities with their aliases, and subject–predicate–object "
    "relations, kept exactly as declared and followed by reconstruct and traverse. Nothing is extracted from "
    "record text and nothing is inferred, so the graph holds precisely what was declared. "
    "`anchor_ref` names the evidence record (`mem:<id>` / `ep:<id>`): each entity listed is recorded as "
    "mentioned by that record, and each relation carries it. "
    "An item that is malformed is listed in `dropped` and skipped; the rest of the call still goes through. "
    "`retract` takes relations away by id and mentions by {entity, ref}; apart from deleting the records "
    "involved, it is the only way a declaration is removed. "
    "Answer: {ok, result:'declared', entities:[{id, name, created}], mentions, relations:[ids], "
    "dropped:[{item, reason}], retracted?:{relations, mentions}}. While pause_persistence is active nothing "
    "is written (result:'skipped', persisted:false)."
)

TRAVERSE_DESCRIPTION = (
    "Show the declared neighbourhood of an entity as a graph: the entity itself, its aliases, the "
    "entity -> entity relations declared on it and on whatever they lead to, followed up to `max_hops` in "
    "either direction, and the refs of the records that mention each entity. Only declarations made with "
    "declare_associations (or `associations` on store) appear; nothing is inferred. Record text is never "
    "included: expand a ref with get_contents. `entity` is a name or an alias, compared after normalization; "
    "if it names several entities this call can read (say a project's and the global pool's), each of them "
    "is a starting point. ORDER: entities by hops, then by the most recently declared relation that reached "
    "them, then by id; mentions by record id; relations newest declaration first. `limit` caps both the "
    "number of entities returned and the number of refs listed for each. "
    "Answer: {entity, max_hops, limit, entities:[{id, name, hops, aliases?, mentions?, mentions_omitted?}], "
    "relations:[{id, subject, predicate, object, declared_by, declared_at, anchor_ref?}] (subject and object "
    "are ids from `entities`; a relation is listed only when both of its ends are), entities_omitted?, "
    "bounds?:{omitted:[max_hops | limit]}, reason?:'no_such_entity'}. The relation ids are the ones "
    "declare_associations' `retract` accepts. A record is listed only if this call could read it: the "
    "project, channel and source_id filters work as in recall."
)


def _declare_refusal(message: str, arguments: Mapping[str, Any]) -> dict[str, Any]:
    from cpersona.services.graph.associations import declare_refusal  # the service's shape, loaded when used

    return declare_refusal(message)


DECLARE_ASSOCIATIONS = ToolSpec(
    name="declare_associations",
    contracts="associations-and-reconstruct.md §3",
    description=DECLARE_DESCRIPTION,
    input_schema=object_schema(
        {
            "agent_id": prop(AGENT_ID, description="The agent the declaration belongs to."),
            "associations": {
                "type": "object",
                "description": "What to declare. A malformed item is listed in `dropped` and skipped.",
                "properties": {
                    "entities": {
                        "type": "array",
                        "description": (
                            "Entities to register when new and to record as mentioned by the anchor. Names and "
                            "aliases are compared after normalization (NFKC, case folding, runs of whitespace made "
                            "one space), so two spellings that normalize alike are one entity."
                        ),
                        "items": {
                            "type": "object",
                            "properties": {
                                "name": {"type": "string", "description": "The entity's name, stored as written."},
                                "aliases": {
                                    "type": "array",
                                    "items": {"type": "string"},
                                    "description": (
                                        "Further names of the same entity. Within one scope an alias leads to one "
                                        "entity only; a claim on an alias another entity already holds is dropped."
                                    ),
                                },
                            },
                            "required": ["name"],
                        },
                    },
                    "relations": {
                        "type": "array",
                        "description": (
                            "Relations to record. subject and object are entity names (registered when new) or "
                            "refs 'mem:<id>' / 'ep:<id>' of this agent's records; predicate is free text, stored "
                            "normalized. On a record → record relation, a predicate from the role vocabulary "
                            "(supports, supersedes, corrects, qualifies, contradicts, temporal_predecessor) is "
                            "read by reconstruct as that role."
                        ),
                        "items": {
                            "type": "object",
                            "properties": {
                                "subject": {"type": "string"},
                                "predicate": {"type": "string"},
                                "object": {"type": "string"},
                            },
                            "required": ["subject", "predicate", "object"],
                        },
                    },
                },
            },
            "anchor_ref": {
                "type": "string",
                "description": "Optional evidence record for this declaration: 'mem:<id>' or 'ep:<id>' of this agent.",
                "default": "",
            },
            "retract": {
                "type": "object",
                "description": (
                    "Declarations to take back: {relations: [relation ids], mentions: [{entity: <entity id>, "
                    "ref: 'mem:<id>'}]}. Only rows of this agent are affected."
                ),
                "properties": {
                    "relations": {"type": "array", "items": {"type": "integer"}},
                    "mentions": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "properties": {"entity": {"type": "integer"}, "ref": {"type": "string"}},
                        },
                    },
                },
            },
            "channel": {
                "type": "string",
                "description": "Channel the declaration belongs to. Default '' (shared by every channel).",
            },
            "project_id": {
                "type": "string",
                "description": "Project the declaration belongs to; omit or send '' for the global pool." + _AUTO,
            },
            "session_key": SESSION_KEY,
        },
        required=["agent_id"],
    ),
    # destructive: `retract` removes declarations.
    annotations=Annotations(read_only=False, destructive=True, idempotent=True),
    service=ServiceRef("cpersona.services.graph.associations", "answer_declare_associations"),
    request=Ref("cpersona.services.graph.associations", "DeclareArguments"),
    project=WRITE_PROJECT,
    access=dataclasses.replace(WRITE_AGENT, says_rejected=True),  # ACL-15: a denial says rejected
    paused=Skip(
        const({"ok": True, "result": "skipped", "entities": [], "mentions": 0, "relations": [], "dropped": []})
    ),
    refusal=_declare_refusal,
)

TRAVERSE = ToolSpec(
    name="traverse",
    contracts="associations-and-reconstruct.md §5",
    description=TRAVERSE_DESCRIPTION,
    input_schema=object_schema(
        {
            "agent_id": prop(AGENT_ID, description="The agent whose declarations are read."),
            "entity": {"type": "string", "description": "An entity name or alias, as declared."},
            "max_hops": {
                "type": "integer",
                "minimum": 0,
                "maximum": 5,
                "default": 1,
                "description": "How many relations to follow away from the entity, in either direction; 0 gives the entity alone.",
            },
            "limit": {
                "type": "integer",
                "minimum": 1,
                "maximum": 100,
                "default": 20,
                "description": "At most this many entities, and at most this many mentioning refs for each.",
            },
            "channel": {"type": "string", "description": "Channel filter, read as recall reads it."},
            "project_id": {
                "type": "string",
                "description": (
                    "Project filter, read as recall reads it: omitted reads every project, '' only the global "
                    "pool, 'X' the project X together with the global pool." + _AUTO
                ),
            },
            "source_id": {
                "type": "string",
                "description": "Per-user filter on the mentioning records' source, as in recall.",
            },
        },
        required=["agent_id", "entity"],
    ),
    annotations=READ_ONLY,
    service=ServiceRef("cpersona.services.graph.traverse", "answer_traverse"),
    request=Ref("cpersona.services.graph.traverse", "TraverseArguments"),
    project=READ_PROJECT,
)

TOOLS = [DECLARE_ASSOCIATIONS, TRAVERSE]
