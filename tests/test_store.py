"""store: validation order, sanitizing, dedup, future stamps, lock, embedding (spec §3.1, §5.2–5.4)."""

from __future__ import annotations

import json
import threading
from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import select, text

from cpersona.services.records import memories
from cpersona.services.records.memories import store
from cpersona.storage.models import Memory
from conftest import make_app

pytestmark = pytest.mark.both_backends  # storage/service behaviour: run on SQLite and PostgreSQL

FIXED_NOW = datetime(2026, 6, 1, 12, 0, 0, 123456, tzinfo=timezone.utc)


def rows(db) -> list[Memory]:
    with db.read() as session:
        found = list(session.scalars(select(Memory).order_by(Memory.id)))
        session.expunge_all()  # keep the loaded values once the read snapshot ends
        return found


def memory(db, row_id: int) -> Memory:
    with db.read() as session:
        found = session.get(Memory, row_id)
        session.expunge_all()
        return found


def rejected(response: dict) -> str:
    assert response["ok"] is False and response["result"] == "rejected", response
    return response["reason"]


class RecordingEmbedder:
    """A real object standing in for the HTTP client: records what it was asked to embed."""

    def __init__(self, app, blob: bytes | None = b"\x00\x00\x80\x3f" * 4, fail: bool = False):
        self.app = app
        self.blob = blob
        self.fail = fail
        self.texts: list[str] = []
        self.lock_was_free: list[bool] = []

    def embed(self, text: str) -> bytes | None:
        self.texts.append(text)
        self.lock_was_free.append(_write_lock_is_free(self.app))
        if self.fail:
            raise ConnectionError("embedding server unreachable")
        return self.blob


def _write_lock_is_free(app) -> bool:
    # The writer lock is re-entrant, so only another thread can tell whether it is held.
    result: list[bool] = []

    def probe() -> None:
        got = app.db._write_lock.acquire(blocking=False)
        if got:
            app.db._write_lock.release()
        result.append(got)

    worker = threading.Thread(target=probe)
    worker.start()
    worker.join()
    return result[0]


# -- outcomes ------------------------------------------------------------------------------------


def test_stored_answer_and_row(app, db):  # spec §3.1 outcomes, ST-10
    response = store(app, agent_id="a", content="The deploy key lives in vault.")
    assert response == {"ok": True, "result": "stored", "id": 1, "embedded": False}
    row = memory(db, 1)
    assert row.ref == "mem:1"
    assert (row.agent_id, row.project_id, row.channel, row.msg_id) == ("a", "", "", "")
    assert row.content == "The deploy key lives in vault."
    assert json.loads(row.source) == {"type": "Agent", "id": "a", "name": ""}
    assert row.metadata_ == "{}" and row.locked == 0 and row.embedding is None


def test_ids_increase_and_are_never_reused(app, db):  # spec ST-10, storage VF-8
    first = store(app, agent_id="a", content="one")["id"]
    with db.write() as session:
        session.execute(text("DELETE FROM memories WHERE id = :id"), {"id": first})
    assert store(app, agent_id="a", content="two")["id"] == first + 1


def test_empty_agent_is_a_real_bucket(app, db):  # spec AX-2
    assert store(app, agent_id="", content="x")["result"] == "stored"
    assert rows(db)[0].agent_id == ""


# -- ST-1 / ST-2: forms and validation order ------------------------------------------------------------


def test_message_form_stores_with_unknown_producer_by_default(app, db):  # spec ST-1, ST-8
    response = store(app, agent_id="a", message={"content": "older form", "id": "m1", "timestamp": "2026-01-01"})
    assert response["result"] == "stored"
    row = rows(db)[0]
    assert (row.content, row.msg_id, row.timestamp, row.source) == ("older form", "m1", "2026-01-01", "{}")


def test_message_form_source_may_be_a_bare_word_or_null(app, db):  # spec ST-8, §5.2.3
    store(app, agent_id="a", message={"content": "one", "source": "user"})
    store(app, agent_id="a", message={"content": "two", "source": None})
    assert [json.loads(r.source) for r in rows(db)] == [{"type": "User", "id": "", "name": ""}, {}]


@pytest.mark.parametrize(
    "top_level",
    [
        {"content": "x"},
        {"id": "i"},
        {"timestamp": "2026-01-01"},
        {"metadata": {"k": 1}},
        {"source": {}},
    ],
)
def test_both_forms_at_once_are_rejected(app, db, top_level):  # spec ST-1
    reason = rejected(store(app, agent_id="a", message={"content": "m"}, **top_level))
    assert "not both" in reason
    assert rows(db) == []


def test_empty_message_and_default_top_level_values_do_not_count_as_a_second_form(app):  # spec ST-1
    assert store(app, agent_id="a", message={}, content="top")["result"] == "stored"
    assert store(app, agent_id="a", message={"content": "m"}, id="", timestamp="", metadata={})["result"] == "stored"


def test_missing_agent_is_rejected(app, db):  # spec ST-2
    assert "agent_id is required" in rejected(store(app, content="x"))
    assert rows(db) == []


@pytest.mark.parametrize(
    ("arguments", "reason"),
    [
        # each line breaks two rules; the one earlier in ST-2's order must win
        ({"message": {"content": "m"}, "content": "x"}, "not both"),
        ({"content": ""}, "agent_id is required"),
        ({"agent_id": "a", "content": "", "id": "i" * 300}, "empty content"),
        ({"agent_id": "a", "content": "x", "id": "i" * 300, "timestamp": "t" * 65}, "id too long (300 chars, max 256)"),
        (
            {"agent_id": "a", "content": "x", "timestamp": "t" * 65, "metadata": {"k": "\ud800"}},
            "timestamp too long (65 chars, max 64)",
        ),
        ({"agent_id": "a", "content": "x\ud800", "metadata": {"k": "v" * 9000}}, "surrogate"),
        ({"agent_id": "a", "content": "[Memory from a] ", "metadata": {"k": "v" * 9000}}, "metadata too large"),
        ({"agent_id": "a", "content": "  ", "timestamp": "2099-01-01T00:00:00Z"}, "empty after sanitization"),
    ],
)
def test_validation_order(db, arguments, reason):  # spec ST-2
    app = make_app(db, future_timestamp_mode="reject")
    assert reason in rejected(store(app, **arguments))
    assert rows(db) == []


def test_empty_raw_content_and_empty_after_sanitizing_are_told_apart(app):  # spec ST-2, SAN-1
    assert rejected(store(app, agent_id="a", content="")) == "empty content"
    assert rejected(store(app, agent_id="a")) == "empty content"
    assert rejected(store(app, agent_id="a", content="   ")) == "empty after sanitization"
    assert rejected(store(app, agent_id="a", content="[Memory from bot] ")) == "empty after sanitization"


@pytest.mark.parametrize("field", ["id", "channel", "project_id"])
def test_key_fields_longer_than_256_are_refused_not_cut(app, db, field):  # spec §5.2.2
    assert rejected(store(app, agent_id="a", content="x", **{field: "k" * 257})) == (
        f"{field} too long (257 chars, max 256)"
    )
    assert store(app, agent_id="a", content="y", **{field: "k" * 256})["result"] == "stored"
    assert len(rows(db)) == 1


def test_source_and_metadata_caps_source_first(app, db):  # spec ST-2, §5.2.2
    big = "y" * 8000
    assert rejected(store(app, agent_id="a", content="m", metadata={"k": big})) == (
        "metadata too large (8009 chars, max 8000)"
    )
    assert rejected(store(app, agent_id="a", content="m", source={"type": "User", "id": big}, metadata={"k": big})) == (
        "source too large (8026 chars, max 8000)"
    )
    assert rows(db) == []


def test_metadata_cap_follows_the_setting(db):  # spec §5.2.2 (CPERSONA_MAX_METADATA_LENGTH)
    app = make_app(db, max_metadata_length="20")
    assert store(app, agent_id="a", content="m", source={}, metadata={"key": "v" * 9})["result"] == "stored"
    assert rejected(store(app, agent_id="a", content="n", source={}, metadata={"key": "v" * 10})) == (
        "metadata too large (21 chars, max 20)"
    )


@pytest.mark.parametrize(
    ("arguments", "reason"),
    [
        ({"content": 5}, "content must be a string"),
        ({"content": "x", "id": 7}, "id must be a string"),
        ({"content": "x", "timestamp": 1700000000}, "timestamp must be a string"),
        ({"content": "x", "metadata": ["not", "an", "object"]}, "metadata must be an object"),
        ({"content": "x", "message": "content"}, "message must be an object"),
        ({"content": "x", "lock": "yes"}, "lock must be true or false"),
        ({"content": "x", "metadata": {"when": datetime(2026, 1, 1)}}, "metadata is not representable as JSON"),
    ],
)
def test_wrong_types_from_a_library_caller_are_clear_rejections(app, db, arguments, reason):
    assert reason in rejected(store(app, agent_id="a", **arguments))
    assert rows(db) == []


def test_a_non_object_associations_rider_is_reported_and_the_memory_stored(app, db):  # spec AS-2
    answer = store(app, agent_id="a", content="x", associations=["e"])
    assert answer["result"] == "stored"
    assert answer["associations"]["dropped"] == [{"item": "associations", "reason": "must be an object"}]
    assert len(rows(db)) == 1


def test_agent_id_of_the_wrong_type_is_rejected(app):
    assert rejected(store(app, agent_id=5, content="x")) == "agent_id must be a string"


def test_non_string_project_and_channel_are_stored_as_the_global_bucket(app, db):  # spec ISO-1
    assert store(app, agent_id="a", content="x", project_id=None, channel=3)["result"] == "stored"
    assert (rows(db)[0].project_id, rows(db)[0].channel) == ("", "")


def test_nul_is_refused_in_content_and_in_keys(app, db):
    # Decision 11, see cpersona/services/sanitize.py: NUL is neither kept nor removed.
    nul = "the NUL character (U+0000) at position"
    assert rejected(store(app, agent_id="a", content="before\x00after")) == f"content contains {nul} 6"
    assert rejected(store(app, agent_id="a", content="\x00")) == f"content contains {nul} 0"
    assert rejected(store(app, agent_id="a", content="x", channel="c\x00")) == f"channel contains {nul} 1"
    assert rejected(store(app, agent_id="a\x00", content="x")) == f"agent_id contains {nul} 1"
    assert rows(db) == []


# -- ST-3: sanitizing -----------------------------------------------------------------------------------


def test_huge_content_is_cut_to_the_cap_and_says_so(app, db):  # spec ST-3
    response = store(app, agent_id="a", content="word " * 10_000)
    assert response["result"] == "stored" and response["truncated"] is True
    stored = rows(db)[0].content
    assert len(stored) <= 16_000 and stored == ("word " * 10_000)[:16_000].rstrip()


def test_content_exactly_at_the_cap_is_not_truncated(db):  # spec ST-3
    app = make_app(db, max_content_length="10")
    assert "truncated" not in store(app, agent_id="a", content="0123456789")
    assert store(app, agent_id="a", content="abcdefghijK")["truncated"] is True
    assert [r.content for r in rows(db)] == ["0123456789", "abcdefghij"]


def test_annotations_are_stripped_before_storing(app, db):  # spec ST-3, §5.2.1
    store(app, agent_id="a", content="[Memory from bot] the real text")
    assert rows(db)[0].content == "the real text"


# -- ST-4, DD-1..DD-4: dedup -----------------------------------------------------------------------------


def test_same_content_same_source_is_skipped_with_the_existing_id(app, db):  # spec ST-4, DD-2, DD-4
    first = store(app, agent_id="a", content="hello")
    again = store(app, agent_id="a", content="  hello  ")
    assert again == {"ok": True, "result": "skipped", "reason": "duplicate content", "id": first["id"]}
    assert len(rows(db)) == 1


def test_changed_content_under_an_existing_id_is_skipped_and_the_row_unchanged(app, db):  # spec ST-4, DD-1, DD-4
    first = store(app, agent_id="a", content="original", id="m1")
    again = store(app, agent_id="a", content="edited", id="m1")
    assert again == {"ok": True, "result": "skipped", "reason": "duplicate msg_id", "id": first["id"]}
    assert [r.content for r in rows(db)] == ["original"]


def test_msg_id_probe_covers_every_channel_and_the_global_pool(app, db):  # spec DD-1
    first = store(app, agent_id="a", content="one", id="m1", channel="c1")["id"]
    assert store(app, agent_id="a", content="two", id="m1", channel="c2")["id"] == first
    assert store(app, agent_id="a", content="three", id="m1", project_id="p")["id"] == first  # global answers P
    assert len(rows(db)) == 1


def test_same_msg_id_in_a_sibling_project_or_another_agent_is_a_new_memory(app, db):  # spec DD-1, SH-1
    store(app, agent_id="a", content="one", id="m1", project_id="p")
    assert store(app, agent_id="a", content="two", id="m1", project_id="q")["result"] == "stored"
    assert store(app, agent_id="a", content="three", id="m1")["result"] == "stored"  # global not answered by P
    assert store(app, agent_id="b", content="one", id="m1", project_id="p")["result"] == "stored"
    assert len(rows(db)) == 4


def test_same_content_different_source_same_bucket_is_rejected(app, db):  # spec ST-5, DD-2
    store(app, agent_id="a", content="hello")
    reason = rejected(store(app, agent_id="a", content="hello", source={"type": "User", "id": "u1", "name": "U"}))
    assert "one copy is kept per bucket" in reason
    assert len(rows(db)) == 1


def test_same_content_different_source_other_channel_is_stored(app, db):  # spec ST-5, DD-2
    store(app, agent_id="a", content="hello")
    response = store(app, agent_id="a", content="hello", channel="c1", source={"type": "User", "id": "u1"})
    assert response["result"] == "stored"
    assert len(rows(db)) == 2


def test_write_into_a_channel_is_answered_by_a_channel_less_copy(app):  # spec DD-2 (Cset)
    first = store(app, agent_id="a", content="hello")["id"]
    assert store(app, agent_id="a", content="hello", channel="c1") == {
        "ok": True,
        "result": "skipped",
        "reason": "duplicate content",
        "id": first,
    }


def test_channel_less_write_is_not_answered_by_a_copy_in_a_channel(app, db):  # spec DD-2 (Cset = {''})
    store(app, agent_id="a", content="hello", channel="c1")
    assert store(app, agent_id="a", content="hello")["result"] == "stored"
    assert len(rows(db)) == 2


def test_write_into_a_project_is_answered_by_a_global_copy_not_the_reverse(app, db):  # spec DD-3
    store(app, agent_id="a", content="hello", project_id="p")
    assert store(app, agent_id="a", content="hello")["result"] == "stored"  # global not answered by P
    assert store(app, agent_id="a", content="hello", project_id="q")["reason"] == "duplicate content"
    assert len(rows(db)) == 2


def test_no_source_id_matches_only_no_source_id(app, db):  # spec DD-2: "no id" equals "no id"
    store(app, agent_id="a", content="same", source={})
    assert store(app, agent_id="a", content="same", source={"type": "User"})["reason"] == "duplicate content"
    # '' is an id, not the absence of one
    assert "one copy" in rejected(store(app, agent_id="a", content="same", source={"type": "User", "id": ""}))


def test_duplicate_skip_does_not_report_truncation_or_future_stamps(app):  # spec §3.1 skipped shape
    store(app, agent_id="a", content="w " * 9000)
    again = store(app, agent_id="a", content="w " * 9000, timestamp="2099-01-01T00:00:00Z")
    assert set(again) == {"ok", "result", "reason", "id"}


# -- DD-5 / ST-13: the unique indexes are the final guard ----------------------------------------------


def test_a_write_that_loses_the_race_to_the_content_index_is_skipped_without_id(
    app, db, monkeypatch
):  # spec DD-5, ST-13
    store(app, agent_id="a", content="raced")
    # Stand in for a writer in another process that got in between our probe and
    # our insert: the probe sees nothing, the unique index does.
    monkeypatch.setattr(memories, "_probe", lambda session, request: memories._PROCEED)
    assert store(app, agent_id="a", content="raced") == {
        "ok": True,
        "result": "skipped",
        "reason": "duplicate (unique index)",
    }
    assert store(app, agent_id="a", content="other text", id="m1")["result"] == "stored"
    assert store(app, agent_id="a", content="third text", id="m1", lock=True) == {
        "ok": True,
        "result": "skipped",
        "reason": "duplicate (unique index)",
        "locked": False,
    }
    assert len(rows(db)) == 2


def test_a_unique_refusal_outside_memories_is_a_fault_not_a_duplicate(app, db):  # spec DD-5, ST-13
    # A trigger's unique clash on another table (a change log, a user's audit
    # table) is not a lost dedup race: "skipped, duplicate" would drop the memory
    # while telling the caller it was already stored.
    with db.write_connection() as conn:
        conn.exec_driver_sql("CREATE TABLE side_log (k integer PRIMARY KEY)")
        conn.exec_driver_sql("INSERT INTO side_log VALUES (1)")
        if db.is_sqlite:
            conn.exec_driver_sql(
                "CREATE TRIGGER side_log_clash AFTER INSERT ON memories WHEN new.content = 'clash' "
                "BEGIN INSERT INTO side_log VALUES (1); END"
            )
        else:
            conn.exec_driver_sql(
                "CREATE FUNCTION side_log_clash() RETURNS trigger LANGUAGE plpgsql AS "
                "$$ BEGIN INSERT INTO side_log VALUES (1); RETURN NULL; END $$"
            )
            conn.exec_driver_sql(
                "CREATE TRIGGER side_log_clash AFTER INSERT ON memories FOR EACH ROW "
                "WHEN (NEW.content = 'clash') EXECUTE FUNCTION side_log_clash()"
            )
    try:
        answer = store(app, agent_id="a", content="clash")
    except Exception as exc:  # noqa: BLE001 - the service may raise; the facade answers it
        answer = {"ok": False, "error": str(exc)}
    assert answer["ok"] is False, answer
    assert rows(db) == []
    assert store(app, agent_id="a", content="fine")["result"] == "stored"


def test_unique_indexes_are_exact_bucket(app, db, monkeypatch):  # spec DD-5
    monkeypatch.setattr(memories, "_probe", lambda session, request: memories._PROCEED)
    store(app, agent_id="a", content="x", id="m")
    assert store(app, agent_id="a", content="x", id="n", channel="c")["result"] == "stored"
    assert store(app, agent_id="a", content="y", id="m", project_id="p")["result"] == "stored"
    assert len(rows(db)) == 3


def test_concurrent_identical_stores_write_one_row(db):  # spec ST-13
    app = make_app(db)
    answers: list[dict] = []
    barrier = threading.Barrier(6)

    def worker() -> None:
        barrier.wait()
        answers.append(store(app, agent_id="a", content="same text", id="m1"))

    threads = [threading.Thread(target=worker) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(a["result"] for a in answers) == ["skipped"] * 5 + ["stored"]
    assert len(rows(db)) == 1


# -- ST-6, ST-11: embedding ----------------------------------------------------------------------------


def test_without_an_embedder_nothing_is_embedded(app, db):  # spec ST-6
    assert store(app, agent_id="a", content="x")["embedded"] is False
    assert rows(db)[0].embedding is None


def test_sanitized_text_is_embedded_once_outside_the_write_lock(app, db):  # spec ST-6, ST-11, PG-4
    embedder = RecordingEmbedder(app)
    app.embedder = embedder
    response = store(app, agent_id="a", content="  [Memory from bot] what matters  ")
    assert response["embedded"] is True
    assert embedder.texts == ["what matters"]
    assert embedder.lock_was_free == [True]
    assert rows(db)[0].embedding == embedder.blob


def test_a_duplicate_costs_no_embedding_request(app):  # spec ST-11
    store(app, agent_id="a", content="x")
    embedder = RecordingEmbedder(app)
    app.embedder = embedder
    assert store(app, agent_id="a", content="x")["result"] == "skipped"
    assert embedder.texts == []


@pytest.mark.parametrize("failure", ["raises", "returns None"])
def test_an_embedding_failure_never_fails_the_store(app, db, failure):  # spec ST-6
    app.embedder = RecordingEmbedder(app, blob=None, fail=failure == "raises")
    response = store(app, agent_id="a", content="x")
    assert response["result"] == "stored" and response["embedded"] is False
    assert rows(db)[0].embedding is None


# -- ST-7, ST-9, FT-*: timestamps ---------------------------------------------------------------------------


def test_omitted_timestamp_is_the_server_clock_in_iso_with_microseconds(app, db):  # spec ST-7, VF-1
    app.clock = lambda: FIXED_NOW
    store(app, agent_id="a", content="x")
    store(app, agent_id="a", content="y", timestamp="")
    assert [r.timestamp for r in rows(db)] == ["2026-06-01T12:00:00.123456+00:00"] * 2
    assert rows(db)[0].created_at == "2026-06-01 12:00:00"


@pytest.mark.parametrize("stamp", ["not-a-date", "2026-01-01", "2026-01-01T00:00:00Z", "now"])
def test_caller_timestamp_is_stored_verbatim(app, db, stamp):  # spec ST-7
    store(app, agent_id="a", content="x", timestamp=stamp)
    assert rows(db)[0].timestamp == stamp


def test_future_stamp_in_warn_mode_is_stored_and_reported(app, db):  # spec ST-9, FT-2
    app.clock = lambda: FIXED_NOW
    stamp = "2026-06-01T13:00:00.123456Z"
    response = store(app, agent_id="a", content="x", timestamp=stamp)
    assert response["result"] == "stored"
    assert response["timestamp_ahead_of_clock"] == {
        "timestamp": stamp,
        "ahead_by_seconds": 3600.0,
        "allowance_seconds": 300,
    }
    assert rows(db)[0].timestamp == stamp


def test_allowance_boundary_follows_the_clock_and_the_setting(db):  # spec §5.4
    app = make_app(db, future_timestamp_skew_seconds="60")
    app.clock = lambda: FIXED_NOW
    edge = (FIXED_NOW + timedelta(seconds=60)).isoformat()
    assert "timestamp_ahead_of_clock" not in store(app, agent_id="a", content="x", timestamp=edge)
    app.clock = lambda: FIXED_NOW - timedelta(seconds=1)  # move time back: now it is ahead
    ahead = store(app, agent_id="a", content="y", timestamp=edge)["timestamp_ahead_of_clock"]
    assert ahead["ahead_by_seconds"] == 61.0 and ahead["allowance_seconds"] == 60


def test_naive_stamps_are_utc(app):  # spec §5.4
    app.clock = lambda: FIXED_NOW
    naive = store(app, agent_id="a", content="x", timestamp="2026-06-01 13:00:00")
    assert naive["timestamp_ahead_of_clock"]["ahead_by_seconds"] == pytest.approx(3600 - 0.123456, abs=1e-3)


def test_stamps_only_sqlite_can_read_are_judged_the_sqlite_way(app):  # spec FT-1
    # 2500000 is a Julian day number in the year 2132 to SQLite's date functions.
    assert "timestamp_ahead_of_clock" in store(app, agent_id="a", content="jd", timestamp="2500000")
    assert "timestamp_ahead_of_clock" not in store(app, agent_id="a", content="now", timestamp="now")
    assert "timestamp_ahead_of_clock" not in store(app, agent_id="a", content="bad", timestamp="not-a-date")


def test_reject_mode_refuses_before_dedup(db):  # spec FT-2
    app = make_app(db, future_timestamp_mode="reject")
    app.clock = lambda: FIXED_NOW
    store(app, agent_id="a", content="dup")
    response = store(app, agent_id="a", content="dup", timestamp="2026-06-01T13:00:00Z", lock=True)
    assert response == {
        "ok": False,
        "result": "rejected",
        "locked": False,
        "reason": "timestamp '2026-06-01T13:00:00Z' is 3599s ahead of this clock (allowance 300s)",
    }
    assert len(rows(db)) == 1


def test_off_mode_stores_silently(db):  # spec FT-2
    app = make_app(db, future_timestamp_mode="off")
    response = store(app, agent_id="a", content="x", timestamp="2099-01-01T00:00:00Z")
    assert response == {"ok": True, "result": "stored", "id": 1, "embedded": False}


# -- ST-12: lock ----------------------------------------------------------------------------------------------


def test_lock_true_locks_the_new_row(app, db):  # spec ST-12
    response = store(app, agent_id="a", content="keep", lock=True)
    assert response["locked"] is True
    assert rows(db)[0].locked == 1


@pytest.mark.parametrize("by", ["content", "msg_id"])
def test_lock_true_on_a_duplicate_locks_the_existing_row(app, db, by):  # spec ST-12
    first = store(app, agent_id="a", content="keep", id="m1")["id"]
    again = store(
        app, agent_id="a", content="keep" if by == "content" else "other", id="" if by == "content" else "m1", lock=True
    )
    assert again["result"] == "skipped" and again["id"] == first and again["locked"] is True
    assert memory(db, first).locked == 1


def test_rejected_store_with_lock_answers_locked_false(app, db):  # spec ST-12
    assert store(app, agent_id="a", content="  ", lock=True) == {
        "ok": False,
        "result": "rejected",
        "reason": "empty after sanitization",
        "locked": False,
    }
    store(app, agent_id="a", content="hello")
    same_bucket = store(app, agent_id="a", content="hello", source={"type": "User", "id": "u"}, lock=True)
    assert same_bucket["result"] == "rejected" and same_bucket["locked"] is False
    assert memory(db, 1).locked == 0


def test_locked_key_only_when_a_lock_was_asked_for(app):  # spec §3.1 outcomes
    assert "locked" not in store(app, agent_id="a", content="x", lock=False)
    assert "locked" not in store(app, agent_id="a", content="x")


# -- riders ------------------------------------------------------------------------------------------------


def test_session_key_and_associations_do_not_change_the_write(app, db):  # spec SH-2, §3.1
    assert store(app, agent_id="a", content="x", session_key="s1", associations={}) == {
        "ok": True,
        "result": "stored",
        "id": 1,
        "embedded": False,
    }
    rider = {"entities": [{"name": "Miso"}]}
    assert store(app, agent_id="a", content="y", associations=rider)["result"] == "stored"
    assert len(rows(db)) == 2


def test_auto_project_is_a_literal_until_the_operating_context_lands(app, db):  # spec OC-11 (dormant context)
    store(app, agent_id="a", content="x", project_id="@auto")
    assert rows(db)[0].project_id == "@auto"


def test_metadata_is_stored_as_json_text(app, db):  # spec storage VF-4
    store(app, agent_id="a", content="x", metadata={"k": "é", "n": float("nan")})
    assert rows(db)[0].metadata_ == '{"k": "\\u00e9", "n": null}'
