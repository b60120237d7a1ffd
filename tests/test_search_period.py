"""The two time primitives of the search backends: a scope's memory span and a period's rows.

Both backends answer the same (the module runs on SQLite and PostgreSQL):
stamps are ordered by instant, not as text; scope and source filters apply
inside the statement; the period search ranks by words held, then newest.
"""

from __future__ import annotations

from datetime import datetime, timezone

import pytest
from sqlalchemy import insert

from cpersona.storage.models import Episode, Memory
from cpersona.storage.scope import Scope
from cpersona.storage.search import open_search

pytestmark = pytest.mark.both_backends

UTC = timezone.utc


def source(user: str) -> str:
    return '{"type": "User", "id": "%s", "name": ""}' % user


def add_memory(db, content: str, timestamp: str, *, agent: str = "a", user: str = "u1") -> int:
    with db.write() as session:
        return session.execute(
            insert(Memory).values(agent_id=agent, content=content, timestamp=timestamp, source=source(user))
        ).inserted_primary_key[0]


def add_episode(db, summary: str, start: str, *, agent: str = "a", keywords: str = "") -> int:
    with db.write() as session:
        return session.execute(
            insert(Episode).values(agent_id=agent, summary=summary, keywords=keywords, start_time=start)
        ).inserted_primary_key[0]


def test_memory_span_orders_by_instant_and_names_the_date_shape_option(db):  # spec §5.9.2, TQ-4
    add_memory(db, "a", "2026-01-01T10:00:00+09:00")  # 01:00 UTC: last as text, first in time
    add_memory(db, "b", "2026-01-01 02:00:00")  # naive: read as UTC, the newest date-shaped stamp
    add_memory(db, "c", "garbage")  # unreadable: no part
    add_memory(db, "d", "")
    add_memory(db, "e", "2030-01-01T00:00:00Z", agent="other")  # out of scope: no part
    backend = open_search(db)
    expected = (datetime(2026, 1, 1, 1, tzinfo=UTC), datetime(2026, 1, 1, 2, tzinfo=UTC))
    assert backend.memory_span(Scope("a"), date_shaped_only=True) == expected
    assert backend.memory_span(Scope("a"), date_shaped_only=False) == expected
    assert backend.memory_span(Scope("nobody"), date_shaped_only=True) == (None, None)


def test_memory_span_date_shape_leaves_out_a_bare_number(db):  # spec §5.9.2 (confidence counts dates only)
    add_memory(db, "a", "2026-03-01T00:00:00Z")
    add_memory(db, "b", "2026-03-02")  # a date-only stamp counts (midnight UTC)
    add_memory(db, "c", "2500000")  # SQLite reads a Julian day (year 2132); not a date here
    assert open_search(db).memory_span(Scope("a"), date_shaped_only=True) == (
        datetime(2026, 3, 1, tzinfo=UTC),
        datetime(2026, 3, 2, tzinfo=UTC),
    )


def test_period_rows_rank_by_words_then_newest_and_stay_in_scope(db):  # spec TQ-6 (the period search)
    start, end = datetime(2026, 4, 1, tzinfo=UTC), datetime(2026, 4, 10, tzinfo=UTC)
    both = add_memory(db, "banana and cherry pie", "2026-04-02T00:00:00+00:00")
    old = add_memory(db, "banana bread", "2026-04-03T00:00:00+00:00")
    new = add_memory(db, "banana split", "2026-04-05T23:00:00-05:00")  # 04-06 04:00 UTC: the newest
    add_memory(db, "banana outside", "2026-04-10T00:00:00+00:00")  # end is exclusive
    add_memory(db, "banana too early", "2026-03-31T23:59:00+00:00")
    add_memory(db, "apple only", "2026-04-04T00:00:00+00:00")  # holds no word
    add_memory(db, "banana elsewhere", "2026-04-04T00:00:00+00:00", agent="other")  # other agent
    other_user = add_memory(db, "banana of another user", "2026-04-04T12:00:00+00:00", user="u2")
    ep = add_episode(db, "fruit talk", "2026-04-04T00:00:00+00:00", keywords="banana")
    backend = open_search(db)
    rows = backend.period_rows(Scope("a"), start, end, ["banana", "cherry"], depth=50)
    assert rows == [("mem", both), ("mem", new), ("mem", other_user), ("ep", ep), ("mem", old)]
    mine = backend.period_rows(Scope("a"), start, end, ["banana", "cherry"], source_id="u1", depth=50)
    assert ("mem", other_user) not in mine and ("ep", ep) in mine  # spec ISO-3: episodes carry no source
    assert backend.period_rows(Scope("a"), start, end, ["banana"], depth=2) == [("mem", new), ("mem", other_user)]


def test_period_rows_without_words_list_the_period_newest_first(db):  # spec TQ-6
    first = add_memory(db, "one", "2026-04-02T00:00:00Z")
    second = add_memory(db, "two", "2026-04-03T00:00:00Z")
    backend = open_search(db)
    start, end = datetime(2026, 4, 1, tzinfo=UTC), datetime(2026, 4, 4, tzinfo=UTC)
    assert backend.period_rows(Scope("a"), start, end, [], depth=50) == [("mem", second), ("mem", first)]
