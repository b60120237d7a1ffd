"""Renders docs/tools.md from the tool registry, so the reference cannot drift.

Regenerate with ``python -m cpersona.mcp.tool_docs > docs/tools.md``; a test
fails when the committed page differs from what the registry renders now.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

from cpersona.mcp import tools as tool_groups
from cpersona.mcp.registry import ToolSpec

# Where each tool's numbered contract points live in the specification.
CONTRACTS: Mapping[str, str] = {
    "store": "memory-and-recall.md §3.1",
    "recall": "memory-and-recall.md §3.2",
    "recall_with_context": "memory-and-recall.md §3.3",
    "get_contents": "memory-and-recall.md §3.4, associations-and-reconstruct.md §7",
    "archive_episode": "memory-and-recall.md §3.5",
    "update_memory": "memory-and-recall.md §3.6",
    "get_profile": "memory-and-recall.md §3.7",
    "update_profile": "memory-and-recall.md §3.8",
    "list_memories": "memory-and-recall.md §3.9",
    "list_episodes": "memory-and-recall.md §3.10",
    "calibrate_threshold": "memory-and-recall.md §3.11",
    "set_recall_precision": "memory-and-recall.md §3.12",
    "get_recall_precision": "memory-and-recall.md §3.13",
    "declare_associations": "associations-and-reconstruct.md §3",
    "traverse": "associations-and-reconstruct.md §5",
    "reconstruct": "associations-and-reconstruct.md §8",
    "delete_memory": "admin-and-safety.md §2",
    "delete_episode": "admin-and-safety.md §3",
    "lock_memory": "admin-and-safety.md §4",
    "unlock_memory": "admin-and-safety.md §4",
    "delete_agent_data": "admin-and-safety.md §5",
    "export_memories": "admin-and-safety.md §6",
    "import_memories": "admin-and-safety.md §7",
    "merge_memories": "admin-and-safety.md §8",
    "pause_persistence": "admin-and-safety.md §9.2",
    "resume_persistence": "admin-and-safety.md §9.3",
    "persistence_status": "admin-and-safety.md §9.4",
    "get_operating_context": "admin-and-safety.md §10.2",
    "get_queue_status": "admin-and-safety.md §11.4",
    "migrate_channel_axis": "admin-and-safety.md §12",
    "check_update": "admin-and-safety.md §13",
    "check_health": "health.md §2",
    "deep_check": "health.md §5",
    "get_session_findings": "health.md §6",
}

INTRO = """\
# Tools

Every tool cpersona offers over MCP, grouped by purpose, with its arguments as
declared in its JSON schema and the section of the contracts
([contracts/](contracts/README.md)) whose numbered points its tests cite. The names,
arguments and answers are those of CPersona 2.6; see
[behavior-contracts.md](behavior-contracts.md) for how to read an answer and
where cpersona deliberately differs.

This page is generated from the tool declarations in `cpersona/mcp/tools/`;
regenerate it with `python -m cpersona.mcp.tool_docs > docs/tools.md`.
"""


def _type(prop: Mapping[str, Any]) -> str:
    kind = prop.get("type", "any")
    if isinstance(kind, list):
        kind = " | ".join(str(k) for k in kind)
    if "enum" in prop:
        kind = " / ".join(f"`{v}`" for v in prop["enum"])
    if kind == "array" and isinstance(prop.get("items"), Mapping):
        kind = f"array of {_type(prop['items'])}"
    bounds = []
    for key, label in (("minimum", "≥"), ("maximum", "≤"), ("maxLength", "length ≤"), ("maxItems", "items ≤")):
        if key in prop:
            bounds.append(f"{label} {prop[key]}")
    return f"{kind} ({', '.join(bounds)})" if bounds else str(kind)


def _hints(spec: ToolSpec) -> str:
    wire = spec.annotations.as_wire()
    words = []
    if wire.get("readOnlyHint"):
        words.append("read-only")
    if wire.get("destructiveHint"):
        words.append("destructive")
    if wire.get("idempotentHint"):
        words.append("idempotent")
    return ", ".join(words) or "writes"


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def render_tool(spec: ToolSpec) -> str:
    schema = spec.input_schema
    required = set(schema.get("required", ()))
    lines = [f"### `{spec.name}`", "", f"*{_hints(spec)}* — contract: `{CONTRACTS.get(spec.name, '—')}`", ""]
    lines += [spec.description.strip(), ""]
    props: Mapping[str, Any] = schema.get("properties", {})
    if props:
        lines += ["| argument | type | default |", "|---|---|---|"]
        for name, prop in props.items():
            default = "required" if name in required else (
                f"`{prop['default']!r}`" if "default" in prop else "—")
            lines.append(f"| `{name}` | {_cell(_type(prop))} | {_cell(default)} |")
        lines.append("")
    return "\n".join(lines)


def render() -> str:
    parts = [INTRO]
    for group in tool_groups._GROUPS:
        first_paragraph = (group.__doc__ or group.__name__).strip().split("\n\n")[0]
        title = " ".join(first_paragraph.split()).replace("``", "`").rstrip(".")
        parts.append(f"## {title}\n")
        parts.extend(render_tool(spec) for spec in group.TOOLS)
    return "\n".join(parts).rstrip() + "\n"


if __name__ == "__main__":
    sys.stdout.write(render())
