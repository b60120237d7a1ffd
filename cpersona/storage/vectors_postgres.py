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

At scale the window goes through an HNSW index instead (:func:`hnsw_scan`):
one partial expression index per vector width (pgvector indexes only
fixed-width columns), ``vector_cosine_ops``, created at start for the common
widths and for each width the newest rows use, when the server is set to read
a far list (CPERSONA_VECTOR_REACH above CPERSONA_MAX_MEMORIES): an HNSW index
costs every write of a vector, and only the far list of a large store uses it. An approximate index picks neighbours before any WHERE, so
the scope and the window would silently return too few rows; pgvector 0.8's
iterative scan (``hnsw.iterative_scan``) keeps walking the graph until enough
rows pass the filter, the window's edges are turned into a (created_at, id)
range first, and a scan that still comes back short, or a window of fewer than
:data:`HNSW_MIN_ROWS` rows, is answered by the exact scan. The index's
candidates are re-ranked by their exact cosine, in the exact scan's order.
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
    """pgvector's ``vector``, named so that reflecting a table that has the column stays quiet.

    Bound values are pgvector's text form (:func:`vector_value`), which the
    server reads into the column's type.
    """

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

# A writer of ours sends the vector with the blob (:func:`vector_value`), which
# saves the SQL decode (~0.6 ms a 384-d row, most of a bulk insert's cost).
# Any other write derives it here, so the column cannot fall out of step with
# a writer that does not know it: an insert without it, an update that
# changes the blob and leaves the vector as it was. A vector is taken as sent
# only when its width is the blob's.
SYNC_FUNCTION_DDL = f"""CREATE OR REPLACE FUNCTION cpersona_sync_vector() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  IF NEW.{VECTOR_COLUMN} IS NOT NULL AND NEW.embedding IS NOT NULL
     AND vector_dims(NEW.{VECTOR_COLUMN}) * 4 = length(NEW.embedding)
     AND (TG_OP = 'INSERT' OR NEW.{VECTOR_COLUMN} IS DISTINCT FROM OLD.{VECTOR_COLUMN}) THEN
    RETURN NEW;
  END IF;
  NEW.{VECTOR_COLUMN} := cpersona_vector(NEW.embedding);
  RETURN NEW;
END $$"""


# Widths given an HNSW index whether or not rows of them exist yet (a partial
# index over no rows costs a write nothing): the usual embedding models'.
HNSW_WIDTHS = (384, 512, 768, 1024, 1536)
HNSW_MAX_DIMENSIONS = 2000  # pgvector's limit for an HNSW index on vector
# Windows with fewer rows than this are scanned exactly. The default near
# window (CPERSONA_MAX_MEMORIES, 10,000) stays below it: at 10k rows the exact
# scan costs about what the index does with enough candidates for the same
# answer (stub vectors, docs/benchmarks.md), so the index serves the far list
# of a large store, where an exact scan reads every vector of the scope.
HNSW_MIN_ROWS = 20_000
# Candidates asked of the index per exact re-rank (hnsw.ef_search is this):
# the coarse index's rule on SQLite (coarse_sqlite.candidates), within
# pgvector's ceiling for ef_search.
HNSW_MAX_CANDIDATES = 1000
# Index tuples one filtered scan may visit before giving up (then: the exact scan).
HNSW_MAX_SCAN_TUPLES = 40000


def hnsw_index_name(table: str, width: int) -> str:
    return f"{table}_{VECTOR_COLUMN}_hnsw_{width}"


def window_index_name(table: str, width: int) -> str:
    return f"{table}_vector_window_{width}"


def is_vector_index(name: str) -> bool:
    """Whether ``name`` is one of :func:`ensure_hnsw_indexes`' indexes (derived, like the column)."""
    return any(
        name.startswith(made(table, 0)[:-1]) and name[len(made(table, 0)) - 1 :].isdigit()
        for table in VECTOR_TABLES
        for made in (hnsw_index_name, window_index_name)
    )


def _width_literal(alias: str, where: str, width: int) -> str:
    """The window predicate with the width as a literal, so the partial indexes of that width apply."""
    return f"{where} AND octet_length({alias}.embedding) = {4 * int(width)}"


def _trigger_name(table: str) -> str:
    return f"{table}_{VECTOR_COLUMN}_sync"


def has_column(conn: Connection, table: str, column: str = VECTOR_COLUMN) -> bool:
    sql = text(
        "SELECT 1 FROM information_schema.columns WHERE table_schema = current_schema()"
        " AND table_name = :table AND column_name = :column"
    )
    return conn.execute(sql, {"table": table, "column": column}).first() is not None


def ensure_vector_columns(conn: Connection, *, hnsw: bool = False) -> bool:
    """Install (or repair) the derived vector columns; True when pgvector serves the scan.

    ``hnsw``: also :func:`ensure_hnsw_indexes` (kept once built: drop them by
    name to stop paying for them on writes).

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
        # With the vector in the row, a row passes ~2 kB and PostgreSQL's toaster
        # shrinks it by compressing the EXTENDED columns, then moving the largest
        # out of line. A blob that compresses (sparse vectors do) then stays in
        # the row while the text and its tsvector go out of line, and every
        # keyword candidate's ILIKE recheck fetched its text from TOAST (~3
        # buffers a row; at 100k rows 4k candidates cost 200 ms). EXTERNAL: the
        # blob is never compressed (float vectors seldom shrink; a write skips
        # the attempt) and is the first column moved out, so the text stays.
        blob = conn.execute(
            text(
                "SELECT attstorage FROM pg_attribute WHERE attrelid = CAST(:table AS regclass) AND attname = 'embedding'"
            ),
            {"table": table},
        ).scalar_one()
        if blob != "e":
            conn.exec_driver_sql(f"ALTER TABLE {table} ALTER COLUMN embedding SET STORAGE EXTERNAL")
        _ensure_toast_target(conn, table)
        conn.exec_driver_sql(
            f"CREATE OR REPLACE TRIGGER {_trigger_name(table)} BEFORE INSERT OR UPDATE OF embedding"
            f" ON {table} FOR EACH ROW EXECUTE FUNCTION cpersona_sync_vector()"
        )
        if added:
            conn.exec_driver_sql(
                f"UPDATE {table} SET {VECTOR_COLUMN} = cpersona_vector(embedding) WHERE embedding IS NOT NULL"
            )
        if hnsw:
            ensure_hnsw_indexes(conn, table)
    return True


# Bytes of a row besides its vector and blob (ids, stamps, a sentence of text
# and its tsvector): what the toast target leaves room for.
ROW_ROOM = 512
TOAST_TARGET_MAX = 8160  # PostgreSQL's ceiling for toast_tuple_target


def toast_target(width: int) -> int:
    """The ``toast_tuple_target`` that moves a row's blob out of line and keeps the rest in.

    PostgreSQL shrinks a row above ~2 kB to its target by moving its largest
    compressible columns out of line, the blob first (EXTERNAL), then the
    tsvector and the text. With the default target (~2 kB) a 384-d row
    without its blob (1.5 kB of vector plus the rest) is still over it, so
    half the rows' tsvectors and some texts went out too (100k bench rows:
    51,161 tsvectors), and the keyword arms read them through the TOAST index.
    Halfway between the row with and without the blob: 6 bytes a dimension.
    """
    return min(TOAST_TARGET_MAX, 6 * width + ROW_ROOM)


def _ensure_toast_target(conn: Connection, table: str) -> None:
    """Set ``table``'s toast target for the width of its newest vectors (384 when it has none)."""
    widths = conn.exec_driver_sql(
        f"SELECT vector_dims(v) FROM (SELECT {VECTOR_COLUMN} AS v FROM {table}"
        f" WHERE {VECTOR_COLUMN} IS NOT NULL ORDER BY id DESC LIMIT 100) AS newest"
    ).scalars()
    counted: dict[int, int] = {}
    for width in widths:
        counted[int(width)] = counted.get(int(width), 0) + 1
    target = toast_target(max(counted, key=lambda w: counted[w]) if counted else 384)
    options = conn.execute(
        text("SELECT reloptions FROM pg_class WHERE oid = CAST(:table AS regclass)"), {"table": table}
    ).scalar_one()
    if f"toast_tuple_target={target}" not in (options or []):
        conn.exec_driver_sql(f"ALTER TABLE {table} SET (toast_tuple_target = {target})")


def width_statistics_name(table: str) -> str:
    return f"{table}_embedding_width"


def ensure_width_statistics(conn: Connection) -> None:
    """Give the planner the share of rows of each vector width (``conn`` holds the writer lock).

    Every window scan filters on ``octet_length(embedding) = :nbytes`` (the
    width, VEC-3). With no statistics on that expression PostgreSQL guesses
    0.5 % of the rows, so for a 10k window of a 100k-row agent it expects the
    filter to leave fewer rows than the window: it reads and ranks the whole
    agent, sorted, instead of walking ``idx_memories_agent`` newest first and
    stopping after the window (EXPLAIN ANALYZE at 100k rows: 322 ms against
    31 ms). An expression statistics object (PostgreSQL 14+) lets ANALYZE,
    autovacuum's included, count the widths. Created once, then analysed once
    so the first start after it has the counts; derived like the pgvector
    column, so outside the Alembic history, and useful with or without
    pgvector (the numpy scan reads the same window).
    """
    if int(conn.exec_driver_sql("SHOW server_version_num").scalar_one()) < 140000:
        return
    present = set(
        conn.exec_driver_sql(
            "SELECT stxname FROM pg_statistic_ext WHERE stxnamespace = current_schema()::regnamespace"
        ).scalars()
    )
    for table in VECTOR_TABLES:
        name = width_statistics_name(table)
        if name not in present:
            conn.exec_driver_sql(f"CREATE STATISTICS IF NOT EXISTS {name} ON (octet_length(embedding)) FROM {table}")
            conn.exec_driver_sql(f"ANALYZE {table}")


def ensure_hnsw_indexes(conn: Connection, table: str) -> None:
    """One HNSW index per width in :data:`HNSW_WIDTHS` and per width of the table's newest rows.

    Building one over rows already there takes time (about a minute per
    100k 384-d rows on a small machine); that happens once, at the first
    start after pgvector appears or a new model's width does.
    """
    newest = conn.exec_driver_sql(
        f"SELECT DISTINCT vector_dims(v) FROM (SELECT {VECTOR_COLUMN} AS v FROM {table}"
        f" WHERE {VECTOR_COLUMN} IS NOT NULL ORDER BY id DESC LIMIT 1000) AS newest"
    ).scalars()
    widths = sorted({*HNSW_WIDTHS, *(int(w) for w in newest if w and int(w) <= HNSW_MAX_DIMENSIONS)})
    present = set(
        conn.execute(
            text("SELECT indexname FROM pg_indexes WHERE schemaname = current_schema() AND tablename = :table"),
            {"table": table},
        ).scalars()
    )
    for width in widths:
        if window_index_name(table, width) not in present:
            # The window's edges (hnsw_scan) are scan positions among the rows of one width:
            # walked in this index, without reading the wide rows (an index-only scan).
            conn.exec_driver_sql(
                f"CREATE INDEX IF NOT EXISTS {window_index_name(table, width)} ON {table}"
                f" (agent_id, created_at DESC, id) INCLUDE (project_id, channel)"
                f" WHERE octet_length(embedding) = {4 * width}"
            )
        if hnsw_index_name(table, width) not in present:
            conn.exec_driver_sql("SET LOCAL maintenance_work_mem = '256MB'")  # a build that fits in memory
            conn.exec_driver_sql(
                f"CREATE INDEX IF NOT EXISTS {hnsw_index_name(table, width)} ON {table}"
                f" USING hnsw (({VECTOR_COLUMN}::vector({width})) vector_cosine_ops)"
                f" WHERE vector_dims({VECTOR_COLUMN}) = {width}"
            )


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


_hnsw_widths: weakref.WeakKeyDictionary[Database, dict[str, frozenset[int]]] = weakref.WeakKeyDictionary()


def hnsw_widths(db: Database, table: str) -> frozenset[int]:
    """Widths with an HNSW index on ``table`` (looked up once per Database)."""
    known = _hnsw_widths.get(db)
    if known is None:
        prefix = hnsw_index_name("", 0)[:-1]  # "_embedding_vec_hnsw_"
        with db.read() as session:
            names = session.execute(
                text("SELECT tablename, indexname FROM pg_indexes WHERE schemaname = current_schema()")
            ).all()
        known = {}
        for name in VECTOR_TABLES:
            head = name + prefix
            widths = {
                int(i[len(head) :]) for t, i in names if t == name and i.startswith(head) and i[len(head) :].isdigit()
            }
            known[name] = frozenset(widths)
        _hnsw_widths[db] = known
    return known.get(table, frozenset())


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


def vector_value(blob: bytes | None) -> str | None:
    """The derived column's value for ``blob`` as pgvector text, or None where the trigger derives NULL.

    None too for a blob whose cosine is undefined (zero, non-finite, not whole
    floats): the trigger then decodes it and stores NULL, as for any writer.
    """
    if not blob or len(blob) % 4:
        return None
    values = np.frombuffer(blob, dtype=FLOAT32)
    if not np.isfinite(values).all() or not values.any():
        return None
    return vector_text(blob)


_sends_vectors: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()


def sends_vectors(conn: Connection) -> bool:
    """Whether writes on ``conn`` carry the derived column (PostgreSQL with pgvector's columns), once per engine."""
    if conn.dialect.name != "postgresql":
        return False
    known = _sends_vectors.get(conn.engine)
    if known is None:
        known = all(has_column(conn, table) for table in VECTOR_TABLES)
        _sends_vectors[conn.engine] = known
    return known


def vector_text(query: bytes) -> str:
    """The float32 blob as pgvector's text form, exactly: 9 significant digits round-trip every float32.

    One format over a list of Python floats: formatting each numpy scalar
    apart cost ~1.6 ms per 384-d vector on a loaded machine, more than the
    trigger's decode it replaces on a write.
    """
    values = np.frombuffer(query, dtype=FLOAT32).tolist()
    return "[" + ",".join(["%.9g"] * len(values)) % tuple(values) + "]"


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


def hnsw_candidates(depth: int) -> int:
    from cpersona.storage.coarse_sqlite import candidates  # one rule for both engines' coarse candidates

    return min(HNSW_MAX_CANDIDATES, candidates(depth))


def _edge_statement(kind: Kind, where: str, width: int) -> Any:
    """The window's row at scan position ``:position``: (created_at, id), or no row."""
    table, alias = _TABLES[kind]
    return text(
        f"SELECT {alias}.created_at AS created_at, {alias}.id AS id FROM {table} {alias}"
        f" WHERE {_width_literal(alias, where, width)}"
        f" ORDER BY {alias}.created_at DESC, {alias}.id ASC LIMIT 1 OFFSET :position"
    )


def _window_rows_statement(kind: Kind, where: str, width: int) -> Any:
    """Rows in the window, counted up to :data:`HNSW_MIN_ROWS` (all the caller's tests need)."""
    table, alias = _TABLES[kind]
    return text(
        f"SELECT count(*) FROM (SELECT 1 FROM {table} {alias} WHERE {_width_literal(alias, where, width)}"
        f" ORDER BY {alias}.created_at DESC, {alias}.id ASC LIMIT least(:span, {HNSW_MIN_ROWS}) OFFSET :start) AS w"
    )


def hnsw_statement(kind: Kind, where: str, width: int, *, newer_edge: bool, older_edge: bool) -> Any:
    """The window's ``:k`` nearest rows through the width's HNSW index, re-ranked by exact cosine.

    The window is the (created_at, id) range strictly after the row at the
    position before it (``:new_at``, ``:new_id``) and up to the row at its
    last position (``:old_at``, ``:old_id``), in scan order (created_at desc,
    id asc); without an edge the range is open on that side. Rows: ``id``,
    ``cosine`` (threshold and depth applied) and ``found`` (candidates the
    index gave, for the caller's short-scan test).
    """
    table, alias = _TABLES[kind]
    bounds = ""
    if newer_edge:  # strictly older than the row just before the window
        bounds += f" AND ({alias}.created_at < :new_at OR ({alias}.created_at = :new_at AND {alias}.id > :new_id))"
    if older_edge:  # not older than the window's last row
        bounds += f" AND ({alias}.created_at > :old_at OR ({alias}.created_at = :old_at AND {alias}.id <= :old_id))"
    distance = f"{alias}.{VECTOR_COLUMN}::vector({width}) <=> CAST(:qv AS vector({width}))"
    return text(
        "WITH cand AS MATERIALIZED ("
        f" SELECT {alias}.id AS id, {alias}.created_at AS created_at, 1.0 - ({distance}) AS cosine"
        f" FROM {table} {alias} WHERE {_width_literal(alias, where, width)}"
        f" AND vector_dims({alias}.{VECTOR_COLUMN}) = {width}{bounds}"
        f" ORDER BY {distance} LIMIT :k)"
        # One row even when no candidate passes the threshold, so ``found`` always comes back.
        " SELECT b.id, b.cosine, f.found FROM (SELECT count(*) AS found FROM cand) f"
        " LEFT JOIN LATERAL (SELECT c.id, c.cosine FROM cand c"
        " WHERE c.cosine >= :threshold AND c.cosine <> 'NaN'::float8"
        " ORDER BY c.cosine DESC, c.created_at DESC, c.id ASC LIMIT :depth) b ON true"
    )


def hnsw_scan(
    session: Any, kind: Kind, where: str, params: dict[str, Any], query: bytes, widths: frozenset[int]
) -> list[tuple[float, int]] | None:
    """(cosine, id) of the window's best rows through an HNSW index; None when the exact scan must answer.

    None for a width without an index, a window of fewer than
    :data:`HNSW_MIN_ROWS` rows, and a filtered index scan that came back with
    fewer candidates than it asked for while the window holds more.
    """
    width = len(query) // 4
    if width not in widths or int(params["span"]) < HNSW_MIN_ROWS:
        return None
    k = hnsw_candidates(int(params["depth"]))
    # Sorts off until the index has answered: the planner cannot estimate how
    # many rows hold a vector of this width (an expression it has no statistics
    # for) and, guessing few, would rank them all by a sort instead of asking
    # the index; the window's edges come from the btree of the same width in
    # order, no sort either. Transaction settings: restored after, for the reads
    # that share the transaction (Database.snapshot).
    session.execute(HNSW_SETTINGS, {"ef": str(k), "tuples": str(HNSW_MAX_SCAN_TUPLES)})
    try:
        return _hnsw_ranked(session, kind, where, params, query, width, k)
    finally:
        session.execute(SORT_BACK)


HNSW_SETTINGS = text(
    "SELECT set_config('hnsw.iterative_scan', 'relaxed_order', true), set_config('hnsw.ef_search', :ef, true),"
    " set_config('hnsw.max_scan_tuples', :tuples, true), set_config('enable_sort', 'off', true)"
)
SORT_BACK = text("SELECT set_config('enable_sort', 'on', true)")


def _hnsw_ranked(
    session: Any, kind: Kind, where: str, params: dict[str, Any], query: bytes, width: int, k: int
) -> list[tuple[float, int]] | None:
    start, span = int(params["start"]), int(params["span"])
    edge = _edge_statement(kind, where, width)
    edges: dict[str, Any] = {}
    if start > 0:
        newer = session.execute(edge, {**params, "position": start - 1}).first()
        if newer is None:  # the scope has no row at the window's start: an empty window
            return []
        edges.update(new_at=newer.created_at, new_id=newer.id)
    older = session.execute(edge, {**params, "position": start + span - 1}).first()
    if older is None:  # the window runs past the scope's oldest row: how many rows it has decides
        rows_in_window = int(session.execute(_window_rows_statement(kind, where, width), params).scalar_one())
        if rows_in_window < HNSW_MIN_ROWS:
            return None
    else:
        rows_in_window = span
        edges.update(old_at=older.created_at, old_id=older.id)
    statement = hnsw_statement(kind, where, width, newer_edge="new_at" in edges, older_edge="old_at" in edges)
    rows = session.execute(statement, {**params, **edges, "qv": vector_text(query), "k": k}).all()
    if int(rows[0].found) < min(k, rows_in_window):
        return None  # the filter starved the index scan (or rows lack a vector): the exact scan answers
    return [(float(r.cosine), r.id) for r in rows if r.id is not None]
