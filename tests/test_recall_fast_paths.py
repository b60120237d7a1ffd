"""Shortcuts recall takes for speed, and the proof that they change no answer.

The LIKE fallback (spec KW-1) is skipped when the MATCH ran and found nothing:
every query term is a substring of the query, so a row holding the whole query
holds every term, and the trigram index would have found it. These tests pin
that argument down on awkward text (case, accents, CJK, punctuation, wildcards)
by running the LIKE pass directly next to the shortcut.
"""

from __future__ import annotations

import pytest
from sqlalchemy import insert

from cpersona.storage.models import Memory
from cpersona.storage.scope import Scope
from cpersona.storage.search_sqlite import SqliteSearch

ROWS = [
    "Caroline: I went to the LGBTQ support group yesterday",
    "Melanie: Pottery class was GREAT, we made bowls",
    "Jon: résumé sent to the café on 5th street",
    "Gina: 東京タワーに行きました",
    "Nate: 100% sure the_file is at C:\\temp\\x",
    "Tim: CVE-2024-3094 patched on the build box",
]

QUERIES = [
    "support group",  # FTS finds it
    "Pottery class was great",
    "zqxv1 wlkjh1",  # nothing anywhere
    "RÉSUMÉ",  # accents: LIKE folds ASCII only
    "résumé",
    "東京タワー",
    "大阪城",
    "100% sure",
    "the_file",
    "C:\\temp",
    "cve-2024-3094",
    "CVE-2025-0001",
    "group support",  # every word present, not the phrase
    "a b",  # no usable term: LIKE runs
]


@pytest.fixture
def search(db) -> SqliteSearch:
    defaults = {"agent_id": "a", "timestamp": "2026-01-01T00:00:00+00:00", "source": "{}"}
    with db.write() as session:
        session.execute(insert(Memory), [{**defaults, "content": text} for text in ROWS])
    return SqliteSearch(db)


def statements(search: SqliteSearch, monkeypatch) -> list[str]:
    seen: list[str] = []
    original = search._run

    def spy(what, sql, params):
        seen.append(what)
        return original(what, sql, params)

    monkeypatch.setattr(search, "_run", spy)
    return seen


@pytest.mark.parametrize("query", QUERIES)
def test_skipping_like_after_an_empty_match_loses_nothing(search, query):  # spec KW-1
    result = search.keyword_memories(Scope("a"), query, 10)
    like = search._like_memories(Scope("a"), query, 10, "")
    if result.method == "like":
        assert [h.record.id for h in result.hits] == [h.record.id for h in like]
    else:
        assert result.hits


def test_a_query_matching_nothing_runs_no_like_scan(search, monkeypatch):  # spec KW-1
    seen = statements(search, monkeypatch)
    result = search.keyword_memories(Scope("a"), "zqxv1 wlkjh1", 10)
    assert result.method == "like" and result.hits == []
    assert "memories LIKE" not in seen and any("FTS" in what for what in seen)


def test_a_failed_match_still_falls_back_to_like(search, monkeypatch):  # spec KW-1: "the FTS query failed"
    monkeypatch.setattr(search, "_fts_memories", lambda *args: None)
    result = search.keyword_memories(Scope("a"), "support group", 10)
    assert result.method == "like" and [h.record.text for h in result.hits] == [ROWS[0]]


def test_a_query_without_terms_still_scans_with_like(search, monkeypatch):  # spec KW-1: "no term"
    seen = statements(search, monkeypatch)
    result = search.keyword_memories(Scope("a"), "5th", 10)
    assert "memories LIKE" in seen or result.method == "fts"
    result = search.keyword_memories(Scope("a"), "on 5", 10)
    assert result.method == "like" and [h.record.text for h in result.hits] == [ROWS[2]]
    assert "memories LIKE" in seen
