"""A bulk load of memory rows into a SQLite file: the same rows a per-row insert writes, ~10-50x faster.

For benchmarks that need 1M rows (bench/scale.py, issue 17 item 5), not for a
file a server has open: while it runs, the file's insert triggers and the
memories table's secondary indexes are dropped (another process writing then
would leave the full-text indexes behind), and its rows are committed in large
batches (a crash mid-load leaves a half-built file;
the load is re-run from scratch anyway; in WAL mode with ``synchronous=NORMAL``
commits do not fsync, so that PRAGMA is left alone).

What it does instead of a row-at-a-time insert with every trigger live:

- the rows go in with ``executemany``, one transaction per ``batch_rows``;
- the two full-text indexes (FTS5 trigram ``memories_fts`` and the word
  index ``memories_words``) are not fed row by row by their AFTER INSERT
  triggers: each is rebuilt in one pass at the end (``'rebuild'``, which reads
  the content table), and the triggers are put back exactly as the file
  declared them (their ``sqlite_master.sql``);
- the memories table's secondary indexes are dropped and created again at the
  end from their own DDL (a sorted build instead of ~1M random B-tree inserts
  into the dedup index on content);
- the coarse index (coarse_sqlite) is written per batch with the very
  expression its TEMP trigger uses, over the batch's id range, so its rows are
  the ones the trigger would have written.

The result is the same rows in every table, the same schema, and the same
full-text matches as the per-row path (tests/test_bulk_load.py compares them).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy import text

from cpersona.storage import coarse_sqlite

# The memories columns a bulk load may set; the rest take their defaults as in a store.
COLUMNS = ("agent_id", "project_id", "msg_id", "content", "source", "timestamp", "metadata", "embedding", "channel")
# AFTER INSERT triggers that feed the full-text indexes; rebuilt in one pass instead.
_FTS_INSERT_TRIGGERS = ("memories_fts_ai", "memories_words_ai")
_FTS_TABLES = ("memories_fts", "memories_words")


def _saved_sql(conn: Any, kind: str, names: Sequence[str] | None = None, table: str | None = None) -> list[tuple]:
    sql = "SELECT name, sql FROM main.sqlite_master WHERE type = :kind AND sql IS NOT NULL"
    params: dict[str, Any] = {"kind": kind}
    if table is not None:
        sql += " AND tbl_name = :table"
        params["table"] = table
    rows = [tuple(r) for r in conn.execute(text(sql + " ORDER BY name"), params)]
    return [r for r in rows if names is None or r[0] in names]


def load_memories(db: Any, batches: Iterable[Sequence[dict[str, Any]]], *, batch_rows: int = 50_000) -> int:
    """Insert every row of ``batches`` (dicts over :data:`COLUMNS`, plus ``created_at``) into memories; rows written.

    ``db`` is a SQLite :class:`cpersona.storage.engine.Database` that no other
    connection is writing. Rows are inserted in the order given, so ids follow it.
    """
    if not db.is_sqlite:
        raise ValueError("bulk_load is for SQLite files")
    written = 0
    with db.write_batches(rows=batch_rows) as load:
        conn = load.connection
        raw = conn.connection.dbapi_connection
        # synchronous stays NORMAL: in WAL mode a commit does not fsync (only checkpoints do), and
        # SQLite refuses to change it inside the batch's transaction anyway.
        saved = {p: raw.execute(f"PRAGMA {p}").fetchone()[0] for p in ("cache_size",)}
        raw.execute("PRAGMA cache_size=-524288")  # 512 MiB while the indexes are built; put back below
        try:
            triggers = _saved_sql(conn, "trigger", _FTS_INSERT_TRIGGERS)
            indexes = _saved_sql(conn, "index", table="memories")
            for name, _sql in triggers:
                conn.exec_driver_sql(f"DROP TRIGGER {name}")
            for name, _sql in indexes:
                conn.exec_driver_sql(f"DROP INDEX {name}")
            # This connection's TEMP coarse trigger is replaced by one statement per batch (below).
            conn.exec_driver_sql("DROP TRIGGER IF EXISTS temp.memories_coarse_ai")
            coarse = coarse_sqlite.present(conn)
            columns = (*COLUMNS, "created_at")
            insert_sql = f"INSERT INTO memories ({', '.join(columns)}) VALUES ({', '.join('?' for _ in columns)})"  # noqa: S608
            defaults = {"project_id": "", "msg_id": "", "source": "{}", "metadata": "{}", "channel": ""}
            for batch in batches:
                if not batch:
                    continue
                first = raw.execute("SELECT coalesce(max(id), 0) + 1 FROM memories").fetchone()[0]
                raw.executemany(insert_sql, [tuple(row.get(c, defaults.get(c)) for c in columns) for row in batch])
                if coarse:
                    conn.execute(coarse_sqlite.backfill_range("memories"), {"lo": first, "hi": first + len(batch)})
                written += len(batch)
                load.tick(len(batch))
            for _name, sql in indexes:
                conn.exec_driver_sql(sql)
            for table in _FTS_TABLES:
                conn.exec_driver_sql(f"INSERT INTO {table} ({table}) VALUES ('rebuild')")  # noqa: S608
            for _name, sql in triggers:
                conn.exec_driver_sql(sql)
        finally:
            for pragma, value in saved.items():
                raw.execute(f"PRAGMA {pragma}={value}")
            # Dropped/created triggers moved schema_version: the next checkout re-creates the TEMP ones.
            conn.connection.info.pop("coarse_schema", None)
    return written
