"""The word-level lexical channel (issue 14 part 3): stemmed whole words beside trigram.

Real SQLite files migrated through the real revisions (and PostgreSQL where
CPERSONA_TEST_PG_URL is set); rows are written with plain SQL where the
triggers, not our services, are what is under test.
"""

from __future__ import annotations

import pytest
from alembic import command
from sqlalchemy import insert

from cpersona.services.recall.service import recall
from cpersona.services.recall.words import with_words
from cpersona.storage.engine import Database, open_sqlite
from cpersona.storage.migrate import alembic_config, head_revision, upgrade
from cpersona.storage.models import Episode, Memory
from cpersona.storage.scope import Scope
from cpersona.storage.search import Hit, Record, open_search
from cpersona.storage.search_words import word_terms

from conftest import make_app

pytestmark = pytest.mark.both_backends

STAMP = "2026-06-02T00:00:00+00:00"
A = Scope("a")


def add_memories(db: Database, *contents: str, agent: str = "a") -> None:
    with db.write() as session:
        session.execute(insert(Memory), [{"agent_id": agent, "content": c, "timestamp": STAMP} for c in contents])


def texts(hits: list[Hit]) -> list[str]:
    return [hit.record.text for hit in hits]


def refs(response: dict) -> list[str]:
    return [m["ref"] for m in response["messages"]]


# -- the query's words ------------------------------------------------------------------------


def test_word_terms_keep_short_content_words_and_drop_function_words_and_cjk() -> None:
    assert word_terms("what happens in Q1") == ["happens", "q1"]
    assert word_terms("Is it AI, or a 5k run?") == ["ai", "5k", "run"]
    assert word_terms("the and of") == []  # only function words: no word list
    assert word_terms("猫の名前 cats") == ["cats"]  # CJK stays with trigram
    assert word_terms("snake_case-name") == ["snake", "case", "name"]  # split as unicode61 splits
    assert word_terms("Run run RUN") == ["run"]


# -- the storage primitive, both engines ------------------------------------------------------


def test_stemming_finds_running_for_runs(db) -> None:
    add_memories(db, "She was running in the park every morning", "The sprint planning meeting moved")
    backend = open_search(db)
    assert texts(backend.word_memories(A, "how often does she run", 10)) == [
        "She was running in the park every morning"
    ]
    # "runs" is no substring of "running": the trigram arm finds nothing
    assert backend.keyword_memories(A, "runs", 10).hits == []
    assert texts(backend.word_memories(A, "runs", 10)) == ["She was running in the park every morning"]


def test_a_two_character_word_is_found(db) -> None:
    add_memories(db, "Revenue targets for Q1 were raised", "Quarterly planning happens in March", "Q2 is quiet")
    backend = open_search(db)
    assert texts(backend.word_memories(A, "Q1", 10)) == ["Revenue targets for Q1 were raised"]
    # trigram has no term for "Q1" at all (too short): it finds only the "happens" row
    assert texts(backend.keyword_memories(A, "what happens in Q1", 10).hits) == ["Quarterly planning happens in March"]
    assert set(texts(backend.word_memories(A, "what happens in Q1", 10))) == {
        "Revenue targets for Q1 were raised",
        "Quarterly planning happens in March",
    }


def test_what_happens_in_q1_recalls_the_q1_row(db) -> None:
    add_memories(db, "Revenue targets for Q1 were raised", "Lunch is at noon", "The cat sleeps")
    response = recall(make_app(db), agent_id="a", query="what happens in Q1")
    assert "mem:1" in refs(response)
    assert refs(response)[-1] == "mem:1"  # and it is the best row


def test_the_word_channel_keeps_the_scope(db) -> None:
    add_memories(db, "Q1 belongs to agent b", agent="b")
    add_memories(db, "Q1 belongs to agent a")
    assert texts(open_search(db).word_memories(A, "Q1", 10)) == ["Q1 belongs to agent a"]


def test_episodes_have_a_word_list_too(db) -> None:
    with db.write() as session:
        session.execute(
            insert(Episode),
            [
                {
                    "agent_id": "a",
                    "summary": "We discussed the Q1 roadmap",
                    "keywords": "planning",
                    "created_at": "2026-06-01 12:00:00",
                }
            ],
        )
    backend = open_search(db)
    assert texts(backend.word_episodes(A, "Q1 plans", 10)) == ["We discussed the Q1 roadmap"]
    assert backend.word_episodes(Scope("b"), "Q1", 10) == []


def test_fts_disabled_means_no_word_search(db) -> None:
    add_memories(db, "Revenue targets for Q1 were raised")
    assert open_search(db, fts_enabled=False).word_memories(A, "Q1", 10) == []


def test_a_zero_word_weight_leaves_the_channel_out(db) -> None:
    add_memories(db, "Revenue targets for Q1 were raised")
    assert recall(make_app(db, RECALL_WORD_WEIGHT="0"), agent_id="a", query="what happens in Q1")["messages"] == []


# -- the merge (pure) -------------------------------------------------------------------------


def _hits(*ids: int) -> list[Hit]:
    return [Hit(Record("mem", i, f"row {i}", "", STAMP)) for i in ids]


@pytest.mark.sqlite_only
def test_the_merge_lifts_rows_both_lists_rank_and_breaks_ties_by_trigram_order() -> None:
    merged = with_words(_hits(1, 2, 3), _hits(3, 4), 10, weight=1.0)
    assert [h.record.id for h in merged] == [3, 1, 2, 4]  # 3 is on both lists; 2 and 4 tie: trigram's first
    assert [h.raw for h in merged] == sorted((h.raw for h in merged), reverse=True)
    assert [h.record.id for h in with_words(_hits(1, 2), _hits(5), 2, weight=1.0)] == [1, 5]  # cut to depth
    assert with_words(_hits(1, 2), _hits(5), 10, weight=0.0) == _hits(1, 2)


# -- the revision: backfill and triggers (SQLite) ----------------------------------------------


def w(db: Database, sql: str, params: tuple = ()) -> None:
    with db.write_connection() as conn:
        conn.exec_driver_sql(sql, params)


def word_ids(db: Database, table: str, match: str) -> list[int]:
    with db.read() as session:
        rows = (
            session.connection()
            .exec_driver_sql(f"SELECT rowid FROM {table} WHERE {table} MATCH ? ORDER BY rowid", (match,))
            .fetchall()
        )
    return [r[0] for r in rows]


@pytest.mark.sqlite_only
def test_rows_written_before_the_revision_are_backfilled_by_it(db_path) -> None:
    db = open_sqlite(db_path)
    try:
        upgrade(db)
        with db.write_connection() as conn:
            command.downgrade(alembic_config(conn), "0005_embedding_identity")
        w(
            db,
            "INSERT INTO memories (agent_id, content, timestamp) VALUES ('a', 'Joggers were running late', ?)",
            (STAMP,),
        )
        w(db, "INSERT INTO episodes (agent_id, summary, keywords) VALUES ('a', 'The Q1 review', 'budgets')")
        upgrade(db)  # the real migration, 0005 -> head
        with db.read() as session:
            version = session.connection().exec_driver_sql("SELECT version_num FROM alembic_version").scalar()
        assert version == head_revision()
        assert word_ids(db, "memories_words", "runs") == [1]
        assert word_ids(db, "episodes_words", "q1") == [1]
        assert word_ids(db, "episodes_words", "budget") == [1]
        w(db, "INSERT INTO memories_words (memories_words, rank) VALUES ('integrity-check', 1)")
    finally:
        db.close()


@pytest.mark.sqlite_only
def test_triggers_keep_the_word_index_equal_to_the_rows(db) -> None:
    w(db, "INSERT INTO memories (agent_id, content, timestamp) VALUES ('a', 'cats are sleeping', ?)", (STAMP,))
    assert word_ids(db, "memories_words", "sleeps") == [1]
    w(db, "UPDATE memories SET content = 'dogs are barking' WHERE id = 1")
    assert word_ids(db, "memories_words", "sleeps") == []
    assert word_ids(db, "memories_words", "bark") == [1]
    w(db, "UPDATE memories SET recall_count = recall_count + 1 WHERE id = 1")  # not the text: index untouched
    w(db, "DELETE FROM memories WHERE id = 1")
    assert word_ids(db, "memories_words", "bark") == []
    w(db, "INSERT INTO episodes (agent_id, summary, keywords) VALUES ('a', 'old summary', 'alpha')")
    w(db, "UPDATE episodes SET keywords = 'gamma' WHERE id = 1")
    assert word_ids(db, "episodes_words", "alpha") == [] and word_ids(db, "episodes_words", "gamma") == [1]
    w(db, "DELETE FROM episodes WHERE id = 1")
    assert word_ids(db, "episodes_words", "gamma") == []
    for table in ("memories_words", "episodes_words"):
        w(db, f"INSERT INTO {table} ({table}, rank) VALUES ('integrity-check', 1)")
