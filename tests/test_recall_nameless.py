"""The query embedded as asked and without the scope's speaker names (issue 14, eighth pass),
against the real local HTTP embedding server of tests/embed_server.py.

A recall whose query names a stored speaker ("Caroline: ..." turns) sends ONE
request with two texts, the query and the query without the name, and searches
with the unit sum of their unit vectors (the nameless one weighted
nameless.WEIGHT); a query naming nobody, or a scope whose
rows carry no speaker label, sends the query alone, as before.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from cpersona.embedding.client import build_embedder
from cpersona.services.recall.nameless import MAX_NAMES, WEIGHT, nameless, speaker_names
from cpersona.services.recall.service import recall
from cpersona.services.records.memories import store

from conftest import make_app
from embed_server import embed_text

pytestmark = pytest.mark.both_backends

TURNS = (
    "Caroline: I went to an LGBTQ support group yesterday and it was powerful",
    "Melanie: That sounds great! I painted a sunrise over the lake last week",
    "Caroline: I am researching adoption agencies now",
    "Melanie: My kids loved the camping trip to the mountains",
)


def _texts_sent(embed_server) -> list[list[str]]:
    return [r.body["texts"] for r in embed_server.embed_requests()]


def _recall_texts(db, embed_server, rows, query: str) -> list[list[str]]:
    app = make_app(db, EMBEDDING_MODE="http", EMBEDDING_URL=embed_server.url, DEGRADED_ADVISORY="false")
    app.embedder = build_embedder(app.settings)
    try:
        for text in rows:
            assert store(app, agent_id="a", content=text, timestamp="2026-06-02T00:00:00+00:00")["embedded"] is True
        before = len(embed_server.embed_requests())
        recall(app, agent_id="a", query=query, limit=5)
        return _texts_sent(embed_server)[before:]
    finally:
        app.embedder.close()


def test_a_query_naming_a_stored_speaker_sends_both_texts_in_one_request(db, embed_server):
    sent = _recall_texts(db, embed_server, TURNS, "What did Caroline research?")
    assert sent == [["What did Caroline research?", "What did research"]]


def test_a_possessive_name_is_removed_too(db, embed_server):
    sent = _recall_texts(db, embed_server, TURNS, "What is Melanie's painting of?")
    assert sent == [["What is Melanie's painting of?", "What is painting of"]]


def test_a_query_naming_no_speaker_sends_the_query_alone(db, embed_server):
    sent = _recall_texts(db, embed_server, TURNS, "Who went camping in the mountains?")
    assert sent == [["Who went camping in the mountains?"]]


def test_a_scope_without_speaker_labels_sends_the_query_alone(db, embed_server):
    rows = ("Caroline from finance approves every expense", "The garage door code is 4417")
    sent = _recall_texts(db, embed_server, rows, "What does Caroline approve?")
    assert sent == [["What does Caroline approve?"]]


def test_the_searched_vector_is_the_unit_sum_of_both_unit_vectors(embed_server, db):
    app = make_app(db, EMBEDDING_MODE="http", EMBEDDING_URL=embed_server.url, DEGRADED_ADVISORY="false")
    embedder = build_embedder(app.settings)
    try:
        got = embedder.embed_query_sum(["What did Caroline research?", "What did research"])
        again = embedder.embed_query_sum(["What did Caroline research?", "What did research"])
    finally:
        embedder.close()
    a, b = (
        np.array(embed_text(t, embed_server.dimension)) for t in ("What did Caroline research?", "What did research")
    )
    want = a / np.linalg.norm(a) + b / np.linalg.norm(b)
    want /= np.linalg.norm(want)
    assert got.outcome.ok and np.allclose(got.vector, want, atol=1e-6)
    assert math.isclose(float(np.linalg.norm(got.vector)), 1.0, rel_tol=1e-5)
    assert again.outcome.from_cache and again.blob == got.blob
    assert len(embed_server.embed_requests()) == 1  # one request, then the cache


def test_names_are_bounded_and_first_seen_first():
    rows = [f"Speaker{i}: hello there" for i in range(MAX_NAMES + 5)]
    names = speaker_names(rows)
    assert len(names) == MAX_NAMES and "speaker0" in names and f"speaker{MAX_NAMES}" not in names
    assert nameless("what did Speaker3 say", names) == "what did say"
    assert nameless("what did anyone say", names) is None
    assert nameless("Speaker3", names) is None  # nothing left but the name: no second text


def test_a_weighted_sum_scales_each_unit_vector_and_is_cached_apart(embed_server, db):
    app = make_app(db, EMBEDDING_MODE="http", EMBEDDING_URL=embed_server.url, DEGRADED_ADVISORY="false")
    embedder = build_embedder(app.settings)
    texts = ["What did Caroline research?", "What did research"]
    try:
        plain = embedder.embed_query_sum(texts)
        weighted = embedder.embed_query_sum(texts, (1.0, 2.0))
    finally:
        embedder.close()
    a, b = (np.array(embed_text(t, embed_server.dimension)) for t in texts)
    want = a / np.linalg.norm(a) + 2.0 * b / np.linalg.norm(b)
    want /= np.linalg.norm(want)
    assert weighted.outcome.ok and not weighted.outcome.from_cache  # not the unweighted entry
    assert np.allclose(weighted.vector, want, atol=1e-6) and not np.allclose(plain.vector, want, atol=1e-4)


def test_recall_searches_with_the_nameless_text_weighted(db, embed_server):
    """The vector recall searched with is the weighted sum: asking for it afterwards hits the cache."""
    app = make_app(db, EMBEDDING_MODE="http", EMBEDDING_URL=embed_server.url, DEGRADED_ADVISORY="false")
    app.embedder = build_embedder(app.settings)
    try:
        for text in TURNS:
            store(app, agent_id="a", content=text, timestamp="2026-06-02T00:00:00+00:00")
        recall(app, agent_id="a", query="What did Caroline research?", limit=5)
        sent = len(embed_server.embed_requests())
        again = app.embedder.embed_query_sum(["What did Caroline research?", "What did research"], (1.0, WEIGHT))
    finally:
        app.embedder.close()
    assert WEIGHT == 2.0
    assert again.outcome.from_cache and len(embed_server.embed_requests()) == sent
