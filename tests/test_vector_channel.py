"""The vector channel: sqlite-vec window scan, thresholds, far list, wiring into recall.

Every test runs on a real SQLite file and, where an embedding is made, against
the real local embedding server of tests/embed_server.py over HTTP. Rows whose
exact cosine matters are written with hand-made vectors, and the server is
told which vector to answer for the query (``TableServer``).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
from sqlalchemy import insert, select, text

from cpersona.config import load_settings
from cpersona.embedding.client import build_embedder
from cpersona.embedding.vectors import to_blob
from cpersona.services.app import App
from cpersona.services.records.episodes import archive_episode
from cpersona.services.records.memories import store
from cpersona.services.recall.service import recall
from cpersona.services.recall.retrievers import Query, nearest, search_backend
from cpersona.storage.models import Episode, Memory
from cpersona.storage.scope import Scope
from embed_server import WORD, EmbedServer, embed_text

pytestmark = pytest.mark.both_backends  # storage/service behaviour: run on SQLite and PostgreSQL

DIM = 64
MEMORY_STAMP = "2026-06-02T00:00:00+00:00"  # after every episode: keeps the episode penalty out


# -- a real embedding server that can answer chosen vectors and synonyms -------------------------


@dataclass
class TableServer(EmbedServer):
    """The test embedding server, plus fixed answers and a small thesaurus.

    ``table`` maps an exact text to the vector to answer; ``synonyms`` rewrites
    words before hashing, so a paraphrase with no word in common with the
    stored text still lands next to it — what a real sentence model does.
    """

    table: dict[str, list[float]] = field(default_factory=dict)
    synonyms: dict[str, str] = field(default_factory=dict)

    def vector(self, text: str) -> list[float]:
        if text in self.table:
            return self.table[text]
        if self.synonyms:
            text = WORD.sub(lambda m: self.synonyms.get(m.group(0).lower(), m.group(0)), text)
        return embed_text(text, self.dimension)


PARAPHRASE = {"automobile": "car", "needs": "wants", "new": "fresh", "tyres": "tires"}


@pytest.fixture
def server():
    srv = TableServer(synonyms=dict(PARAPHRASE)).start()
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture
def vec_app(db, server):
    app = embedding_app(db, server)
    yield app
    app.embedder.close()


def embedding_app(db, server: EmbedServer, **env: str) -> App:
    environ = {
        "CPERSONA_DB_PATH": str(db.path),
        "CPERSONA_EMBEDDING_MODE": "http",
        "CPERSONA_EMBEDDING_URL": server.url,
        **{f"CPERSONA_{k}": v for k, v in env.items()},
    }
    settings = load_settings(environ)
    return App(db=db, settings=settings, embedder=build_embedder(settings))


def unit(*weights: float) -> list[float]:
    """A DIM-wide unit vector with the given leading components."""
    v = np.zeros(DIM)
    v[: len(weights)] = weights
    return list(v / np.linalg.norm(v))


def at_cosine(c: float, axis: int = 1) -> list[float]:
    """A unit vector whose cosine with the query vector ``unit(1)`` is exactly ``c``."""
    v = np.zeros(DIM)
    v[0], v[axis] = c, math.sqrt(max(0.0, 1 - c * c))
    return list(v)


QUERY = unit(1.0)


def add_memories(db, *rows: dict[str, Any]) -> list[int]:
    defaults = {"agent_id": "a", "timestamp": MEMORY_STAMP, "source": '{"type": "Agent", "id": "a", "name": ""}'}
    with db.write() as session:
        ids = []
        for row in rows:
            values = {**defaults, **row}
            if isinstance(values.get("embedding"), list):
                values["embedding"] = to_blob(values["embedding"])
            ids.append(session.execute(insert(Memory).values(**values)).inserted_primary_key[0])
        return ids


def add_episode(db, **row: Any) -> int:
    values = {"agent_id": "a", "created_at": "2026-06-01 12:00:00", **row}
    if isinstance(values.get("embedding"), list):
        values["embedding"] = to_blob(values["embedding"])
    with db.write() as session:
        return session.execute(insert(Episode).values(**values)).inserted_primary_key[0]


def stamp(i: int) -> str:
    """created_at of the i-th row: later i is newer."""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(1_780_000_000 + i))


def scan(
    app: App,
    kind: str,
    scope: Scope,
    *,
    depth: int = 10,
    threshold: float = -1.0,
    window: tuple[int, int] = (0, 10_000),
    source_id: str = "",
    query: list[float] = QUERY,
) -> list[tuple[int, float]]:
    hits = search_backend(app).vector_candidates(
        kind, scope, to_blob(query), depth, threshold=threshold, window=window, source_id=source_id
    )
    return [(h.record.id, round(h.raw, 6)) for h in hits]


def refs(response: dict) -> list[str | None]:
    return [m.get("ref") for m in response["messages"]]


def reason(response: dict, ref: str) -> dict | None:
    return next(m.get("match_reason") for m in response["messages"] if m.get("ref") == ref)


# -- store and recall through the embedder --------------------------------------------------------


def test_store_embeds_and_recall_finds_a_paraphrase_keywords_cannot(db, vec_app, server):  # spec ST-6, VEC-1, §1
    stored = store(vec_app, agent_id="a", content="The automobile needs new tyres")
    assert stored["embedded"] is True
    with db.read() as session:
        blob = session.execute(select(Memory.embedding)).scalar_one()
    assert len(blob) == 4 * DIM
    response = recall(vec_app, agent_id="a", query="car wants fresh tires")
    assert refs(response) == ["mem:1"]
    why = response["messages"][0]["match_reason"]
    assert why["signal"] == "cosine" and why["score"] == why["cosine"] > 0.8  # spec §5.14
    # The lexical channels alone cannot find it: the same query without embeddings.
    keyword_only = App(db=db, settings=load_settings({"CPERSONA_DB_PATH": str(db.path)}))
    assert recall(keyword_only, agent_id="a", query="car wants fresh tires")["messages"] == []


def test_the_query_is_embedded_once_per_recall_and_cached(db, vec_app, server):  # spec VEC-1, EMB-4
    store(vec_app, agent_id="a", content="The automobile needs new tyres")
    before = len(server.embed_requests())
    recall(vec_app, agent_id="a", query="car wants fresh tires")
    assert len(server.embed_requests()) == before + 1
    assert server.embed_requests()[-1].body == {"texts": ["car wants fresh tires"]}
    recall(vec_app, agent_id="a", query="car wants fresh tires")
    assert len(server.embed_requests()) == before + 1  # cache hit: no request
    recall(vec_app, agent_id="a", query="   ")  # a blank query never embeds
    assert len(server.embed_requests()) == before + 1


def test_archive_episode_embeds_the_summary_and_recall_finds_it(db, vec_app, server):  # spec AE-5, VEC-6
    assert archive_episode(vec_app, agent_id="a", summary="automobile needs new tyres")["ok"] is True
    assert server.embed_requests()[-1].body == {"texts": ["automobile needs new tyres"]}
    response = recall(vec_app, agent_id="a", query="car wants fresh tires")
    assert refs(response) == ["ep:1"]
    message = response["messages"][0]
    assert message["content"] == "[Episode] automobile needs new tyres"
    assert message["source"] == {"System": "episode"} and message["match_reason"]["signal"] == "cosine"


def test_a_row_both_arms_found_carries_cosine_and_rrf(db, vec_app):  # spec §5.14, GATE-5
    store(vec_app, agent_id="a", content="The automobile needs new tyres")
    why = recall(vec_app, agent_id="a", query="automobile needs new tyres")["messages"][0]["match_reason"]
    assert why["signal"] == "cosine" and "cosine" in why
    assert why["rrf"] == pytest.approx(2 / 61)  # first on the vector list and on the FTS list


# -- the scan ---------------------------------------------------------------------------------------


def test_isolation_is_inside_the_scan_two_agents_of_very_different_sizes(db, vec_app):  # spec ISO-2, VEC-2
    # A big agent whose 3,000 rows all sit right on the query, written AFTER the
    # small agent's few weaker rows. A filter applied after a k-nearest step, or
    # a window counted over the whole table, would leave the small agent nothing.
    small = add_memories(
        db,
        *(
            {"agent_id": "small", "content": f"small {i}", "embedding": at_cosine(0.5 + i / 10), "created_at": stamp(i)}
            for i in range(3)
        ),
    )
    add_memories(
        db,
        *(
            {"agent_id": "big", "content": f"big {i}", "embedding": QUERY, "created_at": stamp(100 + i)}
            for i in range(3000)
        ),
    )
    app = embedding_app(db, _Never(), MAX_MEMORIES="10")
    assert [i for i, _ in scan(app, "mem", Scope("small"), depth=10, window=(0, 10))] == small[::-1]
    big = scan(app, "mem", Scope("big"), depth=5, window=(0, 10))
    assert len(big) == 5 and all(c == pytest.approx(1.0) for _, c in big)
    # The window is the big agent's own newest 10 rows, so depth beyond it finds no more.
    assert len(scan(app, "mem", Scope("big"), depth=50, window=(0, 10))) == 10


def test_project_and_channel_axes_apply_in_the_scan(db, vec_app):  # spec §5.1, ISO-2
    ids = add_memories(
        db,
        {"content": "global", "embedding": QUERY, "project_id": "", "channel": ""},
        {"content": "in p", "embedding": QUERY, "project_id": "p", "channel": ""},
        {"content": "in q", "embedding": QUERY, "project_id": "q", "channel": ""},
        {"content": "p on c", "embedding": QUERY, "project_id": "p", "channel": "c"},
        {"content": "p on d", "embedding": QUERY, "project_id": "p", "channel": "d"},
    )
    found = lambda scope: sorted(i for i, _ in scan(vec_app, "mem", scope))  # noqa: E731
    assert found(Scope("a")) == ids
    assert found(Scope("a", project_id="")) == [ids[0]]
    assert found(Scope("a", project_id="p")) == [ids[0], ids[1], ids[3], ids[4]]
    assert found(Scope("a", project_id="p", channel="c")) == [ids[0], ids[1], ids[3]]
    assert found(Scope("b")) == []


def test_window_is_the_newest_rows_of_the_scope_with_a_vector(db, vec_app):  # spec VEC-2
    # The best match is the oldest row; with a window of 3 it is out of reach.
    best, *rest = add_memories(
        db,
        {"content": "old best", "embedding": at_cosine(0.99), "created_at": stamp(0)},
        *({"content": f"newer {i}", "embedding": at_cosine(0.4), "created_at": stamp(10 + i)} for i in range(3)),
        {"content": "newest, no vector", "created_at": stamp(99)},
    )
    assert best not in [i for i, _ in scan(vec_app, "mem", Scope("a"), window=(0, 3))]
    assert [i for i, _ in scan(vec_app, "mem", Scope("a"), window=(0, 4))][0] == best
    # Ties in created_at: scan order is id ascending, so the window keeps the lower ids.
    tied = add_memories(
        db, *({"agent_id": "t", "content": f"tie {i}", "embedding": QUERY, "created_at": stamp(500)} for i in range(4))
    )
    assert [i for i, _ in scan(vec_app, "mem", Scope("t"), window=(0, 2))] == tied[:2]


def test_rows_of_another_width_are_never_compared_and_take_no_window_place(db, vec_app):  # spec VEC-3
    good = add_memories(db, {"content": "right width", "embedding": at_cosine(0.6), "created_at": stamp(0)})
    add_memories(
        db,
        *(
            {"content": f"old model {i}", "embedding": list(np.ones(8) / math.sqrt(8)), "created_at": stamp(10 + i)}
            for i in range(5)
        ),
    )
    assert scan(vec_app, "mem", Scope("a"), window=(0, 1)) == [(good[0], pytest.approx(0.6, abs=1e-6))]


def test_undefined_and_non_finite_vectors_never_rank(db, vec_app):  # spec EMB-5
    good = add_memories(db, {"content": "fine", "embedding": at_cosine(0.5)})[0]
    raw = [
        np.zeros(DIM, "<f4").tobytes(),
        np.full(DIM, np.nan, "<f4").tobytes(),
        np.full(DIM, np.inf, "<f4").tobytes(),
        b"\x00" * (4 * DIM - 2),
    ]
    if db.is_sqlite:  # only SQLite's dynamic typing lets text sit in the BLOB column (bytea holds bytes)
        raw.append("x" * (4 * DIM))
    with db.write() as session:
        for i, blob in enumerate(raw):
            session.execute(
                text("INSERT INTO memories (agent_id, content, timestamp, embedding) VALUES ('a', :c, '', :e)"),
                {"c": f"bad {i}", "e": blob},
            )
    assert scan(vec_app, "mem", Scope("a"), threshold=-2.0) == [(good, pytest.approx(0.5, abs=1e-6))]
    # A query vector the scan cannot rank against runs no scan at all.
    backend = search_backend(vec_app)
    for query in (np.zeros(DIM, "<f4").tobytes(), b"", b"abc", np.full(DIM, np.nan, "<f4").tobytes()):
        assert backend.vector_candidates("mem", Scope("a"), query, 10, threshold=-2.0, window=(0, 10)) == []


def test_threshold_drops_rows_and_depth_keeps_the_best_by_cosine_then_scan_order(db, vec_app):  # spec VEC-4, VEC-5
    ids = add_memories(
        db,
        *(
            {"content": f"row {i}", "embedding": at_cosine(c), "created_at": stamp(i)}
            for i, c in enumerate([0.2, 0.7, 0.5, 0.7, 0.1])
        ),
    )
    assert scan(vec_app, "mem", Scope("a"), threshold=0.15, depth=10) == [
        (ids[3], pytest.approx(0.7)),
        (ids[1], pytest.approx(0.7)),
        (ids[2], pytest.approx(0.5)),
        (ids[0], pytest.approx(0.2)),
    ]  # equal cosines: the newer row (earlier scan position) first
    assert [i for i, _ in scan(vec_app, "mem", Scope("a"), threshold=0.3, depth=2)] == [ids[3], ids[1]]


def test_memories_precede_episodes_on_equal_cosine_and_depth_is_shared(db, vec_app):  # spec VEC-5
    mem = add_memories(
        db,
        {"content": "a memory", "embedding": at_cosine(0.8)},
        {"content": "a weaker memory", "embedding": at_cosine(0.3)},
    )
    ep = add_episode(db, summary="an episode", embedding=at_cosine(0.8))
    query = Query(agent_id="a", text="x", scope=Scope("a"))
    hits = nearest(search_backend(vec_app), query, to_blob(QUERY), 2, 0.0, (0, 100))
    assert [h.record.key for h in hits] == [("mem", mem[0]), ("ep", ep)]


def test_source_id_filters_vector_memories_and_skips_vector_episodes(db, vec_app):  # spec ISO-3, ISO-4
    mine, theirs = add_memories(
        db,
        {"content": "mine", "embedding": QUERY, "source": '{"type": "User", "id": "u1", "name": ""}'},
        {"content": "theirs", "embedding": QUERY, "source": '{"type": "User", "id": "u2", "name": ""}'},
    )
    ep = add_episode(db, summary="episode", embedding=QUERY)
    backend = search_backend(vec_app)
    q = to_blob(QUERY)
    assert [
        h.record.key for h in nearest(backend, Query("a", "x", Scope("a"), source_id="u1"), q, 10, 0.0, (0, 99))
    ] == [("mem", mine)]
    with_channel = Query("a", "x", Scope("a", channel="c"), source_id="u1", channel="c")
    assert [h.record.key for h in nearest(backend, with_channel, q, 10, 0.0, (0, 99))] == [("mem", mine), ("ep", ep)]
    assert theirs not in [i for i, _ in scan(vec_app, "mem", Scope("a"), source_id="u1")]


# -- thresholds, far list and fusion in recall ---------------------------------------------------------


def test_fusion_halves_the_threshold_and_cascade_does_not(db, server):  # spec VEC-4
    server.table["probe"] = QUERY
    add_memories(db, {"content": "weak", "embedding": at_cosine(0.2)})
    add_memories(db, *({"content": f"filler {i}"} for i in range(500)))  # pool ≥ 499: the gate's bar is 0.2
    for mode, found in (("rrf", True), ("rsf", True), ("cascade", False)):
        app = embedding_app(db, server, RECALL_MODE=mode, DEGRADED_ADVISORY="false")
        # deep + a big enough pool keeps the gate out of the question: this is about the arm.
        got = recall(app, agent_id="a", query="probe", deep=True)
        rows = [m for m in got["messages"] if (m.get("match_reason") or {}).get("cosine") is not None]
        assert bool(rows) is found, mode
        app.embedder.close()
    app = embedding_app(db, server, VECTOR_MIN_SIMILARITY="0.5", DEGRADED_ADVISORY="false")
    assert recall(app, agent_id="a", query="probe", deep=True)["messages"] == []  # 0.2 < 0.5 × 0.5
    app.embedder.close()


def test_far_list_reaches_past_the_window_as_a_second_list(db, server):  # spec VEC-7, §5.8.2
    server.table["probe"] = QUERY
    old = add_memories(db, {"content": "old but close", "embedding": at_cosine(0.95), "created_at": stamp(0)})[0]
    add_memories(
        db, *({"content": f"recent {i}", "embedding": at_cosine(0.9), "created_at": stamp(10 + i)} for i in range(2))
    )
    plain = embedding_app(db, server, MAX_MEMORIES="2", DEGRADED_ADVISORY="false")
    assert f"mem:{old}" not in refs(recall(plain, agent_id="a", query="probe"))
    far = embedding_app(db, server, MAX_MEMORIES="2", VECTOR_REACH="10", DEGRADED_ADVISORY="false")
    response = recall(far, agent_id="a", query="probe")
    assert f"mem:{old}" in refs(response)
    assert reason(response, f"mem:{old}")["rrf"] == pytest.approx(1 / 61)  # first on the far list
    half = embedding_app(
        db, server, MAX_MEMORIES="2", VECTOR_REACH="10", PRIOR_FAR_WEIGHT="0.5", DEGRADED_ADVISORY="false"
    )
    assert reason(recall(half, agent_id="a", query="probe"), f"mem:{old}")["rrf"] == pytest.approx(0.5 / 61)
    off = embedding_app(
        db, server, MAX_MEMORIES="2", VECTOR_REACH="10", PRIOR_FAR_WEIGHT="0", DEGRADED_ADVISORY="false"
    )
    assert f"mem:{old}" not in refs(recall(off, agent_id="a", query="probe"))
    cascade = embedding_app(
        db, server, MAX_MEMORIES="2", VECTOR_REACH="10", RECALL_MODE="cascade", DEGRADED_ADVISORY="false"
    )
    assert f"mem:{old}" not in refs(recall(cascade, agent_id="a", query="probe"))
    for app in (plain, far, half, off, cascade):
        app.embedder.close()


def test_far_list_length_follows_far_limit(db, server):  # spec VEC-7
    server.table["probe"] = QUERY
    add_memories(
        db, *({"content": f"old {i}", "embedding": at_cosine(0.9 - i / 100), "created_at": stamp(i)} for i in range(6))
    )
    add_memories(db, {"content": "newest", "embedding": at_cosine(0.5), "created_at": stamp(99)})
    app = embedding_app(
        db, server, MAX_MEMORIES="1", VECTOR_REACH="10", VECTOR_FAR_LIMIT="2", DEGRADED_ADVISORY="false"
    )
    response = recall(app, agent_id="a", query="probe", limit=10)
    assert len([r for r in refs(response) if r != "mem:7"]) == 2
    app.embedder.close()


def test_excluded_rows_cast_no_vector_vote(db, vec_app):  # spec §5.7.5
    store(vec_app, agent_id="a", content="The automobile needs new tyres")
    got = recall(
        vec_app, agent_id="a", query="car wants fresh tires", exclude_contents=["the automobile needs new tyres"]
    )
    assert got["messages"] == []


def test_a_lexical_row_with_a_vector_is_not_single_arm_when_the_query_was_embedded(db, server):  # spec §5.8.2
    # Pool of 2: min_score 0.4293, the rrf bar 0.4293 × 3/61 ≈ 0.0211. A first
    # place on one list (1/61 ≈ 0.0164) passes only when single-arm (bar capped at 1/61).
    server.table["zebra"] = QUERY
    add_memories(
        db,
        {"content": "zebra zebra"},
        {"content": "a zebra, in a much longer row that has a vector", "embedding": at_cosine(-0.5, axis=2)},
    )
    app = embedding_app(db, server, DEGRADED_ADVISORY="false")
    got = recall(app, agent_id="a", query="zebra", limit=1)
    assert refs(got) == ["mem:1"]  # the FTS winner has no vector: single-arm, admitted
    app.embedder.close()
    with db.write() as session:
        session.execute(Memory.__table__.update().where(Memory.id == 1).values(embedding=to_blob(at_cosine(-0.5, 2))))
    app = embedding_app(db, server, DEGRADED_ADVISORY="false")
    # It could have been ranked twice, so the fused bar (0.0211) is not capped and a lone
    # first place fails it: the reference answers []. Keyword-only recall admits this row,
    # so we do too (issue 14, behavior-contracts differences: embeddings never cost answers).
    got = recall(app, agent_id="a", query="zebra", limit=1)
    assert refs(got) == ["mem:1"]
    assert got["messages"][0]["match_reason"]["rrf"] == pytest.approx(1 / 61)
    app.embedder.close()


def test_cascade_puts_vector_rows_first_in_cosine_order(db, server):  # spec §5.8.4
    server.table["probe"] = QUERY
    ids = add_memories(
        db,
        {"content": "probe weak", "embedding": at_cosine(0.6)},
        {"content": "probe strong", "embedding": at_cosine(0.9)},
    )
    app = embedding_app(db, server, RECALL_MODE="cascade", DEGRADED_ADVISORY="false", AUTOCUT_ENABLED="false")
    got = recall(app, agent_id="a", query="probe")
    assert refs(got) == [f"mem:{ids[0]}", f"mem:{ids[1]}"]  # reversed: best last
    assert [m["match_reason"]["signal"] for m in got["messages"]] == ["cosine", "cosine"]
    app.embedder.close()


class _Never(EmbedServer):
    """An address nothing listens on: tests that only scan never embed."""

    @property
    def url(self) -> str:  # type: ignore[override]
        return "http://127.0.0.1:9/embed"


def test_scan_cost_stays_bounded_at_20k_rows(db, vec_app):  # issue target: native scan, no Python loop
    rng = np.random.default_rng(7)
    vectors = rng.standard_normal((20_000, DIM)).astype("<f4")
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    with db.write() as session:
        session.execute(
            insert(Memory),
            [
                {
                    "agent_id": "a",
                    "content": f"row {i}",
                    "timestamp": "",
                    "embedding": vectors[i].tobytes(),
                    "created_at": stamp(i),
                }
                for i in range(20_000)
            ],
        )
    backend, q = search_backend(vec_app), vectors[19_000].tobytes()
    timings = []
    for _ in range(5):
        start = time.perf_counter()
        hits = backend.vector_candidates("mem", Scope("a"), q, 10, threshold=0.0, window=(0, 10_000))
        timings.append(time.perf_counter() - start)
    assert hits[0].record.text == "row 19000" and hits[0].raw == pytest.approx(1.0, abs=1e-5)
    assert min(timings) < 1.0  # generous (tens of ms measured): only a per-row Python path fails it


# -- the episode penalty orders, it does not exclude (README decision 3) ------------------------------


@pytest.mark.parametrize("hours_later", [1, 120])
def test_memories_written_before_the_newest_episode_stay_recallable_keyword_only(db, hours_later):
    # In the reference, the penalty halves a first place (1/61 → ≤ 1/61 × f) and
    # the gate's bar for it is 1/61 on a small pool: no memory older than the
    # newest episode could come back at all.
    app = App(db=db, settings=load_settings({"CPERSONA_DB_PATH": str(db.path), "CPERSONA_DEGRADED_ADVISORY": "false"}))
    for i, content in enumerate(["The staging deploy key is in vault", "The wifi password is hunter2"]):
        store(app, agent_id="a", content=content, timestamp=f"2026-06-01T00:0{i}:00+00:00")
    add_episode(db, summary="weekly sync notes", created_at=stamp_hours(hours_later))
    response = recall(app, agent_id="a", query="wifi password")
    assert refs(response) == ["mem:2"]
    factor = max(math.exp(-0.01 * (hours_later - 1 / 60)), 0.5)
    assert response["messages"][0]["match_reason"]["rrf"] == pytest.approx(
        factor / 61, rel=1e-3
    )  # still shown penalised


def test_a_penalised_vector_match_is_judged_on_its_own_cosine(db, server):
    server.table["probe"] = QUERY
    add_memories(db, {"content": "close match", "embedding": at_cosine(0.6), "timestamp": "2026-05-01T00:00:00+00:00"})
    add_episode(db, summary="later chapter", created_at="2026-06-01 00:00:00")
    app = embedding_app(db, server, DEGRADED_ADVISORY="false")
    (row,) = recall(app, agent_id="a", query="probe")["messages"]  # pool 2: bar 0.4293; 0.6 × 0.5 = 0.3 is below it
    assert row["match_reason"]["cosine"] == pytest.approx(0.3, abs=1e-6)
    app.embedder.close()


def stamp_hours(hours: float) -> str:
    """created_at ``hours`` after 2026-06-01 00:00 UTC."""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(1_780_272_000 + hours * 3600))
