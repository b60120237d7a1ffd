"""The real server process over stdio, driven by the MCP SDK's own client."""

from __future__ import annotations

import json
import sqlite3
import sys
from pathlib import Path

import pytest
from mcp import Client, StdioServerParameters

import cpersona

from stdio_harness import REFERENCE, e2e_db_path, run_cli, server_env, stdio_params  # noqa: F401 (fixtures)

pytestmark = pytest.mark.anyio

THE_SEVEN = ["store", "recall", "get_profile", "update_profile", "archive_episode", "list_memories", "list_episodes"]

ENGLISH = "The staging deploy key lives in vault path secret/staging/deploy-7f3a, rotated every ninety days."
JAPANESE = "東京オフィスの定例会議は毎週水曜日の午前十時から第三会議室で行います。"
OTHER = "Lunch options near the office include ramen and a sandwich shop."


def answer(result) -> dict:
    assert len(result.content) == 1 and result.content[0].type == "text"
    body = json.loads(result.content[0].text)
    assert body == result.structured_content
    return body


def recalled(result) -> list[str]:
    body = answer(result)
    assert result.is_error is False, body
    return [m["content"] for m in body["messages"]]


async def test_tools_over_stdio_are_declared_as_the_reference_declares_them(stdio_params):  # spec G-3, T-6
    reference = {tool["name"]: tool for tool in REFERENCE["tools"]}
    async with Client(stdio_params) as client:
        assert client.server_info.name == "cloto-mcp-cpersona"
        assert client.server_info.version == cpersona.__version__  # spec README decision 5
        tools = (await client.list_tools()).tools
    assert set(THE_SEVEN) <= {t.name for t in tools}  # later issues add tools; each must match the reference
    for tool in tools:
        wire = tool.model_dump(by_alias=True, exclude_none=True)
        assert wire["description"].strip()
        assert _strip(wire["inputSchema"]) == reference[tool.name]["inputSchema"], tool.name
        assert wire.get("annotations") == reference[tool.name]["annotations"], tool.name


def _strip(node):
    if isinstance(node, dict):
        return {k: _strip(v) for k, v in node.items() if not (k == "description" and isinstance(v, str))}
    if isinstance(node, list):
        return [_strip(v) for v in node]
    return node


async def test_store_then_recall_english_and_japanese_then_restart(stdio_params):  # spec ST-10, RC-1, RC-3
    async with Client(stdio_params) as client:
        for content in (ENGLISH, JAPANESE, OTHER):
            stored = answer(await client.call_tool("store", {"agent_id": "e2e", "content": content}))
            assert stored["ok"] is True and stored["result"] == "stored" and isinstance(stored["id"], int)

        # An English identifier, a Japanese substring the trigram index serves, and a
        # 2-character one it cannot (the LIKE fallback must find it).
        for query, expected in (("deploy-7f3a", ENGLISH), ("定例会議", JAPANESE), ("水曜", JAPANESE)):
            rows = recalled(await client.call_tool("recall", {"agent_id": "e2e", "query": query}))
            assert rows and rows[-1] == expected, (query, rows)  # the last row is the best match
            assert OTHER not in rows

        other_agent = recalled(await client.call_tool("recall", {"agent_id": "someone-else", "query": "deploy-7f3a"}))
        assert other_agent == []

    # A new process on the same file sees everything the first one wrote.
    async with Client(stdio_params) as client:
        listed = answer(await client.call_tool("list_memories", {"agent_id": "e2e"}))
        assert listed["count"] == 3
        assert {m["content"] for m in listed["memories"]} == {ENGLISH, JAPANESE, OTHER}
        rows = recalled(await client.call_tool("recall", {"agent_id": "e2e", "query": "定例会議"}))
        assert rows[-1] == JAPANESE
        again = answer(await client.call_tool("store", {"agent_id": "e2e", "content": JAPANESE}))
        assert again["result"] == "skipped" and again["reason"] == "duplicate content"  # spec ST-4


async def test_profile_and_episode_round_trip_over_stdio(stdio_params):  # spec PF-3, AE-1, LE-1
    async with Client(stdio_params) as client:
        updated = answer(await client.call_tool("update_profile", {"agent_id": "e2e", "profile": "簡潔な回答を好む。"}))
        assert updated == {"ok": True, "profiles_updated": 1}
        assert answer(await client.call_tool("get_profile", {"agent_id": "e2e"})) == {"profile": "簡潔な回答を好む。"}
        archived = answer(
            await client.call_tool(
                "archive_episode",
                {
                    "agent_id": "e2e",
                    "summary": "Discussed the deploy key rotation.",
                    "keywords": "deploy vault",
                    "history": [{"timestamp": "2026-01-02T10:00:00+00:00"}, {"timestamp": "2026-01-02T09:00:00+00:00"}],
                },
            )
        )
        assert archived["ok"] is True and isinstance(archived["episode_id"], int)
        episodes = answer(await client.call_tool("list_episodes", {"agent_id": "e2e"}))
        assert episodes["count"] == 1
        episode = episodes["episodes"][0]
        assert episode["start_time"] == "2026-01-02T09:00:00+00:00"
        assert episode["end_time"] == "2026-01-02T10:00:00+00:00"


async def test_a_bad_call_does_not_stop_the_process(stdio_params):  # spec G-3, G-4
    async with Client(stdio_params) as client:
        bad = await client.call_tool("recall", {"agent_id": "e2e", "query": "x", "limit": 101})
        assert bad.is_error is True
        assert answer(bad) == {
            "ok": False,
            "error": "Input validation error: 101 is greater than the maximum of 100 (at $.limit)",
        }
        unknown = await client.call_tool("no_such_tool", {})
        assert unknown.is_error is True and answer(unknown)["error"] == "Unknown tool: no_such_tool"
        stored = answer(await client.call_tool("store", {"agent_id": "e2e", "content": "still serving"}))
        assert stored["result"] == "stored"


# --- the command line ----------------------------------------------------------


def test_version_prints_our_version(e2e_db_path):
    done = run_cli("--version", env=server_env(e2e_db_path))
    assert done.returncode == 0
    assert done.stdout.strip() == f"cpersona {cpersona.__version__} ({cpersona.DISTRIBUTION})"
    assert not e2e_db_path.exists()  # --version touches nothing


def test_console_script_is_installed_and_answers_version(e2e_db_path):
    script = Path(sys.executable).parent / "cpersona"
    # pyproject's [project.scripts] installs it with the package; its absence is a packaging bug
    assert script.exists(), f"{script} is missing: reinstall with pip install -e ."
    import subprocess

    done = subprocess.run([str(script), "--version"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == f"cpersona {cpersona.__version__} ({cpersona.DISTRIBUTION})"


def test_help_lists_the_serve_command(e2e_db_path):
    done = run_cli("--help", env=server_env(e2e_db_path))
    assert done.returncode == 0 and "serve" in done.stdout and "--version" in done.stdout


def test_bad_environment_value_stops_start_up_with_one_line_naming_the_variable(e2e_db_path):
    done = run_cli(env=server_env(e2e_db_path, CPERSONA_RECALL_MODE="fast"))
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "CPERSONA_RECALL_MODE" in lines[0] and "fast" in lines[0]
    assert done.stdout == ""  # stdout is the protocol; nothing else may go there
    assert not e2e_db_path.exists()  # refused before the database was opened


def test_http_transport_without_credentials_is_refused_before_the_database(e2e_db_path):  # spec T-7, T-8
    done = run_cli(env=server_env(e2e_db_path, CPERSONA_TRANSPORT="streamable-http"))
    assert done.returncode == 2
    assert "CPERSONA_AUTH_TOKEN" in done.stderr and "CPERSONA_ALLOW_UNAUTHENTICATED_HTTP" in done.stderr
    assert not e2e_db_path.exists()


def test_a_database_of_the_26_line_is_refused_untouched(tmp_path):  # spec README decision 9
    db_path = tmp_path / "newer.db"
    with sqlite3.connect(db_path) as conn:
        conn.execute("CREATE TABLE schema_version (version INTEGER PRIMARY KEY, applied_at TEXT)")
        conn.execute("INSERT INTO schema_version VALUES (15, '2026-01-01')")
    before = db_path.read_bytes()
    done = run_cli(env=server_env(db_path))
    assert done.returncode == 3
    assert "import-db" in done.stderr
    assert db_path.read_bytes() == before


def test_serve_is_the_default_command(e2e_db_path):
    """`cpersona serve` and bare `cpersona` both start the server (stdin at EOF ends it cleanly)."""
    for args in ((), ("serve",)):
        done = run_cli(*args, env=server_env(e2e_db_path))
        assert done.returncode == 0, done.stderr
        assert done.stdout == ""
    assert e2e_db_path.exists()


async def test_http_embeddings_are_wired_into_the_served_app(e2e_db_path, embed_server):  # spec ST-6, T-7
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "cpersona"],
        env=server_env(e2e_db_path, CPERSONA_EMBEDDING_MODE="http", CPERSONA_EMBEDDING_URL=embed_server.url),
    )
    async with Client(params) as client:
        stored = answer(await client.call_tool("store", {"agent_id": "e2e", "content": ENGLISH}))
    assert stored["result"] == "stored" and stored["embedded"] is True


def test_unsupported_embedding_mode_is_refused_before_the_database_opens(e2e_db_path):  # spec T-7 (5)
    done = run_cli(env=server_env(e2e_db_path, CPERSONA_EMBEDDING_MODE="gpu"))
    assert done.returncode == 2 and "CPERSONA_EMBEDDING_MODE" in done.stderr
    assert not e2e_db_path.exists()
