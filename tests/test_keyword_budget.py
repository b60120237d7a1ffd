"""Keyword recall scores a bounded number of rows: the most common terms give way first.

bm25 ranks every row a MATCH finds before LIMIT keeps the best, so a term most
rows hold costs a score per row. ``SqliteSearch`` estimates each term's match
count from the index (its rarest trigram's row count, read through a temporary
``fts5vocab`` table) and leaves out the commonest terms while the estimated
total is over ``SCORED_ROWS_BUDGET`` (storage/search_sqlite.py).
"""

from __future__ import annotations

import pytest
from sqlalchemy import insert, text

from cpersona.storage import search_sqlite
from cpersona.storage.models import Episode, Memory
from cpersona.storage.scope import Scope
from cpersona.storage.search_sqlite import SqliteSearch
from cpersona.storage.search_words import SqliteWordSearch

pytestmark = pytest.mark.sqlite_only  # FTS5 and its vocabulary tables

COMMON, RARE = 300, 3


def corpus(db) -> None:
    rows = [f"the weather report number {i}" for i in range(COMMON)]
    rows += [f"a zeppelin sighting {i}" for i in range(RARE)]
    rows += ["zeppelin weather together"]
    with db.write() as session:
        session.execute(insert(Memory), [{"agent_id": "a", "content": c, "timestamp": "2026-01-01"} for c in rows])


def found(db, query: str) -> list[str]:
    result = SqliteSearch(db).keyword_memories(Scope(agent_id="a"), query, 10)
    return [hit.record.text for hit in result.hits]


def test_over_the_budget_the_common_term_is_not_ranked(db, monkeypatch):
    corpus(db)
    monkeypatch.setattr(search_sqlite, "SCORED_ROWS_BUDGET", 50)
    texts = found(db, "zeppelin weather")
    assert texts and all("zeppelin" in t for t in texts)  # no row only the common term holds
    assert len(texts) == RARE + 1


def test_under_the_budget_every_term_is_ranked_as_before(db):
    corpus(db)
    texts = found(db, "zeppelin weather")
    assert len(texts) == 10 and any("zeppelin" not in t for t in texts)  # the common term ranked too


@pytest.mark.parametrize(
    ("counts", "budget", "kept"),
    [
        ({"a": 10, "b": 20, "c": 30}, 100, ["a", "b", "c"]),  # under the budget: all
        ({"a": 10, "b": 20, "c": 90}, 50, ["a", "b"]),  # the commonest gives way
        ({"a": 80, "b": 900, "c": 5}, 50, ["c"]),  # at least the rarest, even alone
        ({"a": 80, "b": 900, "c": 5}, 90, ["a", "c"]),  # order of the query kept
        ({}, 0, ["a", "b"]),  # counts unknown: every term
    ],
)
def test_rarest_terms_are_kept_first(monkeypatch, counts, budget, kept):
    monkeypatch.setattr(search_sqlite, "SCORED_ROWS_BUDGET", budget)
    terms = ["a", "b", "c"] if counts else ["a", "b"]
    assert SqliteSearch._within_budget(terms, counts) == kept


def test_term_counts_bound_the_real_match_counts_and_leave_the_schema_alone(db, monkeypatch):
    corpus(db)
    with db.read() as session:
        before = session.execute(text("SELECT name FROM sqlite_master ORDER BY name")).all()
    monkeypatch.setattr(search_sqlite, "SCORED_ROWS_BUDGET", 50)  # counted only for a table larger than the budget
    search = search_sqlite._fts_search("memories_fts", "memories", "m", "m.id", "1=1")
    counts = SqliteSearch(db)._term_counts(search, ["zeppelin", "weather", "Report"])
    assert counts["zeppelin"] >= RARE + 1 and counts["weather"] >= COMMON + 1 and counts["Report"] >= COMMON
    assert counts["zeppelin"] < counts["weather"]
    with db.read() as session:
        assert session.execute(text("SELECT name FROM sqlite_master ORDER BY name")).all() == before


def test_a_table_no_larger_than_the_budget_is_not_counted(db, monkeypatch):
    corpus(db)
    monkeypatch.setattr(search_sqlite, "SCORED_ROWS_BUDGET", COMMON + RARE + 1)  # exactly the rows stored
    search = search_sqlite._fts_search("memories_fts", "memories", "m", "m.id", "1=1")
    assert SqliteSearch(db)._term_counts(search, ["zeppelin", "weather"]) == {}


# -- the word channel (storage/search_words.py) counts each word exactly and follows the same rule


def episode_corpus(db) -> None:
    rows = [f"the weather report number {i}" for i in range(COMMON)]
    rows += [f"a zeppelin sighting {i}" for i in range(RARE)]
    rows += ["zeppelin weather together"]
    with db.write() as session:
        session.execute(insert(Episode), [{"agent_id": "a", "summary": c, "keywords": ""} for c in rows])


WORD_ARMS = {
    "memories": (corpus, lambda search, scope, query: search.word_memories(scope, query, 10)),
    "episodes": (episode_corpus, lambda search, scope, query: search.word_episodes(scope, query, 10)),
}


def word_found(db, arm: str, query: str) -> list[str]:
    fill, search = WORD_ARMS[arm]
    return [hit.record.text for hit in search(SqliteWordSearch(db), Scope(agent_id="a"), query)]


@pytest.mark.parametrize("arm", sorted(WORD_ARMS))
def test_over_the_budget_the_common_word_is_not_ranked(db, monkeypatch, arm):
    WORD_ARMS[arm][0](db)
    monkeypatch.setattr(search_sqlite, "SCORED_ROWS_BUDGET", 50)
    texts = word_found(db, arm, "zeppelins weather")  # a stemmed form: the index's stem, counted by MATCH
    assert texts and all("zeppelin" in t for t in texts)
    assert len(texts) == RARE + 1


@pytest.mark.parametrize("arm", sorted(WORD_ARMS))
def test_under_the_budget_every_word_is_ranked_as_before(db, arm):
    WORD_ARMS[arm][0](db)
    texts = word_found(db, arm, "zeppelins weather")
    assert len(texts) == 10 and any("zeppelin" not in t for t in texts)


def test_word_counts_are_the_real_match_counts(db, monkeypatch):
    corpus(db)
    monkeypatch.setattr(search_sqlite, "SCORED_ROWS_BUDGET", 50)
    search = search_sqlite._fts_search("memories_words", "memories", "m", "m.id", "1=1")
    counts = SqliteWordSearch(db)._word_counts(search, ["zeppelins", "weather", "reports"])
    assert counts == {"zeppelins": RARE + 1, "weather": COMMON + 1, "reports": COMMON}
    monkeypatch.setattr(search_sqlite, "SCORED_ROWS_BUDGET", COMMON + RARE + 1)  # no larger than the budget
    assert SqliteWordSearch(db)._word_counts(search, ["zeppelins", "weather"]) == {}
