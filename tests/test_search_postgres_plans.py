"""PostgreSQL keyword and word search: the plans that keep recall fast, with the same answers.

A real PostgreSQL database (skips without CPERSONA_TEST_PG_URL) holding enough
rows that the planner's default would scan the whole table. Each test reads
the plan PostgreSQL chose for the statement the search backend really sent
(EXPLAIN on the same transaction, so its SET LOCAL settings apply), or the
stored data the ranking reads.
"""

from __future__ import annotations

import random

import pytest
from sqlalchemy import event, text

from cpersona.storage.engine import open_postgres
from cpersona.storage.migrate import upgrade
from cpersona.storage.scope import Scope
from cpersona.storage.search_words import pg_word_vector
from cpersona.storage.search_words_postgres import WORD_VECTOR_COLUMN, PostgresWordSearch
from pg_support import fresh_pg_url

ROWS = 3000
WORDS = ("garden", "river", "market", "violin", "summer", "ticket", "window", "planet", "coffee", "letter")
SPEAKERS = ("Caroline", "Melanie", "Jon", "Gina", "Nate", "Joanna", "Tim", "John")


@pytest.fixture(scope="module")
def pg():
    with fresh_pg_url() as url:
        db = open_postgres(url)
        upgrade(db)
        rng = random.Random(5)
        # Each of WORDS in about 1 row of 25 among filler words of a large
        # vocabulary, each speaker in 1 of 8: what a question's terms match in a
        # real memory, where an index beats reading every row.
        filler = [
            "".join(rng.choice("bcdfghjklmnpqrstvwz") + rng.choice("aeiou") for _ in range(3)) for _ in range(500)
        ]
        rows = [
            {
                "c": f"{SPEAKERS[i % 8]}: {' '.join(rng.choice(filler) for _ in range(7))} {WORDS[i % 25 % 10]}"
                f"{'' if i % 25 < 10 else 'q'} ({i})"
            }
            for i in range(ROWS)
        ]
        with db.write_connection() as conn:
            conn.execute(text("INSERT INTO memories (agent_id, content, timestamp) VALUES ('a', :c, '')"), rows)
            conn.execute(text("INSERT INTO episodes (agent_id, summary, keywords) VALUES ('a', :c, 'k')"), rows)
            conn.exec_driver_sql("ANALYZE")
        yield db
        db.close()


def plans_of(db, run, marker: str) -> list[str]:
    """EXPLAIN of every statement containing ``marker`` that ``run()`` sends, in its own transaction.

    The keyword budget's own EXPLAINs (planner estimates) are not plans of the statement.
    """
    plans: list[str] = []

    def after(conn, cursor, statement, parameters, context, executemany):
        if marker in statement and not statement.startswith("EXPLAIN"):
            with conn.connection.dbapi_connection.cursor() as explain:
                explain.execute("EXPLAIN " + statement, parameters)
                plans.append("\n".join(row[0] for row in explain.fetchall()))

    event.listen(db.engine, "after_cursor_execute", after)
    try:
        run()
    finally:
        event.remove(db.engine, "after_cursor_execute", after)
    assert plans, f"no statement with {marker!r} was sent"
    return plans


@pytest.mark.parametrize("kind", ["mem", "ep"])
def test_keyword_candidates_come_from_the_trigram_indexes(pg, kind):
    search = PostgresWordSearch(pg)
    query = "Caroline garden violin"
    if kind == "mem":
        plans = plans_of(pg, lambda: search.keyword_memories(Scope("a"), query, 10), "ILIKE")
        index, table = "idx_memories_content_trgm", "memories"
    else:
        plans = plans_of(pg, lambda: search.keyword_episodes(Scope("a"), query, 10), "ILIKE")
        index, table = "idx_episodes_summary_trgm", "episodes"
    for plan in plans:
        assert index in plan, plan
        assert f"Seq Scan on {table}" not in plan


def test_keyword_ranking_is_unchanged_by_the_index_plan(pg):
    # The same statement with the planner's default (a sequential scan) ranks identically.
    search = PostgresWordSearch(pg)
    original = search._run

    def planner_default(what, sql, params, indexed=False):
        return original(what, sql, params)

    for query in ("Caroline garden violin", "river market", "coffee letter summer window", "Jon planet", "zzqx"):
        indexed = search.keyword_memories(Scope("a"), query, 10)
        search._run = planner_default
        try:
            scanned = search.keyword_memories(Scope("a"), query, 10)
        finally:
            search._run = original
        assert [(h.record.key, h.raw) for h in indexed.hits] == [(h.record.key, h.raw) for h in scanned.hits]
        assert indexed.method == scanned.method


@pytest.mark.parametrize("kind,table,body", [("mem", "memories", "content"), ("ep", "episodes", "summary")])
def test_the_stored_word_vector_is_the_indexed_expression(pg, kind, table, body):
    with pg.write_connection() as conn:
        conn.exec_driver_sql(f"UPDATE {table} SET {body} = 'Rivers were running' WHERE id = 7")
    with pg.read() as session:
        differing = session.execute(
            text(f"SELECT count(*) FROM {table} WHERE {WORD_VECTOR_COLUMN} IS DISTINCT FROM {pg_word_vector(kind)}")
        ).scalar_one()
        stored = session.execute(text(f"SELECT {WORD_VECTOR_COLUMN}::text FROM {table} WHERE id = 7")).scalar_one()
    assert differing == 0
    assert "'river'" in stored and "'run'" in stored  # rewritten with the text


def test_word_ranking_reads_the_stored_vector_with_the_same_scores(pg):
    search = PostgresWordSearch(pg)
    sent = plans_of(pg, lambda: search.word_memories(Scope("a"), "gardens violins", 10), "ts_rank")
    assert all("idx_memories_words" in plan for plan in sent)
    with pg.read() as session:
        expected = session.execute(
            text(
                f"SELECT id, ts_rank({pg_word_vector('mem')}, to_tsquery('english', 'garden | violin'), 1) AS s"
                f" FROM memories WHERE {pg_word_vector('mem')} @@ to_tsquery('english', 'garden | violin')"
                " ORDER BY s DESC, id LIMIT 10"
            )
        ).all()
    hits = search.word_memories(Scope("a"), "gardens violins", 10)
    assert [(h.record.key[1], round(h.raw, 6)) for h in hits] == [(r.id, round(r.s, 6)) for r in expected]
    assert f"m.{WORD_VECTOR_COLUMN}" in " ".join(statement_texts(pg, search))


def statement_texts(db, search) -> list[str]:
    sent: list[str] = []

    def before(conn, cursor, statement, parameters, context, executemany):
        sent.append(statement)

    event.listen(db.engine, "before_cursor_execute", before)
    try:
        search.word_memories(Scope("a"), "gardens violins", 10)
    finally:
        event.remove(db.engine, "before_cursor_execute", before)
    return [s for s in sent if "ts_rank" in s]
