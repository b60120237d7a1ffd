"""The coarse index held in the process (storage/vector_index_sqlite.py): in step across connections.

Two ``Database`` objects on one real SQLite file stand for two server
processes (each has its own engine, pool and in-memory copy); one test writes
from a real second process. A write made through one is seen by the other's
next far list for every kind of change the copy mirrors (insert, delete,
re-embedding edit, project / channel / agent move), through the change log of
revision 0008, and no candidate of another scope ever reaches an answer, even
from a copy that is out of step.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest
from sqlalchemy import text

from cpersona.embedding.vectors import to_blob
from cpersona.storage import coarse_sqlite, vector_index_sqlite
from cpersona.storage.engine import open_sqlite
from cpersona.storage.migrate import upgrade
from cpersona.storage.scope import Scope
from cpersona.storage.search_sqlite import SqliteSearch
from cpersona.storage.vectors_sqlite import scan_parameters
from test_coarse_index import plain_writer
from test_vector_channel import DIM, add_memories, stamp, unit

pytestmark = pytest.mark.sqlite_only  # the coarse index and its change log are SQLite's

FAR = (1, 10**9)  # every row in scope but the newest: the far list of a whole-corpus reach


@pytest.fixture
def two(db_path):
    """Two databases on one file, as two processes would open it."""
    first = open_sqlite(db_path)
    upgrade(first)
    second = open_sqlite(db_path)
    try:
        yield first, second
    finally:
        second.close()
        first.close()


def far(db, scope: Scope, query: list[float], *, window=FAR, depth: int = 5, source_id: str = "") -> list[int]:
    hits = SqliteSearch(db).vector_candidates(
        "mem", scope, to_blob(query), depth, threshold=-1.0, window=window, source_id=source_id
    )
    return [h.record.id for h in hits]


def loads(db) -> int:
    return vector_index_sqlite.for_database(db).loads


def execute(db, sql: str, **params) -> None:
    with db.write_connection() as conn:
        conn.execute(text(sql), params)


def filler(n: int, agent: str = "a") -> list[dict]:
    return [
        {
            "agent_id": agent,
            "content": f"filler {i}",
            "embedding": unit(0.0, 1.0, float(i)),
            "created_at": stamp(100 + i),
        }
        for i in range(n)
    ]


def test_every_kind_of_write_in_one_database_reaches_the_others_next_far_list(two):
    writer, reader = two
    add_memories(writer, *filler(20), {"content": "newest", "embedding": unit(0.0, 0.0, 1.0), "created_at": stamp(999)})
    q = unit(1.0)
    assert far(reader, Scope(agent_id="a"), q)[:1] != []
    assert loads(reader) == 1
    # insert: an old row near the query, beyond the newest
    target = add_memories(writer, {"content": "target", "embedding": unit(1.0, 0.05), "created_at": stamp(5)})[0]
    assert far(reader, Scope(agent_id="a"), q)[0] == target
    # edit of content that re-embeds it away from the query
    execute(
        writer,
        "UPDATE memories SET content = 'moved away', embedding = :e WHERE id = :i",
        e=to_blob(unit(0.0, 0.0, 0.0, 1.0)),
        i=target,
    )
    assert far(reader, Scope(agent_id="a"), q)[0] != target
    execute(writer, "UPDATE memories SET embedding = :e WHERE id = :i", e=to_blob(unit(1.0, 0.05)), i=target)
    assert far(reader, Scope(agent_id="a"), q)[0] == target
    # project move: out of p1's scope, into p2's
    execute(writer, "UPDATE memories SET project_id = 'p2' WHERE id = :i", i=target)
    assert target not in far(reader, Scope(agent_id="a", project_id="p1"), q)
    assert far(reader, Scope(agent_id="a", project_id="p2"), q)[0] == target
    execute(writer, "UPDATE memories SET project_id = '' WHERE id = :i", i=target)
    # channel move
    execute(writer, "UPDATE memories SET channel = 'c2' WHERE id = :i", i=target)
    assert target not in far(reader, Scope(agent_id="a", channel="c1"), q)
    assert far(reader, Scope(agent_id="a", channel="c2"), q)[0] == target
    # agent move: isolation follows the row
    execute(writer, "UPDATE memories SET agent_id = 'b' WHERE id = :i", i=target)
    assert target not in far(reader, Scope(agent_id="a"), q)
    add_memories(
        writer, {"agent_id": "b", "content": "b newest", "embedding": unit(0.0, 1.0), "created_at": stamp(998)}
    )
    assert far(reader, Scope(agent_id="b"), q) == [target]
    # delete
    execute(writer, "DELETE FROM memories WHERE id = :i", i=target)
    assert target not in far(reader, Scope(agent_id="b"), q)
    # every change above was applied from the log, not by loading the table again
    assert loads(reader) == 1


def test_a_write_from_another_process_reaches_the_next_far_list(two, db_path):
    writer, reader = two
    add_memories(writer, *filler(10))
    q = unit(1.0)
    assert far(reader, Scope(agent_id="a"), q)
    script = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(__file__.rsplit("/", 1)[0])!r})
        from cpersona.storage.engine import open_sqlite
        from test_vector_channel import add_memories, stamp, unit
        db = open_sqlite({str(db_path)!r})
        print(add_memories(db, {{"content": "other process", "embedding": unit(1.0), "created_at": stamp(1)}})[0])
        db.close()
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert far(reader, Scope(agent_id="a"), q)[0] == int(done.stdout.split()[-1])
    assert loads(reader) == 1


def test_isolation_applies_inside_the_scan_of_the_copy(two):  # spec ISO-2, ISO-3
    writer, reader = two
    rng = np.random.default_rng(11)
    query = rng.normal(size=DIM)
    crowd = coarse_sqlite.MIN_CANDIDATES + 50  # more near rows of other scopes than candidate places
    near = [list(query + rng.normal(0, 0.05, DIM)) for _ in range(crowd)]
    add_memories(
        writer,
        *(
            {"agent_id": "b", "content": f"b {i}", "source": '{"id": "u1"}', "embedding": v, "created_at": stamp(i)}
            for i, v in enumerate(near)
        ),
    )
    add_memories(
        writer,
        *(
            {"content": f"p2 {i}", "project_id": "p2", "embedding": v, "created_at": stamp(i)}
            for i, v in enumerate(near)
        ),
        *({"content": f"c2 {i}", "channel": "c2", "embedding": v, "created_at": stamp(i)} for i, v in enumerate(near)),
        *(
            {"content": f"u2 {i}", "source": '{"id": "u2"}', "embedding": v, "created_at": stamp(i)}
            for i, v in enumerate(near)
        ),
    )
    mine = add_memories(
        writer,
        {
            "content": "mine",
            "source": '{"id": "u1"}',
            "project_id": "p1",
            "channel": "c1",
            "embedding": list(query + rng.normal(0, 1.0, DIM)),
            "created_at": stamp(-5),
        },
        {"content": "mine, newest", "source": '{"id": "u1"}', "embedding": unit(0.0, 1.0), "created_at": stamp(9999)},
    )
    scope = Scope(agent_id="a", project_id="p1", channel="c1")
    index = vector_index_sqlite.for_database(reader)
    with reader.read() as session:
        conn = session.connection().connection.driver_connection
        qbits = coarse_sqlite.query_bits(to_blob(list(query)))
        ids, _, _ = index.propose(conn, "mem", scope, "u1", qbits, FAR, coarse_sqlite.MIN_CANDIDATES)
    assert ids == [mine[0]]  # the copy itself proposed no row of another scope
    assert far(reader, scope, list(query), source_id="u1") == [mine[0]]
    assert far(reader, Scope(agent_id="c"), list(query)) == []


def test_candidates_of_a_copy_out_of_step_are_tested_again_in_sql(two, db_path):  # spec ISO-2
    writer, reader = two
    add_memories(writer, *filler(10))
    moved = add_memories(writer, {"content": "moves", "embedding": unit(1.0), "created_at": stamp(1)})[0]
    q = unit(1.0)
    assert far(reader, Scope(agent_id="a"), q)[0] == moved
    # A writer without our triggers (no sqlite-vec, our driver: two SQLite libraries in one
    # process corrupt a WAL file): neither the coarse table nor the change log hears of it,
    # so the copy still says agent a.
    plain = plain_writer(writer)
    plain.execute("UPDATE memories SET agent_id = 'b' WHERE id = ?", (moved,))
    with reader.read() as session:
        conn = session.connection().connection.driver_connection
        ids, _, _ = vector_index_sqlite.for_database(reader).propose(
            conn, "mem", Scope(agent_id="a"), "", coarse_sqlite.query_bits(to_blob(q)), FAR, 400
        )
    assert moved in ids  # the copy still proposes it...
    # ...the SQL re-test drops it (and so does the hydration through the scope after it)
    blob = to_blob(q)
    params = scan_parameters(blob, window=FAR, threshold=-1.0, depth=5)
    rows = SqliteSearch(reader)._process_index_scan("mem", Scope(agent_id="a"), "", "m.agent_id = 'a'", params, blob)
    assert rows and moved not in [i for _, i in rows]
    assert moved not in far(reader, Scope(agent_id="a"), q)
    # The same writer makes the best remaining row the newest: inside the near window now, so
    # the far list must not hold it though the copy still places it in the far window.
    best = far(reader, Scope(agent_id="a"), q)[0]
    plain.execute("UPDATE memories SET created_at = ? WHERE id = ?", (stamp(10**6), best))
    plain.close()
    assert best not in far(reader, Scope(agent_id="a"), q)


def test_rows_added_after_the_load_keep_the_window_exact(two):  # spec VEC-2, VEC-5, VEC-7
    writer, reader = two
    rng = np.random.default_rng(5)
    add_memories(
        writer,
        *(
            {"content": f"r{i}", "embedding": list(rng.normal(size=DIM)), "created_at": stamp(i % 40)}
            for i in range(120)
        ),
    )
    backend = SqliteSearch(reader)
    q0 = to_blob(list(rng.normal(size=DIM)))
    backend.vector_candidates("mem", Scope(agent_id="a"), q0, 5, threshold=-1.0, window=FAR)  # loads the copy
    # rows older, newer and equal in created_at to loaded ones, ids both sides
    add_memories(
        writer,
        *(
            {"content": f"s{i}", "embedding": list(rng.normal(size=DIM)), "created_at": stamp((i * 7) % 50 - 5)}
            for i in range(60)
        ),
    )
    execute(writer, "DELETE FROM memories WHERE id % 9 = 0")
    for seed in range(4):
        q = to_blob(list(np.random.default_rng(200 + seed).normal(size=DIM)))
        for window in ((1, 10**9), (10, 60), (0, 30), (37, 81), (150, 400), (170, 171), (5, 6), (23, 24)):
            # depth 400: every row of the window comes back, so a misplaced edge shows
            params = scan_parameters(q, window=window, threshold=-1.0, depth=400)
            exact = backend._vector_scan("mem", "m.agent_id = 'a'", dict(params), q)
            copy = backend._process_index_scan("mem", Scope(agent_id="a"), "", "m.agent_id = 'a'", dict(params), q)
            assert copy == exact, window
    assert loads(reader) == 1


def test_a_log_pruned_past_the_watermark_loads_the_table_again(two):
    writer, reader = two
    add_memories(writer, *filler(10))
    q = unit(1.0)
    far(reader, Scope(agent_id="a"), q)
    lost = add_memories(writer, {"content": "logged, then pruned", "embedding": unit(1.0), "created_at": stamp(3)})[0]
    new = add_memories(writer, {"content": "after the prune", "embedding": unit(1.0, 0.01), "created_at": stamp(2)})[0]
    # what pruning past this reader's watermark leaves: the entry of the first write is gone
    execute(
        writer, f"DELETE FROM {coarse_sqlite.CHANGE_LOG} WHERE seq < (SELECT max(seq) FROM {coarse_sqlite.CHANGE_LOG})"
    )
    assert far(reader, Scope(agent_id="a"), q)[:2] == [lost, new]
    assert loads(reader) == 2


def test_the_change_log_keeps_its_size_bounded(db, monkeypatch):
    add_memories(db, *filler(5))
    with db.read() as session:
        kept = session.execute(text(f"SELECT count(*), max(seq) - min(seq) FROM {coarse_sqlite.CHANGE_LOG}")).one()
    assert kept[0] == 5  # one entry a coarse insert
    trigger = coarse_sqlite.CHANGE_LOG_TRIGGERS_DDL[0]
    assert f"- {coarse_sqlite.CHANGE_LOG_KEEP}" in trigger  # the prune rides on every logged change


def test_start_up_loads_the_copy_in_the_background_when_the_far_list_reads_it(db, tmp_path):
    from cpersona.background import BackgroundWork
    from embed_server import EmbedServer
    from test_vector_channel import embedding_app

    add_memories(db, *filler(5))
    server = EmbedServer(dimension=DIM).start()
    try:
        app = embedding_app(db, server, DEGRADED_ADVISORY="false", MAX_MEMORIES="10", VECTOR_REACH="1000000")
        try:
            work = BackgroundWork(app)
            work.start()
            work.stop()  # waits for the reconcile pass and the load after it
            assert loads(db) == 1
            far(db, Scope(agent_id="a"), unit(1.0))
            assert loads(db) == 1  # the first far list found it loaded
        finally:
            app.embedder.close()
    finally:
        server.stop()


def test_the_copy_proposes_the_candidates_the_sql_walk_would(two, monkeypatch):  # spec VEC-5, VEC-7
    # Far more rows than candidate places, and few sign patterns: many rows tie on Hamming
    # distance at the cut, which both take in scan order (newest first).
    writer, reader = two
    rng = np.random.default_rng(9)
    patterns = np.sign(rng.normal(size=(6, DIM)))
    rows = []
    for i in range(1200):
        v = patterns[i % 6] * rng.uniform(0.1, 1.0, DIM)
        rows.append({"content": f"t{i}", "embedding": list(v), "created_at": stamp(i % 300)})
    add_memories(writer, *rows)
    backend = SqliteSearch(reader)
    for seed in range(6):
        q = to_blob(list(np.random.default_rng(300 + seed).normal(size=DIM)))
        params = scan_parameters(q, window=(10, 10**9), threshold=-1.0, depth=20)
        copy = backend._process_index_scan("mem", Scope(agent_id="a"), "", "m.agent_id = 'a'", dict(params), q)
        with monkeypatch.context() as patch:
            patch.setattr(backend, "_process_index_scan", lambda *args: None)
            walked = backend._coarse_scan("mem", Scope(agent_id="a"), "", "m.agent_id = 'a'", dict(params), q)
        assert copy == walked


def test_a_scope_holding_most_rows_among_others_gets_the_walks_candidates(two, monkeypatch):  # spec VEC-7, ISO-2
    # Two rows of agent a to one of agent b, interleaved in scan order: the copy measures every
    # row in place when the window holds most of them (vector_index_sqlite._hamming) and must
    # then pick the distances of the scope's own rows, not of the rows at those positions.
    writer, reader = two
    rng = np.random.default_rng(21)
    rows = [
        {
            "agent_id": "ab"[i % 3 == 2],
            "content": f"t{i}",
            "embedding": list(rng.normal(size=DIM)),
            "created_at": stamp(i),
        }
        for i in range(1500)
    ]
    add_memories(writer, *rows)
    backend = SqliteSearch(reader)
    for seed in range(4):
        q = to_blob(list(np.random.default_rng(500 + seed).normal(size=DIM)))
        params = scan_parameters(q, window=(10, 10**9), threshold=-1.0, depth=20)
        copy = backend._process_index_scan("mem", Scope(agent_id="a"), "", "m.agent_id = 'a'", dict(params), q)
        with monkeypatch.context() as patch:
            patch.setattr(backend, "_process_index_scan", lambda *args: None)
            walked = backend._coarse_scan("mem", Scope(agent_id="a"), "", "m.agent_id = 'a'", dict(params), q)
        assert copy == walked and len(copy) == 20
