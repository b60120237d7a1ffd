"""storage/bulk_load.py writes what the store's own insert writes, row for row (issue 17 item 5).

The bulk load drops the full-text insert triggers and the memories indexes,
inserts with executemany, writes the coarse rows per batch and rebuilds the
full-text indexes at the end; a file filled so must be indistinguishable from
one filled by :func:`cpersona.storage.memory_writes.insert_memory` one row at
a time with every trigger live: same schema, same rows in every table, same
full-text matches and scores, and later writes keep every index in step.
"""

from __future__ import annotations

import json
import random
import struct

import pytest

from cpersona.storage.bulk_load import load_memories
from cpersona.storage.engine import open_sqlite
from cpersona.storage.memory_writes import insert_memory
from cpersona.storage.migrate import upgrade

WORDS = (
    "garden river coffee piano running tokyo 東京 ramen 図書館 mountain bicycle painting "
    "sunrise kitchen novel festival camping guitar puppy seaside"
).split()


def _vector(rng: random.Random, dims: int) -> bytes:
    return struct.pack(f"<{dims}f", *(rng.uniform(-1, 1) for _ in range(dims)))


def _rows(count: int) -> list[dict]:
    rng = random.Random(17)
    rows = []
    for i in range(count):
        kind = i % 7
        # Most rows carry a quantisable 384-d vector; some none, some an odd width (no coarse row).
        embedding = None if kind == 3 else _vector(rng, 100 if kind == 5 else 384)
        rows.append(
            {
                "agent_id": "alice" if i % 5 else "bob",
                "project_id": "" if i % 3 else "proj",
                "msg_id": f"m-{i}" if i % 4 else "",
                "content": " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 12))) + f" #{i}",
                "source": json.dumps({"type": "User", "id": f"u{i % 3}", "name": "n"}),
                "timestamp": f"2024-01-01T00:{i // 60 % 60:02d}:{i % 60:02d}+00:00",
                "embedding": embedding,
                "channel": "" if i % 6 else "dm",
                "created_at": f"2024-01-01 00:{i // 60 % 60:02d}:{i % 60:02d}",
            }
        )
    return rows


def _by_row_path(path, rows):
    db = open_sqlite(path)
    upgrade(db)
    with db.write_connection() as conn:
        for row in rows:
            assert insert_memory(conn, dict(row)) is not None
    return db


def _by_bulk_path(path, rows):
    db = open_sqlite(path)
    upgrade(db)
    # Uneven batches that straddle commits, so the per-batch coarse ranges and the commits are both exercised.
    assert load_memories(db, [rows[:130], rows[130:131], rows[131:]], batch_rows=100) == len(rows)
    return db


def _snapshot(db) -> dict:
    out: dict = {}
    with db.read() as session:
        conn = session.connection()
        schema = conn.exec_driver_sql(
            "SELECT type, name, tbl_name, sql FROM sqlite_master WHERE name NOT LIKE 'sqlite_autoindex%' "
            "ORDER BY type, name"
        ).all()
        out["schema"] = schema
        for _type, name, _tbl, sql in schema:
            # Plain tables (FTS5's docsize and config included); the FTS segment blobs (_data, _idx)
            # depend on how the index was built, so they are compared through MATCH below instead.
            if _type != "table" or (sql or "").upper().startswith("CREATE VIRTUAL"):
                continue
            if name.endswith(("_fts_data", "_fts_idx", "_words_data", "_words_idx")):
                continue
            # schema_version stamps when each file was upgraded, and the two files are upgraded
            # moments apart: only its versions are the load's business.
            columns = "version" if name == "schema_version" else "*"
            table_rows = conn.exec_driver_sql(f"SELECT {columns} FROM {name}").all()  # noqa: S608
            out[name] = sorted((tuple(r) for r in table_rows), key=repr)
        for table in ("memories_fts", "memories_words"):
            conn.exec_driver_sql(f"INSERT INTO {table} ({table}) VALUES ('integrity-check')")
            terms = [*WORDS, "ard", "cof", "本", "runn", "京", "#1", "#12"]
            for term in terms:
                query = json.dumps(term)  # a quoted FTS5 string: any text is a phrase
                rows = conn.exec_driver_sql(
                    f"SELECT rowid, round(bm25({table}), 9) FROM {table} WHERE {table} MATCH ? ORDER BY rowid",
                    (query,),
                ).all()
                out[f"{table} {term}"] = rows
    return out


@pytest.fixture
def rows():
    return _rows(420)


def test_bulk_load_writes_what_the_store_insert_writes(tmp_path, rows):
    slow = _by_row_path(tmp_path / "rows.db", rows)
    fast = _by_bulk_path(tmp_path / "bulk.db", rows)
    try:
        expected, got = _snapshot(slow), _snapshot(fast)
        assert len(expected["memories"]) == len(rows)
        assert len(expected["memories_coarse"]) == sum(
            1 for r in rows if r["embedding"] is not None and len(r["embedding"]) % 32 == 0
        )
        assert any(v for k, v in expected.items() if k.startswith("memories_fts ")), "the terms must match rows"
        assert set(got) == set(expected)
        for key in expected:
            assert got[key] == expected[key], key
        # After the load every trigger is back: a later store through the normal path keeps every index in step.
        extra = _rows(430)[420:]
        for db in (slow, fast):
            with db.write_connection() as conn:
                for row in extra:
                    insert_memory(conn, dict(row))
        assert _snapshot(fast) == _snapshot(slow)
    finally:
        slow.close()
        fast.close()
