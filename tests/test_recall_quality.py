"""Keyword ranking quality (issue 3): content words decide the FTS order, not function words.

The FTS builder (spec §5.7.1) ORs every term of 3+ characters, so a question's
"what", "did", "they", "with" are terms too. Ranked on all of them, rows full of
such words outrank the one row sharing the question's content word. We rank on
the content words and place rows only a function word matched after them (a
deliberate difference from the reference, measured on LoCoMo: see the comment
on ``FUNCTION_WORDS``). These tests fail on the all-terms ranking.
"""

from __future__ import annotations

import pytest
from sqlalchemy import insert

from cpersona.config import load_settings
from cpersona.services.app import App
from cpersona.services.recall.service import recall
from cpersona.storage.models import Episode, Memory
from cpersona.storage.scope import Scope
from cpersona.storage.search import query_terms
from cpersona.storage.search_sqlite import SqliteSearch, ranking_terms

pytestmark = pytest.mark.both_backends  # storage/service behaviour: run on SQLite and PostgreSQL

MEMORY_STAMP = "2026-06-02T00:00:00+00:00"  # after every episode: no boundary penalty in play
QUESTION = "What did they do with the pottery?"
TARGET = "Melanie: I finally finished my first pottery bowl"
# Short rows made of the question's function words: under bm25 over every term
# each one outscores TARGET (four cheap matches beat one rarer one).
CHATTER = [
    "Caroline: what did they do there with them",
    "Caroline: they did what they could with the others",
    "Melanie: what they did with them was odd",
]
UNRELATED = [f"Melanie: a note about gardening and hiking number {i}" for i in range(6)]


def make_app(db, **env: str) -> App:
    environ = {"CPERSONA_DB_PATH": str(db.path), **{f"CPERSONA_{k}": v for k, v in env.items()}}
    return App(db=db, settings=load_settings(environ))


def add_memories(db, contents: list[str]) -> dict[str, str]:
    """Insert ``contents`` in order; returns content -> ref."""
    with db.write() as session:
        session.execute(
            insert(Memory),
            [{"agent_id": "a", "content": c, "timestamp": MEMORY_STAMP, "source": "{}"} for c in contents],
        )
    return {content: f"mem:{i}" for i, content in enumerate(contents, start=1)}


@pytest.fixture
def corpus(db) -> dict[str, str]:
    return add_memories(db, [*CHATTER, TARGET, *UNRELATED])


def test_function_words_are_left_out_of_the_ranking_terms():
    terms = query_terms(QUESTION)
    assert terms == ["What", "did", "they", "with", "the", "pottery"]  # spec §5.7.1 (unchanged)
    assert ranking_terms(terms) == ["pottery"]
    # A query of nothing but function words keeps them all: something still ranks.
    assert ranking_terms(query_terms("what did they")) == ["what", "did", "they"]
    # Temporal connectives are content in questions ("until", "while").
    assert ranking_terms(query_terms("until the meeting")) == ["until", "meeting"]


@pytest.mark.sqlite_only  # SqliteSearch itself: FTS5 bm25 ranking
def test_content_word_match_ranks_first_and_function_word_matches_follow(db, corpus):  # spec §5.7.2
    result = SqliteSearch(db).keyword_memories(Scope("a"), QUESTION, 10)
    assert result.method == "fts"
    order = [hit.record.ref for hit in result.hits]
    assert order[0] == corpus[TARGET]
    # Rows matched only by function words still come back (the list is no
    # shorter than the all-terms ranking gave), after every content-word row.
    assert sorted(order[1:]) == sorted(corpus[c] for c in CHATTER)
    assert not set(order) & {corpus[c] for c in UNRELATED}
    # Raw scores stay in list order, so rsf normalisation agrees with the ranks.
    scores = [hit.raw for hit in result.hits]
    assert scores == sorted(scores, reverse=True)


@pytest.mark.sqlite_only  # SqliteSearch itself: FTS5 bm25 ranking
def test_fill_never_exceeds_depth(db, corpus):
    result = SqliteSearch(db).keyword_memories(Scope("a"), QUESTION, 2)
    assert [hit.record.ref for hit in result.hits][0] == corpus[TARGET]
    assert len(result.hits) == 2


@pytest.mark.sqlite_only  # SqliteSearch itself: FTS5 bm25 ranking
def test_query_of_only_function_words_still_uses_fts(db, corpus):  # spec KW-1
    result = SqliteSearch(db).keyword_memories(Scope("a"), "what did they", 10)
    assert result.method == "fts"
    assert {hit.record.ref for hit in result.hits} == {corpus[c] for c in CHATTER}


@pytest.mark.sqlite_only  # SqliteSearch itself: FTS5 bm25 ranking
def test_content_words_matching_nothing_fall_back_to_function_word_rows(db, corpus):  # spec KW-1
    # "zebra" matches no row: the function-word rows are what FTS finds, as with
    # every term ORed; the LIKE fallback is not taken while FTS finds something.
    result = SqliteSearch(db).keyword_memories(Scope("a"), "what did they do with zebras", 10)
    assert result.method == "fts"
    assert {hit.record.ref for hit in result.hits} == {corpus[c] for c in CHATTER}


@pytest.mark.sqlite_only  # SqliteSearch itself: FTS5 bm25 ranking
def test_episode_arm_ranks_on_content_words_too(db):  # spec §5.7.3
    with db.write() as session:
        session.execute(
            insert(Episode),
            [{"agent_id": "a", "summary": s, "keywords": ""} for s in [*CHATTER, TARGET, *UNRELATED]],
        )
    hits = SqliteSearch(db).keyword_episodes(Scope("a"), QUESTION, 10)
    assert hits[0].record.ref == "ep:4"
    assert len(hits) == 1 + len(CHATTER)


@pytest.mark.parametrize("mode", ["rrf", "rsf"])
def test_keyword_only_recall_puts_the_content_match_last(db, corpus, mode):  # spec RC-1
    app = make_app(db, RECALL_MODE=mode)
    messages = recall(app, agent_id="a", query=QUESTION, limit=10)["messages"]
    assert messages, "the gate dropped every row"
    assert messages[-1]["ref"] == corpus[TARGET]  # the best row ends the list
    assert messages[-1]["match_reason"]["signal"] == mode
