"""Moving memories in and out: ``export_memories``, ``import_memories``, ``merge_memories``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cpersona.mcp.demands import EXPORT, IMPORT, MERGE
from cpersona.mcp.pause_gate import PassThrough, Skip
from cpersona.mcp.registry import Annotations, Ref, ServiceRef, ToolSpec
from cpersona.mcp.tools.common import SESSION_KEY, object_schema


# What the pause needs of the portability service, imported on the first paused
# call of its tool: a server start loads none of it.


def _merge_arguments(args: Mapping[str, Any]) -> tuple[Any, Any, Any, Any]:
    return (
        args.get("source_agent_id"),
        args.get("target_agent_id"),
        args.get("strategy", "skip"),
        args.get("mode", "copy"),
    )


def _vet_import(app: Any, args: Mapping[str, Any]) -> None:
    from cpersona.services import portability

    portability.vet_import(app, args.get("input_path"))


def _paused_import(app: Any, args: Mapping[str, Any]) -> dict[str, Any]:
    from cpersona.services import portability

    return portability.paused_import_body()


def _validate_merge(app: Any, args: Mapping[str, Any]) -> None:
    from cpersona.services import portability

    portability.validate_merge(*_merge_arguments(args))


def _paused_merge(app: Any, args: Mapping[str, Any]) -> dict[str, Any]:
    from cpersona.services import portability

    return portability.paused_merge_body(*_merge_arguments(args))


EXPORT_MEMORIES = ToolSpec(
    name="export_memories",
    contracts="admin-and-safety.md §6",
    description=(
        "Write an agent's memories, episodes, profile and declared associations (entities with their "
        "aliases, mentions and relations) to a JSONL file on the server, as a backup or to carry them to "
        "another server. The file is replaced only once it has been written completely, and only when it is "
        "itself an earlier export: the server's own files, anything that is not a regular file, a symlink "
        "and other existing files are refused. Over HTTP, paths stay inside the server's export directory."
    ),
    input_schema=object_schema(
        {
            "agent_id": {"type": "string", "description": "The agent to export; '' exports every agent."},
            "output_path": {"type": "string", "description": "Where to write the JSONL file, as a path on the server."},
            "include_embeddings": {
                "type": "boolean",
                "description": "Also write each record's vector, base64-encoded. Default false; rarely needed.",
                "default": False,
            },
        },
        required=["agent_id", "output_path"],
    ),
    annotations=Annotations(read_only=False, destructive=True),
    service=ServiceRef("cpersona.services.portability.export", "answer_export_memories"),
    request=Ref("cpersona.services.portability.export", "ExportArguments"),
    access=EXPORT,
    paused=PassThrough(),  # P-12: it writes a file, not a record
)

IMPORT_MEMORIES = ToolSpec(
    name="import_memories",
    contracts="admin-and-safety.md §7",
    description=(
        "Read a JSONL file written by export_memories and restore its memories, episodes, profiles and "
        "declared associations; each association is pointed at the record it names as restored here. "
        "Importing the same file again adds nothing: a memory is skipped when its msg_id, or its content "
        "within the same project and channel, is already stored, and an episode when its summary is, "
        "within the same project and channel."
    ),
    input_schema=object_schema(
        {
            "input_path": {"type": "string", "description": "The JSONL file to read, as a path on the server."},
            "target_agent_id": {
                "type": "string",
                "description": "Write every record under this agent instead; '' (default) keeps each record's own agent_id.",
                "default": "",
            },
            "dry_run": {
                "type": "boolean",
                "description": "Only count what would be imported; nothing is written.",
                "default": False,
            },
            "session_key": SESSION_KEY,
        },
        required=["input_path"],
    ),
    annotations=Annotations(read_only=False, destructive=True, idempotent=True),
    service=ServiceRef("cpersona.services.portability.importer", "answer_import_memories"),
    request=Ref("cpersona.services.portability.importer", "ImportArguments"),
    access=IMPORT,
    # IM-1 (the file is vetted) comes before the pause (IM-2); a dry run still runs.
    paused=Skip(_paused_import, before=_vet_import, unless_dry_run=True),
)

MERGE_MEMORIES = ToolSpec(
    name="merge_memories",
    contracts="admin-and-safety.md §8",
    description=(
        "Copy one agent's memories, episodes, profile and declared associations into another agent: the same "
        "result as an export followed by an import, without a file. It commits in batches, so other clients "
        "keep writing meanwhile; if it stops part-way, running it again completes it. With strategy "
        "'skip' a memory whose msg_id the target already has, or an episode whose summary it already has, is "
        "left out."
    ),
    input_schema=object_schema(
        {
            "source_agent_id": {"type": "string", "description": "The agent whose records are copied."},
            "target_agent_id": {"type": "string", "description": "The agent that receives them."},
            "strategy": {
                "type": "string",
                "description": "How duplicates are handled: only 'skip' (the default), which keeps the target's own copy.",
                "default": "skip",
            },
            "mode": {
                "type": "string",
                "description": "'copy' (default) leaves the source as it was; 'move' deletes from the source what was copied.",
                "default": "copy",
            },
            "dry_run": {
                "type": "boolean",
                "description": "Only count what would be merged; nothing is written.",
                "default": False,
            },
            "session_key": SESSION_KEY,
        },
        required=["source_agent_id", "target_agent_id"],
    ),
    annotations=Annotations(read_only=False, destructive=True, idempotent=True),
    service=ServiceRef("cpersona.services.portability.merge", "answer_merge_memories"),
    request=Ref("cpersona.services.portability.merge", "MergeArguments"),
    access=MERGE,
    # MG-1 (the arguments) comes before the pause (MG-2); a dry run still runs.
    paused=Skip(_paused_merge, before=_validate_merge, unless_dry_run=True),
)

TOOLS = [EXPORT_MEMORIES, IMPORT_MEMORIES, MERGE_MEMORIES]
