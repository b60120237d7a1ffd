"""A stored chat turn's vector: the turn whole plus its sentences, each under the speaker (embedding.passages).

Issue 14, seventh pass: docs/benchmarks.md and the differences table in
docs/behavior-contracts.md. Unit tests with a recording embedder, then one
store / backfill round trip on both backends against tests/embed_server.py.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from sqlalchemy import select

from cpersona.config import load_settings
from cpersona.embedding.client import build_embedder
from cpersona.embedding.passages import MAX_PIECES, combine, embed_passage, embed_passages, pieces
from cpersona.embedding.vectors import FLOAT32
from cpersona.services.app import App
from cpersona.services.records.backfill import backfill_pass, stop_backfill
from cpersona.services.records.memories import store
from cpersona.storage.models import Memory

TURN = "Jon: Hey Gina! Good to see you too. Lost my job as a banker yesterday, so I'm starting a business."


def test_a_labelled_turn_is_cut_into_sentences_each_under_its_label():
    assert pieces(TURN) == [
        "Jon: Hey Gina!",
        "Jon: Good to see you too.",
        "Jon: Lost my job as a banker yesterday, so I'm starting a business.",
    ]


@pytest.mark.parametrize(
    "text",
    [
        "Jon: Thanks!",  # one sentence: its own vector is its sentence's
        "The user keeps two cats. Their names are Mike and Tama.",  # no speaker label
        "see https://example.org/a?b=c for more. It helps.",  # a URL's colon is no label
        "ユーザーは猫を二匹飼っている。名前はミケとタマ。",  # Japanese text without a label
        "",
    ],
)
def test_other_texts_keep_their_own_vector_only(text):
    assert pieces(text) == []


def test_wordless_pieces_are_dropped_and_long_turns_are_bounded():
    assert pieces("Ann: Yes!! ... Sure.") == ["Ann: Yes!!", "Ann: Sure."]
    long = "Ann: " + " ".join(f"Sentence number {i}." for i in range(40))
    assert len(pieces(long)) == MAX_PIECES


def test_the_stored_vector_is_the_turn_plus_the_unit_sum_of_its_sentences():
    whole = np.array([1.0, 0.0, 0.0], dtype=FLOAT32)
    parts = [np.array([0.0, 1.0, 0.0], dtype=FLOAT32), np.array([0.0, 0.0, 1.0], dtype=FLOAT32)]
    got = combine(whole, parts)
    s = 1 / math.sqrt(2)
    expected = np.array([1.0, s, s]) / math.sqrt(2.0)
    assert np.allclose(got, expected, atol=1e-6)
    assert abs(float(np.linalg.norm(got)) - 1.0) < 1e-6
    assert combine(whole, []) is whole


class Recording:
    """An embedder that records what it was asked and answers one-hot-ish vectors per text."""

    def __init__(self, fail: set[str] = frozenset()) -> None:
        self.asked: list[list[str]] = []
        self.fail = fail

    def vector(self, text: str) -> bytes:
        v = np.zeros(8, dtype=FLOAT32)
        v[hash(text) % 8] = 1.0
        v[len(text) % 8] += 0.5
        return (v / np.linalg.norm(v)).astype(FLOAT32).tobytes()

    def embed(self, text: str) -> bytes | None:
        self.asked.append([text])
        return None if text in self.fail else self.vector(text)

    def embed_many(self, texts, batch_size: int = 512):
        self.asked.append(list(texts))
        return [None if t in self.fail else self.vector(t) for t in texts]


def as_vector(blob: bytes) -> np.ndarray:
    return np.frombuffer(blob, dtype=FLOAT32)


def test_embed_passage_sends_the_turn_and_its_sentences_in_one_request():
    embedder = Recording()
    blob = embed_passage(embedder, TURN)
    assert embedder.asked == [[TURN, *pieces(TURN)]]
    expected = combine(as_vector(embedder.vector(TURN)), [as_vector(embedder.vector(p)) for p in pieces(TURN)])
    assert np.allclose(as_vector(blob), expected)
    # a text without a label: one text, its own vector
    assert embed_passage(embedder, "plain note") == embedder.vector("plain note")
    assert embedder.asked[-1] == ["plain note"]


def test_no_vector_for_the_turn_means_no_vector_and_a_missing_sentence_is_left_out():
    assert embed_passage(Recording(fail={TURN}), TURN) is None
    first = pieces(TURN)[0]
    embedder = Recording(fail={first})
    blob = embed_passage(embedder, TURN)
    rest = [as_vector(embedder.vector(p)) for p in pieces(TURN)[1:]]
    assert np.allclose(as_vector(blob), combine(as_vector(embedder.vector(TURN)), rest))


def test_embed_passages_keeps_each_text_aligned_with_its_blob():
    embedder = Recording()
    texts = ["plain note", TURN, "Ann: Hi. Bye.", "another"]
    blobs = embed_passages(embedder, texts, batch_size=32)
    assert len(embedder.asked) == 1  # one embed_many call for all of them
    assert blobs == [embed_passage(Recording(), t) for t in texts]


# -- the write paths ---------------------------------------------------------------------------


def http_app(db, server) -> App:
    settings = load_settings(
        {"CPERSONA_DB_PATH": str(db.path), "CPERSONA_EMBEDDING_MODE": "http", "CPERSONA_EMBEDDING_URL": server.url}
    )
    return App(db=db, settings=settings, embedder=build_embedder(settings))


def stored_vectors(db) -> dict[str, bytes | None]:
    with db.read() as session:
        return {row.content: row.embedding for row in session.execute(select(Memory)).scalars()}


@pytest.mark.both_backends
def test_store_and_backfill_write_the_combined_vector(db, embed_server):
    app = http_app(db, embed_server)
    try:
        assert store(app, agent_id="a", content=TURN)["embedded"] is True
        assert store(app, agent_id="a", content="a plain note. Two sentences here.")["embedded"] is True
        expected = embed_passage(app.embedder, TURN)
        vectors = stored_vectors(db)
        assert np.allclose(as_vector(vectors[TURN]), as_vector(expected))
        assert (
            vectors["a plain note. Two sentences here."]
            == app.embedder.embed_many(["a plain note. Two sentences here."])[0]
        )
        # a row stored while the backend was down gets the same vector from the backfill
        embed_server.status = 503
        later = "Gina: Congrats, Jon! The studio looks amazing."
        assert store(app, agent_id="a", content=later)["embedded"] is False
        embed_server.status = 200
        backfill_pass(app)
        assert np.allclose(as_vector(stored_vectors(db)[later]), as_vector(embed_passage(app.embedder, later)))
    finally:
        stop_backfill(app)
        app.embedder.close()
