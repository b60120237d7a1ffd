"""The initialize instructions: our guidance, then the operator's summary verbatim (spec OC-4)."""

from __future__ import annotations

from pathlib import Path

from conftest import make_app

from cpersona.mcp.server import build_server

CONTEXT = """\
version = 1
context_revision = "r1"

[instructions]
summary = "Use project @auto for team notes."
"""


def test_instructions_carry_the_operator_summary_after_a_blank_line(db, tmp_path: Path):  # spec OC-4
    path = tmp_path / "operating-context.toml"
    path.write_text(CONTEXT, encoding="utf-8")
    server = build_server(make_app(db, OPERATING_CONTEXT_PATH=str(path)))
    guidance, summary = server.instructions.split("\n\n", 1)
    assert "recall" in guidance or "reconstruct" in guidance
    assert summary == "Use project @auto for team notes."


def test_instructions_without_a_context_file_are_the_guidance_alone(db, tmp_path: Path):
    server = build_server(make_app(db, OPERATING_CONTEXT_PATH=str(tmp_path / "absent.toml")))
    assert "\n\n" not in server.instructions
    assert "store" in server.instructions
