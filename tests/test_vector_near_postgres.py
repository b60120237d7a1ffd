"""The held near window on PostgreSQL (storage/vector_near_postgres.py) answers as pgvector's exact scan.

Two Database objects on one PostgreSQL database stand for two servers of a
team: one holds the window, the other writes. Every answer of the holder is
compared with the exact scan (same ids, same cosines bit for bit, same order)
over scopes, windows, thresholds and depths; after inserts, deletes, moves
between scopes, vector changes, a transaction that commits after a later one,
a pruned log and a truncate. Needs pgvector (skips without, fails under
CPERSONA_TEST_PG_REQUIRE_PGVECTOR=1).
"""

from __future__ import annotations

import numpy as np
import pytest
from sqlalchemy import text

from cpersona.storage import vector_near_postgres as near
from cpersona.storage.engine import open_postgres
from cpersona.storage.migrate import upgrade
from cpersona.storage.scope import Scope
from cpersona.storage.search_postgres import PostgresSearch
from cpersona.storage.vectors_postgres import pgvector_serves
from pg_support import fresh_pg_url, skip_without_pgvector

WIDTH = 8
AGENTS = ("a", "b")
PROJECTS = ("", "p", "q")


def _blob(rng: np.random.Generator, i: int) -> bytes | None:
    if i % 19 == 0:
        return None
    if i % 29 == 0:
        return np.zeros(WIDTH, dtype="<f4").tobytes()  # takes a window place, ranks nowhere
    width = 12 if i % 11 == 0 else WIDTH
    return rng.standard_normal(width).astype("<f4").tobytes()


def _row(rng: np.random.Generator, i: int) -> dict:
    return {
        "id": i,
        "a": AGENTS[i % 2],
        "p": PROJECTS[i % 3],
        "c": "c1" if i % 5 == 0 else "",
        "t": f"row {i}",
        # Pairs share a stamp: the (created_at desc, id asc) tie order matters.
        "ca": f"2024-01-01 {(i // 2) // 3600:02d}:{((i // 2) // 60) % 60:02d}:{(i // 2) % 60:02d}",
        "e": _blob(rng, i),
    }


INSERT = {
    "mem": "INSERT INTO memories (id, agent_id, project_id, channel, content, timestamp, created_at, embedding)"
    " VALUES (:id, :a, :p, :c, :t, :ca, :ca, :e)",
    "ep": "INSERT INTO episodes (id, agent_id, project_id, channel, summary, created_at, embedding)"
    " VALUES (:id, :a, :p, :c, :t, :ca, :e)",
}
TABLE = {"mem": "memories", "ep": "episodes"}


def _insert(db, rows, kinds=("mem", "ep")) -> None:
    with db.write_connection() as conn:
        for kind in kinds:
            conn.execute(text(INSERT[kind]), rows)


@pytest.fixture
def team():
    """(holder, writer): two Database objects on one fresh database of 300 rows per kind."""
    with fresh_pg_url() as url:
        holder, writer = open_postgres(url), open_postgres(url)
        upgrade(holder)
        if not pgvector_serves(holder):
            skip_without_pgvector()
        rng = np.random.default_rng(20261203)
        _insert(writer, [_row(rng, i) for i in range(1, 301)])
        yield holder, writer
        holder.close()
        writer.close()


CASES = [
    (Scope("a"), 1000, -1.0, 500),
    (Scope("a"), 30, 0.0, 10),
    (Scope("a", "p"), 1000, -1.0, 500),
    (Scope("b", None, "c1"), 50, 0.1, 20),
    (Scope("b", ""), 40, -1.0, 5),
    (Scope(), 60, 0.3, 7),
    (Scope("nobody"), 100, -1.0, 5),
]


def _answers(db, held: bool, kind: str, query: bytes) -> list:
    search = PostgresSearch(db)
    search.held_near = held
    out = []
    for scope, stop, threshold, depth in CASES:
        hits = search.vector_candidates(kind, scope, query, depth, threshold=threshold, window=(0, stop))
        out.append([(h.record.id, h.raw) for h in hits])
    return out


def _check(holder, kind: str, seed: int = 8) -> None:
    query = np.random.default_rng(seed).standard_normal(WIDTH).astype("<f4").tobytes()
    exact = _answers(holder, False, kind, query)
    assert _answers(holder, True, kind, query) == exact
    assert sum(len(a) for a in exact) > 100  # real rankings were compared


@pytest.mark.parametrize("kind", ["mem", "ep"])
def test_held_window_answers_as_the_exact_scan_and_follows_another_writer(team, kind):
    holder, writer = team
    index = near.for_database(holder)
    _check(holder, kind)
    assert index.loads == 1
    rng = np.random.default_rng(5)
    _insert(writer, [_row(rng, i) for i in range(301, 341)], (kind,))  # newest rows
    with writer.write_connection() as conn:
        table = TABLE[kind]
        conn.execute(text(f"DELETE FROM {table} WHERE id IN (300, 298, 7)"))
        conn.execute(text(f"UPDATE {table} SET agent_id = 'b' WHERE id IN (296, 294)"))  # moved to another scope
        conn.execute(text(f"UPDATE {table} SET project_id = 'q' WHERE id = 290"))
        conn.execute(
            text(f"UPDATE {table} SET embedding = :e WHERE id = 288"),
            {"e": rng.standard_normal(WIDTH).astype("<f4").tobytes()},
        )
        conn.execute(text(f"UPDATE {table} SET created_at = '2023-01-01 00:00:00' WHERE id = 286"))  # older: re-sorted
    for seed in (8, 9, 10):
        _check(holder, kind, seed)
    assert index.loads == 1, "followed through the change log, not loaded again"


def test_a_transaction_committed_after_a_later_one_is_not_missed(team):
    """Sequence numbers are taken before commit; the log is read by transaction visibility instead."""
    holder, writer = team
    _check(holder, "mem")
    rng = np.random.default_rng(6)
    early = writer.engine.connect()
    early.begin()
    early.execute(text(INSERT["mem"]), [_row(rng, 400)])  # the older transaction, still open
    _insert(writer, [_row(rng, 402)], ("mem",))  # a younger one commits first
    _check(holder, "mem")
    early.commit()
    early.close()
    query = np.random.default_rng(8).standard_normal(WIDTH).astype("<f4").tobytes()
    search = PostgresSearch(holder)
    ids = [
        h.record.id for h in search.vector_candidates("mem", Scope("a"), query, 500, threshold=-1.0, window=(0, 1000))
    ]
    assert 400 in ids and 402 in ids
    _check(holder, "mem")
    assert near.for_database(holder).loads == 1


def test_a_pruned_log_or_a_truncate_loads_again(team):
    holder, writer = team
    index = near.for_database(holder)
    _check(holder, "mem")
    rng = np.random.default_rng(7)
    _insert(writer, [_row(rng, i) for i in range(500, 510)], ("mem",))
    with writer.write_connection() as conn:
        conn.execute(text("SELECT cpersona_prune_vector_changes(0)"))
        assert conn.execute(text(f"SELECT count(*) FROM {near.CHANGE_LOG}")).scalar_one() == 0
    _check(holder, "mem")
    assert index.loads == 2, "the entries it needed were pruned: loaded again"
    with writer.write_connection() as conn:
        conn.execute(text("TRUNCATE memories CASCADE"))
    _insert(writer, [_row(rng, i) for i in range(600, 700)], ("mem",))
    _check(holder, "mem")
    assert index.loads == 3


def test_a_recall_older_than_the_copy_is_scanned_in_sql(team):
    holder, writer = team
    index = near.for_database(holder)
    query = np.random.default_rng(8).standard_normal(WIDTH).astype("<f4").tobytes()
    with holder.read() as old:
        old.execute(text("SELECT 1"))  # the old snapshot is taken here
        _insert(writer, [_row(np.random.default_rng(3), 800)], ("mem",))
        _check(holder, "mem")  # the copy moves past ``old``
        assert index.near(old, "mem", Scope("a"), query, 1000, 10, -1.0) is None


def test_the_update_trigger_ignores_counter_updates(team):
    holder, writer = team
    with writer.write_connection() as conn:
        before = conn.execute(text(f"SELECT count(*) FROM {near.CHANGE_LOG}")).scalar_one()
        conn.execute(text("UPDATE memories SET recall_count = recall_count + 1, last_recalled_at = 'x'"))
        conn.execute(text("UPDATE memories SET agent_id = agent_id WHERE id < 50"))  # same value: no entry
        assert conn.execute(text(f"SELECT count(*) FROM {near.CHANGE_LOG}")).scalar_one() == before


def test_snapshot_containment():
    s = near._Snapshot.parse
    assert s("10:12:10,11").contains(s("10:12:10,11"))
    assert s("12:12:").contains(s("10:12:10,11"))
    assert not s("10:12:10,11").contains(s("12:12:"))  # 10 and 11 were seen by the older copy
    assert not s("10:11:10").contains(s("10:12:10"))  # 11 was seen by the copy, not yet here
    assert s("10:11:10").contains(s("10:12:10,11"))
