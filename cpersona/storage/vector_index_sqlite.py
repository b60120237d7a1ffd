"""The coarse vector index held in the process: sign bits and scope codes in numpy arrays.

The far list's SQL walk of ``memories_coarse`` costs ~0.4-0.5 µs a row (about
55 ms of CPU per recall at 100k rows, ~500 ms at 1M: docs/benchmarks.md,
"Scale"); the same Hamming ranking over a matrix in memory costs ~4 ms at 100k.
So each process keeps a copy of the coarse table (per kind, for one bit width):
the sign bits, the row ids, integer codes of the isolation columns (agent,
project, channel, source id) and each row's place in scan order. The scan
applies the isolation predicates and the window on those arrays before the
Hamming ranking (spec ISO-2: another scope's rows never take a candidate
place), and it only *proposes*: the candidates are re-read from SQL and
tested again there exactly as before (isolation, width, the window's edge row,
exact float cosine: ``coarse_sqlite.rerank_statement``), so a copy out of step
costs at most a candidate place, never a row of another scope.

Staying in step with other processes: every change to a coarse row is logged
by stored triggers in ``coarse_changes`` (revision 0008), with an AUTOINCREMENT
sequence. Before each scan the copy reads the log's head from
``sqlite_sequence`` (one primary-key read); when it moved, it reads the entries
past its watermark, drops those ids and re-reads those keys from the coarse
table. A head that went backwards (another file), a log pruned past the
watermark, or more changes than are worth applying one by one: the table is
loaded again. ``PRAGMA data_version`` would not do: every commit moves it,
recall's own counter updates included.

Scan order: rows are held in *reverse* scan order (``created_at`` asc, id
desc), so ``created`` is ascending and new rows can be placed by binary
search. Rows added since the last load sit at the end with fractional ranks
between the loaded ones; when they grow many, the arrays are re-sorted in
memory (no SQL). numpy is imported by this module only, which is imported
only when a far list runs (never on the embeddings-off start path).
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cpersona.storage import coarse_sqlite
from cpersona.storage.per_database import PerDatabase
from cpersona.storage.scope import Scope

_TABLES = {"mem": "memories_coarse", "ep": "episodes_coarse"}
# Applying changes one by one beyond this many is dearer than loading again.
RELOAD_CHANGES = 20_000
# Rows added since the load are re-sorted into place once they are this many.
MERGE_ADDED = 4_096
# Rows fetched at a time. Each chunk of fetched tuples is held beside the arrays, and its small
# objects fill pymalloc arenas that a few longer-lived objects then pin: 16k rows a chunk left
# ~4 MB more RSS after a 100k-row load than 2k (and 15 MB more at its peak), for the same CPU.
_LOAD_CHUNK = 2_048
_ID_CHUNK = 16_384  # ids a statement reads the float vectors of


class _Codes:
    """Strings of one column as small integer codes, append-only (readers never see a code move)."""

    def __init__(self) -> None:
        self.of: dict[Any, int] = {}
        self.names: list[Any] = []

    def code(self, value: Any) -> int:
        found = self.of.get(value)
        if found is None:
            found = self.of[value] = len(self.names)
            self.names.append(value)
        return found

    def get(self, value: Any) -> int:
        return self.of.get(value, -1)


_COLUMNS = ("agent", "project", "channel", "source")


@dataclass
class _Arrays:
    """One immutable-length view for scanners: rows [0, n); rows [0, loaded) are sorted.

    A row's place in scan order (its rank) is its position for the loaded rows, and a
    fractional rank in ``added`` for the rows placed since (``_ranks``): a float64 rank for
    every row cost 8 MB at 1M rows. ``created`` holds SQLite's own stamps
    ('YYYY-MM-DD HH:MM:SS') as int64 digits (8 bytes, not 19), any other stamp as bytes
    (``_encode``); the scope codes are as narrow as their number allows (``_code_type``).
    """

    n: int
    loaded: int
    bits: np.ndarray
    ids: np.ndarray
    created: np.ndarray
    alive: np.ndarray
    codes: dict[str, np.ndarray]
    # Each row's place in its kind's float matrix (_Floats), -1 while its vector is not held.
    slot: np.ndarray
    # Ranks of the rows [loaded, n), at [row - loaded].
    added: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.float64))
    # Added rows by their place among the loaded ones: {rows loaded before them: [(created, -id, row)]}.
    slots: dict[int, list[tuple[Any, int, int]]] = field(default_factory=dict)


@dataclass
class _Floats:
    """Float32 vectors of the rows near windows read (those of ``slot`` >= 0), and their norms."""

    matrix: np.ndarray
    norms: np.ndarray
    used: int = 0


@dataclass
class _KindIndex:
    kind: str
    nbits: int
    seq: int
    arrays: _Arrays
    codes: dict[str, _Codes] = field(default_factory=lambda: {c: _Codes() for c in _COLUMNS})
    floats: _Floats | None = None


def _source_key(row: Any, kind: str) -> Any:
    return row[5] if kind == "mem" else None


def _select(kind: str) -> str:
    source = "source_key" if kind == "mem" else "NULL"
    return f"SELECT agent_id, created_at, id, project_id, channel, {source}, bits FROM {_TABLES[kind]} c"


class ProcessIndex:
    """The in-memory copies for one database (see the module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._kinds: dict[str, _KindIndex] = {}
        self.loads = 0  # full loads so far (tests read it)
        self._logged = False  # the change log was seen in the file

    # -- keeping in step ------------------------------------------------------------------------

    def _head(self, conn: Any) -> int | None:
        """The change log's newest sequence number (0 while empty), None without a change log."""
        log = coarse_sqlite.CHANGE_LOG
        # The schema is read until the log is seen, not at every scan: that read was a third of
        # the copy's cost per scan at 100k rows, and a log once there stays (revision 0008).
        if not self._logged:
            if not conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (log,)).fetchone():
                return None
            self._logged = True
        row = conn.execute("SELECT seq FROM sqlite_sequence WHERE name = ?", (log,)).fetchone()
        return int(row[0]) if row else 0

    def _load(self, conn: Any, kind: str, nbits: int, head: int) -> _KindIndex:
        # Counted first and read in chunks: a million rows as one list of tuples would
        # briefly hold several times the arrays' own size. The stamps are held at the width of
        # the longest one (19 bytes for SQLite's own; a wider one written later re-sorts the copy
        # into wider arrays, _apply): a fixed 32 cost 13 MB more at 1M rows.
        table = _TABLES[kind]
        count, width = conn.execute(
            f"SELECT count(*), max(length(CAST(created_at AS BLOB))) FROM {table} WHERE length(bits) = ?", (nbits,)
        ).fetchone()
        index = _KindIndex(kind, nbits, head, _empty(nbits, 0))
        created = _STAMP if int(width or 0) == _CANONICAL else np.dtype(f"S{max(1, int(width or 0))}")
        a = index.arrays = _empty(nbits, int(count) + MERGE_ADDED, created)
        cursor = conn.execute(
            f"{_select(kind)} WHERE length(c.bits) = ? ORDER BY c.created_at ASC, c.id DESC", (nbits,)
        )
        while rows := cursor.fetchmany(_LOAD_CHUNK):
            a = _fill(index, a, rows, kind)
            a.alive[a.n : a.n + len(rows)] = True
            a.n = a.loaded = a.n + len(rows)
        a.added = np.zeros(len(a.ids) - a.loaded, dtype=np.float64)
        self.loads += 1
        return index

    def _refresh(self, conn: Any, kind: str, nbits: int) -> _KindIndex | None:
        head = self._head(conn)
        if head is None:
            return None
        index = self._kinds.get(kind)
        if index is None or index.nbits != nbits or head < index.seq:
            index = self._kinds[kind] = self._load(conn, kind, nbits, head)
            return index
        if head == index.seq:
            return index
        log = coarse_sqlite.CHANGE_LOG
        oldest = conn.execute(f"SELECT min(seq) FROM {log}").fetchone()[0]
        pending = head - index.seq
        if oldest is None or oldest > index.seq + 1 or pending > max(RELOAD_CHANGES, index.arrays.n // 4):
            index = self._kinds[kind] = self._load(conn, kind, nbits, head)
            return index
        entries = conn.execute(
            f"SELECT agent_id, created_at, id FROM {log} WHERE seq > ? AND seq <= ? AND kind = ?",
            (index.seq, head, kind),
        ).fetchall()
        if entries:
            keys = list(dict.fromkeys(entries))
            lookup = f"{_select(kind)} WHERE c.agent_id = ? AND c.created_at = ? AND c.id = ? AND length(c.bits) = ?"
            fresh = [r for key in keys for r in conn.execute(lookup, (*key, nbits)).fetchall()]
            _apply(index, {int(k[2]) for k in keys}, fresh, kind)
        index.seq = head
        return index

    def warm(self, db: Any, kind: str, nbits: int) -> None:
        """Load (or bring in step) one copy ahead of the first far list (start-up, background)."""
        with db.read() as session:
            conn = session.connection().connection.driver_connection
            with self._lock:
                self._refresh(conn, kind, nbits)

    # -- the scan -------------------------------------------------------------------------------

    def propose(
        self,
        conn: Any,
        kind: str,
        scope: Scope,
        source_id: str,
        qbits: bytes,
        window: tuple[int, int],
        k: int,
    ) -> tuple[list[int], tuple[str, int] | None, tuple[str, int] | None] | None:
        """Up to ``k`` ids of the window's rows in scope nearest ``qbits`` by Hamming distance, with
        the window's first row and first row past it as (created_at, id) keys (None: no edge).

        None when this database has no change log (the caller walks the table in SQL instead).
        """
        with self._lock:
            index = self._refresh(conn, kind, len(qbits))
        if index is None:
            return None
        a = index.arrays
        n = a.n
        source = source_id if kind == "mem" else ""
        start, stop = max(0, window[0]), max(0, window[1])
        if stop <= start:
            return [], None, None
        if not _scope_mask(np.ones(0, dtype=bool), a, index.codes, scope, source, slice(0, 0)):
            return [], None, None  # a value no row holds
        lo = hi = None
        rank = None
        if start > 0:
            # The window's first row, the one past the scope's newest ``start``, is found on the
            # newest part of the arrays (_newest): ranking every row in scope to find it cost
            # about a third of the far list at 1M rows.
            _, first = _newest(a, index.codes, scope, source, start)
            if first is None:
                return [], None, None
            rank = float(_ranks(a, np.array([first]))[0])
            lo = _row_key(a, first)
        query = np.frombuffer(qbits, dtype=np.uint8)
        if stop - start >= n:  # the window runs to the scope's oldest row (a whole-corpus reach)
            idx = _nearest_in_blocks(a, index.codes, scope, source, query, n, rank, k)
            return [int(i) for i in a.ids[idx]], lo, None
        mask = a.alive[:n].copy()
        _scope_mask(mask, a, index.codes, scope, source, slice(0, n))
        if rank is not None:
            _at_most(mask, a, n, rank)
        idx = np.flatnonzero(mask)
        if stop - start < len(idx):  # the window ends before the scope's oldest row
            ranks = _ranks(a, idx)
            past = _nth(ranks, len(idx) - 1 - (stop - start))
            hi = _key(a, idx, ranks, past)
            idx = idx[ranks > past]
        if len(idx) > k:
            distance = _hamming(a.bits, idx, query, n)
            idx = idx[_nearest(distance, _ranks(a, idx), k)]
        return [int(i) for i in a.ids[idx]], lo, hi

    # -- the near window: exact cosine over float vectors held for the window's rows ------------

    def serves(self, kind: str, nbits: int) -> bool:
        """Whether a copy of ``kind`` at this bit width is loaded (only then do near windows use it)."""
        index = self._kinds.get(kind)
        return index is not None and index.nbits == nbits

    def near(
        self,
        conn: Any,
        kind: str,
        scope: Scope,
        source_id: str,
        query: bytes,
        stop: int,
        depth: int,
        threshold: float,
    ) -> tuple[list[int], tuple[str, int] | None] | None:
        """Ids of the rows of the near window (the scope's newest ``stop`` rows of the query's
        width) that can be among its best ``depth`` by exact cosine at or above ``threshold``,
        with the first row past the window as a (created_at, id) key (None: no row past it).

        Every row that the exact scan would answer is among them (NEAR_SLACK bounds the
        float32 rounding of both computations), so re-ranking just these ids in SQL with
        sqlite-vec's own cosine gives the exact scan's list. None without a change log.
        """
        with self._lock:
            index = self._refresh(conn, kind, len(query) // 32)
            if index is None:
                return None
            a = index.arrays
            rows, past_row = _newest(a, index.codes, scope, source_id if kind == "mem" else "", stop)
            past = None if past_row is None else _row_key(a, past_row)
            if not len(rows):
                return [], past
            slots = _held(conn, index, rows, len(query) // 4)
            rows, slots = rows[slots >= 0], slots[slots >= 0]  # rows deleted since the copy's refresh
            f = index.floats
            q = np.frombuffer(query, dtype="<f4")
            # einsum, not matmul: numpy's BLAS runs a matrix-vector product this size on worker
            # threads that spin on after it (measured: 2x the CPU of this single-threaded loop).
            dots = np.einsum("ij,j->i", f.matrix[: f.used], q)[slots] if f is not None else np.empty(0)
            qnorm = float(np.sqrt(np.dot(q.astype(np.float64), q.astype(np.float64))))
            with np.errstate(divide="ignore", invalid="ignore"):
                cosine = dots.astype(np.float64) / (f.norms[slots] * qnorm) if f is not None else dots
        finite = np.isfinite(cosine)  # sqlite-vec answers NULL for a zero or non-finite vector
        rows, cosine = rows[finite], cosine[finite]
        cut = threshold - NEAR_SLACK
        if len(cosine) > depth > 0:
            kth = float(-np.partition(-cosine, depth - 1)[depth - 1])
            cut = max(cut, kth - 2 * NEAR_SLACK)
        return [int(i) for i in a.ids[rows[cosine >= cut]]], past


# Bound on |cosine here - sqlite-vec's cosine| for one row: both sum float32 products (n * 2**-24
# relative to |a||q| each, 2.3e-5 at 384-d, 2.4e-4 at 4,096-d), with margin.
NEAR_SLACK = 1e-3
_FLOAT_ROOM = 1_024  # rows of float vectors held past the window, for the rows stored next


def _newest(
    a: _Arrays, codes: dict[str, _Codes], scope: Scope, source_id: str, stop: int
) -> tuple[np.ndarray, int | None]:
    """Rows of the scope's newest ``stop`` (scan positions [0, stop)) and the first row past
    them (None: there is none). Only the newest part of the arrays is read: a step back over the loaded rows,
    longer each time, until more than ``stop`` rows in scope are newer than where it stopped."""
    n, loaded = a.n, a.loaded
    added = np.arange(loaded, n)
    step, lo = max(2 * stop, 8_192), loaded
    while True:
        lo = max(0, lo - step)
        sel = np.concatenate([np.arange(lo, loaded), added])
        mask = a.alive[sel]
        if not _scope_mask(mask, a, codes, scope, source_id, sel):
            return np.empty(0, dtype=np.int64), None
        found = sel[mask]
        if lo > 0:  # added rows placed before loaded row lo are older than every row kept
            found = found[_ranks(a, found) > lo - 1]
        if len(found) > stop or lo == 0:
            break
        step *= 4
    if len(found) <= stop:
        return found, None
    top = np.argpartition(-_ranks(a, found), stop)
    return found[top[:stop]], int(found[top[stop]])


def _row_key(a: _Arrays, row: int) -> tuple[str, int]:
    return _stamp_text(a.created[row]), int(a.ids[row])


def _ranks(a: _Arrays, rows: np.ndarray) -> np.ndarray:
    """Each row's place in scan order (float64): its position if loaded, else its added rank."""
    ranks = rows.astype(np.float64)
    if a.n > a.loaded:
        added = rows >= a.loaded
        if added.any():
            ranks[added] = a.added[rows[added] - a.loaded]
    return ranks


def _at_most(mask: np.ndarray, a: _Arrays, n: int, rank: float) -> None:
    """Clear ``mask`` (rows [0, n)) for rows ranked above ``rank``: a slice of the loaded rows,
    a comparison of the added ones."""
    mask[max(0, int(np.floor(rank)) + 1) : min(n, a.loaded)] = False
    if n > a.loaded:
        mask[a.loaded : n] &= a.added[: n - a.loaded] <= rank


def _held(conn: Any, index: _KindIndex, rows: np.ndarray, dims: int) -> np.ndarray:
    """Each row's slot in the float matrix, reading the vectors not held yet (-1: row gone)."""
    a, f = index.arrays, index.floats
    slots = a.slot[rows]
    missing = rows[slots < 0]
    if not len(missing):
        return slots
    if f is None or f.matrix.shape[1] != dims or f.used + len(missing) > len(f.matrix):
        # Held anew for this window (and room for the rows stored next): the vectors of rows
        # that left every window are let go, so the matrix stays about one window's size.
        keep = rows[slots >= 0] if f is not None and f.matrix.shape[1] == dims else rows[:0]
        room = len(rows) + len(rows) // 8 + _FLOAT_ROOM
        g = _Floats(np.empty((room, dims), dtype=np.float32), np.empty(room, dtype=np.float64), len(keep))
        if len(keep):
            g.matrix[: len(keep)] = f.matrix[a.slot[keep]]
            g.norms[: len(keep)] = f.norms[a.slot[keep]]
        a.slot[: a.n] = -1
        a.slot[keep] = np.arange(len(keep), dtype=np.int32)
        index.floats = f = g
        missing = rows[a.slot[rows] < 0]
    table = "memories" if index.kind == "mem" else "episodes"
    row_of = dict(zip(a.ids[missing].tolist(), missing.tolist()))
    ids = list(row_of)
    first = f.used
    for lo in range(0, len(ids), _ID_CHUNK):
        chunk = json.dumps(ids[lo : lo + _ID_CHUNK])
        for row_id, blob in conn.execute(
            f"SELECT id, embedding FROM {table} WHERE id IN (SELECT value FROM json_each(?))", (chunk,)
        ):
            if isinstance(blob, bytes) and len(blob) == 4 * dims:
                f.matrix[f.used] = np.frombuffer(blob, dtype="<f4")
                a.slot[row_of[row_id]] = f.used
                f.used += 1
    fresh = f.matrix[first : f.used].astype(np.float64)
    f.norms[first : f.used] = np.sqrt(np.einsum("ij,ij->i", fresh, fresh))
    return a.slot[rows]


def _nearest(distance: np.ndarray, ranks: np.ndarray, k: int) -> np.ndarray:
    """Positions of the ``k`` smallest distances, ties at the cut taken in scan order (newest
    first: highest rank), as coarse_sqlite.far_statement orders them, so the copy proposes the
    candidates the SQL walk would."""
    kth = np.partition(distance, k - 1)[k - 1]
    below = np.flatnonzero(distance < kth)
    ties = np.flatnonzero(distance == kth)
    ties = ties[np.argsort(-ranks[ties], kind="stable")[: k - len(below)]]
    return np.concatenate([below, ties])


def _nth(values: np.ndarray, i: int) -> float:
    return float(np.partition(values, i)[i])


def _key(a: _Arrays, idx: np.ndarray, ranks: np.ndarray, rank: float) -> tuple[str, int]:
    return _row_key(a, int(idx[np.flatnonzero(ranks == rank)[0]]))


_BLOCK = 32_768  # rows per step: the block's temporaries stay in the CPU cache


def _hamming(bits: np.ndarray, idx: np.ndarray, query: np.ndarray, n: int) -> np.ndarray:
    """Hamming distance of each ``bits[idx]`` row to ``query``, a block of rows at a time.

    When ``idx`` holds most of the ``n`` rows (a whole-corpus reach), every row is measured in
    place, block by contiguous block, and the distances of ``idx`` picked afterwards: gathering
    the rows first copied nearly the whole matrix at every far list."""
    words = bits.shape[1] // 8 if bits.shape[1] % 8 == 0 else 0
    if words:  # 64 bits at a time: 8x fewer popcounts than byte by byte
        table, query = bits.view(np.uint64), query.view(np.uint64)
    else:
        table = bits
    every = len(idx) * 2 > n
    count = n if every else len(idx)
    out = np.empty(count, dtype=np.int32)
    width = table.shape[1]
    rows = np.empty((min(_BLOCK, count), width), dtype=table.dtype)
    counts = np.empty(rows.shape, dtype=np.uint8)
    for lo in range(0, count, _BLOCK):
        m = min(_BLOCK, count - lo)
        if every:
            np.bitwise_xor(table[lo : lo + m], query, out=rows[:m])
        else:
            np.take(table, idx[lo : lo + m], axis=0, out=rows[:m])
            np.bitwise_xor(rows[:m], query, out=rows[:m])
        np.bitwise_count(rows[:m], out=counts[:m])
        # Column by column: numpy's reduction over a short row costs ~7x more than these adds.
        total = out[lo : lo + m]
        np.add(counts[:m, 0], counts[:m, 1] if width > 1 else 0, out=total, dtype=np.int32)
        for j in range(2, width):
            np.add(total, counts[:m, j], out=total)
    return out[idx] if every else out


def _nearest_in_blocks(
    a: _Arrays,
    codes: dict[str, _Codes],
    scope: Scope,
    source_id: str,
    query: np.ndarray,
    n: int,
    rank: float | None,
    k: int,
) -> np.ndarray:
    """Rows [0, n) in scope (ranked at most ``rank``, if given) nearest ``query``: the ``k`` that
    ``_nearest`` would pick over all of them, found a block at a time.

    Each block keeps the rows within its own k-th smallest distance (ties included) and no
    farther than the best k kept so far; every row of the overall best k (and every row tied
    at its cut) is within both, so the final pick over what is kept is the same. Nothing the
    size of the table is allocated: the whole-table masks, index lists and distances of a
    1M-row far list were ~30 MB of temporaries a recall, which the C heap kept afterwards.
    """
    table, q = _words(a.bits, query)
    rows_buf = np.empty((min(_BLOCK, n), table.shape[1]), dtype=table.dtype)
    counts_buf = np.empty(rows_buf.shape, dtype=np.uint8)
    kept_rows: list[np.ndarray] = []
    kept_d: list[np.ndarray] = []
    kept = 0
    bound = None
    for lo in range(0, n, _BLOCK):
        hi = min(n, lo + _BLOCK)
        mask = a.alive[lo:hi].copy()
        _scope_mask(mask, a, codes, scope, source_id, slice(lo, hi))
        if rank is not None:
            _at_most_in(mask, a, lo, hi, rank)
        rows = np.flatnonzero(mask)
        if not len(rows):
            continue
        d = _distances(table[lo:hi], q, rows_buf[: hi - lo], counts_buf[: hi - lo])[rows]
        if bound is not None:
            near = d <= bound
            rows, d = rows[near], d[near]
        if len(d) > k:
            near = d <= np.partition(d, k - 1)[k - 1]
            rows, d = rows[near], d[near]
        kept_rows.append(rows + lo)
        kept_d.append(d)
        kept += len(d)
        if kept > 4 * k:  # tighten the bound on what the later blocks keep
            r, dd = np.concatenate(kept_rows), np.concatenate(kept_d)
            bound = int(np.partition(dd, k - 1)[k - 1])
            near = dd <= bound
            kept_rows, kept_d, kept = [r[near]], [dd[near]], int(np.count_nonzero(near))
    if not kept_rows:
        return np.empty(0, dtype=np.int64)
    rows, d = np.concatenate(kept_rows), np.concatenate(kept_d)
    if len(rows) > k:
        rows = rows[_nearest(d, _ranks(a, rows), k)]
    return rows


def _at_most_in(mask: np.ndarray, a: _Arrays, lo: int, hi: int, rank: float) -> None:
    """``_at_most`` for the rows [lo, hi) (``mask`` holds those rows)."""
    first = max(lo, int(np.floor(rank)) + 1)
    end = min(hi, a.loaded)
    if first < end:
        mask[first - lo : end - lo] = False
    if hi > a.loaded:
        start = max(lo, a.loaded)
        mask[start - lo :] &= a.added[start - a.loaded : hi - a.loaded] <= rank


def _words(bits: np.ndarray, query: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The sign bits and the query as 64-bit words where the width allows (8x fewer popcounts)."""
    if bits.shape[1] % 8 == 0:
        return bits.view(np.uint64), query.view(np.uint64)
    return bits, query


def _distances(block: np.ndarray, query: np.ndarray, rows: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Hamming distance of each row of ``block`` (contiguous) to ``query``, in the given buffers."""
    np.bitwise_xor(block, query, out=rows)
    np.bitwise_count(rows, out=counts)
    width = block.shape[1]
    total = np.empty(len(block), dtype=np.int32)
    np.add(counts[:, 0], counts[:, 1] if width > 1 else 0, out=total, dtype=np.int32)
    for j in range(2, width):
        np.add(total, counts[:, j], out=total)
    return total


def _scope_mask(mask: np.ndarray, a: _Arrays, codes: dict[str, _Codes], scope: Scope, source_id: str, sel: Any) -> bool:
    """AND the isolation predicates of storage/scope.py (and spec ISO-3's source id) of the rows
    ``sel`` (a slice or an index array of the arrays) into ``mask``, one entry per selected row;
    False when nothing can match (a value no row holds)."""
    if scope.agent_id is not None:
        agent = codes["agent"].get(scope.agent_id)
        if agent < 0:
            return False
        mask &= a.codes["agent"][sel] == agent
    for column, values in (("project", scope.project_values), ("channel", scope.channel_values)):
        if values is None:
            continue
        wanted = [c for c in (codes[column].get(v) for v in values) if c >= 0]
        if not wanted:
            return False
        column_codes = a.codes[column][sel]
        hit = column_codes == wanted[0]
        for c in wanted[1:]:
            hit |= column_codes == c
        mask &= hit
    if source_id:
        names = codes["source"].names
        if source_id[-1].isalnum():
            wanted = [codes["source"].get(source_id)]
        else:  # a prefix (search_sqlite.source_filter)
            wanted = [i for i, name in enumerate(names) if isinstance(name, str) and name.startswith(source_id)]
        wanted = [c for c in wanted if c >= 0]
        if not wanted:
            return False
        source_codes = a.codes["source"][sel]
        hit = source_codes == wanted[0]
        if len(wanted) > 1:
            hit |= np.isin(source_codes, np.asarray(wanted[1:], dtype=np.int32))
        mask &= hit
    return True


# -- building and changing the arrays --------------------------------------------------------------


# SQLite's own stamps, datetime('now'): held as the int64 of their 14 digits, which orders them
# as their text does and gives the text back (_stamp_text). Any other stamp in a copy holds
# every stamp of it as bytes instead (the order of text is only kept within one form).
_CANONICAL = 19
_STAMP = np.dtype(np.int64)
_SEPARATORS = {4: ord("-"), 7: ord("-"), 10: ord(" "), 13: ord(":"), 16: ord(":")}
_DIGITS = [i for i in range(_CANONICAL) if i not in _SEPARATORS]
_WEIGHTS = 10 ** np.arange(len(_DIGITS) - 1, -1, -1, dtype=np.int64)
_CODE_TYPES = (np.dtype(np.uint8), np.dtype(np.uint16), np.dtype(np.int32))


def _encode(stamps: list[bytes], dtype: np.dtype) -> np.ndarray | None:
    """``stamps`` (UTF-8) as values of a ``created`` array of ``dtype``; None when one does not
    fit it (a stamp of another form for the int64 digits, a longer one for bytes)."""
    if dtype != _STAMP:
        if stamps and max(map(len, stamps)) > dtype.itemsize:
            return None
        return np.array(stamps, dtype=dtype)
    if any(len(s) != _CANONICAL for s in stamps):
        return None
    raw = np.frombuffer(b"".join(stamps), dtype=np.uint8).reshape(len(stamps), _CANONICAL)
    if any((raw[:, i] != c).any() for i, c in _SEPARATORS.items()):
        return None
    digits = raw[:, _DIGITS] - np.uint8(48)  # a byte below '0' wraps past 9
    if (digits > 9).any():
        return None
    return digits.astype(np.int64) @ _WEIGHTS


def _stamp_text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8")
    t = f"{int(value):014d}"
    return f"{t[0:4]}-{t[4:6]}-{t[6:8]} {t[8:10]}:{t[10:12]}:{t[12:14]}"


def _as_bytes(created: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """A ``created`` array of int64 digits as the stamps' text in ``dtype`` (S19 or wider)."""
    out = np.empty(len(created), dtype=dtype)
    for lo in range(0, len(created), _LOAD_CHUNK):
        out[lo : lo + _LOAD_CHUNK] = [_stamp_text(v).encode() for v in created[lo : lo + _LOAD_CHUNK]]
    return out


def _code_type(count: int) -> np.dtype:
    return next(t for t in _CODE_TYPES if count - 1 <= np.iinfo(t).max)


def _empty(nbits: int, capacity: int, created: np.dtype = _STAMP, codes: dict[str, np.dtype] | None = None) -> _Arrays:
    capacity = max(capacity, 1024)
    return _Arrays(
        0,
        0,
        np.zeros((capacity, nbits), dtype=np.uint8),
        np.zeros(capacity, dtype=np.int64),
        np.zeros(capacity, dtype=created),
        np.zeros(capacity, dtype=bool),
        {c: np.zeros(capacity, dtype=(codes or {}).get(c, _CODE_TYPES[0])) for c in _COLUMNS},
        np.full(capacity, -1, dtype=np.int32),
    )


def _fill(index: _KindIndex, a: _Arrays, rows: list[Any], kind: str) -> _Arrays:
    """Write coarse ``rows`` into rows [a.n, a.n + len(rows)) of ``a`` (not ranks, not alive);
    the arrays they went into (new ones when ``a`` had no room or could not hold a stamp)."""
    stamps = [r[1].encode("utf-8") for r in rows]
    created = _encode(stamps, a.created.dtype)
    if created is None or a.n + len(rows) > len(a.ids):
        if created is None:  # another form of stamp, or a longer one: bytes of the widest
            width = max(max(map(len, stamps)), a.created.dtype.itemsize, _CANONICAL)
            dtype = np.dtype(f"S{width}")
        else:
            dtype = a.created.dtype
        # The room left is kept: a load that meets another form of stamp half-way goes on
        # into these arrays instead of merging again at every chunk.
        a = index.arrays = _merged(index, max(len(rows), len(a.ids) - a.n), dtype)
        created = _encode(stamps, dtype)
    n = len(rows)
    at, end = a.n, a.n + n
    a.bits[at:end] = np.frombuffer(b"".join(r[6] for r in rows), dtype=np.uint8).reshape(n, index.nbits)
    a.ids[at:end] = [r[2] for r in rows]
    a.created[at:end] = created
    for column, place in (("agent", 0), ("project", 3), ("channel", 4), ("source", None)):
        code = index.codes[column].code
        values = [code(r[place] if place is not None else _source_key(r, kind)) for r in rows]
        wanted = _code_type(len(index.codes[column].names))
        if wanted.itemsize > a.codes[column].dtype.itemsize:  # more values than the codes held
            a.codes[column] = a.codes[column].astype(wanted)
        a.codes[column][at:end] = values
    return a


def _apply(index: _KindIndex, changed: set[int], fresh: list[Any], kind: str) -> None:
    """Drop every row of ``changed`` ids, add ``fresh`` coarse rows after them, in place."""
    a = index.arrays
    if changed:
        a.alive[: a.n] &= ~np.isin(a.ids[: a.n], np.fromiter(changed, dtype=np.int64))
    if not fresh:
        return
    if a.n + len(fresh) - a.loaded > MERGE_ADDED:
        a = index.arrays = _merged(index, len(fresh), a.created.dtype)
    a = _fill(index, a, fresh, kind)
    n = a.n
    need = n + len(fresh)
    _place(a, n, need)
    a.alive[n:need] = True
    a.n = need  # published last: a scanner that read the old n never sees a half-written row


def _place(a: _Arrays, n: int, need: int) -> None:
    """Fractional ranks for the rows [n, need) just added, between the loaded ones, in scan order."""
    created_loaded = a.created[: a.loaded]
    touched = set()
    for i in range(n, need):
        created, row_id = a.created[i], int(a.ids[i])
        left = int(np.searchsorted(created_loaded, created, "left"))
        right = int(np.searchsorted(created_loaded, created, "right"))
        # Within one created_at the loaded rows run id descending: those of a larger id come first.
        before = left + int(np.count_nonzero(a.ids[left:right] > row_id))
        a.slots.setdefault(before, []).append((created, -row_id, i))
        touched.add(before)
    for before in touched:
        members = sorted(a.slots[before])
        a.slots[before] = members
        for j, (_, _, i) in enumerate(members):
            a.added[i - a.loaded] = before - 1 + (j + 1) / (len(members) + 1)


def _merged(index: _KindIndex, room: int, created: np.dtype) -> _Arrays:
    """Every live row, in scan order again, in new arrays with ``room`` rows to spare (no SQL),
    their stamps held as ``created`` (the same dtype, or bytes for stamps of another form).

    The added rows' fractional ranks already order them among the loaded ones,
    so one argsort of the ranks is the whole merge.
    """
    a = index.arrays
    live = np.flatnonzero(a.alive[: a.n])
    live = live[np.argsort(_ranks(a, live), kind="stable")]
    m = len(live)
    b = _empty(index.nbits, m + room + MERGE_ADDED, created, {c: a.codes[c].dtype for c in _COLUMNS})
    b.bits[:m] = a.bits[live]
    b.ids[:m] = a.ids[live]
    if created == a.created.dtype or a.created.dtype != _STAMP:
        b.created[:m] = a.created[live]
    else:
        b.created[:m] = _as_bytes(a.created[live], created)
    for column in _COLUMNS:
        b.codes[column][:m] = a.codes[column][live]
    b.slot[:m] = a.slot[live]
    b.alive[:m] = True
    b.n = b.loaded = m
    b.added = np.zeros(len(b.ids) - m, dtype=np.float64)
    return b


_INDEXES: PerDatabase[ProcessIndex] = PerDatabase(ProcessIndex)


def for_database(db: Any) -> ProcessIndex:
    """The one process-held index of ``db`` (created empty; loaded at its first scan)."""
    return _INDEXES.get(db)


def warm_database(db: Any) -> None:
    """Load the copies of ``db`` for the bit width of each kind's newest coarse row (start-up)."""
    index = for_database(db)
    for kind, table in _TABLES.items():
        with db.read() as session:
            conn = session.connection().connection.driver_connection
            row = conn.execute(f"SELECT length(bits) FROM {table} LIMIT 1").fetchone()
        if row and row[0]:
            index.warm(db, kind, int(row[0]))
