"""With a query vector, keyword rows sharing only the scope's common words leave the memories list (issue 14, seventh pass).

A name most memories hold ("Nate", in every turn he speaks) matches half the
scope; a row that holds it and nothing else the query asks about takes a
seat the vector channel could fill. Real databases (SQLite, and PostgreSQL
where CPERSONA_TEST_PG_URL is set); rows written with plain SQL so contents
and ids are exactly the test's.
"""

from __future__ import annotations

import pytest
from sqlalchemy import insert

from cpersona.embedding.client import build_embedder
from cpersona.services.recall import common_words
from cpersona.services.recall.retrievers import exclusion, retrieve, search_backend
from cpersona.services.recall.service import depth_for, parse_request
from cpersona.storage.engine import Database
from cpersona.storage.models import Memory
from cpersona.storage.scope import Scope
from cpersona.storage.search import Hit, Record, WordSpread, open_search

from conftest import make_app

pytestmark = pytest.mark.both_backends

STAMP = "2026-06-02T10:00:00+00:00"
QUERY = "What did Nate think of the coconut ice cream?"
ANSWER = "Nate: the coconut ice cream was rich and creamy, my new favourite snack"
NAME_ONLY = "Joanna: good to see you Nate, how was your week?"
# Nate in every row: the name is common in this scope (far above a twentieth of its rows).
FILLER = [f"Nate: day {i} at the tournament, practice round {i} went fine" for i in range(40)]


def add(db: Database, *contents: str, agent: str = "a") -> None:
    with db.write() as session:
        session.execute(insert(Memory), [{"agent_id": agent, "content": c, "timestamp": STAMP} for c in contents])


def memories_list(app, query: str = QUERY) -> list[str]:
    req = parse_request(app, {"agent_id": "a", "query": query, "limit": 10})
    with app.db.snapshot():
        found = retrieve(app, search_backend(app), req.retriever_query(), depth_for(app, req), exclusion(()))
    keys = found.keys("memories")
    return [found.records[key].text for key in keys]


def test_word_spread_counts_each_word_in_scope_by_its_stem(db) -> None:  # spec ISO-2
    add(db, "Nate played chess", "Nate plays games", "Joanna: hi Nate", "Joanna: coconut ice cream")
    add(db, "Nate and Nate again, playing", agent="b")  # another scope counts nothing here
    spread = open_search(db).word_spread(Scope("a"), "What games does Nate play?", [1, 2, 3, 4], cap=100, share=1.0)
    assert spread.rows == 4
    assert spread.counts == {"games": 1, "nate": 3, "play": 2}  # "played", "plays" are "play"
    assert spread.held == {1: {"nate", "play"}, 2: {"nate", "play", "games"}, 3: {"nate"}}


def test_word_spread_counts_a_word_just_past_the_share_and_a_scope_up_to_the_cap(db) -> None:
    add(db, *(f"Nate note {i}" for i in range(6)), "a quiet day")
    search = open_search(db)
    spread = search.word_spread(Scope("a"), "Nate notes", [1, 7], cap=100, share=0.3)
    assert spread.rows == 7
    assert spread.counts == {"nate": 3, "notes": 3}  # 6 each: counting stops at int(0.3 * 7) + 1
    assert spread.held == {1: {"nate", "notes"}}
    cut = search.word_spread(Scope("a"), "Nate notes", [1, 2], cap=5, share=0.3)
    assert (cut.rows, cut.counts, cut.held) == (5, {}, {})  # a scope the cap cut short: nothing is judged


def test_with_a_query_vector_a_row_holding_only_the_common_name_leaves_the_list(db, embed_server) -> None:
    add(db, *FILLER, NAME_ONLY, ANSWER)
    keyword_only = memories_list(make_app(db))
    assert NAME_ONLY in keyword_only and ANSWER in keyword_only  # keyword-only recall keeps every row
    app = make_app(db, EMBEDDING_MODE="http", EMBEDDING_URL=embed_server.url, DEGRADED_ADVISORY="false")
    app.embedder = build_embedder(app.settings)
    try:
        hybrid = memories_list(app)
    finally:
        app.embedder.close()
    assert ANSWER in hybrid  # it holds "coconut", "ice", "cream": uncommon words
    assert NAME_ONLY not in hybrid


def _hit(i: int, text: str) -> Hit:
    return Hit(Record("mem", i, text, "", STAMP, STAMP))


class _Spread:
    """A backend answering word_spread with a fixed spread."""

    def __init__(self, spread: WordSpread | None) -> None:
        self.spread = spread

    def word_spread(self, scope, query, ids, *, source_id="", cap, share):
        return self.spread


HITS = [_hit(1, "name and cream"), _hit(2, "name only"), _hit(3, "nothing")]


def test_rows_holding_an_uncommon_word_stay_in_order() -> None:
    spread = WordSpread(100, {"name": 60, "cream": 3}, {1: frozenset({"name", "cream"}), 2: frozenset({"name"})})
    kept = common_words.without_common_only(_Spread(spread), Scope("a"), "q", HITS)
    assert [h.record.id for h in kept] == [1]


@pytest.mark.parametrize(
    "spread",
    [
        None,  # the word index cannot say
        WordSpread(100, {"name": 60, "cream": 30}, {1: frozenset({"name", "cream"})}),  # no uncommon word
        WordSpread(100, {"name": 60, "cream": 3}, {2: frozenset({"name"})}),  # every row would go
        WordSpread(common_words.SCOPE_CAP, {"name": 60, "cream": 3}, {1: frozenset({"cream"})}),  # scope too large
    ],
)
def test_the_list_is_left_alone_when_nothing_tells_the_rows_apart(spread) -> None:
    kept = common_words.without_common_only(_Spread(spread), Scope("a"), "q", HITS)
    assert [h.record.id for h in kept] == [1, 2, 3]
