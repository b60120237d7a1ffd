"""The word channel skips scoring rows only common words match, and only when that leaves its answer as it was.

storage/bm25_bound.py: a row holding only phrases of C scores below
(k1 + 1) * sum(idf(C)); when the probe-th best row holding a rarer phrase
scores at least that, the statement scored over those rows alone gives the
whole statement's first rows. Otherwise the whole statement runs.
"""

from __future__ import annotations

import pytest
from sqlalchemy import insert

from cpersona.storage import bm25_bound, search_sqlite
from cpersona.storage.models import Memory
from cpersona.storage.scope import Scope
from cpersona.storage.search_words import SqliteWordSearch

pytestmark = pytest.mark.sqlite_only  # FTS5's bm25

SCOPE = Scope(agent_id="a")


def store(db, rows: list[str]) -> None:
    with db.write() as session:
        session.execute(insert(Memory), [{"agent_id": "a", "content": c, "timestamp": "2026-01-01"} for c in rows])


def lists(db, query: str, depth: int = 10) -> tuple[list[tuple[int, float]], list[tuple[int, float]], list[str]]:
    """(the word arm's answer, the same with the split turned off, the split statements it ran)."""
    ran: list[str] = []
    rows = search_sqlite.SqliteSearch._rows

    def spy(self, session, sql, params):
        if "+rowid IN" in sql.text:
            ran.append(sql.text)
        return rows(self, session, sql, params)

    search = SqliteWordSearch(db)
    search_sqlite.SqliteSearch._rows = spy
    try:
        split = [(h.record.id, h.raw) for h in search.word_memories(SCOPE, query, depth)]
    finally:
        search_sqlite.SqliteSearch._rows = rows
    whole = search_sqlite.SqliteSearch._pruned_probe
    search_sqlite.SqliteSearch._pruned_probe = lambda self, *args: None
    try:
        full = [(h.record.id, h.raw) for h in search.word_memories(SCOPE, query, depth)]
    finally:
        search_sqlite.SqliteSearch._pruned_probe = whole
    return split, full, ran


def test_a_common_word_is_split_off_and_the_answer_is_the_same(db):
    store(db, [f"the apple number {i}" for i in range(300)] + [f"zebra sighting {i}" for i in range(20)])
    store(db, [f"zebra and apple {i}" for i in range(5)])
    split, full, ran = lists(db, "zebra apple")
    assert ran  # the split statement answered
    assert split == full and len(split) == 10


def test_rows_only_the_common_word_holds_still_rank_when_they_score_higher(db):
    # Long rows hold the rare word once (low bm25); short rows repeat the common one.
    filler = " ".join(f"w{j}" for j in range(150))
    store(db, [f"zebra {filler} {i}" for i in range(20)])
    store(db, [f"apple apple apple {i}" for i in range(300)] + [f"pear {i}" for i in range(700)])
    split, full, _ = lists(db, "zebra apple")
    assert split == full
    texts = [h.record.text for h in SqliteWordSearch(db).word_memories(SCOPE, "zebra apple", 10)]
    assert all(t.startswith("apple") for t in texts)  # the common word's short rows lead


def test_the_split_follows_the_counts(monkeypatch):
    counts = {"s": 4200, "caroline": 1700, "lgbtq": 98, "group": 99}
    terms = ["caroline", "s", "lgbtq", "group"]
    rare, bound = bm25_bound.split(terms, counts, 10_000)
    assert rare == ["lgbtq", "group"]  # the commonest first, in the query's order
    assert bound == pytest.approx(2.2 * (bm25_bound.idf(10_000, 4200) + bm25_bound.idf(10_000, 1700)))
    monkeypatch.setattr(bm25_bound, "MAX_BOUND", 1.0)  # room for "s" (0.71) only
    assert bm25_bound.split(terms, counts, 10_000)[0] == ["caroline", "lgbtq", "group"]
    assert bm25_bound.split(["a", "b"], {"a": 150, "b": 3}, 10_000) is None  # too few rows to skip
    assert bm25_bound.split(["a", "b"], {"a": 9000}, 10_000) is None  # a count missing
    assert bm25_bound.split(["a", "b"], {"a": 9000, "b": 0}, 10_000) is None  # no row holds what is left


@pytest.mark.parametrize(
    ("blob", "rows"), [(b"\x05\x19", 5), (b"\x81\x00\x07", 128), (b"\xff\x7f", 16383), (b"", None)]
)
def test_the_row_count_is_read_off_the_totals_record(blob, rows):
    assert bm25_bound.total_rows(blob) == rows
