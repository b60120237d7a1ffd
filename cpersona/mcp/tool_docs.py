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
    lines = [f"### `{spec.name}`", "", f"*{_hints(spec)}* — contract: `{spec.contracts or '—'}`", ""]
    lines += [spec.description.strip(), ""]
    props: Mapping[str, Any] = schema.get("properties", {})
    if props:
        lines += ["| argument | type | default |", "|---|---|---|"]
        for name, prop in props.items():
            default = "required" if name in required else (f"`{prop['default']!r}`" if "default" in prop else "—")
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
