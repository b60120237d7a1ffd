"""The keyword arms rank by the index alone, then read the best rows in scope.

That shortcut must return exactly what ranking inside the scope returns (the
joined statement it replaced): same rows, same order, same bm25, whatever the
scope holds of the best matches, and it must fall back to the joined statement
when the scope holds too few of them.
"""

from __future__ import annotations

import random

import pytest
from sqlalchemy import insert

from cpersona.storage import search_sqlite
from cpersona.storage.models import Episode, Memory
from cpersona.storage.scope import Scope
from cpersona.storage.search import query_terms
from cpersona.storage.search_sqlite import SqliteSearch, fts5_match

WORDS = (
    "garden painting camping pottery museum guitar adoption charity yoga beach mountain bakery library concert"
).split()
QUERIES = [
    "painting",
    "camping pottery",
    "What did Melanie paint at the museum?",
    "guitar concert beach",
    "yoga",
    "the",
    "zzqx",
]


@pytest.fixture
def mixed_db(db):
    """Rows of a big agent, a small agent, other projects and channels, all sharing words."""
    rng = random.Random(11)
    memories, episodes = [], []
    for i in range(600):
        agent = "small" if i % 20 == 0 else "big"
        words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 9)))
        memories.append(
            {
                "agent_id": agent,
                "content": f"{rng.choice(['Melanie', 'Jon'])}: {words} ({i})",
                "timestamp": "2026-01-01T00:00:00+00:00",
                "source": '{"id": "u%d"}' % (i % 3),
                "project_id": "p" if i % 7 == 0 else "",
                "channel": "c" if i % 5 == 0 else "",
            }
        )
        if i % 6 == 0:
            episodes.append({"agent_id": agent, "summary": f"episode {words}", "keywords": rng.choice(WORDS)})
    with db.write() as session:
        session.execute(insert(Memory), memories)
        session.execute(insert(Episode), episodes)
    return db


SCOPES = [Scope("big"), Scope("small"), Scope("big", project_id="p"), Scope("big", channel="c"), Scope("nobody")]


def joined(search: SqliteSearch, kind: str, scope: Scope, match: str, depth: int, source_id: str = ""):
    """What the joined statement alone answers (the behaviour before the shortcut)."""
    where, params = search_sqlite.sql_fragment(scope, "m" if kind == "mem" else "e")
    if kind == "mem":
        by_source, source_params = search_sqlite.source_filter(source_id)
        where, params = f"{where} AND {by_source}", {**params, **source_params}
        statements = search_sqlite._fts_search("memories_fts", "memories", "m", search_sqlite.MEMORY_COLUMNS, where)
    else:
        statements = search_sqlite._fts_search("episodes_fts", "episodes", "e", search_sqlite.EPISODE_COLUMNS, where)
    rows = SqliteSearch._run(
        search, "test", statements.joined, {**params, "match": match, "depth": depth}
    )  # not counted
    return [(r.id, r.rank) for r in rows]


@pytest.mark.parametrize("depth", [1, 5, 25])
def test_the_shortcut_returns_what_the_joined_statement_returns(mixed_db, depth, monkeypatch):
    search = SqliteSearch(mixed_db)
    fell_back = []
    real_run = search._run

    def counting_run(what, sql, params):
        if "LIMIT :depth" in str(sql) and "NOT INDEXED" not in str(sql):
            fell_back.append(what)
        return real_run(what, sql, params)

    monkeypatch.setattr(search, "_run", counting_run)
    for scope in SCOPES:
        for query in QUERIES:
            terms = query_terms(query)
            if not terms:
                continue
            match = fts5_match(terms)
            for source_id in ("", "u1"):
                where, params = search_sqlite.sql_fragment(scope, "m")
                by_source, source_params = search_sqlite.source_filter(source_id)
                statements = search_sqlite._fts_search(
                    "memories_fts", "memories", "m", search_sqlite.MEMORY_COLUMNS, f"{where} AND {by_source}"
                )
                got = search._best_in_scope("t", statements, {**params, **source_params}, terms, depth)
                assert [(r.id, rank) for r, rank in got] == joined(search, "mem", scope, match, depth, source_id)
            where, params = search_sqlite.sql_fragment(scope, "e")
            statements = search_sqlite._fts_search(
                "episodes_fts", "episodes", "e", search_sqlite.EPISODE_COLUMNS, where
            )
            got = search._best_in_scope("t", statements, params, terms, depth)
            assert [(r.id, rank) for r, rank in got] == joined(search, "ep", scope, match, depth)
    assert fell_back  # the small agent's scope holds few of the best matches: the joined statement answered


def test_keyword_arms_give_the_same_hits_with_and_without_the_shortcut(mixed_db, monkeypatch):
    search = SqliteSearch(mixed_db)

    def hits():
        out = []
        for scope in SCOPES:
            for query in QUERIES:
                out.append(
                    [(h.record.ref, h.raw, h.record.text) for h in search.keyword_memories(scope, query, 10).hits]
                )
                out.append([(h.record.ref, h.raw, h.record.text) for h in search.keyword_episodes(scope, query, 10)])
        return out

    shortcut = hits()
    monkeypatch.setattr(search_sqlite, "PROBE_FACTOR", 0)  # probe == depth: more fallbacks, same answers
    assert hits() == shortcut
    real_best = SqliteSearch._best_in_scope

    def joined_only(self, what, statements, params, terms, depth, **_):  # upper: the trigram bound's counts
        rows = self._run(what, statements.joined, {**params, "match": fts5_match(terms), "depth": depth})
        return None if rows is None else [(r, r.rank) for r in rows]

    monkeypatch.setattr(SqliteSearch, "_best_in_scope", joined_only)
    assert hits() == shortcut
    monkeypatch.setattr(SqliteSearch, "_best_in_scope", real_best)
