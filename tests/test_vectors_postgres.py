"""The PostgreSQL vector arm: pgvector and the numpy fallback rank as SQLite does.

Same rows in a SQLite file and a PostgreSQL database; SqliteSearch (sqlite-vec),
PostgresSearch over pgvector and PostgresSearch over numpy must return the same
ids in the same order with the same cosines (float tolerance) for every window,
threshold and scope (spec §5.6: VEC-2 window, VEC-3 width filter, VEC-5 order,
ISO-2 isolation inside the scan). The pgvector half skips, with the reason, on a
cluster without the extension (Debian 12's PostgreSQL 15 has none; .ci/run
starts one that has it, with `tests/pg_cluster.sh pgvector-bin`, and makes the
skip a failure).
"""

from __future__ import annotations

import numpy as np
import pytest
from sqlalchemy import text

from cpersona.storage.engine import open_postgres
from cpersona.storage.migrate import open_and_upgrade, upgrade
from cpersona.storage.scope import Scope
from cpersona.storage.search_postgres import PostgresSearch
from cpersona.storage.search_sqlite import SqliteSearch
from cpersona.storage.vectors_postgres import VECTOR_COLUMN, pgvector_serves
from pg_support import fresh_pg_url, skip_without_pgvector

ROWS = 240
AGENTS = ("a", "b")
PROJECTS = ("", "p", "q")


def _blob(rng: np.random.Generator, i: int) -> bytes | None:
    """Mostly 8-d vectors; some 12-d (another model), a zero vector, some without any."""
    if i % 17 == 0:
        return None
    if i % 23 == 0:
        return np.zeros(8, dtype="<f4").tobytes()
    width = 12 if i % 7 == 0 else 8
    # No subnormal vectors here: sqlite-vec sums in float32, where their squares
    # underflow, so no two engines agree on them (their exact decode is pinned below).
    return rng.standard_normal(width).astype("<f4").tobytes()


def _rows() -> list[dict]:
    rng = np.random.default_rng(20261130)
    rows = []
    for i in range(ROWS):
        rows.append(
            {
                "id": i + 1,
                "a": AGENTS[i % 2],
                "p": PROJECTS[i % 3],
                "c": "c1" if i % 5 == 0 else "",
                "t": f"row {i}",
                # Pairs share a created_at, so the (created_at desc, id asc) tie order matters.
                "ca": f"2024-01-01 00:{(i // 2) // 60:02d}:{(i // 2) % 60:02d}",
                "e": _blob(rng, i),
            }
        )
    return rows


def _fill(db, rows) -> None:
    with db.write_connection() as conn:
        for r in rows:
            conn.execute(
                text(
                    "INSERT INTO memories (id, agent_id, project_id, channel, content, timestamp, created_at, embedding)"
                    " VALUES (:id, :a, :p, :c, :t, :ca, :ca, :e)"
                ),
                r,
            )
            conn.execute(
                text(
                    "INSERT INTO episodes (id, agent_id, project_id, channel, summary, created_at, embedding)"
                    " VALUES (:id, :a, :p, :c, :t, :ca, :e)"
                ),
                r,
            )


@pytest.fixture(scope="module")
def backends(tmp_path_factory):
    with fresh_pg_url() as url:
        pg, lite = open_postgres(url), open_and_upgrade(tmp_path_factory.mktemp("lite") / "v.db")
        upgrade(pg)
        rows = _rows()
        _fill(pg, rows)
        _fill(lite, rows)
        yield SqliteSearch(lite), PostgresSearch(pg, pgvector=False), pg
        pg.close()
        lite.close()


def _assert_same(expected, got):
    assert [h.record.key for h in got] == [h.record.key for h in expected]
    assert np.allclose([h.raw for h in got], [h.raw for h in expected], rtol=0, atol=1e-5)


CASES = [
    # (scope, window, threshold, depth)
    (Scope("a"), (0, 1000), -1.0, 500),
    (Scope("a"), (0, 30), 0.0, 10),
    (Scope("a"), (30, 1000), 0.2, 10),  # the far list: positions after the near window
    (Scope("a", "p"), (0, 1000), -1.0, 500),  # project unions with the global pool
    (Scope("b", None, "c1"), (0, 50), 0.1, 20),  # channel unions with channel-less rows
    (Scope("b"), (5, 6), -1.0, 5),
    (Scope("nobody"), (0, 100), -1.0, 5),
]


@pytest.mark.parametrize("kind", ["mem", "ep"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[1]}-{c[2]}")
@pytest.mark.parametrize("width", [8, 12])
def test_numpy_fallback_matches_sqlite(backends, kind, case, width):
    lite, fallback, _ = backends
    scope, window, threshold, depth = case
    query = np.random.default_rng(width).standard_normal(width).astype("<f4").tobytes()
    expected = lite.vector_candidates(kind, scope, query, depth, threshold=threshold, window=window)
    _assert_same(expected, fallback.vector_candidates(kind, scope, query, depth, threshold=threshold, window=window))


@pytest.mark.parametrize("kind", ["mem", "ep"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[1]}-{c[2]}")
@pytest.mark.parametrize("width", [8, 12])
def test_pgvector_matches_sqlite_and_numpy(backends, kind, case, width):
    lite, fallback, pg = backends
    if not pgvector_serves(pg):
        skip_without_pgvector()
    scope, window, threshold, depth = case
    query = np.random.default_rng(width).standard_normal(width).astype("<f4").tobytes()
    expected = lite.vector_candidates(kind, scope, query, depth, threshold=threshold, window=window)
    got = PostgresSearch(pg).vector_candidates(kind, scope, query, depth, threshold=threshold, window=window)
    _assert_same(expected, got)
    _assert_same(fallback.vector_candidates(kind, scope, query, depth, threshold=threshold, window=window), got)
    if case == CASES[0]:
        assert len(got) > (40 if width == 8 else 10)  # a real ranking was compared, not two empty lists


@pytest.fixture
def hnsw_everywhere(backends, monkeypatch):
    """The HNSW path for every window of the small fixture (at the default bound it serves only large ones)."""
    from cpersona.storage import vectors_postgres

    _, _, pg = backends
    if not pgvector_serves(pg):
        skip_without_pgvector()
    with pg.write_connection() as conn:
        for table in vectors_postgres.VECTOR_TABLES:  # the fixture's widths (8, 12) come from its newest rows
            vectors_postgres.ensure_hnsw_indexes(conn, table)
    vectors_postgres._hnsw_widths.pop(pg, None)
    monkeypatch.setattr(vectors_postgres, "HNSW_MIN_ROWS", 1)
    return pg


@pytest.mark.parametrize("kind", ["mem", "ep"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[1]}-{c[2]}")
@pytest.mark.parametrize("width", [8, 12])
def test_the_hnsw_index_gives_the_exact_answer_with_isolation_and_window(hnsw_everywhere, backends, kind, case, width):
    """Scope, source, width and window edges applied inside the index scan; re-ranked as the exact scan ranks."""
    from cpersona.storage import vectors_postgres
    from cpersona.storage.scope import sql_fragment
    from cpersona.storage.vectors_sqlite import scan_parameters

    lite, _, pg = backends
    scope, window, threshold, depth = case
    query = np.random.default_rng(width).standard_normal(width).astype("<f4").tobytes()
    expected = lite.vector_candidates(kind, scope, query, depth, threshold=threshold, window=window)
    _assert_same(
        expected, PostgresSearch(pg).vector_candidates(kind, scope, query, depth, threshold=threshold, window=window)
    )
    alias = "m" if kind == "mem" else "e"
    where, params = sql_fragment(scope, alias)
    params.update(scan_parameters(query, window=window, threshold=threshold, depth=depth))
    table = "memories" if kind == "mem" else "episodes"
    with pg.read() as session:
        through_index = vectors_postgres.hnsw_scan(
            session, kind, where, params, query, vectors_postgres.hnsw_widths(pg, table)
        )
    # A zero vector (8-d only) takes a window position but has no vector to index: such a
    # window looks short to the index scan, which then leaves it to the exact scan.
    if width == 12 and scope.agent_id != "nobody":
        assert through_index is not None, "the index did not answer: the exact scan was compared with itself"
    if through_index is not None:
        assert [i for _, i in through_index] == [h.record.id for h in expected]


def test_a_starved_index_scan_falls_back_to_the_exact_scan(hnsw_everywhere, backends, monkeypatch):
    """An index scan that may visit too few rows to fill the window answers None, and the exact scan answers."""
    from cpersona.storage import vectors_postgres

    lite, _, pg = backends
    monkeypatch.setattr(vectors_postgres, "HNSW_MAX_SCAN_TUPLES", 1)
    query = np.random.default_rng(8).standard_normal(8).astype("<f4").tobytes()
    scope, window, threshold, depth = CASES[0]
    expected = lite.vector_candidates("mem", scope, query, depth, threshold=threshold, window=window)
    got = PostgresSearch(pg).vector_candidates("mem", scope, query, depth, threshold=threshold, window=window)
    assert len(expected) > 40
    _assert_same(expected, got)


def test_a_database_without_pgvector_columns_uses_numpy(backends):
    _, _, pg = backends
    if pgvector_serves(pg):
        pytest.skip("the cluster has pgvector; the fallback is pinned by test_numpy_fallback_matches_sqlite")
    with pg.read() as session:
        columns = (
            session.execute(text("SELECT column_name FROM information_schema.columns WHERE table_name = 'memories'"))
            .scalars()
            .all()
        )
    assert VECTOR_COLUMN not in columns  # nothing was added that only pgvector could fill


# -- the derived column follows the blob -------------------------------------------


@pytest.fixture
def pgvector_db():
    with fresh_pg_url() as url:
        db = open_postgres(url)
        upgrade(db)
        if not pgvector_serves(db):
            db.close()
            skip_without_pgvector()
        yield db
        db.close()


def _stored_vector(db, row_id: int):
    with db.read() as session:
        value = session.execute(
            text(f"SELECT {VECTOR_COLUMN}::text FROM memories WHERE id = :id"), {"id": row_id}
        ).scalar_one()
    return None if value is None else np.array([float(v) for v in value.strip("[]").split(",")], dtype="<f4")


def _insert(db, row_id: int, blob: bytes | None) -> None:
    with db.write_connection() as conn:
        conn.execute(
            text("INSERT INTO memories (id, agent_id, content, timestamp, embedding) VALUES (:id, 'a', :t, '', :e)"),
            {"id": row_id, "t": f"m{row_id}", "e": blob},
        )


def test_the_vector_column_is_the_blob_exactly(pgvector_db):
    values = np.array([1.5, -0.0, 3.4028235e38, 1e-45, -2.5e-40, 0.1, -7.25, 123456.789], dtype="<f4")
    _insert(pgvector_db, 1, values.tobytes())
    assert np.array_equal(_stored_vector(pgvector_db, 1), values)  # bit-exact decode, subnormals included
    changed = values[::-1].copy()
    with pgvector_db.write_connection() as conn:
        conn.execute(text("UPDATE memories SET embedding = :e WHERE id = 1"), {"e": changed.tobytes()})
    assert np.array_equal(_stored_vector(pgvector_db, 1), changed)
    with pgvector_db.write_connection() as conn:
        conn.execute(text("UPDATE memories SET embedding = NULL WHERE id = 1"))
    assert _stored_vector(pgvector_db, 1) is None


@pytest.mark.parametrize(
    "blob",
    [
        np.zeros(4, dtype="<f4").tobytes(),  # cosine undefined, as sqlite-vec's NULL
        np.array([1.0, np.inf], dtype="<f4").tobytes(),  # pgvector refuses non-finite values
        np.array([1.0, np.nan], dtype="<f4").tobytes(),
        b"\x00\x00\x80\x3f\x00",  # not a whole number of floats
        b"",
    ],
)
def test_blobs_pgvector_cannot_rank_derive_null_and_never_fail_the_write(pgvector_db, blob):
    _insert(pgvector_db, 1, blob)
    assert _stored_vector(pgvector_db, 1) is None


def test_rows_written_before_pgvector_are_backfilled_at_the_next_start(pgvector_db):
    # A database that predates the extension: no column, no trigger, rows with blobs.
    with pgvector_db.write_connection() as conn:
        for table in ("memories", "episodes"):
            conn.exec_driver_sql(f"ALTER TABLE {table} DROP COLUMN {VECTOR_COLUMN}")
            conn.exec_driver_sql(f"DROP TRIGGER {table}_{VECTOR_COLUMN}_sync ON {table}")
    blob = np.array([0.5, -1.0, 2.0], dtype="<f4").tobytes()
    _insert(pgvector_db, 1, blob)
    upgrade(pgvector_db)
    assert np.array_equal(_stored_vector(pgvector_db, 1), np.frombuffer(blob, dtype="<f4"))
    _insert(pgvector_db, 2, blob)  # and the trigger is back
    assert _stored_vector(pgvector_db, 2) is not None


def test_a_dropped_extension_is_restored_at_the_next_start(pgvector_db):
    with pgvector_db.write_connection() as conn:
        conn.exec_driver_sql("DROP EXTENSION vector CASCADE")  # takes the columns with it
    fresh = open_postgres(pgvector_db.engine.url.render_as_string(hide_password=False))
    try:
        assert not pgvector_serves(fresh)  # until then the scan is numpy's
        upgrade(fresh)  # the extension is still available, so the column comes back
        assert pgvector_serves(open_postgres(pgvector_db.engine.url.render_as_string(hide_password=False)))
    finally:
        fresh.close()
    _insert(pgvector_db, 1, np.array([1.0, 2.0], dtype="<f4").tobytes())
    assert _stored_vector(pgvector_db, 1) is not None


def test_the_vector_stays_in_the_row_and_the_blob_moves_out(pgvector_db):
    # The scan reads every vector of the window; a 384-d row passes the ~2 kB
    # TOAST threshold, and out-of-line vectors cost a TOAST fetch each.
    rng = np.random.default_rng(3)
    for i in range(1, 4):
        _insert(pgvector_db, i, rng.standard_normal(384).astype("<f4").tobytes())
    with pgvector_db.read() as session:
        if session.execute(text("SELECT to_regproc('pg_column_toast_chunk_id')")).scalar_one() is None:
            pytest.skip("PostgreSQL before 17 cannot tell an out-of-line value")
        placed = session.execute(
            text(
                f"SELECT count(*) FILTER (WHERE pg_column_toast_chunk_id({VECTOR_COLUMN}) IS NULL),"
                " count(*) FILTER (WHERE pg_column_toast_chunk_id(embedding) IS NOT NULL) FROM memories"
            )
        ).one()
    assert tuple(placed) == (3, 3)  # every vector in its row, every blob out of line


# -- writers send the vector with the blob -------------------------------------------


def _decodes_in(conn) -> int:
    """How often this transaction ran the trigger's SQL decode (track_functions needs a superuser)."""
    row = conn.execute(text("SELECT calls FROM pg_stat_xact_user_functions WHERE funcname = 'cpersona_vector'")).first()
    return 0 if row is None else int(row.calls)


@pytest.mark.parametrize("writer", ["store", "restore"])
def test_our_writers_send_the_vector_and_the_trigger_decodes_nothing(pgvector_db, writer):
    from cpersona.storage.memory_writes import insert_memory
    from cpersona.storage.repositories.restore import RestoreRows

    values = np.array([1.5, -0.0, 3.4028235e38, 1e-45, -2.5e-40, 0.1, -7.25, 123456.789], dtype="<f4")
    row = {"agent_id": "a", "content": "m", "timestamp": "", "embedding": values.tobytes()}
    with pgvector_db.write_connection() as conn:
        conn.exec_driver_sql("SET LOCAL track_functions = 'all'")
        if writer == "store":
            new_id = insert_memory(conn, row)
        else:
            new_id = RestoreRows(conn, list(row), ["agent_id", "summary", "embedding"]).insert_memory(row)
            RestoreRows(conn, list(row), ["agent_id", "summary", "embedding"]).insert_episode(
                {"agent_id": "a", "summary": "e", "embedding": values.tobytes()}
            )
        assert _decodes_in(conn) == 0
        conn.execute(
            text("INSERT INTO memories (agent_id, content, timestamp, embedding) VALUES ('a', 'raw', '', :e)"),
            {"e": values.tobytes()},
        )
        assert _decodes_in(conn) == 1  # a writer that does not send it still gets it derived
    assert np.array_equal(_stored_vector(pgvector_db, new_id), values)  # what was sent is the blob, bit for bit


def test_a_sent_vector_is_kept_only_while_it_belongs_to_the_blob(pgvector_db):
    blob = np.array([1.0, 2.0, 3.0], dtype="<f4").tobytes()
    with pgvector_db.write_connection() as conn:
        sent = "INSERT INTO memories (id, agent_id, content, timestamp, embedding, embedding_vec) VALUES (:id, 'a', :t, '', :e, CAST(:v AS vector))"  # noqa: E501
        conn.execute(text(sent), {"id": 1, "t": "same width", "e": blob, "v": "[4,5,6]"})
        conn.execute(text(sent), {"id": 2, "t": "other width", "e": blob, "v": "[4,5]"})
    assert _stored_vector(pgvector_db, 1).tolist() == [4, 5, 6]  # taken as sent: that is what saves the decode
    assert _stored_vector(pgvector_db, 2).tolist() == [1, 2, 3]  # not the blob's width: derived
    with pgvector_db.write_connection() as conn:  # the blob changes, the vector is left as it was: derived again
        conn.execute(text("UPDATE memories SET embedding = :e WHERE id = 1"), {"e": blob[::-1]})
    assert np.array_equal(_stored_vector(pgvector_db, 1), np.frombuffer(blob[::-1], dtype="<f4"))


@pytest.mark.parametrize("reach, built", [("0", False), ("10000", False), ("1000000000", True)])
def test_the_hnsw_indexes_are_built_where_a_far_list_is_asked_for(pgvector_db, tmp_path, reach, built):
    from cpersona.config import load_settings
    from cpersona.storage.migrate import open_database_and_upgrade
    from cpersona.storage.vectors_postgres import HNSW_WIDTHS, hnsw_index_name, hnsw_widths

    url = pgvector_db.engine.url.render_as_string(hide_password=False)
    settings = load_settings(
        {"CPERSONA_DB_PATH": str(tmp_path / "side.db"), "CPERSONA_DATABASE_URL": url, "CPERSONA_VECTOR_REACH": reach}
    )
    db = open_database_and_upgrade(settings)  # CPERSONA_MAX_MEMORIES: 10,000
    try:
        assert hnsw_widths(db, "memories") == (frozenset(HNSW_WIDTHS) if built else frozenset())
        with db.read() as session:
            names = set(session.execute(text("SELECT indexname FROM pg_indexes")).scalars())
        assert (hnsw_index_name("episodes", 384) in names) is built
    finally:
        db.close()
