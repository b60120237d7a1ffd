"""docs/tools.md is generated from the registry; it must list every tool as declared now."""

from __future__ import annotations

from pathlib import Path

from cpersona.mcp.tool_docs import render
from cpersona.mcp.tools import default_registry

DOC = Path(__file__).resolve().parents[1] / "docs" / "tools.md"


def test_tools_page_matches_the_registry():
    assert DOC.read_text(encoding="utf-8") == render(), (
        "docs/tools.md is stale: run `python -m cpersona.mcp.tool_docs > docs/tools.md`"
    )


def test_every_tool_names_its_contract():
    missing = [spec.name for spec in default_registry() if not spec.contracts]
    assert missing == [], missing
