"""Replies beside their questions in the keyword memories list (issue 14, fifth pass).

A memory that asks something and matches the query brings the memory stored
right after it in the same scope (its reply, stamped within the hour) into the
keyword list, just ahead of it. Real databases (SQLite, and PostgreSQL where
CPERSONA_TEST_PG_URL is set); rows written with plain SQL so ids and stamps are
exactly the test's.
"""

from __future__ import annotations

import pytest
from sqlalchemy import insert

from cpersona.services.recall import replies
from cpersona.services.recall.service import recall
from cpersona.storage.engine import Database
from cpersona.storage.models import Memory
from cpersona.storage.scope import Scope
from cpersona.storage.search import Hit, Record, open_search

from conftest import make_app

pytestmark = pytest.mark.both_backends

STAMP = "2026-06-02T10:00:00+00:00"
QUESTION = "Maria: Great news! How often do you all work out together with the family?"
REPLY = "Three times a week; it keeps us on track."
# A pool this large lets the gate's pool-size bar pass more than the first row (spec §5.10).
FILLER = [f"Note {i}: the shelter needed {i} volunteers and the team won game {i}." for i in range(200)]


def add(db: Database, *rows: tuple[str, str] | tuple[str, str, str]) -> None:
    """Rows (content, timestamp[, agent]) in order, so ids follow the list."""
    with db.write() as session:
        session.execute(
            insert(Memory),
            [{"content": r[0], "timestamp": r[1], "agent_id": r[2] if len(r) > 2 else "a"} for r in rows],
        )


def contents(response: dict) -> list[str]:
    """Best row first (spec RC-1: recall lists rows in ascending relevance)."""
    return [m["content"] for m in reversed(response["messages"])]


def ask(db: Database, query: str = "How often does John work out with his family?") -> list[str]:
    return contents(recall(make_app(db), agent_id="a", query=query, limit=5))


def test_a_question_row_brings_its_reply_ahead_of_it(db) -> None:
    add(db, *((f, STAMP) for f in FILLER), (QUESTION, STAMP), (REPLY, STAMP), ("John: See you soon!", STAMP))
    found = ask(db)
    assert REPLY in found  # it shares no word with the query
    assert found.index(REPLY) == found.index(QUESTION) - 1  # ahead of its question (spec RC-1 order)


def test_the_reply_is_the_next_row_of_the_same_scope(db) -> None:  # spec ISO-2
    add(
        db,
        *((f, STAMP) for f in FILLER),
        (QUESTION, STAMP),
        ("Agent b: Every day at dawn, with the family.", STAMP, "b"),
        (REPLY, STAMP),
    )
    found = ask(db)
    assert REPLY in found
    assert not any(text.startswith("Agent b") for text in found)


def test_a_row_stamped_days_later_is_no_reply(db) -> None:
    add(db, *((f, STAMP) for f in FILLER), (QUESTION, STAMP), (REPLY, "2026-06-05T10:00:00+00:00"))
    assert REPLY not in ask(db)


def test_a_row_that_asks_nothing_brings_nothing(db) -> None:
    add(db, *((f, STAMP) for f in FILLER), ("Maria: We all work out together with the family.", STAMP), (REPLY, STAMP))
    assert REPLY not in ask(db)


def test_next_memories_keeps_scope_source_and_reach(db) -> None:
    add(db, ("q one?", STAMP), ("other agent", STAMP, "b"), ("reply one", STAMP), ("q two?", STAMP))
    backend = open_search(db)
    found = backend.next_memories(Scope("a"), [1, 4], reach=64)
    assert {k: r.text for k, r in found.items()} == {1: "reply one"}  # 4 has no later row in scope
    assert backend.next_memories(Scope("a"), [1], reach=1) == {}  # id 2 is b's; 3 is past the reach
    assert backend.next_memories(Scope("b"), [1], reach=64)[1].text == "other agent"
    assert backend.next_memories(Scope("a"), [1], source_id="discord:1", reach=64) == {}  # spec ISO-3


# -- the list rule (pure, one backend stand-in) ----------------------------------------------


@pytest.mark.sqlite_only
def test_only_a_sentence_that_ends_in_a_question_mark_asks() -> None:
    assert replies.asks("Wow! Did you see that band?")
    assert replies.asks("How often? We go on Sundays.")
    assert replies.asks("彼は言った「来る？」")  # full-width, closing bracket after it
    assert not replies.asks("Search https://www.google.com/?hl=ja for it")  # a URL's query string
    assert not replies.asks("「なぜ来ないのだろう？」とアルマに尋ねた。")  # a quoted question the sentence goes on past
    assert not replies.asks("We all work out together.")


class _Next:
    def __init__(self, following: dict[int, Record]) -> None:
        self.following = following

    def next_memories(self, scope, ids, *, source_id="", reach):  # noqa: ANN001 - a stand-in
        return {i: self.following[i] for i in ids if i in self.following}


def _rec(i: int, text: str, stamp: str = STAMP) -> Record:
    return Record("mem", i, text, "", stamp)


@pytest.mark.sqlite_only
def test_the_list_keeps_its_depth_and_moves_a_listed_reply_up_once() -> None:
    hits = [Hit(_rec(1, "a?"), 3.0), Hit(_rec(5, "b"), 2.0), Hit(_rec(2, "reply"), 1.0), Hit(_rec(7, "c"), 0.5)]
    out = replies.with_replies(_Next({1: _rec(2, "reply")}), Scope("a"), hits, 3)
    assert [h.record.id for h in out] == [2, 1, 5]  # the reply moved up, not listed twice; depth 3
    assert [h.raw for h in out] == [3.0, 3.0, 2.0]  # raw scores stay in list order (rsf)
