"""The trigram arm skips scoring rows only common terms hold, and only when its answer stays the same.

storage/bm25_bound.py (split_by_upper, count_floors) and
SqliteSearch._capped_probe: the split is chosen on upper bounds of the terms'
counts (their rarest trigram's count), the statement scores only rows holding
a rarer term, and its probe-th score must then be shown to beat every row
holding only the common terms, from counts capped by LIMIT (lower bounds).
When it cannot be shown, the whole statement runs. Either way the answer is
the whole statement's: the same ids, order and scores (issue 17 item 2).
"""

from __future__ import annotations

import random

import pytest
from sqlalchemy import insert

from cpersona.storage import bm25_bound, search_sqlite
from cpersona.storage.models import Memory
from cpersona.storage.scope import Scope
from cpersona.storage.search_sqlite import SqliteSearch

pytestmark = pytest.mark.sqlite_only  # FTS5's bm25

SCOPE = Scope(agent_id="a")


@pytest.fixture(autouse=True)
def small_corpus(monkeypatch):
    # The budget's counts (the upper bounds) are read only above SCORED_ROWS_BUDGET rows (and a
    # query's terms all kept below it), and a split only pays above MIN_COMMON_ROWS: both scaled
    # down to a test's thousand rows.
    monkeypatch.setattr(search_sqlite, "SCORED_ROWS_BUDGET", 700)
    monkeypatch.setattr(bm25_bound, "MIN_COMMON_ROWS", 40)


def store(db, rows: list[str]) -> None:
    with db.write() as session:
        session.execute(insert(Memory), [{"agent_id": "a", "content": c, "timestamp": "2026-01-01"} for c in rows])


def answers(db, query: str, depth: int = 10) -> tuple[list[tuple[int, float]], list[tuple[int, float]], list[str]]:
    """(the trigram arm's answer, the same with the bounded path off, the bounded statements it ran)."""
    ran: list[str] = []
    rows = SqliteSearch._rows

    def spy(self, session, sql, params):
        if "+rowid IN" in sql.text and "memories_fts" in sql.text:
            ran.append("pruned")
        if "LIMIT :cap" in sql.text:
            ran.append("floor")
        return rows(self, session, sql, params)

    search = SqliteSearch(db)
    SqliteSearch._rows = spy
    try:
        bounded = [(h.record.id, h.raw) for h in search.keyword_memories(SCOPE, query, depth).hits]
    finally:
        SqliteSearch._rows = rows
    capped = SqliteSearch._capped_probe
    SqliteSearch._capped_probe = lambda self, *args: None
    try:
        full = [(h.record.id, h.raw) for h in search.keyword_memories(SCOPE, query, depth).hits]
    finally:
        SqliteSearch._capped_probe = capped
    return bounded, full, ran


def test_a_common_term_is_split_off_and_the_answer_is_the_same(db):
    store(db, [f"the apple number {i} of many" for i in range(300)] + [f"zebra sighting {i}" for i in range(20)])
    store(db, [f"zebra and apple {i}" for i in range(5)] + [f"pear {i}" for i in range(600)])
    bounded, full, ran = answers(db, "zebra apple")
    assert ran == ["pruned", "floor"]  # the pruned statement answered, shown by one capped count
    assert bounded == full and len(bounded) == 10
    assert answers(db, "zebra apple")[2] == ["pruned"]  # the floor is remembered while the index is unchanged


def test_rows_only_the_common_term_holds_still_rank_when_they_score_higher(db):
    # Long rows hold the rare term once (low bm25); short rows repeat the common one.
    filler = " ".join(f"w{j}" for j in range(150))
    store(db, [f"zebra {filler} {i}" for i in range(20)])
    store(db, [f"apple apple apple {i}" for i in range(300)] + [f"pear {i}" for i in range(700)])
    bounded, full, ran = answers(db, "zebra apple")
    assert "pruned" in ran  # tried, and not shown: the whole statement answered
    assert bounded == full
    texts = [h.record.text for h in SqliteSearch(db).keyword_memories(SCOPE, "zebra apple", 10).hits]
    assert all(t.startswith("apple") for t in texts)  # the common term's short rows lead


def test_many_queries_over_a_skewed_corpus_answer_as_the_whole_statement(db):
    rng = random.Random(17)
    common = ["melanie", "thanks", "really"]
    rare = [f"{w}{i}" for w in ("pottery", "workshop", "zebra", "violin") for i in range(6)]
    words = [f"word{i}" for i in range(60)]
    rows = []
    for _ in range(900):
        held = rng.sample(common, rng.randint(0, 2)) + rng.sample(rare, rng.choice((0, 0, 0, 1, 2)))
        held += rng.sample(words, rng.randint(1, 25))
        rng.shuffle(held)
        rows.append(" ".join(held))
    store(db, rows)
    tried = 0
    for _ in range(60):
        query = " ".join(rng.sample(common, rng.randint(1, 2)) + rng.sample(rare, rng.randint(1, 3)))
        depth = rng.choice((5, 10, 25))
        bounded, full, ran = answers(db, query, depth)
        assert bounded == full, query
        tried += "pruned" in ran
    assert tried >= 20  # the bounded path was exercised, not skipped


def test_the_split_follows_the_upper_bounds(monkeypatch):
    upper = {"melanie": 14_000, "pottery": 600, "workshop": 160}
    assert bm25_bound.split_by_upper(["melanie", "pottery", "workshop"], upper, 100_000) == (
        ["pottery", "workshop"],
        ["melanie"],
    )
    # Not worth it: the common term holds less than COMMON_SHARE times R's rows.
    assert bm25_bound.split_by_upper(["a", "b"], {"a": 3000, "b": 2000}, 100_000) is None
    # A term without an upper bound (a declared phrase) stays in R.
    assert bm25_bound.split_by_upper(["a", "name"], {"a": 30_000}, 100_000) == (["name"], ["a"])
    monkeypatch.setattr(bm25_bound, "MAX_RARE", 1)
    assert bm25_bound.split_by_upper(["a", "b", "c"], {"a": 30_000, "b": 10, "c": 20}, 100_000) is None


def test_the_floors_keep_the_bound_under_the_score_to_beat():
    floors = bm25_bound.count_floors([14_000], 100_000, 7.0)
    assert floors is not None and floors[0] <= 14_000
    assert bm25_bound.bound_from_floors(floors, 100_000) <= 7.0
    assert bm25_bound.bound_from_floors([floors[0] - 1], 100_000) > 7.0  # the least count that does
    assert bm25_bound.count_floors([500], 100_000, 7.0) is None  # a term that rare weighs more than 7 alone
    two = bm25_bound.count_floors([30_000, 20_000], 100_000, 6.0)
    assert two is not None and bm25_bound.bound_from_floors(two, 100_000) <= 6.0


def test_a_loose_upper_bound_is_caught_by_the_capped_count(db):
    # "apple"'s trigrams (app, ppl, ple) are each in hundreds of rows that do not hold the word,
    # so its upper bound calls it common while five rows hold it: rare, heavily weighted, and
    # those short rows lead. The capped count falls short of the floor the bound needs, so the
    # split is not shown and the whole statement answers.
    store(db, [f"zebra {i}" for i in range(20)])
    store(db, [f"app ppl ple {i}" for i in range(400)] + [f"apple {i}" for i in range(5)])
    store(db, [f"pear {i}" for i in range(600)])
    bounded, full, ran = answers(db, "zebra apple")
    assert ran[:2] == ["pruned", "floor"]  # split on the upper bound, then tested
    assert bounded == full
    texts = [h.record.text for h in SqliteSearch(db).keyword_memories(SCOPE, "zebra apple", 10).hits]
    assert texts[0].startswith("apple ")  # a row only the (truly rare) common-looking term holds leads
