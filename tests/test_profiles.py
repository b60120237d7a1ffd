"""get_profile and update_profile (spec §3.7, §3.8) on a real SQLite file."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest
from sqlalchemy import select

from cpersona.services.records.profiles import get_profile, update_profile
from cpersona.storage.models import Profile
from conftest import make_app

pytestmark = pytest.mark.both_backends  # storage/service behaviour: run on SQLite and PostgreSQL


def profiles(db) -> list[Profile]:
    with db.read() as session:
        found = list(session.scalars(select(Profile).order_by(Profile.id)))
        session.expunge_all()
        return found


def test_no_profile_reads_as_empty_text_without_ok(app):  # spec §3.7, G-2
    assert get_profile(app, agent_id="nobody") == {"profile": ""}
    assert get_profile(app, agent_id="") == {"profile": ""}


def test_update_then_get(app, db):  # spec §3.7, §3.8
    assert update_profile(app, agent_id="a", profile="Likes terse answers.") == {"ok": True, "profiles_updated": 1}
    assert get_profile(app, agent_id="a") == {"profile": "Likes terse answers."}
    row = profiles(db)[0]
    assert (row.agent_id, row.user_id, row.project_id) == ("a", "", "")


def test_second_update_replaces_and_restamps(app, db):  # spec PF-3
    app.clock = lambda: datetime(2026, 6, 1, 12, 0, 0, tzinfo=timezone.utc)
    update_profile(app, agent_id="a", profile="likes tea")
    app.clock = lambda: datetime(2026, 6, 2, 8, 30, 0, tzinfo=timezone.utc)
    update_profile(app, agent_id="a", profile="likes coffee")
    rows = profiles(db)
    assert len(rows) == 1
    assert (rows[0].content, rows[0].updated_at) == ("likes coffee", "2026-06-02 08:30:00")


def test_profiles_are_per_agent(app):  # spec PF-3, ISO-5
    update_profile(app, agent_id="a", profile="about a")
    update_profile(app, agent_id="b", profile="about b")
    assert get_profile(app, agent_id="a") == {"profile": "about a"}
    assert get_profile(app, agent_id="b") == {"profile": "about b"}
    assert get_profile(app, agent_id="") == {"profile": ""}  # '' is its own bucket, not "any"


def test_profile_is_sanitized_against_its_own_cap(app, db):  # spec PF-1
    response = update_profile(app, agent_id="a", profile="[Memory from x] " + "p" * 2100)
    assert response == {"ok": True, "profiles_updated": 1, "truncated": True}
    assert get_profile(app, agent_id="a")["profile"] == "p" * 2000


def test_profile_cap_follows_the_setting_and_exact_fit_is_not_truncated(db):  # spec PF-1
    app = make_app(db, max_profile_length="5")
    assert update_profile(app, agent_id="a", profile="12345") == {"ok": True, "profiles_updated": 1}
    assert update_profile(app, agent_id="a", profile="123456")["truncated"] is True


@pytest.mark.parametrize(
    ("profile", "reason"),
    [
        ("", "empty profile"),
        (None, "empty profile"),
        ("  ", "empty after sanitization"),
        ("[Memory from bot] ", "empty after sanitization"),
    ],
)
def test_empty_profiles_are_refused_and_the_stored_one_kept(app, profile, reason):  # spec PF-2, SAN-1
    update_profile(app, agent_id="a", profile="kept")
    assert update_profile(app, agent_id="a", profile=profile) == {
        "ok": False,
        "profiles_updated": 0,
        "reason": reason,
    }
    assert get_profile(app, agent_id="a") == {"profile": "kept"}


@pytest.mark.parametrize(
    ("arguments", "reason"),
    [
        ({"agent_id": None, "profile": "p"}, "agent_id is required"),
        ({"agent_id": 1, "profile": "p"}, "agent_id must be a string"),
        ({"agent_id": "a", "profile": 42}, "profile must be a string"),
        ({"agent_id": "a", "profile": "p\udc00"}, "surrogate"),
    ],
)
def test_bad_arguments_are_clear_failures(app, db, arguments, reason):
    response = update_profile(app, **arguments)
    assert response["ok"] is False and response["profiles_updated"] == 0 and reason in response["reason"]
    assert profiles(db) == []


def test_get_profile_with_a_bad_agent_is_a_failure_not_a_crash(app):
    assert get_profile(app, agent_id=None) == {"ok": False, "error": "agent_id is required"}


def test_a_legacy_row_under_another_user_id_is_still_read(app, db):  # spec §6 item 11
    with db.write() as session:
        session.add(Profile(agent_id="a", user_id="u1", content="legacy text"))
    assert get_profile(app, agent_id="a") == {"profile": "legacy text"}
    update_profile(app, agent_id="a", profile="current text")
    assert get_profile(app, agent_id="a") == {"profile": "current text"}
