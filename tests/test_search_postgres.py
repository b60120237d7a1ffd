"""PostgresSearch answers as SqliteSearch does on the same rows (spec §5.6, §5.7.1,
KW-1, ISO-2, ISO-3, VEC-2/3/5): same hits for keyword and vector arms, same scope."""

from __future__ import annotations

import numpy as np
import pytest
from sqlalchemy import text

from cpersona.storage.engine import open_postgres
from cpersona.storage.migrate import open_and_upgrade, upgrade
from cpersona.storage.scope import Scope
from cpersona.storage.search_postgres import PostgresSearch
from cpersona.storage.search_sqlite import SqliteSearch
from pg_support import fresh_pg_url

DIM = 8
MEMORIES = [
    # agent, project, channel, content, source, created_at
    ("a", "", "", "The migration to PostgreSQL finished on Tuesday", '{"id": "u1"}', "2024-01-01 00:00:01"),
    ("a", "", "", "東京タワーの夜景がとても綺麗だった", '{"id": "discord:42"}', "2024-01-01 00:00:02"),
    ("a", "p", "", "Project p memory about migration plans", "{}", "2024-01-01 00:00:03"),
    ("a", "q", "", "Project q memory about migration plans", "{}", "2024-01-01 00:00:04"),
    ("b", "", "", "Agent b also talks about migration", "{}", "2024-01-01 00:00:05"),
    ("a", "", "c1", "channel one note: ok", "not json", "2024-01-01 00:00:06"),
    ("a", "", "", "ok", '{"id": "u2"}', "2024-01-01 00:00:07"),
]
EPISODES = [
    ("a", "", "", "Weekly sync about the database migration", "migration, postgres", "2024-02-01 10:00:00"),
    ("a", "", "", "東京で会議", "会議, 東京", "2024-03-01T09:00:00+09:00"),
]


def _vector(i: int) -> bytes:
    rng = np.random.default_rng(i)
    return rng.standard_normal(DIM).astype("<f4").tobytes()


def _fill(db) -> None:
    with db.write_connection() as conn:
        for i, (agent, project, channel, content, source, created) in enumerate(MEMORIES):
            conn.execute(
                text(
                    "INSERT INTO memories (id, agent_id, project_id, channel, content, source, timestamp, created_at, embedding)"
                    " VALUES (:id, :a, :p, :c, :t, :s, :ts, :ca, :e)"
                ),
                {
                    "id": i + 1,
                    "a": agent,
                    "p": project,
                    "c": channel,
                    "t": content,
                    "s": source,
                    "ts": created,
                    "ca": created,
                    "e": _vector(i) if i != 3 else b"\x00" * 12,
                },
            )  # row 4: another width
        for i, (agent, project, channel, summary, keywords, created) in enumerate(EPISODES):
            conn.execute(
                text(
                    "INSERT INTO episodes (id, agent_id, project_id, channel, summary, keywords, created_at, embedding)"
                    " VALUES (:id, :a, :p, :c, :s, :k, :ca, :e)"
                ),
                {
                    "id": i + 1,
                    "a": agent,
                    "p": project,
                    "c": channel,
                    "s": summary,
                    "k": keywords,
                    "ca": created,
                    "e": _vector(100 + i),
                },
            )


@pytest.fixture(scope="module")
def backends(tmp_path_factory):
    # Read-only tests: one pair of databases for the module.
    with fresh_pg_url() as url:
        pg, lite = open_postgres(url), open_and_upgrade(tmp_path_factory.mktemp("lite") / "m.db")
        upgrade(pg)
        _fill(pg)
        _fill(lite)
        yield SqliteSearch(lite), PostgresSearch(pg)
        pg.close()
        lite.close()


def ids(hits):
    return [h.record.key for h in hits]


SCOPES = [Scope("a"), Scope("a", "p"), Scope("a", ""), Scope("a", None, "c1"), Scope(None), Scope("b")]


@pytest.mark.parametrize("scope", SCOPES)
@pytest.mark.parametrize("query", ["migration", "MIGRATION plans", "東京タワー", "夜景", "ok", "会議", "zzz"])
def test_keyword_arms_find_the_same_rows(backends, scope, query):
    lite, pg = backends
    a, b = lite.keyword_memories(scope, query, 10), pg.keyword_memories(scope, query, 10)
    assert a.method == b.method
    assert sorted(ids(a.hits)) == sorted(ids(b.hits))  # spec ISO-2: scope applied inside
    assert sorted(ids(lite.keyword_episodes(scope, query, 10))) == sorted(ids(pg.keyword_episodes(scope, query, 10)))


def test_more_matched_terms_rank_first(backends):
    _, pg = backends
    hits = pg.keyword_memories(Scope("a"), "migration plans project", 10).hits
    assert ids(hits)[0][1] in (3, 4) and hits[0].raw > hits[-1].raw


def test_function_words_only_fill_after_content_words(backends):
    # As on SQLite (search_sqlite.ranking_terms): "the" matches row 1, "plans" rows 3 and 4;
    # the content word ranks first, the function-word row follows, below it.
    lite, pg = backends
    for backend in (lite, pg):
        hits = backend.keyword_memories(Scope("a"), "the plans", 10).hits
        assert {h.record.id for h in hits[:2]} == {3, 4}
        assert [h.record.id for h in hits[2:]] == [1]
        assert hits[2].raw < min(h.raw for h in hits[:2])
    # Depth reached by content words alone: no function-word row at all.
    assert {h.record.id for h in pg.keyword_memories(Scope("a"), "the plans", 2).hits} == {3, 4}


@pytest.mark.parametrize("source_id", ["u1", "u", "discord:", "u2"])
def test_source_filter_matches_sqlite(backends, source_id):
    # spec ISO-3: exact when the id ends in a letter/digit, prefix otherwise; non-JSON never matches
    lite, pg = backends
    a = lite.recent_memories(Scope("a"), 10, source_id=source_id)
    b = pg.recent_memories(Scope("a"), 10, source_id=source_id)
    assert ids(a) == ids(b)


@pytest.mark.parametrize("kind", ["mem", "ep"])
@pytest.mark.parametrize("window", [(0, 100), (0, 2), (2, 100)])
@pytest.mark.parametrize("threshold", [-1.0, 0.0, 0.3])
def test_vector_arm_ranks_the_same_window(backends, kind, window, threshold):
    # spec VEC-2/3/5: window over the scope's rows of the query's width, threshold, order
    lite, pg = backends
    query = _vector(0 if kind == "mem" else 100)
    a = lite.vector_candidates(kind, Scope("a"), query, 5, threshold=threshold, window=window)
    b = pg.vector_candidates(kind, Scope("a"), query, 5, threshold=threshold, window=window)
    assert ids(a) == ids(b)
    assert [round(h.raw, 4) for h in a] == [round(h.raw, 4) for h in b]


def test_scope_facts_match(backends):
    lite, pg = backends
    for scope in SCOPES:
        assert lite.pool_count(scope) == pg.pool_count(scope)
        assert lite.episode_boundary(scope) == pg.episode_boundary(scope)
        assert lite.fetch(scope, [("mem", 1), ("mem", 5), ("ep", 2)]) == pg.fetch(
            scope, [("mem", 1), ("mem", 5), ("ep", 2)]
        )


def test_the_backend_is_chosen_by_the_engine(backends):
    from cpersona.storage.search import open_search

    lite, pg = backends
    assert isinstance(open_search(lite.db), SqliteSearch)
    assert isinstance(open_search(pg.db, fts_enabled=False), PostgresSearch)
    assert open_search(pg.db, fts_enabled=False).fts_enabled is False


@pytest.mark.parametrize("scope", SCOPES)
@pytest.mark.parametrize(
    ("query", "phrases"),
    [
        ("zzz", ["migration plans"]),
        ("", ["database migration"]),
        ("ok", ["Project q memory"]),
        ("zzz", ["東京タワー"]),
        ("zzz", ["pl"]),
    ],
)
def test_phrases_find_the_same_rows(backends, scope, query, phrases):
    # spec RX-8: a declared multi-word name is one phrase on both backends
    lite, pg = backends
    a = lite.keyword_memories(scope, query, 10, phrases=phrases)
    b = pg.keyword_memories(scope, query, 10, phrases=phrases)
    assert a.method == b.method
    assert sorted(ids(a.hits)) == sorted(ids(b.hits))
    assert sorted(ids(lite.keyword_episodes(scope, query, 10, phrases=phrases))) == sorted(
        ids(pg.keyword_episodes(scope, query, 10, phrases=phrases))
    )
