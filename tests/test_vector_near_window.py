"""The near window from vectors the process holds (storage/vector_index_sqlite.py, ``near``).

Where a copy of the coarse index is loaded (a reach past the window loads it
at start), the near list (scan positions [0, CPERSONA_MAX_MEMORIES) of the
scope, spec VEC-2) is found on the copy, scored on float vectors held for the
window's rows, and only the rows that can make the answer are re-ranked in
SQL by sqlite-vec. The list must be the exact scan's, row for row and cosine
for cosine: these tests compare it with a second ``Database`` on the same
real file that has no copy (so it runs the SQL scan of vectors_sqlite), over
every scope kind, windows shorter and longer than the scope, thresholds,
exact ties, and after inserts, re-embeddings, scope moves and deletes that
reach the copy through the change log (revision 0008).
"""

from __future__ import annotations

import numpy as np
import pytest
from sqlalchemy import text

from cpersona.embedding.vectors import to_blob
from cpersona.storage import vector_index_sqlite
from cpersona.storage.engine import open_sqlite
from cpersona.storage.migrate import upgrade
from cpersona.storage.scope import Scope
from cpersona.storage.search_sqlite import SqliteSearch
from test_vector_channel import DIM, add_memories, stamp

pytestmark = pytest.mark.sqlite_only  # the coarse index, its copy and the change log are SQLite's


class HeldOnly(SqliteSearch):
    """The backend with the SQL scan of the near window taken away: every near list must come
    from the held vectors (a fallback to SQL would fail the test instead of passing quietly)."""

    def _vector_scan(self, kind, where, params, query):  # noqa: ANN001, ANN202
        raise AssertionError("the near window was scanned in SQL")


@pytest.fixture
def pair(db_path):
    """(held, exact): two databases on one file; ``held`` has its copy loaded, ``exact`` none."""
    held = open_sqlite(db_path)
    upgrade(held)
    exact = open_sqlite(db_path)
    try:
        yield held, exact
    finally:
        exact.close()
        held.close()


def near(db, scope: Scope, query, *, window=(0, 10_000), depth=10, threshold=-1.0, source_id="", held=False):
    backend = HeldOnly(db) if held else SqliteSearch(db)
    hits = backend.vector_candidates(
        "mem", scope, to_blob(list(query)), depth, threshold=threshold, window=window, source_id=source_id
    )
    return [(h.record.id, h.raw) for h in hits]


SCOPES = (
    (Scope(), ""),
    (Scope(agent_id="a"), ""),
    (Scope(agent_id="b"), ""),
    (Scope(agent_id="a", project_id="p1"), ""),
    (Scope(agent_id="a", project_id=""), ""),
    (Scope(agent_id="a", channel="c1"), ""),
    (Scope(project_id="p2", channel="c2"), ""),
    (Scope(agent_id="a"), "u1"),
    (Scope(agent_id="a", project_id="p1", channel="c1"), "u"),  # a source prefix (search_sqlite.source_filter)
    (Scope(agent_id="nobody"), ""),
)


def corpus(rng, n: int, first: int = 0) -> list[dict]:
    rows = []
    for i in range(first, first + n):
        vector = rng.normal(size=DIM)
        if i % 17 == 0 and rows:  # exact ties: the same vector again (cosine order is then scan order)
            vector = np.frombuffer(rows[-1]["embedding"], dtype="<f4").astype(np.float64)
        rows.append(
            {
                "agent_id": "ab"[i % 3 == 0],
                "project_id": ("", "p1", "p2")[i % 3],
                "channel": ("", "c1", "c2", "c1")[i % 4],
                "source": '{"id": "%s"}' % ("u1", "u2", "x")[i % 5 % 3],
                "content": f"row {i}",
                "embedding": to_blob(list(vector)),
                "created_at": stamp(i // 2),  # pairs share a created_at: the id breaks the tie
            }
        )
    return rows


def same_everywhere(held, exact, rng, *, queries: int = 4) -> int:
    compared = 0
    for _ in range(queries):
        query = rng.normal(size=DIM)
        for scope, source in SCOPES:
            for window, depth, threshold in (((0, 10_000), 10, -1.0), ((0, 60), 7, -1.0), ((0, 200), 25, 0.15)):
                want = near(exact, scope, query, window=window, depth=depth, threshold=threshold, source_id=source)
                got = near(
                    held, scope, query, window=window, depth=depth, threshold=threshold, source_id=source, held=True
                )
                assert got == want, (scope, source, window, depth, threshold)
                compared += bool(want)
    return compared


def test_the_held_near_window_is_the_exact_scan_in_every_scope(pair):  # spec VEC-2, VEC-5, ISO-2, ISO-3
    held, exact = pair
    rng = np.random.default_rng(3)
    add_memories(held, *corpus(rng, 420))
    vector_index_sqlite.warm_database(held)
    assert same_everywhere(held, exact, rng) > 20
    index = vector_index_sqlite.for_database(held)
    assert index._kinds["mem"].floats is not None  # the lists above really came from held vectors
    assert not vector_index_sqlite.for_database(exact).serves("mem", DIM // 8)


def test_writes_reach_the_held_window_through_the_change_log(pair):  # spec VEC-2, ISO-2
    held, exact = pair
    rng = np.random.default_rng(5)
    add_memories(held, *corpus(rng, 300))
    vector_index_sqlite.warm_database(held)
    same_everywhere(held, exact, rng, queries=1)
    # Writes from the other database (another process): new rows push the oldest out of the
    # windows, a re-embedding, moves across every scope axis, deletes.
    add_memories(exact, *corpus(rng, 40, first=300))
    with exact.write_connection() as conn:
        ids = [r[0] for r in conn.execute(text("SELECT id FROM memories ORDER BY id DESC LIMIT 12"))]
        conn.execute(
            text("UPDATE memories SET embedding = :e WHERE id = :i"),
            {"e": to_blob(list(rng.normal(size=DIM))), "i": ids[0]},
        )
        conn.execute(text("UPDATE memories SET agent_id = 'b' WHERE id = :i"), {"i": ids[1]})
        conn.execute(text("UPDATE memories SET project_id = 'p2' WHERE id = :i"), {"i": ids[2]})
        conn.execute(text("UPDATE memories SET channel = 'c2' WHERE id = :i"), {"i": ids[3]})
        conn.execute(text('UPDATE memories SET source = \'{"id": "u2"}\' WHERE id = :i'), {"i": ids[4]})
        conn.execute(text("UPDATE memories SET embedding = NULL WHERE id = :i"), {"i": ids[5]})
        conn.execute(text("DELETE FROM memories WHERE id IN (:a, :b)"), {"a": ids[6], "b": ids[7]})
        conn.execute(text("DELETE FROM memories WHERE id IN (SELECT id FROM memories ORDER BY id LIMIT 5)"))
    same_everywhere(held, exact, rng)
    # and from the held database itself, one row with a longer stamp than any the copy holds
    # (it is held at the loaded stamps' width: the copy must widen, not cut the stamp)
    add_memories(held, *corpus(rng, 30, first=340))
    with held.read() as session:
        order = session.execute(text("SELECT created_at FROM memories ORDER BY created_at DESC, id ASC")).all()
    wide = add_memories(held, {**corpus(rng, 1, first=400)[0], "created_at": order[9][0] + ".500000"})[0]
    with held.read() as session:  # its place: cut at 19 bytes it would sort after the rows of that second
        order = [r[0] for r in session.execute(text("SELECT id FROM memories ORDER BY created_at DESC, id ASC"))]
    edge = (0, order.index(wide) + 1)
    query = rng.normal(size=DIM)
    want = near(exact, Scope(), query, window=edge, depth=edge[1])
    assert wide in [i for i, _ in want]
    assert near(held, Scope(), query, window=edge, depth=edge[1], held=True) == want
    same_everywhere(held, exact, rng, queries=2)
    assert vector_index_sqlite.for_database(held).loads == 1  # followed by the log, never loaded again


def test_another_agents_rows_never_enter_a_held_window(pair):  # spec ISO-2
    held, exact = pair
    rng = np.random.default_rng(9)
    query = rng.normal(size=DIM)
    # The other agent's rows are the query itself and newer than every row of agent a.
    add_memories(
        held,
        *(
            {"agent_id": "a", "content": f"a {i}", "embedding": list(rng.normal(size=DIM)), "created_at": stamp(i)}
            for i in range(30)
        ),
    )
    add_memories(
        held,
        *(
            {"agent_id": "b", "content": f"b {i}", "embedding": list(query), "created_at": stamp(100 + i)}
            for i in range(30)
        ),
    )
    vector_index_sqlite.warm_database(held)
    mine = near(held, Scope(agent_id="a"), query, window=(0, 10), depth=10, held=True)
    assert len(mine) == 10
    with held.read() as session:
        agents = {
            r[0]
            for r in session.execute(
                text("SELECT agent_id FROM memories WHERE id IN (%s)" % ",".join(str(i) for i, _ in mine))
            )
        }
    assert agents == {"a"}
    assert mine == near(exact, Scope(agent_id="a"), query, window=(0, 10), depth=10)


def test_held_vectors_stay_about_one_window(pair):
    held, _ = pair
    rng = np.random.default_rng(13)
    add_memories(held, *corpus(rng, 400))
    vector_index_sqlite.warm_database(held)
    for scope, source in SCOPES:
        near(held, scope, rng.normal(size=DIM), window=(0, 50), source_id=source, held=True)
    floats = vector_index_sqlite.for_database(held)._kinds["mem"].floats
    assert floats.used <= len(floats.matrix) <= 50 + 50 // 4 + vector_index_sqlite._FLOAT_ROOM
