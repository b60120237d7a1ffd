"""The write-side text rules: sanitizer, bounds, source normalisation, JSON columns, time stamps."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import pytest

from cpersona.config import ConfigError, load_settings
from cpersona.services.sanitize import (
    check_json_size,
    check_key_field,
    check_timestamp_field,
    find_lone_surrogate,
    normalize_source,
    parse_stored_json,
    sanitize,
    source_id_text,
    to_json,
)
from cpersona.services.timestamps import FuturePolicy, ahead_of_clock, instant_seconds, parse_iso, sql_stamp

NOW = datetime(2026, 6, 1, 12, 0, 0, tzinfo=timezone.utc)


# -- sanitizer (§5.2.1) ------------------------------------------------------------------


def test_annotations_are_removed_with_the_whitespace_after_them():  # spec §5.2.1 step 1
    assert sanitize("a [Memory from x]\n\n b [Memory from y]", 100).text == "a b"


def test_annotation_removal_runs_to_a_fixed_point():  # spec §5.2.1 step 1
    assert sanitize("[Memory fr[Memory from a] om b] x", 100).text == "x"


@pytest.mark.parametrize("text", ["[memory from a] lower", "[Memory from ] empty name", "[Memory from a"])
def test_near_annotations_are_ordinary_text(text):  # spec §5.2.1 (reference behaviour)
    assert sanitize(text, 100).text == text


def test_annotation_names_may_span_lines():
    assert sanitize("[Memory from a\nb] newline", 100).text == "newline"


def test_whitespace_is_trimmed_and_an_annotation_only_text_is_empty():  # spec SAN-1
    assert sanitize("  hi \n", 100).text == "hi"
    assert sanitize("[Memory from bot] ", 100).empty
    assert sanitize(" \t\n", 100).empty


def test_cap_counts_code_points_and_reports_truncation():  # spec ST-3, §5.2.1 step 3
    exact = sanitize("é" * 10, 10)
    assert exact.text == "é" * 10 and exact.truncated is False
    cut = sanitize("é" * 11, 10)
    assert cut.text == "é" * 10 and cut.truncated is True


def test_cut_prefix_loses_its_trailing_whitespace():  # spec §5.2.1 step 3
    cut = sanitize("abcd    efgh", 6)
    assert cut.text == "abcd" and cut.truncated is True


def test_trimming_alone_is_not_truncation():  # spec ST-3: only the cap sets truncated
    assert sanitize("   abc   ", 3).truncated is False


@pytest.mark.parametrize(
    "text",
    [
        "plain",
        "[Memory fr[Memory from a] om b] x",
        "x " * 40,
        "a [Memory from q]   b   ",
        "<@123> hi",
    ],
)
def test_sanitizer_is_idempotent(text):  # spec SAN-2
    once = sanitize(text, 17)
    twice = sanitize(once.text, 17)
    assert twice.text == once.text and twice.truncated is False


def test_discord_mentions_are_kept():  # spec SAN-3
    assert sanitize("hi <@1234567890> and <#42>", 100).text == "hi <@1234567890> and <#42>"


def test_nul_characters_are_refused_not_removed():
    # Decision 11 (differs from the reference, which keeps NUL): SQLite's LIKE and
    # length() stop at a NUL, PostgreSQL refuses it in TEXT, and removing it would
    # store other text than was sent; every caller refuses first, so this is the backstop.
    with pytest.raises(ValueError, match="NUL"):
        sanitize("before\x00after", 100)
    with pytest.raises(ValueError, match="NUL"):
        sanitize("\x00", 100)


def test_a_cap_below_one_is_refused_at_startup_and_by_the_sanitizer():  # spec SAN-4
    with pytest.raises(ConfigError):
        load_settings({"CPERSONA_MAX_CONTENT_LENGTH": "0"})
    with pytest.raises(ConfigError):
        load_settings({"CPERSONA_MAX_PROFILE_LENGTH": "0"})
    with pytest.raises(ValueError):
        sanitize("x", 0)


# -- bounds that refuse (§5.2.2) -----------------------------------------------------------


def test_key_fields_are_refused_past_256_never_cut():
    assert check_key_field("channel", "c" * 256) is None
    assert check_key_field("channel", "c" * 257) == "channel too long (257 chars, max 256)"
    assert check_key_field("id", "a\x00b") == "id contains the NUL character (U+0000) at position 1"


def test_timestamp_is_refused_past_64():
    assert check_timestamp_field("t" * 64) is None
    assert check_timestamp_field("t" * 65) == "timestamp too long (65 chars, max 64)"


def test_json_size_message_names_field_length_and_cap():
    assert check_json_size("metadata", "x" * 9009, 8000) == "metadata too large (9009 chars, max 8000)"
    assert check_json_size("metadata", "x" * 8000, 8000) is None


def test_lone_surrogates_are_found_at_any_depth():  # spec G-6
    assert find_lone_surrogate("ok", {"k": ["fine", {"deep": "bad\ud800"}]})
    assert find_lone_surrogate({"key\udfff": 1})
    assert not find_lone_surrogate("ok", {"k": ["emoji 😀"]}, None, 5)


# -- JSON columns (VF-4) ----------------------------------------------------------------------


def test_json_columns_use_default_separators_and_escape_non_ascii():
    assert to_json({"type": "User", "id": "ü", "name": "ñ"}) == '{"type": "User", "id": "\\u00fc", "name": "\\u00f1"}'


def test_non_finite_numbers_are_written_as_null():  # spec §5.2.2
    text = to_json({"a": float("nan"), "b": [float("inf"), -float("inf"), 1.5]})
    assert json.loads(text) == {"a": None, "b": [None, None, 1.5]}


def test_a_value_json_cannot_hold_is_refused_not_crashed():
    with pytest.raises(ValueError):
        to_json({"a": object()})


def test_stored_json_reads_back_or_falls_back_to_empty_object():
    assert parse_stored_json('{"type": "Agent"}') == {"type": "Agent"}
    assert parse_stored_json("") == {}
    assert parse_stored_json("not json") == {}


# -- source normalisation (§5.2.3) ------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "stored"),
    [
        (None, {}),
        ("user", {"type": "User", "id": "", "name": ""}),
        ("  Assistant ", {"type": "Agent", "id": "", "name": ""}),
        ("AI", {"type": "Agent", "id": "", "name": ""}),
        ("bob", "bob"),
        ({"type": "User", "id": "u"}, {"type": "User", "id": "u"}),
        ({"type": " session ", "id": "s"}, {"type": "System", "id": "s"}),
        ({"type": "assistant", "id": "x", "extra": 1}, {"type": "Agent", "id": "x", "extra": 1}),
        ({"type": "robot", "id": "s"}, {"type": "robot", "id": "s"}),
        ({"User": "bob"}, {"type": "User", "id": "bob", "name": "bob"}),
        ({"System": "cron"}, {"type": "System", "id": "cron", "name": ""}),
        ({"Agent": {"id": "z"}}, {"id": "z", "type": "Agent", "name": ""}),
        ({"User": "u", "Agent": "b"}, {"User": "u", "Agent": "b"}),
        ({"User": 5}, {"User": 5}),
        ({"user": "lower"}, {"user": "lower"}),
        ({}, {}),
    ],
)
def test_source_normalisation(given, stored):  # spec ST-8, §5.2.3
    assert normalize_source(given) == stored


def test_source_id_compares_as_text_and_no_id_is_not_the_empty_id():  # spec DD-2
    assert source_id_text({"id": "u1"}) == "u1"
    assert source_id_text({"id": 5}) == "5"
    assert source_id_text({"type": "User"}) is None
    assert source_id_text({"id": None}) is None
    assert source_id_text("bob") is None
    assert source_id_text({"id": ""}) == ""


# -- time stamps (§5.4, VF-2) -------------------------------------------------------------------


def test_iso_parsing_reads_naive_as_utc_and_accepts_z():
    assert parse_iso("2026-01-01T00:00:00") == datetime(2026, 1, 1, tzinfo=timezone.utc)
    assert parse_iso("2026-01-01T00:00:00Z") == datetime(2026, 1, 1, tzinfo=timezone.utc)
    assert parse_iso("2026-01-01T02:00:00+02:00") == datetime(2026, 1, 1, tzinfo=timezone.utc)
    assert parse_iso("not-a-date") is None


def test_sqlite_reading_is_the_fallback_for_what_iso_refuses():  # spec FT-1
    assert instant_seconds("2440587.5") == pytest.approx(0.0)  # a Julian day number: the Unix epoch
    assert instant_seconds("not-a-date") is None
    assert instant_seconds("") is None


def test_exactly_now_plus_allowance_is_accepted():  # spec §5.4
    at_edge = (NOW + timedelta(seconds=300)).isoformat()
    past_edge = (NOW + timedelta(seconds=300, milliseconds=1)).isoformat()
    assert ahead_of_clock(at_edge, NOW, 300) is None
    found = ahead_of_clock(past_edge, NOW, 300)
    assert found is not None and found.report() == {
        "timestamp": past_edge,
        "ahead_by_seconds": 300.001,
        "allowance_seconds": 300,
    }


def test_refusal_names_the_stamp_as_sent_and_whole_seconds():  # spec FT-2
    found = ahead_of_clock("2026-06-01T13:00:00.9Z", NOW, 300)
    assert found.refusal() == "timestamp '2026-06-01T13:00:00.9Z' is 3600s ahead of this clock (allowance 300s)"


def test_mode_off_never_judges():  # spec FT-2
    assert FuturePolicy("off", 300).judge(["2099-01-01"], NOW) is None
    assert FuturePolicy("warn", 300).judge(["2099-01-01"], NOW) is not None


def test_server_clock_stamp_form():  # storage VF-1
    assert sql_stamp(datetime(2026, 6, 1, 12, 0, 5, 999999, tzinfo=timezone.utc)) == "2026-06-01 12:00:05"
