"""The health tools on their real surfaces: the facade's call path with the real pause gate (spec H-3, DC-1),
get_session_findings over streamable HTTP (F-8), and the checkup CLI's
report-only run leaving the file byte-identical (CLI-3, H-13).
"""

from __future__ import annotations

from health_seed import h  # noqa: F401  (the seeding fixture)

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from cpersona.mcp.dispatch import call_tool
from cpersona.mcp.gates import GateChain
from cpersona.mcp.pause_gate import PauseGate
from cpersona.mcp.tools import default_registry
from test_http_transport import HttpServer, mcp_call

pytestmark = [pytest.mark.anyio, pytest.mark.both_backends]
SKIP_REASON = "no-persist mode active — fix downgraded to fix=False"
REGISTRY = default_registry()
GATES = GateChain([PauseGate()])


async def call(app, name, **arguments):
    return (await call_tool(app, REGISTRY, GATES, name, arguments)).payload


async def test_pause_downgrades_check_health_and_deep_check_fix(app, h):
    # spec H-3, DC-1: the real gate chain turns fix into a report; nothing is written
    h.insert_memory(app, "   ")  # empty_content (check_health) and short_content (deep_check) would delete it
    await call(app, "pause_persistence", session_key="s")
    health = await call(app, "check_health", fix=True, checks=["empty_content"], session_key="s")
    assert health["fixed"] is False and health["repairs_skipped"] is True
    assert health["repairs_skip_reason"] == SKIP_REASON and health["issues"][0]["count"] == 1
    deep = await call(app, "deep_check", agent_id="a", fix=True, checks=["short_content"], session_key="s")
    assert deep["fixed"] is False and deep["repairs_skipped"] is True and deep["repairs_skip_reason"] == SKIP_REASON
    assert deep["results"]["short_content"] == {"count": 1, "samples": deep["results"]["short_content"]["samples"]}
    assert len(h.query(app, "SELECT id FROM memories")) == 1
    # another bucket is not paused: its fix runs
    other = await call(app, "deep_check", agent_id="a", fix=True, checks=["short_content"], session_key="t")
    assert other["fixed"] is True and "repairs_skipped" not in other
    assert h.query(app, "SELECT id FROM memories") == []


@pytest.fixture
def http_server(tmp_path: Path):
    server = HttpServer(tmp_path, CPERSONA_AUTH_TOKEN="s3cret-token")
    yield server
    server.stop()


async def test_findings_over_http_mark_identity_shared_without_a_key(http_server):
    # spec F-8: a shared transport and an undeclared session key
    keyless = await mcp_call(http_server.url, "s3cret-token", "get_session_findings", {})
    assert keyless["identity_shared"] is True and keyless["_meta"]["superauditor"] == "1.1"
    literal = await mcp_call(http_server.url, "s3cret-token", "get_session_findings", {"session_key": "transport"})
    assert literal["identity_shared"] is True
    keyed = await mcp_call(http_server.url, "s3cret-token", "get_session_findings", {"session_key": "me"})
    assert "identity_shared" not in keyed


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_report_only_checkup_leaves_the_file_byte_identical(tmp_path):
    # spec CLI-3, H-13: no migration, no journal-mode switch, no write of any kind
    import sqlite3

    path = tmp_path / "legacy.db"
    conn = sqlite3.connect(path)  # a rollback-journal file, as an older server or a copy leaves it
    conn.execute("CREATE TABLE IF NOT EXISTS probe (x)")
    conn.close()
    import os

    db_env = {k: v for k, v in os.environ.items() if not k.startswith(("CPERSONA_", "EMBEDDING_"))}
    db_env["CPERSONA_UPDATE_CHECK"] = "false"
    subprocess.run(
        [sys.executable, "-m", "cpersona.checkup", "--db", str(path), "--fix"],
        env=db_env,
        capture_output=True,
        text=True,
        timeout=120,
    )  # a --fix run migrates it to the current schema
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA journal_mode=DELETE")
    conn.execute("INSERT INTO memories (agent_id, content, timestamp) VALUES ('a', '   ', '2024-01-01 00:00:00')")
    conn.commit()
    conn.close()
    before = _digest(path)
    out = subprocess.run(
        [sys.executable, "-m", "cpersona.checkup", "--db", str(path), "--json", "--deep"],
        env=db_env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode in (0, 1), out.stderr
    report = json.loads(out.stdout)
    assert any(i["type"] == "empty_content" for i in report["issues"])
    assert _digest(path) == before
    assert not Path(f"{path}-wal").exists() and not Path(f"{path}-shm").exists()
