"""The vector scan over PostgreSQL: pgvector when the server has it, numpy otherwise.

Vectors stay where every writer puts them: ``memories.embedding`` /
``episodes.embedding``, little-endian float32 BYTEA (spec VF-5). When the
server offers the ``vector`` extension, :func:`ensure_vector_columns` (run at
every start, under the writer lock, after Alembic) adds a derived column
``embedding_vec vector`` to both tables, fills it from the blobs and installs a
BEFORE INSERT / UPDATE OF embedding trigger that keeps it equal to the blob.
Being derived in the database, the column cannot fall out of step whichever
writer (services, import, merge, raw SQL) touched the row, and services never
know it exists. It is not an Alembic revision because whether it can exist
depends on the server, not on the schema history: a server that gains pgvector
later gets the column at the next start, one that loses it falls back.

The column has no fixed dimension (widths vary by model). A blob that is not a
whole number of floats, holds a non-finite value or is all zeros derives NULL:
pgvector refuses the first two, and the cosine of a zero vector is undefined,
which is what sqlite-vec's NULL means on SQLite.

Both scans have the semantics of :mod:`cpersona.storage.vectors_sqlite`: the
window is positions [start, stop) of the scope's rows that carry a blob of the
query's byte length (isolation inside the scan, spec ISO-2; width filter,
VEC-3), newest first (created_at desc, id asc); rows under the threshold are
dropped; the best ``depth`` come back ordered by (cosine desc, scan position).
The width filter reads the blob, not the vector, so a row whose vector is NULL
still takes its place in the window and ranks nowhere, as on SQLite.

Why not an HNSW / IVFFlat index: approximate indexes pick neighbours before any
WHERE, so the scope and the newest-N window would silently return too few rows
(the same reason SQLite does not use vec0). The scan is exact.
"""

from __future__ import annotations

import logging
import weakref
from typing import Any

import numpy as np
from sqlalchemy import Connection, text
from sqlalchemy.dialects.postgresql.base import ischema_names
from sqlalchemy.exc import DBAPIError
from sqlalchemy.types import UserDefinedType

from cpersona.embedding.vectors import FLOAT32
from cpersona.storage.engine import Database
from cpersona.storage.search import Kind

log = logging.getLogger(__name__)

VECTOR_COLUMN = "embedding_vec"
VECTOR_TABLES = ("memories", "episodes")
VECTOR_CHUNK_ROWS = 2048  # rows per fetch of the numpy scan: bounds memory, not the answer

_TABLES: dict[str, tuple[str, str]] = {"mem": ("memories", "m"), "ep": ("episodes", "e")}


class PgVectorType(UserDefinedType):
    """pgvector's ``vector``, named so that reflecting a table that has the column stays quiet."""

    cache_ok = True

    def get_col_spec(self, **kw: Any) -> str:
        return "vector"


# Table inspection (portability's layout check, Alembic's comparison) would
# otherwise warn "Did not recognize type 'vector'" on every run.
ischema_names.setdefault("vector", PgVectorType)

# float32 little-endian blob -> vector, exactly: each value is rebuilt from its
# sign, exponent and mantissa bits in float8 (exact for every float32) and cast
# to real. NULL for a blob pgvector cannot hold or whose cosine is undefined.
DECODE_FUNCTION_DDL = """CREATE OR REPLACE FUNCTION cpersona_vector(blob bytea) RETURNS vector
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
  SELECT CASE
    WHEN length(blob) = 0 OR mod(length(blob), 4) <> 0 THEN NULL
    WHEN bool_or((f.bits >> 23) & 255 = 255) OR bool_and(f.bits & 2147483647 = 0) THEN NULL
    -- The aggregate is computed even when an earlier branch is taken, so
    -- infinities and NaNs (exponent 255) must not reach the cast to real.
    ELSE array_agg(
      ((1 - 2 * (f.bits >> 31)) * CASE (f.bits >> 23) & 255
        WHEN 255 THEN 0
        WHEN 0 THEN (f.bits & 8388607) * power(2::float8, -149)
        ELSE ((f.bits & 8388607) + 8388608) * power(2::float8, ((f.bits >> 23) & 255) - 150) END)::real
      ORDER BY f.i)::vector
  END
  FROM (SELECT i, (get_byte(blob, i + 3)::bigint << 24) | (get_byte(blob, i + 2) << 16)
                  | (get_byte(blob, i + 1) << 8) | get_byte(blob, i) AS bits
        FROM generate_series(0, length(blob) - 4, 4) AS i) f
$$"""

SYNC_FUNCTION_DDL = f"""CREATE OR REPLACE FUNCTION cpersona_sync_vector() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  NEW.{VECTOR_COLUMN} := cpersona_vector(NEW.embedding);
  RETURN NEW;
END $$"""


def _trigger_name(table: str) -> str:
    return f"{table}_{VECTOR_COLUMN}_sync"


def has_column(conn: Connection, table: str, column: str = VECTOR_COLUMN) -> bool:
    sql = text(
        "SELECT 1 FROM information_schema.columns WHERE table_schema = current_schema()"
        " AND table_name = :table AND column_name = :column"
    )
    return conn.execute(sql, {"table": table, "column": column}).first() is not None


def ensure_vector_columns(conn: Connection) -> bool:
    """Install (or repair) the derived vector columns; True when pgvector serves the scan.

    ``conn`` holds the writer lock inside a transaction. Without the extension
    nothing is created, and triggers left by a database whose extension was
    dropped are removed, so writes keep working and the scan falls back.
    """
    installed = conn.exec_driver_sql("SELECT 1 FROM pg_extension WHERE extname = 'vector'").first()
    if installed is None:
        available = conn.exec_driver_sql("SELECT 1 FROM pg_available_extensions WHERE name = 'vector'").first()
        if available is not None:
            try:
                with conn.begin_nested():
                    conn.exec_driver_sql("CREATE EXTENSION IF NOT EXISTS vector")
                installed = True
            except DBAPIError as exc:  # e.g. a role that may not create extensions
                log.warning(
                    "pgvector is installed on the server but this role cannot enable it (%s); vectors rank "
                    "in-process until CREATE EXTENSION vector is run in this database",
                    exc.orig,
                )
    if installed is None:
        for table in VECTOR_TABLES:
            conn.exec_driver_sql(f"DROP TRIGGER IF EXISTS {_trigger_name(table)} ON {table}")
        return False
    conn.exec_driver_sql(DECODE_FUNCTION_DDL)
    conn.exec_driver_sql(SYNC_FUNCTION_DDL)
    for table in VECTOR_TABLES:
        added = not has_column(conn, table)
        if added:
            conn.exec_driver_sql(f"ALTER TABLE {table} ADD COLUMN {VECTOR_COLUMN} vector")
        # Kept in the row (pgvector's default, EXTERNAL, moves it out of line next
        # to the blob once a row passes ~2 kB, as a 384-d row does): the scan reads
        # every vector of the window, and a TOAST fetch each doubled its time at
        # 10k rows. The blob, EXTENDED, goes out of line instead; the scan only
        # reads its length, which needs no fetch. Rows written before keep their
        # layout until rewritten.
        storage = conn.execute(
            text("SELECT attstorage FROM pg_attribute WHERE attrelid = CAST(:table AS regclass) AND attname = :column"),
            {"table": table, "column": VECTOR_COLUMN},
        ).scalar_one()
        if storage != "m":  # ALTER takes a table lock: only when it changes something
            conn.exec_driver_sql(f"ALTER TABLE {table} ALTER COLUMN {VECTOR_COLUMN} SET STORAGE MAIN")
        conn.exec_driver_sql(
            f"CREATE OR REPLACE TRIGGER {_trigger_name(table)} BEFORE INSERT OR UPDATE OF embedding"
            f" ON {table} FOR EACH ROW EXECUTE FUNCTION cpersona_sync_vector()"
        )
        if added:
            conn.exec_driver_sql(
                f"UPDATE {table} SET {VECTOR_COLUMN} = cpersona_vector(embedding) WHERE embedding IS NOT NULL"
            )
    return True


_served_by_pgvector: weakref.WeakKeyDictionary[Database, bool] = weakref.WeakKeyDictionary()


def pgvector_serves(db: Database) -> bool:
    """Whether ``db``'s tables carry the derived vector columns (looked up once per Database)."""
    known = _served_by_pgvector.get(db)
    if known is None:
        with db.read() as session:
            conn = session.connection()
            known = all(has_column(conn, table) for table in VECTOR_TABLES)
        _served_by_pgvector[db] = known
    return known


def _window_where(alias: str, where: str) -> str:
    return f"{where} AND {alias}.embedding IS NOT NULL AND octet_length({alias}.embedding) = :nbytes"


def pgvector_scan_statement(kind: Kind, where: str) -> Any:
    """The ranked window scan run by pgvector; same parameters and rows as SQLite's.

    Parameters: ``:qv`` (the query as pgvector text), ``:nbytes``, ``:start``,
    ``:span``, ``:threshold``, ``:depth`` and the ones ``where`` binds.
    """
    table, alias = _TABLES[kind]
    return text(
        "SELECT w.id, w.cosine FROM ("
        f" SELECT {alias}.id AS id, {alias}.created_at AS created_at,"
        f" 1.0 - ({alias}.{VECTOR_COLUMN} <=> CAST(:qv AS vector)) AS cosine"
        f" FROM {table} {alias} WHERE {_window_where(alias, where)}"
        f" ORDER BY {alias}.created_at DESC, {alias}.id ASC LIMIT :span OFFSET :start"
        # PostgreSQL sorts NaN above every number, so it must be refused by name.
        ") w WHERE w.cosine >= :threshold AND w.cosine <> 'NaN'::float8"
        " ORDER BY w.cosine DESC, w.created_at DESC, w.id ASC LIMIT :depth"
    )


def vector_text(query: bytes) -> str:
    """The float32 blob as pgvector's text form; repr round-trips every float32 exactly."""
    return "[" + ",".join(repr(float(v)) for v in np.frombuffer(query, dtype=FLOAT32)) + "]"


def pgvector_scan(
    session: Any, kind: Kind, where: str, params: dict[str, Any], query: bytes
) -> list[tuple[float, int]]:
    """(cosine, id) of the window's best rows, ranked inside PostgreSQL."""
    rows = session.execute(pgvector_scan_statement(kind, where), {**params, "qv": vector_text(query)})
    return [(float(r.cosine), r.id) for r in rows]


def numpy_scan(session: Any, kind: Kind, where: str, params: dict[str, Any], query: bytes) -> list[tuple[float, int]]:
    """(cosine, id) of the window's best rows, ranked in-process over chunks of blobs."""
    table, alias = _TABLES[kind]
    sql = text(
        f"SELECT {alias}.id, {alias}.embedding FROM {table} {alias} WHERE {_window_where(alias, where)}"
        f" ORDER BY {alias}.created_at DESC, {alias}.id ASC LIMIT :span OFFSET :start"
    )
    q = np.frombuffer(query, dtype=FLOAT32).astype(np.float64)
    q /= np.linalg.norm(q)
    scored: list[tuple[float, int, int]] = []  # (cosine, scan position, id)
    position = 0
    result = session.execute(sql, params)
    while chunk := result.fetchmany(VECTOR_CHUNK_ROWS):
        matrix = np.frombuffer(b"".join(bytes(r.embedding) for r in chunk), dtype=FLOAT32)
        matrix = matrix.reshape(len(chunk), -1).astype(np.float64)
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            cosines = (matrix @ q) / np.linalg.norm(matrix, axis=1)
        for offset, (row, cosine) in enumerate(zip(chunk, cosines)):
            # NaN (zero or non-finite stored vector) fails every threshold, as on SQLite.
            if np.isfinite(cosine) and cosine >= params["threshold"]:
                scored.append((float(cosine), position + offset, row.id))
        position += len(chunk)
    scored.sort(key=lambda s: (-s[0], s[1]))
    return [(cosine, row_id) for cosine, _, row_id in scored[: params["depth"]]]
