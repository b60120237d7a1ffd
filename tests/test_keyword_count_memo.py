"""The keyword budget's counts are remembered between recalls, and never outlive a change of the index.

``SqliteSearch._budget_counts`` keeps each FTS5 index's term counts together with
the index's state (its totals and structure records, storage/search_sqlite.py).
A write through any connection, in this process or another, that changes what
a count would read must also change that state, so the next search counts
again. Here a second ``Database`` on the same file plays the other process:
its writes move a common word under or over the budget, which changes the
answer, and the first one's next search must give the new answer.
"""

from __future__ import annotations

import pytest
from sqlalchemy import insert, text

from cpersona.storage import search_sqlite
from cpersona.storage.engine import open_sqlite
from cpersona.storage.models import Memory
from cpersona.storage.scope import Scope
from cpersona.storage.search_words import SqliteWordSearch
from test_keyword_budget import COMMON, RARE, corpus

pytestmark = pytest.mark.sqlite_only  # FTS5's own records

BUDGET = 50
SCOPE = Scope(agent_id="a")


ARMS = {
    "trigram": lambda search, query: search.keyword_memories(SCOPE, query, 10).hits,
    "words": lambda search, query: search.word_memories(SCOPE, query, 10),
}


def found(db, arm: str) -> list[str]:
    return [hit.record.text for hit in ARMS[arm](SqliteWordSearch(db), "zeppelin weather")]


@pytest.fixture
def other(db_path):
    """A second engine on the same file: its own connections, as another process has."""
    database = open_sqlite(db_path)
    yield database
    database.close()


@pytest.fixture
def budget(monkeypatch):
    monkeypatch.setattr(search_sqlite, "SCORED_ROWS_BUDGET", BUDGET)


def count_statements(monkeypatch) -> list[str]:
    """The counting statements run from now on (the vocabulary read, the per-word count(*) MATCH)."""
    seen: list[str] = []
    rows = search_sqlite.SqliteSearch._rows

    def spy(self, session, sql, params):
        if "_vocab" in sql.text or "count(*) FROM memories_words" in sql.text:
            seen.append(sql.text)
        return rows(self, session, sql, params)

    monkeypatch.setattr(search_sqlite.SqliteSearch, "_rows", spy)
    return seen


@pytest.mark.parametrize("arm", sorted(ARMS))
def test_counts_are_read_once_while_the_index_is_unchanged(db, budget, monkeypatch, arm):
    corpus(db)
    seen = count_statements(monkeypatch)
    first = found(db, arm)
    assert len(first) == RARE + 1  # over the budget: the common word is left out
    assert len(seen) == 1  # one counting statement; the word arm's split reuses the budget's counts
    with db.write() as session:  # a recall's counter bump: memories change, the index does not
        session.execute(text("UPDATE memories SET recall_count = recall_count + 1"))
    assert found(db, arm) == first
    assert len(seen) == 1


@pytest.mark.parametrize("arm", sorted(ARMS))
def test_a_delete_through_another_connection_is_counted_again(db, other, budget, arm):
    corpus(db)
    assert len(found(db, arm)) == RARE + 1
    with other.write() as session:  # the common word falls under the budget: now it is ranked too
        session.execute(text("DELETE FROM memories WHERE content LIKE 'the weather report number %' AND id > 20"))
    texts = found(db, arm)
    assert len(texts) == 10 and any("zeppelin" not in t for t in texts)


@pytest.mark.parametrize("arm", sorted(ARMS))
def test_an_update_through_another_connection_is_counted_again(db, other, budget, arm):
    corpus(db)
    assert len(found(db, arm)) == RARE + 1
    with other.write() as session:  # same rows, same lengths: only the index's segments tell
        session.execute(
            text("UPDATE memories SET content = replace(content, 'weather', 'climate') WHERE id > 20 AND id <= :n"),
            {"n": COMMON},
        )
    texts = found(db, arm)
    assert len(texts) == 10 and any("zeppelin" not in t for t in texts)


@pytest.mark.parametrize("arm", sorted(ARMS))
def test_an_insert_through_another_connection_is_counted_again(db, other, budget, arm):
    with db.write() as session:  # the common word starts under the budget
        session.execute(
            insert(Memory),
            [{"agent_id": "a", "content": f"the weather report {i}", "timestamp": "2026-01-01"} for i in range(20)]
            + [{"agent_id": "a", "content": f"filler line {i}", "timestamp": "2026-01-01"} for i in range(BUDGET)]
            + [{"agent_id": "a", "content": "a zeppelin sighting", "timestamp": "2026-01-01"}],
        )
    assert len(found(db, arm)) == 10
    with other.write() as session:  # ...and goes over it
        session.execute(
            insert(Memory),
            [{"agent_id": "a", "content": f"more weather {i}", "timestamp": "2026-01-01"} for i in range(COMMON)],
        )
    assert found(db, arm) == ["a zeppelin sighting"]


def test_the_word_arms_split_reuses_the_budgets_counts(db, budget, monkeypatch):
    corpus(db)
    seen = count_statements(monkeypatch)
    # Over the budget "weather" gives way; the two rare words left are counted once, for both uses.
    texts = [h.record.text for h in SqliteWordSearch(db).word_memories(SCOPE, "zeppelin sighting weather", 10)]
    assert len(texts) == RARE + 1
    assert len(seen) == 1
