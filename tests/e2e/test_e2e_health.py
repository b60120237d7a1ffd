"""check_health over the real stdio process (spec §2, F-8)."""

from __future__ import annotations

import sqlite3

import pytest
from mcp import Client

from stdio_harness import e2e_db_path, stdio_params  # noqa: F401 (fixtures)

pytestmark = pytest.mark.anyio


async def test_check_health_over_stdio(stdio_params, e2e_db_path):
    # spec §2: the whole registry through the real process; stdio findings never say identity_shared
    async with Client(stdio_params) as client:
        await client.call_tool("store", {"agent_id": "e2e", "content": "hello"})
        raw = sqlite3.connect(e2e_db_path)  # plant the defect behind the server's back (store cleans it)
        raw.execute("UPDATE memories SET content = '[Memory from bot] ' || content")
        raw.commit()
        raw.close()
        result = (await client.call_tool("check_health", {"checks": ["memory_annotation"]})).structured_content
        assert result["checks_run"] == ["memory_annotation"] and result["status"] == "healthy"
        [issue] = result["issues"]
        assert issue["type"] == "memory_annotation" and issue["repairable"] == 1
        fixed = (
            await client.call_tool("check_health", {"checks": ["memory_annotation"], "fix": True})
        ).structured_content
        assert fixed["fixed"] is True and fixed["issues"][0]["count"] == 1
        again = (await client.call_tool("check_health", {"checks": ["memory_annotation"]})).structured_content
        assert again["issues"] == []
        full = (await client.call_tool("check_health", {})).structured_content
        assert len(full["checks_run"]) == 38 and set(full["severity_summary"]) == {"critical", "warn", "info"}
        findings = (await client.call_tool("get_session_findings", {})).structured_content
        assert "identity_shared" not in findings
        bad = (await client.call_tool("check_health", {"checks": ["nope"]})).structured_content
        assert bad["ok"] is False and bad["unknown_checks"] == ["nope"]
