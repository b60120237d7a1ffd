"""The SQLite search primitives on a real migrated database file."""

from __future__ import annotations

import json
import time
from datetime import datetime, timezone

import pytest
from sqlalchemy import insert, text

from cpersona.storage import search_sqlite
from cpersona.storage.models import Episode, Memory, Profile
from cpersona.storage.scope import Scope
from cpersona.storage.search import MAX_TERMS, query_terms
from cpersona.storage.search_sqlite import SqliteSearch, fts5_match, like_pattern


def add_memories(db, *rows: dict) -> None:
    defaults = {"agent_id": "a", "timestamp": "2026-01-01T00:00:00+00:00", "source": "{}"}
    with db.write() as session:
        session.execute(insert(Memory), [{**defaults, **row} for row in rows])


def add_episodes(db, *rows: dict) -> None:
    with db.write() as session:
        session.execute(insert(Episode), [{"agent_id": "a", **row} for row in rows])


def refs(hits) -> list[str]:
    return [hit.record.ref for hit in hits]


@pytest.fixture
def search(db) -> SqliteSearch:
    return SqliteSearch(db)


# -- the FTS query builder ------------------------------------------------------------


def test_query_terms_follow_the_builder_example():  # spec §5.7.1
    assert query_terms('What is the CVE-2024-3094 bug? 日本語のテキスト ab "quoted"') == [
        "What", "the", "CVE-2024-3094", "bug",
        "日本語", "本語の", "語のテ", "のテキ", "テキス", "キスト", "quoted",
    ]  # fmt: skip


def test_query_terms_drop_what_a_trigram_index_cannot_match():  # spec §5.7.1 step 3
    assert query_terms("東京") == []
    assert query_terms("ab cd") == []
    assert query_terms('"""') == []
    assert query_terms("*") == []
    assert query_terms("東京タワー") == ["東京タ", "京タワ", "タワー"]
    assert query_terms("secret/staging/deploy") == ["secret/staging/deploy"]


def test_query_terms_are_unique_bounded_and_free_of_control_characters():
    assert query_terms("deploy deploy DEPLOY") == ["deploy", "DEPLOY"]
    assert query_terms("\x00alpha\x00beta") == ["alpha", "beta"]
    many = query_terms(" ".join(f"word{i}" for i in range(1000)))
    assert len(many) == MAX_TERMS and many[0] == "word0"


def test_every_term_is_quoted_as_a_literal_phrase():
    assert fts5_match(['say "hi"', "NEAR(x"]) == '"say ""hi""" OR "NEAR(x"'


def test_like_pattern_escapes_wildcards():
    assert like_pattern("50%_a\\b") == "%50\\%\\_a\\\\b%"


# -- memories arm ------------------------------------------------------------------


def test_japanese_substring_of_three_or_more_characters_is_found_by_fts(db, search):
    add_memories(db, {"content": "私は東京タワーに行った"}, {"content": "大阪城を見た"})
    result = search.keyword_memories(Scope("a"), "東京タワー", 10)
    assert result.method == "fts"
    assert refs(result.hits) == ["mem:1"]


def test_two_character_japanese_query_falls_back_to_like(db, search):  # spec KW-1
    add_memories(db, {"content": "私は東京タワーに行った"}, {"content": "大阪城を見た"})
    result = search.keyword_memories(Scope("a"), "東京", 10)
    assert result.method == "like"
    assert refs(result.hits) == ["mem:1"]
    assert result.hits[0].raw is None  # LIKE rows carry no bm25


def test_identifier_with_slashes_is_found_whole(db, search):
    add_memories(
        db,
        {"content": "The staging deploy key is stored in vault at secret/staging/deploy."},
        {"content": "secret rotation happens on staging"},
    )
    result = search.keyword_memories(Scope("a"), "secret/staging/deploy", 10)
    assert result.method == "fts"
    assert refs(result.hits) == ["mem:1"]


def test_fts_ranks_by_bm25_and_matches_case_insensitively(db, search):
    add_memories(
        db,
        {"content": "deploy notes and a long tail of unrelated words to dilute the match somewhat"},
        {"content": "Deploy deploy DEPLOY"},
    )
    result = search.keyword_memories(Scope("a"), "DEPLOY", 10)
    assert refs(result.hits) == ["mem:2", "mem:1"]
    assert result.hits[0].raw > result.hits[1].raw  # higher is better (-bm25)


def test_fts_without_a_match_falls_back_to_like(db, search):  # spec KW-1
    add_memories(db, {"content": "abc def"})
    result = search.keyword_memories(Scope("a"), "c d", 10)  # no usable term
    assert result.method == "like" and refs(result.hits) == ["mem:1"]


def test_like_is_ascii_case_insensitive_newest_first_and_escaped(db, search):
    add_memories(
        db,
        {"content": "Deploy day", "created_at": "2026-01-01 00:00:00"},
        {"content": "deploy night", "created_at": "2026-01-02 00:00:00"},
        {"content": "500 users"},
        {"content": "a_b literal"},
        {"content": "axb"},
    )
    assert refs(search.keyword_memories(Scope("a"), "De", 10).hits) == ["mem:2", "mem:1"]
    assert refs(search.keyword_memories(Scope("a"), "0%", 10).hits) == []
    assert refs(search.keyword_memories(Scope("a"), "_b", 10).hits) == ["mem:4"]


@pytest.mark.parametrize(
    "query",
    [
        '"""',
        "*",
        '"',
        "NEAR(a b)",
        "a OR NOT b AND",
        "col:x ^y",
        "(((",
        "\x00",
        "\x00alpha\x00",
        "'; DROP TABLE memories; --",
    ],
)
def test_hostile_queries_are_read_literally(db, search, query):
    add_memories(db, {"content": "alpha beta gamma"})
    result = search.keyword_memories(Scope("a"), query, 10)
    expected = ["mem:1"] if "alpha" in query else []
    assert refs(result.hits) == expected
    assert search.keyword_episodes(Scope("a"), query, 10) == []
    with db.read() as session:
        assert session.execute(text("select count(*) from memories")).scalar() == 1


@pytest.mark.parametrize(
    "query", ["x" * 100_000, '"' * 100_000, "*" * 100_000, "東京タワー" * 20_000, "word " * 20_000]
)
def test_huge_queries_answer_quickly(db, search, query):
    add_memories(db, *({"content": f"row {i} about words and 東京タワー"} for i in range(200)))
    started = time.monotonic()
    result = search.keyword_memories(Scope("a"), query, 10)
    search.keyword_episodes(Scope("a"), query, 10)
    assert time.monotonic() - started < 1.0
    assert len(result.hits) <= 10


def test_depth_caps_every_arm(db, search):
    add_memories(db, *({"content": f"alpha {i}"} for i in range(30)))
    add_episodes(db, *({"summary": f"alpha {i}"} for i in range(30)))
    assert len(search.keyword_memories(Scope("a"), "alpha", 7).hits) == 7
    assert len(search.keyword_memories(Scope("a"), "al", 7).hits) == 7  # LIKE
    assert len(search.keyword_episodes(Scope("a"), "alpha", 7)) == 7
    assert search.keyword_memories(Scope("a"), "alpha", 0).hits == []


def test_fts_disabled_uses_like_and_searches_no_episodes(db):  # spec KW-1, §5.7.3
    add_memories(db, {"content": "alpha"})
    add_episodes(db, {"summary": "alpha"})
    search = SqliteSearch(db, fts_enabled=False)
    result = search.keyword_memories(Scope("a"), "alpha", 10)
    assert result.method == "like" and refs(result.hits) == ["mem:1"]
    assert search.keyword_episodes(Scope("a"), "alpha", 10) == []


def test_missing_fts_tables_degrade_to_like(db, search):  # spec DB-4
    add_memories(db, {"content": "alpha"})
    with db.write_connection() as conn:
        for trigger in ("memories_fts_ai", "memories_fts_ad", "memories_fts_au"):
            conn.exec_driver_sql(f"DROP TRIGGER {trigger}")
        conn.exec_driver_sql("DROP TABLE memories_fts")
    result = search.keyword_memories(Scope("a"), "alpha", 10)
    assert result.method == "like" and refs(result.hits) == ["mem:1"]


def test_a_statement_past_its_deadline_is_abandoned(db, search, monkeypatch):
    monkeypatch.setattr(search_sqlite, "STATEMENT_DEADLINE_SECONDS", 0.05)
    slow = text("WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n) SELECT count(*) FROM n")
    started = time.monotonic()
    assert search._run("test", slow, {}) is None
    assert time.monotonic() - started < 2
    # the pooled connection is usable afterwards, without the handler
    add_memories(db, {"content": "alpha"})
    assert refs(search.keyword_memories(Scope("a"), "alpha", 10).hits) == ["mem:1"]


def test_reads_off_the_cursor_fail_as_sqlalchemy_errors_with_rows_by_name(db, search):
    # The recall's reads go to the driver's cursor (no SQLAlchemy execution
    # path); the dispatch layer still sees SQLAlchemy's error classes, and rows
    # still read by column name.
    from sqlalchemy.exc import OperationalError

    add_memories(db, {"content": "alpha"})
    assert search.table_counts(Scope("a"), cap=499) == (1, 0)
    assert [r.content for r in search._run("test", text("SELECT m.content FROM memories m"), {})] == ["alpha"]
    with db.write_connection() as conn:
        conn.exec_driver_sql("DROP TABLE profiles")
    with pytest.raises(OperationalError, match="no such table"):
        search.profile("a")


# -- isolation inside each retriever ---------------------------------------------------


@pytest.fixture
def spread(db):
    """The same word in every bucket of the three axes."""
    add_memories(
        db,
        {"agent_id": "a", "content": "alpha global"},  # 1
        {"agent_id": "a", "content": "alpha in p1", "project_id": "p1"},  # 2
        {"agent_id": "a", "content": "alpha in p2", "project_id": "p2"},  # 3
        {"agent_id": "a", "content": "alpha on c1", "channel": "c1"},  # 4
        {"agent_id": "a", "content": "alpha on c2", "channel": "c2"},  # 5
        {"agent_id": "b", "content": "alpha of b"},  # 6
        {"agent_id": "", "content": "alpha of nobody"},  # 7
    )
    add_episodes(
        db,
        {"agent_id": "a", "summary": "alpha ep global"},
        {"agent_id": "a", "summary": "alpha ep p1", "project_id": "p1"},
        {"agent_id": "a", "summary": "alpha ep c2", "channel": "c2"},
        {"agent_id": "b", "summary": "alpha ep of b"},
    )


SCOPES = [  # spec §5.1 / SH-1
    (Scope("a"), {1, 2, 3, 4, 5}, {1, 2, 3}),
    (Scope("b"), {6}, {4}),
    (Scope(""), {7}, set()),
    (Scope("a", project_id=""), {1, 4, 5}, {1, 3}),
    (Scope("a", project_id="p1"), {1, 2, 4, 5}, {1, 2, 3}),
    (Scope("a", channel="c1"), {1, 2, 3, 4}, {1, 2}),
    (Scope("a", channel=""), {1, 2, 3, 4, 5}, {1, 2, 3}),
    (Scope("a", project_id="p2", channel="c2"), {1, 3, 5}, {1, 3}),
]


@pytest.mark.parametrize("scope,memories,episodes", SCOPES)
def test_every_arm_applies_the_isolation_axes(
    search, spread, scope, memories, episodes
):  # spec ISO-2, GATE-1 (pool_count)
    ids = lambda hits: {hit.record.id for hit in hits}  # noqa: E731
    assert ids(search.keyword_memories(scope, "alpha", 50).hits) == memories  # FTS
    assert ids(search.keyword_memories(scope, "al", 50).hits) == memories  # LIKE
    assert ids(search.recent_memories(scope, 50)) == memories
    assert ids(search.keyword_episodes(scope, "alpha", 50)) == episodes
    assert search.pool_count(scope) == len(memories) + len(episodes)


def test_scope_is_applied_before_the_depth_cut(db, search):
    """Another agent's better matches must not crowd this agent's row out of the depth."""
    add_memories(db, *({"agent_id": "b", "content": f"alpha alpha alpha {i}"} for i in range(40)))
    add_memories(db, {"agent_id": "a", "content": "alpha and a lot of other words around it"})
    assert refs(search.keyword_memories(Scope("a"), "alpha", 1).hits) == ["mem:41"]
    assert refs(search.keyword_memories(Scope("a"), "al", 1).hits) == ["mem:41"]


def test_fetch_hydrates_only_rows_in_scope(search, spread):
    wanted = [("mem", 1), ("mem", 2), ("mem", 3), ("mem", 6), ("ep", 2), ("ep", 99)]
    found = search.fetch(Scope("a", project_id="p1"), wanted)
    assert sorted(found) == [("ep", 2), ("mem", 1), ("mem", 2)]
    assert found[("ep", 2)].content == "[Episode] alpha ep p1"


# -- source_id -------------------------------------------------------------------------


def test_source_id_exact_and_prefix(db, search):  # spec ISO-3
    def src(value) -> str:
        return json.dumps(value)

    add_memories(
        db,
        {"content": "alpha 1", "source": src({"type": "User", "id": "discord:42"})},
        {"content": "alpha 2", "source": src({"type": "User", "id": "discord:420"})},
        {"content": "alpha 3", "source": src({"type": "User", "id": "Discord:42"})},
        {"content": "alpha 4", "source": "not json"},
        {"content": "alpha 5", "source": src("discord:42")},
        {"content": "alpha 6", "source": src({"id": 42})},
    )
    ids = lambda sid: sorted(h.record.id for h in search.keyword_memories(Scope("a"), "alpha", 10, source_id=sid).hits)  # noqa: E731
    assert ids("discord:42") == [1]  # ends in a digit: exact, case-sensitive
    assert ids("discord:") == [1, 2]  # ends in punctuation: prefix
    assert ids("42") == [6]  # compared as text
    assert ids("") == [1, 2, 3, 4, 5, 6]
    recent = search.recent_memories(Scope("a"), 10, source_id="discord:")
    assert sorted(h.record.id for h in recent) == [1, 2]


# -- listings and scope facts ------------------------------------------------------------


def test_recency_is_created_at_desc_then_id_desc(db, search):  # spec RC-3
    add_memories(
        db,
        {"content": "old", "created_at": "2026-01-01 00:00:00"},
        {"content": "tie low id", "created_at": "2026-01-03 00:00:00"},
        {"content": "tie high id", "created_at": "2026-01-03 00:00:00"},
        {"content": "middle", "created_at": "2026-01-02 00:00:00"},
    )
    assert refs(search.recent_memories(Scope("a"), 3)) == ["mem:3", "mem:2", "mem:4"]
    assert all(hit.raw is None for hit in search.recent_memories(Scope("a"), 3))


def test_episode_boundary_is_the_newest_instant_in_scope(db, search):  # spec §5.9.1
    add_episodes(
        db,
        {"summary": "a", "created_at": "2026-03-01 10:00:00"},
        {"summary": "b", "created_at": "2026-03-01T20:00:00+09:00"},  # 11:00 UTC: newest
        {"summary": "c", "created_at": "2026-03-01 10:30:00", "project_id": "p"},
        {"summary": "d", "created_at": "2026-04-01 00:00:00", "agent_id": "other"},
    )
    assert search.episode_boundary(Scope("a")) == datetime(2026, 3, 1, 11, 0, tzinfo=timezone.utc)
    assert search.episode_boundary(Scope("a", project_id="")) == datetime(2026, 3, 1, 11, 0, tzinfo=timezone.utc)
    assert search.episode_boundary(Scope("nobody")) is None


def test_episode_rows_show_start_time_else_created_at(db, search):  # spec §5.7.3
    add_episodes(
        db,
        {"summary": "alpha one", "start_time": "2026-02-01T09:00:00Z", "created_at": "2026-02-02 00:00:00"},
        {"summary": "alpha two", "start_time": "", "created_at": "2026-02-03 00:00:00", "resolved": 1},
    )
    rows = {h.record.id: h.record for h in search.keyword_episodes(Scope("a"), "alpha", 10)}
    assert rows[1].timestamp == "2026-02-01T09:00:00Z"
    assert rows[2].timestamp == "2026-02-03 00:00:00" and rows[2].resolved


def test_profile_is_per_agent(db, search):  # spec ISO-5
    with db.write() as session:
        session.execute(insert(Profile), [{"agent_id": "a", "content": "Likes tea", "project_id": "p"}])
    assert search.profile("a") == "Likes tea"
    assert search.profile("b") is None


# -- phrases (declared names, spec RX-8) ---------------------------------------------


def test_phrase_terms_are_cleaned_bounded_and_deduplicated():
    from cpersona.storage.search import phrase_terms

    assert phrase_terms(["Mina  Tanaka", "MINA TANAKA", "ab", " x ", "deploy"], ["Deploy"]) == ["Mina Tanaka"]
    assert phrase_terms(["\x00Release\ncalendar "]) == ["Release calendar"]


def test_a_multi_word_phrase_matches_only_where_its_words_stand_together(search, db):  # spec RX-8
    add_memories(
        db,
        {"content": "Mina Tanaka owns the release calendar"},
        {"content": "Tanaka and Mina met; nobody owns anything"},
        {"content": "unrelated note about lunch"},
    )
    add_episodes(
        db,
        {"summary": "Sync with Mina Tanaka on the calendar", "keywords": ""},
        {"summary": "Mina said Tanaka would call", "keywords": ""},
    )
    # The phrase is one term: "Mina" OR "Tanaka" would also find the second row of each table.
    assert refs(search.keyword_memories(Scope("a"), "zzqq", 10, phrases=["Mina Tanaka"]).hits) == ["mem:1"]
    assert refs(search.keyword_episodes(Scope("a"), "zzqq", 10, phrases=["mina tanaka"])) == ["ep:1"]
    # A phrase alone (blank query) still searches; a too-short phrase adds nothing.
    assert refs(search.keyword_memories(Scope("a"), "", 10, phrases=["Mina Tanaka"]).hits) == ["mem:1"]
    assert search.keyword_memories(Scope("a"), "", 10, phrases=["Mi"]).method == "none"
    # Without phrases the words are separate terms, as before.
    assert sorted(refs(search.keyword_memories(Scope("a"), "Mina Tanaka", 10).hits)) == ["mem:1", "mem:2"]
