"""The near vector window on PostgreSQL, from vectors held in the process (issue 17 item 3).

pgvector's exact window scan computes a cosine for every row of the scope's
newest ``CPERSONA_MAX_MEMORIES`` (10k) and sorts them by ``created_at``:
~23 ms of a 90 ms recall at 10k rows (docs/benchmarks.md, "Round five").
SQLite serves that window from vectors its process holds
(:mod:`cpersona.storage.vector_index_sqlite`); this is the same for
PostgreSQL: each process keeps, per kind and vector width, every row's id,
scan key and isolation codes, and the float32 vectors of the rows windows
have read. The window and a cosine per row are computed here; only the rows
that can be among the best ``depth`` (a float32 rounding slack wide) are
re-ranked in SQL by pgvector's own cosine, with the scope and width
predicates applied again, so the answer is the exact scan's.

Staying in step with other writers (several servers share one database):
revision 0009 logs every insert, delete, relevant update and truncate of
``memories`` / ``episodes`` in ``vector_changes`` with the writing
transaction's id (``pg_current_xact_id()``). A sequence would not do: sequence
numbers are handed out before commit, so a later number can become visible
first. Instead the copy remembers the snapshot it was brought to
(``pg_current_snapshot()``, read inside the recall's own REPEATABLE READ
transaction, so the re-rank sees the same rows). At the next recall it reads
the entries of transactions visible now and not in that snapshot
(``xid >= its xmin AND NOT pg_visible_in_snapshot(xid, it)``, through the xid
index), re-reads those rows, and moves to the new snapshot. A recall whose
snapshot does not contain the copy's (an older one) is answered by the SQL
scan. Writers prune the log now and then (:data:`LOG_KEEP` entries kept) and
raise ``vector_change_state.pruned`` past every xid they removed; a copy
whose snapshot's xmin is below it loads again, as does one that sees a
truncate or more changes than are worth applying one by one.

Served only when it can be exact, else None (the SQL scan answers): with
pgvector, without a source filter (the source id lives in JSON; such recalls
are rare), for the near window (from position 0), while every held stamp is
SQLite's canonical 'YYYY-MM-DD HH:MM:SS' (compared as digits, which every
collation orders as text does: the punctuation sits at the same places), and
while the change log exists.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from sqlalchemy import BigInteger, text
from sqlalchemy.dialects.postgresql.base import ischema_names

from cpersona.storage.per_database import PerDatabase
from cpersona.storage.scope import Scope

# The drift check reflects the log table before leaving it out; without a name for xid8 it warns.
ischema_names.setdefault("xid8", BigInteger)

CHANGE_LOG = "vector_changes"
CHANGE_STATE = "vector_change_state"
LOG_KEEP = 100_000  # entries a pruning writer leaves (older ones go)
PRUNE_CHANCE = 0.01  # share of write statements that prune
# Applying changes one by one beyond this many (or a quarter of the rows) is dearer than loading again.
RELOAD_CHANGES = 20_000
# Bound on |cosine here - pgvector's cosine| for one row: both sum float32 products (pgvector in
# float32, n * 2**-24 relative to |a||q|: 2.3e-5 at 384-d, 1.2e-4 at 2,000-d), with margin.
NEAR_SLACK = 1e-3
_TABLES = {"mem": "memories", "ep": "episodes"}
_KINDS = {v: k for k, v in _TABLES.items()}

# -- DDL (revision 0009 runs it; the single copy) -----------------------------------------------

CHANGE_LOG_DDL = (
    f"CREATE TABLE IF NOT EXISTS {CHANGE_LOG} (seq bigserial PRIMARY KEY, kind text NOT NULL,"
    " row_id bigint NOT NULL, xid xid8 NOT NULL DEFAULT pg_current_xact_id())",
    f"CREATE INDEX IF NOT EXISTS {CHANGE_LOG}_xid ON {CHANGE_LOG} (xid)",
    f"CREATE TABLE IF NOT EXISTS {CHANGE_STATE} (one integer PRIMARY KEY CHECK (one = 1), pruned xid8 NOT NULL)",
    f"INSERT INTO {CHANGE_STATE} VALUES (1, '0') ON CONFLICT DO NOTHING",
    # Drops the oldest entries past LOG_KEEP that this transaction can see (so finished), and
    # records the first xid that may now be missing: a copy whose xmin is below it loads again.
    f"""CREATE OR REPLACE FUNCTION cpersona_prune_vector_changes(keep bigint) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE cut xid8;
BEGIN
  WITH gone AS (DELETE FROM {CHANGE_LOG} WHERE seq <= (SELECT max(seq) FROM {CHANGE_LOG}) - keep RETURNING xid)
  SELECT max(xid) INTO cut FROM gone;
  IF cut IS NOT NULL THEN
    UPDATE {CHANGE_STATE} SET pruned = greatest(pruned, (cut::text::numeric + 1)::text::xid8) WHERE one = 1;
  END IF;
END $$""",
    # Statement triggers with transition tables: one INSERT ... SELECT per bulk statement.
    f"""CREATE OR REPLACE FUNCTION cpersona_log_vector_rows() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  IF TG_OP = 'TRUNCATE' THEN
    INSERT INTO {CHANGE_LOG} (kind, row_id) VALUES (TG_ARGV[0], -1);
  ELSIF TG_OP = 'DELETE' THEN
    INSERT INTO {CHANGE_LOG} (kind, row_id) SELECT TG_ARGV[0], id FROM old_rows;
  ELSE
    INSERT INTO {CHANGE_LOG} (kind, row_id) SELECT TG_ARGV[0], id FROM new_rows;
  END IF;
  IF random() < {PRUNE_CHANCE} THEN
    PERFORM cpersona_prune_vector_changes({LOG_KEEP});
  END IF;
  RETURN NULL;
END $$""",
    # Row trigger for updates: only the columns the copy holds, and only when one changed (a
    # recall's counter update must not log every row it returned). Both ids when id changes.
    f"""CREATE OR REPLACE FUNCTION cpersona_log_vector_update() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO {CHANGE_LOG} (kind, row_id) VALUES (TG_ARGV[0], NEW.id);
  IF NEW.id IS DISTINCT FROM OLD.id THEN
    INSERT INTO {CHANGE_LOG} (kind, row_id) VALUES (TG_ARGV[0], OLD.id);
  END IF;
  RETURN NULL;
END $$""",
)

_HELD_COLUMNS = "id, agent_id, project_id, channel, created_at, embedding"


def trigger_names(table: str) -> tuple[str, ...]:
    return tuple(f"{table}_vector_log_{e}" for e in ("ins", "del", "upd", "trunc"))


def triggers_ddl(table: str) -> tuple[str, ...]:
    kind = _KINDS[table]
    ins, dele, upd, trunc = trigger_names(table)
    source = ", source" if table == "memories" else ""
    changed = " OR ".join(
        f"OLD.{c} IS DISTINCT FROM NEW.{c}"
        for c in (
            "id",
            "agent_id",
            "project_id",
            "channel",
            "created_at",
            "embedding",
            *(("source",) if source else ()),
        )
    )
    return (
        f"CREATE OR REPLACE TRIGGER {ins} AFTER INSERT ON {table} REFERENCING NEW TABLE AS new_rows"
        f" FOR EACH STATEMENT EXECUTE FUNCTION cpersona_log_vector_rows('{kind}')",
        f"CREATE OR REPLACE TRIGGER {dele} AFTER DELETE ON {table} REFERENCING OLD TABLE AS old_rows"
        f" FOR EACH STATEMENT EXECUTE FUNCTION cpersona_log_vector_rows('{kind}')",
        f"CREATE OR REPLACE TRIGGER {upd} AFTER UPDATE OF {_HELD_COLUMNS}{source} ON {table}"
        f" FOR EACH ROW WHEN ({changed}) EXECUTE FUNCTION cpersona_log_vector_update('{kind}')",
        f"CREATE OR REPLACE TRIGGER {trunc} AFTER TRUNCATE ON {table}"
        f" FOR EACH STATEMENT EXECUTE FUNCTION cpersona_log_vector_rows('{kind}')",
    )


DROP_FUNCTIONS = ("cpersona_log_vector_rows()", "cpersona_log_vector_update()", "cpersona_prune_vector_changes(bigint)")

# -- snapshots ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Snapshot:
    text: str
    xmin: int
    xmax: int
    xip: frozenset[int]

    @classmethod
    def parse(cls, value: str) -> _Snapshot:
        xmin, xmax, xip = value.split(":")
        return cls(value, int(xmin), int(xmax), frozenset(int(x) for x in xip.split(",") if x))

    def sees(self, xid: int) -> bool:
        return xid < self.xmin or (xid < self.xmax and xid not in self.xip)

    def contains(self, older: _Snapshot) -> bool:
        """Whether every transaction ``older`` sees is seen here (this snapshot is not behind it)."""
        if self.xmax < older.xmax:
            if older.xmax - self.xmax > 4_096:  # too far behind to be worth checking xid by xid
                return False
            if any(older.sees(x) for x in range(self.xmax, older.xmax)):
                return False
        return not any(older.sees(x) for x in self.xip)


# -- the held rows --------------------------------------------------------------------------------


class _Codes:
    def __init__(self) -> None:
        self.of: dict[str, int] = {}

    def code(self, value: str) -> int:
        found = self.of.get(value)
        if found is None:
            found = self.of[value] = len(self.of)
        return found

    def get(self, value: str) -> int:
        return self.of.get(value, -1)


_EMPTY_I = np.zeros(0, dtype=np.int64)


@dataclass
class _Held:
    """Rows of one kind and vector width, sorted by (created asc, id desc): newest last."""

    nbytes: int
    snapshot: _Snapshot
    ids: np.ndarray = field(default_factory=lambda: _EMPTY_I)
    created: np.ndarray = field(default_factory=lambda: _EMPTY_I)
    agent: np.ndarray = field(default_factory=lambda: _EMPTY_I)
    project: np.ndarray = field(default_factory=lambda: _EMPTY_I)
    channel: np.ndarray = field(default_factory=lambda: _EMPTY_I)
    alive: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))
    codes: dict[str, _Codes] = field(default_factory=lambda: {c: _Codes() for c in ("agent", "project", "channel")})
    where: dict[int, int] = field(default_factory=dict)  # id -> position
    # Each position's row in ``matrix`` (float32 vectors of the rows windows read), -1 while not held.
    slot: np.ndarray = field(default_factory=lambda: _EMPTY_I)
    matrix: np.ndarray | None = None
    norms: np.ndarray = field(default_factory=lambda: np.zeros(0))
    used: int = 0
    canonical: bool = True

    def hold(self, positions: np.ndarray, blobs: list[bytes]) -> None:
        """Keep the vectors of ``positions`` (their blobs, in the same order)."""
        width = self.nbytes // 4
        need = self.used + len(blobs)
        if self.matrix is None or need > len(self.matrix):
            grown = np.zeros((max(need, 2 * (0 if self.matrix is None else len(self.matrix)), 1024), width), "<f4")
            norms = np.zeros(len(grown))
            if self.matrix is not None:
                grown[: self.used], norms[: self.used] = self.matrix[: self.used], self.norms[: self.used]
            self.matrix, self.norms = grown, norms
        block = np.frombuffer(b"".join(blobs), dtype="<f4").reshape(len(blobs), width)
        self.matrix[self.used : need] = block
        with np.errstate(over="ignore", invalid="ignore"):
            b = block.astype(np.float64)
            self.norms[self.used : need] = np.sqrt(np.einsum("ij,ij->i", b, b))
        self.slot[positions] = np.arange(self.used, need)
        self.used = need


def _stamp(value: str) -> int | None:
    """SQLite's own stamp as its 14 digits, None for any other form."""
    if len(value) != 19 or value[4] != "-" or value[7] != "-" or value[10] != " " or value[13] != ":":
        return None
    if value[16] != ":":
        return None
    digits = value[0:4] + value[5:7] + value[8:10] + value[11:13] + value[14:16] + value[17:19]
    return int(digits) if digits.isdigit() else None


_META = "SELECT id, agent_id, project_id, channel, created_at FROM {table} WHERE embedding IS NOT NULL AND octet_length(embedding) = :nbytes"


def _add(held: _Held, rows: list[Any]) -> None:
    """Place ``rows`` (id, agent, project, channel, created_at); re-sorts unless all are newest."""
    if not rows:
        return
    stamps = [_stamp(r[4]) for r in rows]
    if any(s is None for s in stamps):
        held.canonical = False
        return
    c = held.codes
    ids = np.array([r[0] for r in rows], dtype=np.int64)
    created = np.array(stamps, dtype=np.int64)
    order = np.lexsort((-ids, created))
    ids, created = ids[order], created[order]
    rows = [rows[i] for i in order]
    agent = np.array([c["agent"].code(r[1]) for r in rows], dtype=np.int64)
    project = np.array([c["project"].code(r[2]) for r in rows], dtype=np.int64)
    channel = np.array([c["channel"].code(r[3]) for r in rows], dtype=np.int64)
    n = len(held.ids)
    in_order = n == 0 or (created[0], -ids[0]) > (held.created[-1], -held.ids[-1])
    held.ids = np.concatenate([held.ids, ids])
    held.created = np.concatenate([held.created, created])
    held.agent = np.concatenate([held.agent, agent])
    held.project = np.concatenate([held.project, project])
    held.channel = np.concatenate([held.channel, channel])
    held.alive = np.concatenate([held.alive, np.ones(len(ids), dtype=bool)])
    held.slot = np.concatenate([held.slot, np.full(len(ids), -1, dtype=np.int64)])
    if not in_order:
        _resort(held)
    else:
        held.where.update((int(i), n + k) for k, i in enumerate(ids))


def _resort(held: _Held) -> None:
    """Drop dead rows and sort again (created asc, id desc)."""
    keep = np.flatnonzero(held.alive)
    order = keep[np.lexsort((-held.ids[keep], held.created[keep]))]
    for name in ("ids", "created", "agent", "project", "channel", "slot"):
        setattr(held, name, getattr(held, name)[order])
    held.alive = np.ones(len(order), dtype=bool)
    held.where = {int(i): k for k, i in enumerate(held.ids)}


def _drop(held: _Held, ids: set[int]) -> None:
    for i in ids:
        pos = held.where.pop(i, None)
        if pos is not None:
            held.alive[pos] = False
            held.slot[pos] = -1
    if len(held.where) < len(held.alive) * 3 // 4:
        _resort(held)


CHANGES_STATEMENT = text(
    "SELECT s.snap, s.pruned, c.kind, c.row_id FROM (SELECT pg_current_snapshot()::text AS snap,"
    f" (SELECT pruned::text FROM {CHANGE_STATE}) AS pruned) s"
    f" LEFT JOIN {CHANGE_LOG} c ON c.xid >= CAST(:xmin AS xid8)"
    " AND NOT pg_visible_in_snapshot(c.xid, CAST(:prev AS pg_snapshot))"
)
SNAPSHOT_STATEMENT = text(f"SELECT pg_current_snapshot()::text, to_regclass('{CHANGE_LOG}') IS NOT NULL")


class NearIndex:
    """The held rows of one Database (see the module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[tuple[str, int], _Held] = {}
        self.loads = 0  # full loads (tests read it)
        self.logged: bool | None = None

    def _load(self, session: Any, kind: str, nbytes: int, snapshot: _Snapshot) -> _Held:
        held = _Held(nbytes, snapshot)
        result = session.execute(text(_META.format(table=_TABLES[kind])), {"nbytes": nbytes})
        rows = [tuple(r) for r in result]
        _add(held, rows)
        self.loads += 1
        self._held[(kind, nbytes)] = held
        return held

    def _refresh(self, session: Any, kind: str, nbytes: int) -> _Held | None:
        held = self._held.get((kind, nbytes))
        if held is None:
            snap, logged = session.execute(SNAPSHOT_STATEMENT).one()
            if not logged:
                self.logged = False
                return None
            return self._load(session, kind, nbytes, _Snapshot.parse(snap))
        rows = session.execute(CHANGES_STATEMENT, {"xmin": str(held.snapshot.xmin), "prev": held.snapshot.text}).all()
        now = _Snapshot.parse(rows[0].snap)
        if now.text == held.snapshot.text:
            return held
        if not now.contains(held.snapshot):
            return None  # this recall's snapshot is older than the copy: the SQL scan answers it
        changed = {int(r.row_id) for r in rows if r.kind == kind}
        if (
            int(rows[0].pruned) > held.snapshot.xmin
            or -1 in changed
            or len(changed) > max(RELOAD_CHANGES, len(held.where) // 4)
        ):
            return self._load(session, kind, nbytes, now)
        if changed:
            _drop(held, changed)
            found = session.execute(
                text(_META.format(table=_TABLES[kind]) + " AND id = ANY(:ids)"),
                {"nbytes": nbytes, "ids": sorted(changed)},
            ).all()
            _add(held, [tuple(r) for r in found])
        held.snapshot = now
        return held

    def near(
        self, session: Any, kind: str, scope: Scope, query: bytes, stop: int, depth: int, threshold: float
    ) -> list[int] | None:
        """Ids of the near window's rows (the scope's newest ``stop`` of the query's width) that can
        be among its best ``depth`` at or above ``threshold``; None when the SQL scan must answer."""
        nbytes = len(query)
        with self._lock:
            held = self._refresh(session, kind, nbytes)
            if held is None or not held.canonical:
                return None
            rows = _newest(held, scope, stop)
            if not len(rows):
                return []
            missing = rows[held.slot[rows] < 0]
            if len(missing):
                fetched = session.execute(
                    text(f"SELECT id, embedding FROM {_TABLES[kind]} WHERE id = ANY(:ids)"),
                    {"ids": [int(i) for i in held.ids[missing]]},
                ).all()
                blobs = {int(r.id): bytes(r.embedding) for r in fetched if r.embedding is not None}
                got = [p for p in missing if len(blobs.get(int(held.ids[p]), b"")) == nbytes]
                held.hold(np.array(got, dtype=np.int64), [blobs[int(held.ids[p])] for p in got])
                rows = rows[held.slot[rows] >= 0]  # a row deleted since the refresh has no blob here
            ids, slots = held.ids[rows], held.slot[rows]
            q32 = np.frombuffer(query, dtype="<f4")
            # einsum, not matmul: numpy's BLAS runs a matrix-vector product this size on worker
            # threads that spin on after it (vector_index_sqlite measured 2x the CPU).
            dots = np.einsum("ij,j->i", held.matrix[: held.used], q32)[slots] if held.used else np.empty(0)
            norms = held.norms[slots] if held.used else np.empty(0)
        qnorm = float(np.sqrt(np.dot(q32.astype(np.float64), q32.astype(np.float64))))
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            cosine = dots.astype(np.float64) / (norms * qnorm)
        finite = np.isfinite(cosine)  # pgvector's column is NULL for a zero or non-finite vector
        ids, cosine = ids[finite], cosine[finite]
        cut = threshold - NEAR_SLACK
        if len(cosine) > depth > 0:
            kth = float(-np.partition(-cosine, depth - 1)[depth - 1])
            cut = max(cut, kth - 2 * NEAR_SLACK)
        return [int(i) for i in ids[cosine >= cut]]


def _newest(held: _Held, scope: Scope, stop: int) -> np.ndarray:
    """Positions of the scope's newest ``stop`` rows, read back from the newest end in growing steps."""
    n = len(held.ids)
    c = held.codes
    tests: list[tuple[np.ndarray, tuple[int, ...]]] = []
    if scope.agent_id is not None:
        tests.append((held.agent, (c["agent"].get(scope.agent_id),)))
    if (projects := scope.project_values) is not None:
        tests.append((held.project, tuple(c["project"].get(p) for p in projects)))
    if (channels := scope.channel_values) is not None:
        tests.append((held.channel, tuple(c["channel"].get(v) for v in channels)))
    step, hi = max(2 * stop, 8_192), n
    found: list[np.ndarray] = []
    count = 0
    while hi > 0 and count < stop:
        lo = max(0, hi - step)
        mask = held.alive[lo:hi].copy()
        for column, values in tests:
            mask &= np.isin(column[lo:hi], values)
        hits = np.flatnonzero(mask) + lo
        found.append(hits)
        count += len(hits)
        hi, step = lo, step * 4
    if not found:
        return _EMPTY_I
    rows = np.concatenate(found[::-1])
    return rows[-stop:] if len(rows) > stop else rows


_INDEXES: PerDatabase[NearIndex] = PerDatabase(NearIndex)


def for_database(db: Any) -> NearIndex:
    """The one process-held near window of ``db`` (created empty; loaded at its first recall)."""
    return _INDEXES.get(db)


def rerank_statement(kind: str, where: str) -> Any:
    """The exact scan's ranking (vectors_postgres.pgvector_scan_statement) over the proposed ids only."""
    table, alias = _TABLES[kind], "m" if kind == "mem" else "e"
    return text(
        "SELECT w.id, w.cosine FROM ("
        f" SELECT {alias}.id AS id, {alias}.created_at AS created_at,"
        f" 1.0 - ({alias}.embedding_vec <=> CAST(:qv AS vector)) AS cosine"
        f" FROM {table} {alias} WHERE {alias}.id = ANY(:ids) AND {where}"
        f" AND {alias}.embedding IS NOT NULL AND octet_length({alias}.embedding) = :nbytes"
        ") w WHERE w.cosine >= :threshold AND w.cosine <> 'NaN'::float8"
        " ORDER BY w.cosine DESC, w.created_at DESC, w.id ASC LIMIT :depth"
    )
