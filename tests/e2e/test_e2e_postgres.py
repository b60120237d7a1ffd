"""The same server over stdio with CPERSONA_DATABASE_URL pointing at PostgreSQL.

Skipped without CPERSONA_TEST_PG_URL (.ci/run starts a throwaway cluster and
sets it). Storage-level PostgreSQL suites live beside the SQLite ones; this
proves the MCP path end to end: start-up migration, store, dedup, recall of an
English identifier and a Japanese substring, listing, and a restart.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from mcp import Client, StdioServerParameters

from pg_support import fresh_pg_url
from stdio_harness import server_env

pytestmark = pytest.mark.anyio

ENGLISH = "The staging deploy key lives in vault at secret/staging/deploy-7f3a."
JAPANESE = "毎週水曜日の定例会議は午前十時から始まる。"


def answer(result) -> dict:
    assert not result.is_error, result
    return json.loads(result.content[0].text)


async def test_store_recall_restart_on_postgres(tmp_path: Path):
    with fresh_pg_url() as url:
        params = StdioServerParameters(
            command=sys.executable,
            args=["-m", "cpersona"],
            env=server_env(tmp_path / "unused.db", CPERSONA_DATABASE_URL=url),
        )
        async with Client(params) as client:
            for content in (ENGLISH, JAPANESE):
                stored = answer(await client.call_tool("store", {"agent_id": "pg", "content": content}))
                assert stored["result"] == "stored", stored
            again = answer(await client.call_tool("store", {"agent_id": "pg", "content": ENGLISH}))
            assert again["result"] == "skipped" and again["reason"] == "duplicate content"  # spec ST-4
            for query, expected in (("deploy-7f3a", ENGLISH), ("定例会議", JAPANESE), ("水曜", JAPANESE)):
                rows = [
                    m["content"]
                    for m in answer(await client.call_tool("recall", {"agent_id": "pg", "query": query}))["messages"]
                ]
                assert rows and rows[-1] == expected, (query, rows)  # spec RC-1
        async with Client(params) as client:
            listed = answer(await client.call_tool("list_memories", {"agent_id": "pg"}))
            assert {m["content"] for m in listed["memories"]} == {ENGLISH, JAPANESE}
        assert not (tmp_path / "unused.db").exists()  # the SQLite path was never touched
