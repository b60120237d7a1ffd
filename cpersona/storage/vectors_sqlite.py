"""The vector scan over SQLite: cosine ranking of the stored BLOB vectors, run by sqlite-vec.

Vectors live in ``memories.embedding`` / ``episodes.embedding`` as little-endian
float32 blobs (spec VF-5, IMPL-6), which is the layout sqlite-vec's scalar
functions read directly; no derived table has to be kept in step with writes,
imports or deletes.

One statement per table does the whole scan inside SQLite, with no per-row
Python:

- the inner query walks the scope's rows newest first (``created_at`` desc, id
  asc — the agent index serves the order) and keeps scan positions
  ``[start, stop)`` of those that carry a vector of the query's byte length.
  The isolation predicates sit in this WHERE clause, so the window is counted
  over the caller's own rows only and no other tenant can crowd it (spec ISO-2).
  The width test is also how a row embedded by another model (another
  dimension) is never compared (VEC-3).
- the outer query ranks that window by cosine (``1 - vec_distance_cosine``),
  drops rows under the threshold and keeps the best ``depth``, ties broken by
  scan position (VEC-5).

Why not a ``vec0`` virtual table: its k-nearest step runs before any WHERE on
non-partition columns and ``k`` is capped at 4096, so a tenant or window filter
applied there silently returns too few rows; the window (newest N of a scope)
is not expressible as a partition either. Measured on a loaded 2-core box with
384-d vectors, 100k rows in one agent, a 10k window: 17–40 ms per table
(see tests/test_vector_channel.py and the task report for the figures).

A vector whose cosine is undefined (all zeros) or not finite yields SQL NULL
from sqlite-vec, which no threshold comparison admits.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import TextClause, text

from cpersona.embedding.vectors import FLOAT32
from cpersona.storage.search import Kind

_TABLES: dict[str, tuple[str, str]] = {"mem": ("memories", "m"), "ep": ("episodes", "e")}


def usable_query(blob: bytes | None) -> bool:
    """Whether ``blob`` is a float32 vector a scan can rank against.

    A query of the wrong byte count, with non-finite values or of zero length
    (norm) ranks nothing, so the scan is not run for it at all.
    """
    if not blob or len(blob) % 4:
        return False
    import numpy as np  # only once there is a vector (see cpersona.embedding.vectors)

    vector = np.frombuffer(blob, dtype=FLOAT32)
    return bool(np.isfinite(vector).all()) and float(np.dot(vector, vector)) > 0.0


def scan_statement(kind: Kind, where: str) -> TextClause:
    """The ranked window scan for ``kind``; ``where`` is the caller's isolation text.

    Parameters: ``:q`` (query blob), ``:nbytes`` (its length), ``:start`` /
    ``:span`` (window offset and size), ``:threshold``, ``:depth``, plus the
    ones ``where`` binds. Result rows: ``id``, ``cosine``.
    """
    table, alias = _TABLES[kind]
    return text(
        "SELECT w.id, w.cosine FROM ("
        f" SELECT {alias}.id AS id, {alias}.created_at AS created_at,"
        f" 1.0 - vec_distance_cosine({alias}.embedding, :q) AS cosine"
        f" FROM {table} {alias}"
        f" WHERE {where} AND typeof({alias}.embedding) = 'blob' AND length({alias}.embedding) = :nbytes"
        f" ORDER BY {alias}.created_at DESC, {alias}.id ASC"
        " LIMIT :span OFFSET :start"
        ") w WHERE w.cosine >= :threshold"
        " ORDER BY w.cosine DESC, w.created_at DESC, w.id ASC LIMIT :depth"
    )


def scan_parameters(query: bytes, *, window: tuple[int, int], threshold: float, depth: int) -> dict[str, Any]:
    start, stop = max(0, int(window[0])), max(0, int(window[1]))
    return {
        "q": query,
        "nbytes": len(query),
        "start": start,
        "span": max(0, stop - start),
        "threshold": float(threshold),
        "depth": int(depth),
    }
