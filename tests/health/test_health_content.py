"""Checks 1-4 (spec R-12..R-16): a database with exactly the defect, one without, the state after fix, a rerun."""

from __future__ import annotations

import pytest

from health_seed import h  # noqa: F401  (the seeding fixture)

from cpersona.services.health.content import clean_annotations, clean_mentions

pytestmark = pytest.mark.both_backends  # storage/service behaviour: run on SQLite and PostgreSQL


def test_clean_functions_reach_a_fixed_point():
    # spec: a removal can form a new match; cleaning repeats, then trims.
    assert clean_annotations("[Memory from [Memory from a] b] hello ") == "b] hello"
    assert clean_annotations("  [Memory from x]   text") == "text"
    assert clean_mentions("<@<@123>456> hi <@!9>") == "hi"


def test_clean_database_reports_nothing(app, h):
    h.insert_memory(app, "plain text")
    for name in ("memory_annotation", "discord_mention", "oversized_content", "duplicate_content"):
        assert h.run(app, name) == []


def test_memory_annotation_counts_candidates_and_repairable_excludes_locked(app, h):
    # spec
    a = h.insert_memory(app, "[Memory from bob] hello")
    h.insert_memory(app, "[Memory from bob] locked one", locked=1)
    [issue] = h.run(app, "memory_annotation")
    assert (issue["count"], issue["repairable"], issue["severity"]) == (2, 1, "info")
    h.run(app, "memory_annotation", fix=True)
    rows = {r.id: (r.content, r.embedding) for r in h.query(app, "SELECT id, content, embedding FROM memories")}
    assert rows[a] == ("hello", None)
    # spec R-5: the locked leftover is out of reach: review, not a repair
    [again] = h.run(app, "memory_annotation")
    assert again["repairable"] == 0 and again["needs_human_review"] is True


def test_rewrite_folds_into_identical_row_of_the_bucket(app, h):
    # spec R-14: the rewritten text collides with an existing row -> the rewritten row goes
    keep = h.insert_memory(app, "hello")
    gone = h.insert_memory(app, "hello <@123>")
    h.run(app, "discord_mention", fix=True)
    assert [r.id for r in h.query(app, "SELECT id FROM memories")] == [keep]
    assert gone != keep
    assert h.run(app, "discord_mention") == []


def test_oversized_content_truncates_to_the_cap_keeping_the_start(db, h):
    # spec R-15, H-15
    app = h.make_app(db, MAX_CONTENT_LENGTH="10")
    row = h.insert_memory(app, "0123456789abcdef")
    h.insert_memory(app, "x" * 20, locked=1)
    [issue] = h.run(app, "oversized_content")
    assert issue == {
        "type": "oversized_content",
        "count": 2,
        "repairable": 1,
        "max_len": 10,
        "severity": "warn",
        "check": "oversized_content",
    }
    h.run(app, "oversized_content", fix=True)
    assert h.query(app, "SELECT content FROM memories WHERE id = :i", i=row)[0].content == "0123456789"
    [left] = h.run(app, "oversized_content")
    assert left["count"] == 1 and left["repairable"] == 0


def test_duplicate_content_named_channel_covered_by_global_copy(app, h):
    # spec R-16: (b) a named-channel row is covered by the channel-'' row of the same text
    glob = h.insert_memory(app, "same text")
    named = h.insert_memory(app, "same text", channel="c1")
    h.insert_memory(app, "same text", channel="c2")
    h.insert_memory(app, "sibling only", channel="c1")
    h.insert_memory(app, "sibling only", channel="c2")  # siblings without a '' copy: not duplicates
    [issue] = h.run(app, "duplicate_content")
    assert (issue["groups"], issue["total_extra"], issue["repairable"]) == (1, 2, 2)
    h.run(app, "duplicate_content", fix=True)
    left = {r.id for r in h.query(app, "SELECT id FROM memories WHERE content = 'same text'")}
    assert left == {glob} and named not in left
    assert h.run(app, "duplicate_content") == []


def test_duplicate_content_is_agent_scoped(app, h):
    # spec R-10: a call naming an agent repairs only that agent
    h.insert_memory(app, "dup", agent="a")
    h.insert_memory(app, "dup", agent="a", channel="x")
    h.insert_memory(app, "dup", agent="b")
    h.insert_memory(app, "dup", agent="b", channel="x")
    h.run(app, "duplicate_content", agent_id="a", fix=True)
    assert len(h.query(app, "SELECT id FROM memories WHERE agent_id = 'b'")) == 2
    assert len(h.query(app, "SELECT id FROM memories WHERE agent_id = 'a'")) == 1


# Rows of one (agent, project, content) group as (channel, locked), in id order, and which of them
# survive the fix (spec R-16: a bucket's keeper is its lowest-id locked row, else its lowest-id row; a
# named-channel row under a '' copy is covered; locked rows are never deleted).
KEEPERS = [
    ([("", 0), ("", 0), ("", 0)], {0}),  # the oldest of unlocked twins
    ([("", 0), ("", 1), ("", 0)], {1}),  # the locked one, not the oldest
    ([("", 0), ("", 1), ("", 1)], {1, 2}),  # the lowest-id locked keeps; the other locked stays
    ([("c", 0), ("c", 0), ("", 0)], {2}),  # the '' copy covers the named channel, whatever its id
    ([("c", 1), ("", 0), ("", 0)], {0, 1}),  # a covered locked row stays; the '' keeper is the oldest
    ([("c", 0), ("c", 0), ("d", 0)], {0, 2}),  # siblings without a '' copy: one keeper per channel
    ([("c", 0), ("d", 1), ("c", 1)], {1, 2}),  # per channel: c keeps its locked row, d its only row
]


@pytest.mark.parametrize("plan,survivors", KEEPERS)
def test_duplicate_content_keeps_the_right_rows(app, h, plan, survivors):  # spec R-16
    h.execute(app, "DROP INDEX idx_memories_dedup_content")  # to plant exact duplicates in one bucket
    ids = [h.insert_memory(app, "same text", channel=channel, locked=locked) for channel, locked in plan]
    h.insert_memory(app, "same text", agent="other")  # another agent's copy is not a duplicate
    h.run(app, "duplicate_content", agent_id="a", fix=True)
    left = {r.id for r in h.query(app, "SELECT id FROM memories WHERE agent_id = 'a'")}
    assert left == {ids[i] for i in survivors}
    assert len(h.query(app, "SELECT id FROM memories WHERE agent_id = 'other'")) == 1
    assert all(i["repairable"] == 0 for i in h.run(app, "duplicate_content", agent_id="a"))  # only locked left
