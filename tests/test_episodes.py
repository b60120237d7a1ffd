"""archive_episode and list_episodes (spec §3.5, §3.10) on a real SQLite file."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest
from sqlalchemy import select

from cpersona.services.records.episodes import archive_episode, history_span, list_episodes
from cpersona.storage.models import Episode
from conftest import make_app

pytestmark = pytest.mark.both_backends  # storage/service behaviour: run on SQLite and PostgreSQL

FIXED_NOW = datetime(2026, 6, 1, 12, 0, 0, tzinfo=timezone.utc)


def episodes(db) -> list[Episode]:
    with db.read() as session:
        found = list(session.scalars(select(Episode).order_by(Episode.id)))
        session.expunge_all()
        return found


def stamps(*values) -> list[dict]:
    return [{"role": "user", "content": "x", "timestamp": v} for v in values]


# -- archive_episode --------------------------------------------------------------------------


def test_archive_stores_the_caller_summary(app, db):  # spec §3.5, SH-3
    app.clock = lambda: FIXED_NOW
    response = archive_episode(
        app,
        agent_id="a",
        summary="Talked about Miso the cat.",
        keywords="cat miso",
        resolved=True,
        project_id="home",
        channel="c1",
    )
    assert response == {"ok": True, "episode_id": 1}
    row = episodes(db)[0]
    assert row.ref == "ep:1"
    assert (row.agent_id, row.project_id, row.channel) == ("a", "home", "c1")
    assert (row.summary, row.keywords, row.resolved) == ("Talked about Miso the cat.", "cat miso", 1)
    assert (row.start_time, row.end_time, row.embedding) == (None, None, None)
    assert row.created_at == "2026-06-01 12:00:00"


def test_every_archive_adds_a_row(app, db):  # spec DD-6
    assert archive_episode(app, agent_id="a", summary="same")["episode_id"] == 1
    assert archive_episode(app, agent_id="a", summary="same")["episode_id"] == 2
    assert len(episodes(db)) == 2


def test_empty_summary_tells_the_caller_to_precompute_it(app, db):  # spec AE-1
    response = archive_episode(app, agent_id="a", summary="")
    assert response["ok"] is False and response["episode_id"] is None
    assert "pre-compute summary (and keywords)" in response["error"]
    assert archive_episode(app, agent_id="a")["episode_id"] is None
    assert episodes(db) == []


@pytest.mark.parametrize("summary", ["   ", "[Memory from bot] "])
def test_summary_empty_after_sanitizing_is_refused(app, db, summary):  # spec AE-2, SAN-1
    assert archive_episode(app, agent_id="a", summary=summary) == {
        "ok": False,
        "episode_id": None,
        "error": "summary is required to archive an episode",
    }
    assert episodes(db) == []


def test_summary_and_keywords_are_sanitized(app, db):  # spec AE-2
    archive_episode(app, agent_id="a", summary="  [Memory from x] the gist ", keywords="[Memory from q] kw  ")
    row = episodes(db)[0]
    assert (row.summary, row.keywords) == ("the gist", "kw")


@pytest.mark.parametrize(("summary", "keywords"), [("s" * 17_000, "k"), ("s", "k" * 16_001)])
def test_truncated_when_the_cap_cut_summary_or_keywords(app, db, summary, keywords):  # spec AE-2
    response = archive_episode(app, agent_id="a", summary=summary, keywords=keywords)
    assert response["truncated"] is True
    row = episodes(db)[0]
    assert len(row.summary) <= 16_000 and len(row.keywords) <= 16_000


def test_not_truncated_when_nothing_was_cut(app):  # spec AE-2
    assert "truncated" not in archive_episode(app, agent_id="a", summary="s" * 16_000, keywords="k" * 16_000)


def test_non_string_keywords_are_dropped(app, db):  # spec AE-2
    assert archive_episode(app, agent_id="a", summary="s", keywords=5)["ok"] is True
    assert episodes(db)[0].keywords == ""


def test_history_span_by_parsed_instant_stored_as_sent(app, db):  # spec AE-3
    history = stamps("2024-01-02T00:00:00+02:00", "2024-01-01T23:00:00Z") + [{"timestamp": 5}, {"content": "x"}]
    archive_episode(app, agent_id="a", summary="s", history=history)
    row = episodes(db)[0]
    # 2024-01-02T00:00+02:00 is 22:00Z on the 1st: earlier than 23:00Z although it sorts later as text
    assert (row.start_time, row.end_time) == ("2024-01-02T00:00:00+02:00", "2024-01-01T23:00:00Z")


def test_history_span_rules():  # spec AE-3
    assert history_span(stamps("zzz", "aaa")) == ("aaa", "zzz")  # nothing parses: string order
    assert history_span(stamps("zzz", "2024-01-01")) == ("2024-01-01", "2024-01-01")  # unparsed ignored
    assert history_span(stamps("")) == (None, None)
    assert history_span([]) == (None, None)
    assert history_span(["not an object", {"timestamp": None}]) == (None, None)
    tie = stamps("2024-01-01T00:00:00", "2024-01-01T00:00:00+00:00")
    assert history_span(tie) == ("2024-01-01T00:00:00", "2024-01-01T00:00:00")


def test_future_history_end_is_reported_in_warn_mode(app, db):  # spec AE-4, FT-2
    app.clock = lambda: FIXED_NOW
    response = archive_episode(
        app, agent_id="a", summary="s", history=stamps("2026-06-01T11:00:00Z", "2026-06-01T13:00:00Z")
    )
    assert response["ok"] is True
    assert response["timestamp_ahead_of_clock"] == {
        "timestamp": "2026-06-01T13:00:00Z",
        "ahead_by_seconds": 3600.0,
        "allowance_seconds": 300,
    }


def test_start_is_checked_after_end(app):  # spec AE-4 (byte-order fallback can put the later date first)
    app.clock = lambda: FIXED_NOW
    # neither parses as ISO, so start/end are the string min/max; "zzz" cannot be
    # read at all, "2500000" is a Julian day far ahead to SQLite (FT-1)
    response = archive_episode(app, agent_id="a", summary="s", history=stamps("2500000", "zzz"))
    assert response["timestamp_ahead_of_clock"]["timestamp"] == "2500000"


def test_future_history_is_refused_in_reject_mode(db):  # spec AE-4, FT-2
    app = make_app(db, future_timestamp_mode="reject")
    app.clock = lambda: FIXED_NOW
    response = archive_episode(
        app, agent_id="a", summary="s", history=stamps("2020-01-01T00:00:00Z", "2026-06-01T13:00:00Z")
    )
    assert response == {
        "ok": False,
        "episode_id": None,
        "error": "history timestamp '2026-06-01T13:00:00Z' is 3600s ahead of this clock (allowance 300s)",
    }
    assert episodes(db) == []


class SummaryEmbedder:
    def __init__(self, fail: bool = False):
        self.texts: list[str] = []
        self.fail = fail

    def embed(self, text: str) -> bytes | None:
        self.texts.append(text)
        if self.fail:
            raise TimeoutError("slow backend")
        return b"\x00\x00\x80\x3f" * 2


def test_only_the_sanitized_summary_is_embedded(app, db):  # spec AE-5
    app.embedder = SummaryEmbedder()
    archive_episode(app, agent_id="a", summary=" [Memory from x] gist ", keywords="kw1 kw2")
    assert app.embedder.texts == ["gist"]
    assert episodes(db)[0].embedding == b"\x00\x00\x80\x3f" * 2


def test_embedding_failure_stores_the_episode_without_a_vector(app, db):  # spec AE-5
    app.embedder = SummaryEmbedder(fail=True)
    assert archive_episode(app, agent_id="a", summary="gist")["ok"] is True
    assert episodes(db)[0].embedding is None


@pytest.mark.parametrize("field", ["channel", "project_id"])
def test_long_channel_or_project_is_refused(app, db, field):  # spec AE-7
    response = archive_episode(app, agent_id="a", summary="s", **{field: "x" * 257})
    assert response == {"ok": False, "episode_id": None, "error": f"{field} too long (257 chars, max 256)"}
    assert episodes(db) == []


@pytest.mark.parametrize(
    ("arguments", "error"),
    [
        ({"agent_id": None, "summary": "s"}, "agent_id is required"),
        ({"agent_id": 3, "summary": "s"}, "agent_id must be a string"),
        ({"agent_id": "a", "summary": ["s"]}, "summary must be a string"),
        ({"agent_id": "a", "summary": "s", "history": "yesterday"}, "history must be an array"),
        ({"agent_id": "a", "summary": "s", "resolved": "yes"}, "resolved must be true or false"),
        ({"agent_id": "a", "summary": "s\ud800"}, "surrogate"),
    ],
)
def test_bad_arguments_are_clear_failures(app, db, arguments, error):
    response = archive_episode(app, **arguments)
    assert response["ok"] is False and response["episode_id"] is None and error in response["error"]
    assert episodes(db) == []


def test_non_string_project_and_channel_are_the_global_bucket(app, db):  # spec ISO-1
    archive_episode(app, agent_id="a", summary="s", project_id=None, channel=7)
    assert (episodes(db)[0].project_id, episodes(db)[0].channel) == ("", "")


# -- list_episodes ------------------------------------------------------------------------------


def archive_at(app, when: str, **arguments) -> int:
    app.clock = lambda: datetime.fromisoformat(when).replace(tzinfo=timezone.utc)
    return archive_episode(app, **arguments)["episode_id"]


def test_list_row_shape_has_no_channel_and_no_resolved(app):  # spec §3.10, G-2
    archive_at(
        app,
        "2026-06-01 10:00:00",
        agent_id="i",
        summary="ep summary",
        history=stamps("2026-01-01T00:00:00Z"),
        resolved=True,
        channel="c",
    )
    assert list_episodes(app, agent_id="i") == {
        "episodes": [
            {
                "id": 1,
                "agent_id": "i",
                "project_id": "",
                "summary": "ep summary",
                "keywords": "",
                "start_time": "2026-01-01T00:00:00Z",
                "end_time": "2026-01-01T00:00:00Z",
                "created_at": "2026-06-01 10:00:00",
            }
        ],
        "count": 1,
    }


def test_list_is_newest_first_with_same_second_ties_newest_id_first(app):  # spec LE-1, LM-1, §6 item 6
    archive_at(app, "2026-06-01 10:00:00", agent_id="a", summary="old")
    archive_at(app, "2026-06-01 12:00:00", agent_id="a", summary="new-1")
    archive_at(app, "2026-06-01 12:00:00", agent_id="a", summary="new-2")
    archive_at(app, "2026-06-01 11:00:00", agent_id="a", summary="middle")
    assert [e["summary"] for e in list_episodes(app, agent_id="a")["episodes"]] == ["new-2", "new-1", "middle", "old"]


def test_list_default_limit_is_50_and_clamp_is_200(app, db):  # spec §3.10, LE-1
    with db.write() as session:
        session.add_all(Episode(agent_id="a", summary=f"e{i}", created_at="2026-01-01 00:00:00") for i in range(201))
    assert list_episodes(app, agent_id="a")["count"] == 50
    capped = list_episodes(app, agent_id="a", limit=1000)
    assert capped["count"] == 200 and capped["budget_rows"] == 200
    assert "budget_rows" not in list_episodes(app, agent_id="a", limit=200)


def test_budget_rows_only_when_rows_past_the_cap_exist(app, db):  # spec LE-1
    with db.write() as session:
        session.add_all(Episode(agent_id="a", summary=f"e{i}") for i in range(200))
    assert "budget_rows" not in list_episodes(app, agent_id="a", limit=1000)


def test_negative_limit_lists_nothing(app):  # spec LM-2 via LE-1
    archive_episode(app, agent_id="a", summary="s")
    assert list_episodes(app, limit=-1) == {"episodes": [], "count": 0}
    assert list_episodes(app, limit=0) == {"episodes": [], "count": 0}


def test_list_filters(app):  # spec §3.10 (= §3.9 axes), §5.1
    archive_episode(app, agent_id="a", summary="global")
    archive_episode(app, agent_id="a", summary="in p", project_id="p")
    archive_episode(app, agent_id="a", summary="in q", project_id="q")
    archive_episode(app, agent_id="b", summary="b's")
    summaries = lambda **kw: sorted(e["summary"] for e in list_episodes(app, **kw)["episodes"])  # noqa: E731
    assert summaries() == ["b's", "global", "in p", "in q"]
    assert summaries(agent_id="") == ["b's", "global", "in p", "in q"]
    assert summaries(agent_id="a") == ["global", "in p", "in q"]
    assert summaries(agent_id="a", project_id="") == ["global"]
    assert summaries(agent_id="a", project_id="p") == ["global", "in p"]


def test_character_budget_over_summary_and_keywords(app):  # spec LE-1, §5.15.3
    # 25 episodes of 32,000 characters spend exactly the 800,000 budget; the
    # 26th does not fit and is degraded, field by field.
    for i in range(27):
        archive_at(
            app, f"2026-06-01 10:{i:02d}:00", agent_id="a", summary=f"e{i:02d} " + "s" * 15_996, keywords="k" * 16_000
        )
    archive_at(app, "2026-06-01 09:00:00", agent_id="a", summary="short old summary", keywords="k" * 16_000)
    listed = list_episodes(app, agent_id="a", limit=200)
    rows = listed["episodes"]
    assert listed["count"] == 28 and listed["budget_chars"] == 800_000
    assert all("ref" not in r and len(r["summary"]) == 16_000 for r in rows[:25])
    degraded = rows[25]
    assert degraded["ref"] == f"ep:{degraded['id']}"
    assert len(degraded["summary"]) == 500 and degraded["summary_len"] == 16_000 and degraded["summary_truncated"]
    assert len(degraded["keywords"]) == 500 and degraded["keywords_len"] == 16_000
    assert degraded["keywords_truncated"] is True
    last = rows[-1]  # short summary kept whole, long keywords cut
    assert last["summary"] == "short old summary" and "summary_truncated" not in last
    assert last["keywords_truncated"] is True and last["ref"] == f"ep:{last['id']}"


def test_bad_list_arguments_are_clear_failures(app):
    assert list_episodes(app, limit="10") == {
        "ok": False,
        "error": "limit must be an integer, not str",
        "episodes": [],
        "count": 0,
    }
    assert list_episodes(app, agent_id=5)["ok"] is False
