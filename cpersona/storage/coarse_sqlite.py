"""The coarse vector index over SQLite: one sign bit per dimension, scanned by Hamming distance.

The exact scan (``vectors_sqlite``) ranks float32 cosines over the newest
``CPERSONA_MAX_MEMORIES`` rows; beyond that window (the far list, spec VEC-7)
it would have to read every float vector of the scope, ~1.5 KB a row at
384-d. ``memories_coarse`` / ``episodes_coarse`` hold each vector's sign bits
(``vec_quantize_binary``: 48 bytes at 384-d) next to copies of the columns the
isolation predicate and the scan order read, so the far list is one
sequential walk of a narrow table: the best few hundred rows by Hamming
distance come out of it, and only they are re-ranked by the exact cosine of
their float vectors (read by primary key).

Kept in step by TEMP triggers that each of our connections creates for
itself (:func:`refresh_triggers`, called by storage/engine.py where sqlite-vec
is loaded), so no write path of ours — store, edit, delete, merge, import,
backfill, repair, a cleared identity, raw SQL — can forget it: an insert or
update of a row with a quantisable vector writes its coarse row, an update or
delete removes the old one. The triggers call ``vec_quantize_binary``, so they
are never stored in the file: a stored trigger that calls an extension
function makes every write to its table fail for a writer without the
extension (the ``sqlite3`` shell, CPersona 2.6), since SQLite resolves the
trigger's functions when it prepares the statement. Writes made by such
writers leave the index behind; it is a rebuildable cache, brought back in
step by :func:`reconcile` (at start, and by the ``coarse_index`` health
check), and the far list re-reads and re-tests the real row, so a stale copy
costs a candidate place, never a wrong answer.

A vector is quantisable when it is a blob of 8k float32 (``length % 32 = 0``);
other widths have no coarse row and the far list falls back to the exact
scan for queries of such a width (``quantisable``).

The tables are WITHOUT ROWID with the key (agent_id, created_at DESC, id):
one agent's rows sit together in scan order (created_at desc, id asc, the
order of VEC-2), so a window of scan positions is a contiguous range and the
isolation predicates run inside the walk, on the copied columns (spec ISO-2).
"""

from __future__ import annotations

import logging
from typing import Any

from sqlalchemy import Connection, TextClause, text

from cpersona.storage.search import Kind

log = logging.getLogger(__name__)

# Candidates taken from the Hamming ranking for each exact re-rank: at least
# this many, and at least CANDIDATE_FACTOR per row asked for. Measured with
# bench/coarse_overlap.py (MiniLM vectors of LoCoMo turns; see docs/benchmarks.md).
MIN_CANDIDATES = 400
CANDIDATE_FACTOR = 20

_QUANTISABLE = "typeof({v}) = 'blob' AND length({v}) > 0 AND length({v}) % 32 = 0"
_SOURCE_KEY = "CAST(CASE WHEN json_valid({r}.source) THEN json_extract({r}.source, '$.id') END AS TEXT)"

TABLES_DDL = (
    """CREATE TABLE IF NOT EXISTS memories_coarse (
  agent_id   TEXT NOT NULL,
  created_at TEXT NOT NULL,
  id         INTEGER NOT NULL,
  project_id TEXT NOT NULL,
  channel    TEXT NOT NULL,
  source_key TEXT,
  bits       BLOB NOT NULL,
  PRIMARY KEY (agent_id, created_at DESC, id)) WITHOUT ROWID""",
    """CREATE TABLE IF NOT EXISTS episodes_coarse (
  agent_id   TEXT NOT NULL,
  created_at TEXT NOT NULL,
  id         INTEGER NOT NULL,
  project_id TEXT NOT NULL,
  channel    TEXT NOT NULL,
  bits       BLOB NOT NULL,
  PRIMARY KEY (agent_id, created_at DESC, id)) WITHOUT ROWID""",
)
TABLE_NAMES = ("memories_coarse", "episodes_coarse")

# NOT NULL columns of the coarse key: the v13 layout declares them NOT NULL too,
# COALESCE only keeps a foreign file with NULLs from refusing the write.
_MEM_VALUES = (
    "COALESCE({r}.agent_id, ''), COALESCE({r}.created_at, ''), {r}.id, COALESCE({r}.project_id, ''), "
    "COALESCE({r}.channel, ''), " + _SOURCE_KEY + ", vec_quantize_binary({r}.embedding)"
)
_EP_VALUES = (
    "COALESCE({r}.agent_id, ''), COALESCE({r}.created_at, ''), {r}.id, COALESCE({r}.project_id, ''), "
    "COALESCE({r}.channel, ''), vec_quantize_binary({r}.embedding)"
)
_COLUMNS = {"memories": _MEM_VALUES, "episodes": _EP_VALUES}
_WATCHED = {
    "memories": "embedding, agent_id, created_at, project_id, channel, source",
    "episodes": "embedding, agent_id, created_at, project_id, channel",
}


def _triggers(table: str) -> tuple[str, ...]:
    # TEMP, on main's table: lives in this connection only, never in the file's schema. Inside a
    # trigger the modified table must be unqualified; it resolves to main's (no temp table has the name).
    coarse = f"{table}_coarse"
    delete_old = (
        f"DELETE FROM {coarse} WHERE agent_id = COALESCE(old.agent_id, '') "
        f"AND created_at = COALESCE(old.created_at, '') AND id = old.id;"
    )
    insert_new = f"INSERT OR REPLACE INTO {coarse} SELECT {_COLUMNS[table].format(r='new')} WHERE {_QUANTISABLE.format(v='new.embedding')};"  # noqa: E501
    return (
        f"CREATE TEMP TRIGGER IF NOT EXISTS {coarse}_ai AFTER INSERT ON main.{table} BEGIN\n  {insert_new}\nEND",
        f"CREATE TEMP TRIGGER IF NOT EXISTS {coarse}_ad AFTER DELETE ON main.{table} BEGIN\n  {delete_old}\nEND",
        f"CREATE TEMP TRIGGER IF NOT EXISTS {coarse}_au AFTER UPDATE OF {_WATCHED[table]} ON main.{table} BEGIN\n"
        f"  {delete_old}\n  {insert_new}\nEND",
    )


TEMP_TRIGGERS_DDL = (*_triggers("memories"), *_triggers("episodes"))
TRIGGER_NAMES = tuple(f"{t}_coarse_{e}" for t in ("memories", "episodes") for e in ("ai", "ad", "au"))


def refresh_triggers(dbapi_conn: Any, info: dict[str, Any]) -> None:
    """Give this connection the TEMP triggers while main holds the coarse tables, drop them once it does not.

    Called at every checkout; ``info`` is the pooled connection's own dict. The
    file's ``schema_version`` moves with every schema change (a migration on
    another connection too), so the check costs one pragma while nothing changed.
    """
    version = dbapi_conn.execute("PRAGMA main.schema_version").fetchone()[0]
    if info.get("coarse_schema") == version:
        return
    marks = ", ".join("?" for _ in TABLE_NAMES)
    present = dbapi_conn.execute(
        f"SELECT count(*) FROM main.sqlite_master WHERE type = 'table' AND name IN ({marks})", TABLE_NAMES
    ).fetchone()[0] == len(TABLE_NAMES)
    for name in TRIGGER_NAMES:
        dbapi_conn.execute(f"DROP TRIGGER IF EXISTS temp.{name}")
    if present:
        for ddl in TEMP_TRIGGERS_DDL:
            dbapi_conn.execute(ddl)
    info["coarse_schema"] = version


# Rows stored before the index existed (revision 0007).
BACKFILL = tuple(
    f"INSERT OR REPLACE INTO {t}_coarse SELECT {_COLUMNS[t].format(r=t)} FROM {t} "
    f"WHERE {_QUANTISABLE.format(v=f'{t}.embedding')}"
    for t in ("memories", "episodes")
)


def backfill_range(table: str) -> TextClause:
    """What the insert trigger writes, for the rows with ``:lo <= id < :hi`` at once (bulk_load)."""
    return text(
        f"INSERT OR REPLACE INTO {table}_coarse SELECT {_COLUMNS[table].format(r=table)} FROM {table} "
        f"WHERE {table}.id >= :lo AND {table}.id < :hi AND {_QUANTISABLE.format(v=f'{table}.embedding')}"
    )


# -- drift left by writers without our triggers ------------------------------------------------

_COPIED = {
    "memories": ("agent_id", "created_at", "id", "project_id", "channel", "source_key", "bits"),
    "episodes": ("agent_id", "created_at", "id", "project_id", "channel", "bits"),
}


def _stale(table: str) -> str:
    """Coarse rows that are not exactly what the row's own columns give (gone, moved, re-embedded)."""
    values = [v.strip() for v in _split(_COLUMNS[table].format(r="r"))]
    same = " AND ".join(f"c.{col} IS {value}" for col, value in zip(_COPIED[table], values))
    return (
        f"FROM {table}_coarse c WHERE NOT EXISTS (SELECT 1 FROM {table} r WHERE r.id = c.id "
        f"AND {_QUANTISABLE.format(v='r.embedding')} AND {same})"
    )


def _missing(table: str) -> str:
    """Rows with a quantisable vector and no coarse row under their key (by primary key, no scan)."""
    return (
        f"FROM {table} r WHERE {_QUANTISABLE.format(v='r.embedding')} AND NOT EXISTS ("
        f"SELECT 1 FROM {table}_coarse c WHERE c.agent_id = COALESCE(r.agent_id, '') "
        f"AND c.created_at = COALESCE(r.created_at, '') AND c.id = r.id)"
    )


def _split(values: str) -> list[str]:
    """The top-level comma-separated expressions of a VALUES list."""
    out, depth, start = [], 0, 0
    for i, ch in enumerate(values):
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            out.append(values[start:i])
            start = i + 1
    return [*out, values[start:]]


def present(conn: Connection) -> bool:
    found = conn.execute(
        text(
            "SELECT count(*) FROM main.sqlite_master WHERE type = 'table' AND name IN "
            "('memories_coarse', 'episodes_coarse')"
        )
    ).scalar()
    return found == len(TABLE_NAMES)


def drift(conn: Connection) -> dict[str, dict[str, int]]:
    """{table: {"stale": n, "missing": n}} for every table out of step; {} when the index is in step."""
    out: dict[str, dict[str, int]] = {}
    for table in ("memories", "episodes"):
        stale = conn.execute(text(f"SELECT count(*) {_stale(table)}")).scalar() or 0
        missing = conn.execute(text(f"SELECT count(*) {_missing(table)}")).scalar() or 0
        if stale or missing:
            out[table] = {"stale": int(stale), "missing": int(missing)}
    return out


def reconcile(conn: Connection) -> dict[str, dict[str, int]]:
    """Bring the index back in step inside the caller's write transaction; what was found out of step."""
    found = drift(conn)
    for table in found:
        conn.execute(
            text(
                f"DELETE FROM {table}_coarse WHERE (agent_id, created_at, id) IN "
                f"(SELECT c.agent_id, c.created_at, c.id {_stale(table)})"
            )
        )
        conn.execute(
            text(f"INSERT OR REPLACE INTO {table}_coarse SELECT {_COLUMNS[table].format(r='r')} {_missing(table)}")
        )
    return found


_TABLES: dict[str, tuple[str, str]] = {"mem": ("memories", "m"), "ep": ("episodes", "e")}


def quantisable(query: bytes) -> bool:
    """Whether a query of this byte length has coarse rows to be compared with."""
    return len(query) > 0 and len(query) % 32 == 0


def query_bits(query: bytes) -> bytes:
    """``vec_quantize_binary`` of a float32 query, computed here: bound as a parameter, the
    statement's per-row work is one ``vec_bit`` and one Hamming distance (a query quantised
    inside the statement cost ~45% more CPU per row at 100k rows)."""
    import numpy as np

    return np.packbits(np.frombuffer(query, dtype="<f4") > 0, bitorder="little").tobytes()


def candidates(depth: int) -> int:
    return max(MIN_CANDIDATES, depth * CANDIDATE_FACTOR)


def far_statement(kind: Kind, coarse_where: str, where: str) -> TextClause:
    """Coarse walk of the window, then exact re-rank of its best candidates.

    ``coarse_where`` is the isolation text over alias ``c`` (the coarse copy of
    the columns), ``where`` the same over the row's own alias: the re-rank
    reads the row by id and tests it again, so a row that moved out of scope
    between the two never comes back. Parameters: those of
    ``vectors_sqlite.scan_parameters`` plus ``:qbits`` (:func:`query_bits`), ``:nbits``
    (bit blob length) and ``:k`` (candidates). Result rows: ``id``, ``cosine``.
    """
    table, alias = _TABLES[kind]
    return text(
        "WITH win AS ("
        f"  SELECT c.id AS id, c.created_at AS created_at, c.bits AS bits FROM {table}_coarse c"
        f"  WHERE {coarse_where} AND length(c.bits) = :nbits"
        "   ORDER BY c.created_at DESC, c.id ASC LIMIT :span OFFSET :start),"
        " cand AS ("
        "  SELECT win.id AS id FROM win"
        "  ORDER BY vec_distance_hamming(vec_bit(win.bits), vec_bit(:qbits)), win.created_at DESC, win.id ASC"
        "  LIMIT :k)"
        " SELECT r.id, r.cosine FROM ("
        f"  SELECT {alias}.id AS id, {alias}.created_at AS created_at,"
        f"  1.0 - vec_distance_cosine({alias}.embedding, :q) AS cosine"
        f"  FROM cand JOIN {table} {alias} ON {alias}.id = cand.id"
        f"  WHERE {where} AND typeof({alias}.embedding) = 'blob' AND length({alias}.embedding) = :nbytes"
        " ) r WHERE r.cosine >= :threshold"
        " ORDER BY r.cosine DESC, r.created_at DESC, r.id ASC LIMIT :depth"
    )


def reconcile_database(db: Any) -> dict[str, dict[str, int]]:
    """:func:`reconcile` for a whole database, the write lock taken only when a read found drift.

    The start-up pass (cpersona/background.py): the counting read walks both
    indexes without the lock, so a file in step costs other writers nothing.
    """
    if not db.is_sqlite or db.read_only is not None:
        return {}
    with db.read() as session:
        conn = session.connection()
        if not present(conn) or not drift(conn):
            return {}
    with db.write_connection() as conn:
        found = reconcile(conn)
    if found:
        log.info("coarse vector index brought back in step with rows written without it: %s", found)
    return found
