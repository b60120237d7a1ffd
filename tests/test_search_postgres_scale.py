"""PostgreSQL recall at scale: SQLite's keyword budget, the vector window's plan, the row layout.

A real PostgreSQL database per module (skips without CPERSONA_TEST_PG_URL).

- The keyword budget (search_sqlite.SCORED_ROWS_BUDGET) applies on PostgreSQL
  too, on the planner's row estimates: over it, the commonest terms are not
  ranked, and the answer is SQLite's for the same rows and budget.
- The vector window's width filter has statistics (vectors_postgres.
  ensure_width_statistics), so a window smaller than the agent's rows is read
  newest first through ``idx_memories_agent`` instead of ranking every row.
- With pgvector's column in the row, the blob is stored EXTERNAL and the
  table's toast target leaves room for the vector, so the text and tsvector
  the keyword arms read stay in the row.
"""

from __future__ import annotations

import numpy as np
import pytest
from sqlalchemy import event, insert, text

from cpersona.storage import search_sqlite
from cpersona.storage.engine import open_postgres
from cpersona.storage.migrate import open_and_upgrade, upgrade
from cpersona.storage.models import Memory
from cpersona.storage.scope import Scope
from cpersona.storage.search_postgres import plan_estimates
from cpersona.storage.search_words import SqliteWordSearch
from cpersona.storage.search_words_postgres import PostgresWordSearch
from cpersona.storage.vectors_postgres import pgvector_serves, toast_target, width_statistics_name
from pg_support import fresh_pg_url, skip_without_pgvector
from test_search_postgres_plans import plans_of

COMMON, RARE = 1500, 4


def _rows() -> list[dict]:
    rng = np.random.default_rng(3)
    texts = [f"the weather report number {i}" for i in range(COMMON)]
    texts += [f"a zeppelin sighting {i}" for i in range(RARE)]
    texts += ["zeppelin weather together"]
    return [
        {
            "agent_id": "a",
            "content": t,
            "timestamp": "2026-01-01",
            "created_at": f"2026-01-01 00:{i // 60 % 60:02d}:{i % 60:02d}",
            "embedding": rng.standard_normal(8).astype("<f4").tobytes(),
        }
        for i, t in enumerate(texts)
    ]


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    with fresh_pg_url() as url:
        pg = open_postgres(url)
        upgrade(pg)
        lite = open_and_upgrade(tmp_path_factory.mktemp("lite") / "s.db")
        rows = _rows()
        for db in (pg, lite):
            with db.write_connection() as conn:
                conn.execute(insert(Memory), rows)
        with pg.write_connection() as conn:
            conn.exec_driver_sql("ANALYZE memories")  # what autovacuum does after a fill
        yield pg, lite
        pg.close()
        lite.close()


def _texts(hits) -> list[str]:
    return [h.record.text for h in hits]


@pytest.mark.parametrize("channel", ["trigram", "words"])
def test_over_the_budget_postgres_leaves_out_the_common_term_as_sqlite_does(engines, monkeypatch, channel):
    pg, lite = engines
    monkeypatch.setattr(search_sqlite, "SCORED_ROWS_BUDGET", 200)
    pg_search, lite_search = PostgresWordSearch(pg), SqliteWordSearch(lite)
    if channel == "trigram":
        got = _texts(pg_search.keyword_memories(Scope("a"), "zeppelin weather", 10).hits)
        expected = _texts(lite_search.keyword_memories(Scope("a"), "zeppelin weather", 10).hits)
    else:
        got = _texts(pg_search.word_memories(Scope("a"), "zeppelin weather", 10))
        expected = _texts(lite_search.word_memories(Scope("a"), "zeppelin weather", 10))
    assert got and all("zeppelin" in t for t in got)  # no row only the common term holds
    assert len(got) == RARE + 1
    assert sorted(got) == sorted(expected)


def test_under_the_budget_postgres_ranks_every_term(engines):
    pg, _ = engines
    hits = PostgresWordSearch(pg).keyword_memories(Scope("a"), "zeppelin weather", 10).hits
    assert len(hits) == 10 and any("zeppelin" not in t for t in _texts(hits))
    assert _texts(hits)[0] == "zeppelin weather together"  # both terms: ranked first


def test_the_estimates_are_read_from_one_explain(engines, monkeypatch):
    pg, _ = engines
    monkeypatch.setattr(search_sqlite, "SCORED_ROWS_BUDGET", 200)
    search = PostgresWordSearch(pg)
    counts = search._term_counts("memories", ("m.content",), ["weather", "zeppelin"])
    assert set(counts) == {"weather", "zeppelin"}
    assert counts["weather"] > 10 * counts["zeppelin"]  # the statistics tell common from rare
    assert plan_estimates([{"Plan": {"Plans": []}}], 2) is None  # unreadable: no budget, every term kept


def test_a_table_no_larger_than_the_budget_ranks_every_term_as_sqlite_does(engines, monkeypatch):
    # "weather" and "report" each match ~1,500 rows: together over a budget of 2,000, but the
    # table holds fewer rows than that, so no statement can score more (SQLite's _may_overrun).
    pg, _ = engines
    monkeypatch.setattr(search_sqlite, "SCORED_ROWS_BUDGET", 2000)
    sent: list[dict] = []

    def before(conn, cursor, statement, parameters, context, executemany):
        if statement.startswith("WITH f AS"):
            sent.append(dict(parameters))

    event.listen(pg.engine, "before_cursor_execute", before)
    try:
        PostgresWordSearch(pg).keyword_memories(Scope("a"), "weather report", 10)
    finally:
        event.remove(pg.engine, "before_cursor_execute", before)
    assert sent and {"%weather%", "%report%"} <= set(sent[0].values())


@pytest.mark.parametrize("pgvector", [False, True])
def test_a_window_smaller_than_the_agent_is_read_newest_first_through_the_index(engines, pgvector):
    pg, lite = engines
    if pgvector and not pgvector_serves(pg):
        skip_without_pgvector()
    with pg.read() as session:
        names = set(session.execute(text("SELECT stxname FROM pg_statistic_ext")).scalars())
    assert width_statistics_name("memories") in names and width_statistics_name("episodes") in names
    search = PostgresWordSearch(pg, pgvector=pgvector)
    # The SQL scan's plan: the held near window (vector_near_postgres) loads every row once by
    # design, so it sits out here; it answers like the scan below.
    search.held_near = False
    query = np.random.default_rng(9).standard_normal(8).astype("<f4").tobytes()

    def run():
        return search.vector_candidates("mem", Scope("a"), query, 10, threshold=-1.0, window=(0, 100))

    for plan in plans_of(pg, run, "octet_length"):
        assert "idx_memories_agent" in plan, plan
        assert "Seq Scan on memories" not in plan, plan
    expected = SqliteWordSearch(lite).vector_candidates("mem", Scope("a"), query, 10, threshold=-1.0, window=(0, 100))
    assert [h.record.key[1] for h in run()] == [h.record.key[1] for h in expected]
    search.held_near = True
    assert [h.record.key[1] for h in run()] == [h.record.key[1] for h in expected]


def test_with_pgvector_the_blob_leaves_the_row_before_the_text(engines):
    pg, _ = engines
    if not pgvector_serves(pg):
        skip_without_pgvector()
    with pg.read() as session:
        storage = session.execute(
            text("SELECT attstorage FROM pg_attribute WHERE attrelid = 'memories'::regclass AND attname = 'embedding'")
        ).scalar_one()
    assert storage == "e"
    with pg.read() as session:
        options = session.execute(text("SELECT reloptions FROM pg_class WHERE oid = 'memories'::regclass")).scalar_one()
    assert f"toast_tuple_target={toast_target(384)}" in options
    # A sparse (compressible) 384-d blob beside a text: the row passes 2 kB and one column must go.
    blob = np.zeros(384, dtype="<f4")
    blob[::40] = 0.3
    content = "a sentence of ordinary length about the weather report, long enough to be moved out " * 3
    with pg.write_connection() as conn:
        row_id = conn.execute(
            text(
                "INSERT INTO memories (agent_id, content, timestamp, embedding) VALUES ('t', :c, '', :e) RETURNING id"
            ),
            {"c": content, "e": blob.tobytes()},
        ).scalar_one()
        if int(conn.exec_driver_sql("SHOW server_version_num").scalar_one()) >= 170000:
            moved = conn.execute(
                text(
                    "SELECT pg_column_toast_chunk_id(content), pg_column_toast_chunk_id(word_vector),"
                    " pg_column_toast_chunk_id(embedding) FROM memories WHERE id = :i"
                ),
                {"i": row_id},
            ).one()
            # The text and its tsvector in the row (the keyword arms read them), the blob out of it.
            assert moved[0] is None and moved[1] is None and moved[2] is not None
        conn.execute(text("DELETE FROM memories WHERE id = :i"), {"i": row_id})
