"""reconstruct over a real SQLite file (spec associations-and-reconstruct §8)."""

from __future__ import annotations

import hashlib

import pytest
from sqlalchemy import text as sql

from cpersona.services.graph.associations import declare_associations
from cpersona.services.records.memories import store
from cpersona.services.reconstruct import reconstruct
from conftest import make_app

pytestmark = pytest.mark.both_backends  # storage/service behaviour: run on SQLite and PostgreSQL

A = "agent"


def _put(app, content, stamp, source_id="s1", **kw):
    out = store(
        app, content=content, agent_id=A, timestamp=stamp, source={"type": "User", "id": source_id, "name": ""}, **kw
    )
    assert out.get("ok", True) is not False, out
    return f"mem:{out['id']}" if "id" in out else out


def _ref_of(app, text):
    with app.db.read() as session:
        ident = session.execute(sql("SELECT id FROM memories WHERE content = :t"), {"t": text}).scalar_one()
    return f"mem:{ident}"


def _memory_rows(app):
    with app.db.read() as session:
        return [
            tuple(r)
            for r in session.execute(
                sql("SELECT id, content, recall_count, last_recalled_at FROM memories ORDER BY id")
            )
        ]


def _seed(app):
    texts = [
        ("The eviction trigger for the gateway cache is owned by the platform team.", "2026-08-12T10:00:00+00:00", "a"),
        ("Cache eviction on the search cluster uses a size-based policy.", "2026-08-09T10:00:00+00:00", "b"),
        ("Cache eviction notes for the gateway service.", "2026-08-01T10:00:00+00:00", "c"),
        ("Follow-up on cache eviction for the gateway.", "2026-08-01T10:00:20+00:00", "c"),
        ("Lunch menu for Friday is pasta.", "2026-07-01T10:00:00+00:00", "d"),
    ]
    for content, stamp, source in texts:
        _put(app, content, stamp, source_id=source)
    return {t[0]: _ref_of(app, t[0]) for t in texts}


def test_items_quote_rows_verbatim_and_bundle_adjacent(app):
    refs = _seed(app)
    out = reconstruct(app, agent_id=A, query="cache eviction gateway")
    assert out["effective_count"] == 10  # spec RX-3: server default 10
    items = out["items"]
    assert items and out["returned_count"] == len(items)
    stored = {ref: text for text, ref in refs.items()}
    for item in items:  # spec RX-50 (2): content is a quotation of the head record
        assert item["content"] == stored[item["head_ref"]]
        assert item["ranges"] == [[0, len(item["content"])]]
    adjacent = [i for i in items if i.get("independence_reason") == "cluster:adjacent"]
    assert len(adjacent) == 1  # spec RX-16: same source, same context, 20 s apart
    claims = adjacent[0]["claims"]
    assert [c["as_of"] for c in claims] == sorted((c["as_of"] for c in claims), reverse=True)  # spec RX-25
    assert all(c["why"] == "cluster:adjacent" for c in claims)
    assert len(adjacent[0]["excerpts"]) == 1  # the other claim is quoted (RX-32)
    assert out["shortfall_reason"] == "exhausted_candidates"  # spec RX-38
    assert "budget_policy" not in out and "bounds" not in out  # spec RX-40: nothing was changed


def test_count_is_a_ceiling_and_zero_count(app):
    _seed(app)
    one = reconstruct(app, agent_id=A, query="cache eviction", count=1)
    assert one["returned_count"] == 1 and one["shortfall_reason"] if one["returned_count"] < 1 else True
    zero = reconstruct(app, agent_id=A, query="cache eviction", count=0)
    assert zero == {
        "items": [],
        "effective_count": 0,
        "returned_count": 0,
        "shortfall_reason": "count_zero",
        **{k: v for k, v in zero.items() if k == "advisory"},
    }  # spec RX-13
    clamped = reconstruct(app, agent_id=A, query="cache eviction", count=50)
    assert clamped["requested_count"] == 50 and clamped["effective_count"] == 10  # spec RX-3
    assert clamped["count_policy"] == {"source": "caller", "clamped": True, "reason": "count_requested"}


def test_no_candidates_reason(app):
    _seed(app)
    out = reconstruct(app, agent_id=A, query="zzqqxx")
    assert out["items"] == [] and out["shortfall_reason"] == "no_relevant_evidence"  # spec RX-13


def test_budget_raised_to_one_quote_and_excerpts_cut(app):
    _seed(app)
    out = reconstruct(app, agent_id=A, query="cache eviction gateway", budget=10)
    assert out["budget_policy"] == {"source": "caller", "clamped": True, "reason": "raised_to_one_excerpt"}  # RX-4
    assert out["requested_budget"] == 10
    total = sum(len(i["content"]) + sum(len(e["content"]) for e in i.get("excerpts", [])) for i in out["items"])
    assert total <= 800  # spec RX-36: quoted characters within the budget


def test_budget_prefix_property(app):
    _seed(app)
    small = reconstruct(app, agent_id=A, query="cache eviction gateway", budget=800)
    large = reconstruct(app, agent_id=A, query="cache eviction gateway", budget=5000)
    # spec RX-36: raising the budget never removes an item or an excerpt
    assert [i["head_ref"] for i in small["items"]] == [i["head_ref"] for i in large["items"]][: len(small["items"])]


def test_operator_forced_count(db):
    app = make_app(db, RECONSTRUCT_FORCED_COUNT="1")
    _seed(app)
    out = reconstruct(app, agent_id=A, query="cache eviction", count=5)
    assert out["effective_count"] == 1  # spec RX-3
    assert out["count_policy"] == {"source": "operator_forced", "clamped": False, "reason": "forced_count_set"}


def test_refusals_have_one_shape(app):
    bad = reconstruct(app, agent_id=A, query="x", mode="lite", lite=True)
    assert bad == {
        "ok": False,
        "error": 'pass mode or lite, not both: lite=true is mode "lite"',
        "items": [],
        "returned_count": 0,
    }  # spec RX-1
    assert reconstruct(app, agent_id=A, query="x", mode="max")["error"] == "mode must be one of ['lite', 'pro']"
    cue = reconstruct(app, agent_id=A, query="x", time_cue={"confidence": "sure"})
    assert cue["error"] == "time_cue needs either after/before or ago, not both and not neither"  # spec TQ-1
    assert (
        reconstruct(app, agent_id=A, query="x", time_cue={"after": "2026-01-01"})["error"]
        == "time_cue.confidence is required: one of sure, likely, vague"
    )
    assert (
        reconstruct(app, agent_id=A, query="x", time_cue={"after": "nope", "confidence": "sure"})["error"]
        == "time_cue.after is not a date or timestamp: 'nope'"
    )  # spec TQ-2
    assert (
        reconstruct(app, agent_id=A, query="x", time_cue={"ago": {"unit": "years", "value": 1}, "confidence": "sure"})[
            "error"
        ]
        == "time_cue.ago.unit must be one of days, weeks, months"
    )  # spec TQ-3
    assert reconstruct(app, agent_id=None, query="x")["ok"] is False


def test_nothing_is_written(app):
    _seed(app)
    file_bytes = (lambda: hashlib.sha256(app.db.path.read_bytes()).hexdigest()) if app.db.is_sqlite else (lambda: "")
    before = file_bytes()
    rows_before = _memory_rows(app)
    for kwargs in ({}, {"mode": "lite"}, {"mode": "pro"}, {"trace": True}, {"budget": 5}):
        reconstruct(app, agent_id=A, query="cache eviction gateway", **kwargs)
    assert _memory_rows(app) == rows_before  # spec RX-50 (1), recall_count included
    assert file_bytes() == before  # and on SQLite not one byte of the file


def test_deterministic(app):
    _seed(app)
    first = reconstruct(app, agent_id=A, query="cache eviction gateway", trace=True)
    second = reconstruct(app, agent_id=A, query="cache eviction gateway", trace=True)
    first.pop("advisory", None), second.pop("advisory", None)  # told in full once per session, by design
    assert first == second  # spec RX-50 (3)
    assert first["reconstruction"]["policy"] == "v1"  # spec RX-43
    assert first["trace"]["candidate_refs"]


def test_modes_compact_shape_and_cap(app):
    _seed(app)
    lite = reconstruct(app, agent_id=A, query="cache eviction gateway", mode="lite")
    assert lite["mode"] == "lite" and lite["cap"] == 3000 and lite["used_tokens"] <= 3000  # spec RX-44
    assert all("ranges" not in i for i in lite["items"])  # spec RX-45
    single = reconstruct(app, agent_id=A, query="platform team eviction trigger", mode="lite")
    assert any("as_of" in i and "claims" not in i for i in single["items"])  # spec RX-45
    pro = reconstruct(app, agent_id=A, query="cache eviction gateway", mode="pro")
    assert pro["effective_count"] == 15 and pro["cap"] == 5000  # spec RX-3, RX-44


def test_long_record_quoted_by_passages(app):
    filler = " ".join(f"Sentence number {i} talks about weather." for i in range(60))
    text = filler + " The rotation key for the vault is stored in the HSM. " + filler
    _put(app, text, "2026-09-01T10:00:00+00:00")
    out = reconstruct(app, agent_id=A, query="vault rotation key HSM")
    item = out["items"][0]
    assert item["content_len"] == len(text)  # spec RX-31
    assert "rotation key for the vault" in item["content"]
    for start, end in item["ranges"]:
        assert text[start:end] in item["content"]
    assert len(item["content"]) <= 800


def test_declared_relation_adds_walked_evidence_not_items(app):
    _put(app, "Mina approves hotfixes during the deploy freeze.", "2026-07-01T10:00:00+00:00", source_id="x1")
    _put(app, "The release calendar lives under ops/calendar.", "2026-07-05T10:00:00+00:00", source_id="x2")
    head, walked = (
        _ref_of(app, "Mina approves hotfixes during the deploy freeze."),
        _ref_of(app, "The release calendar lives under ops/calendar."),
    )
    plain = reconstruct(app, agent_id=A, query="deploy freeze hotfixes")
    declare_associations(
        app,
        agent_id=A,
        anchor_ref=head,
        associations={
            "entities": [{"name": "Mina"}],
            "relations": [{"subject": "Mina", "predicate": "owns", "object": "Release calendar"}],
        },
    )
    declare_associations(app, agent_id=A, anchor_ref=walked, associations={"entities": [{"name": "Release calendar"}]})
    out = reconstruct(app, agent_id=A, query="deploy freeze hotfixes")
    # spec RX-51: same items in the same order; the walk adds evidence inside
    assert [i["head_ref"] for i in out["items"]] == [i["head_ref"] for i in plain["items"]]
    claims = out["items"][0]["claims"]
    walked_claims = [c for c in claims if c["ref"] == walked]
    assert walked_claims == [{"ref": walked, "as_of": "2026-07-05T10:00:00+00:00", "why": "relation:owns", "hops": 1}]
    no_hops = reconstruct(app, agent_id=A, query="deploy freeze hotfixes", max_hops=0)
    assert all(c["ref"] != walked for c in no_hops["items"][0]["claims"])  # spec RX-21
    assert no_hops["bounds"]["omitted"] == ["max_hops"]  # spec RX-22, RX-42
    lite = reconstruct(app, agent_id=A, query="deploy freeze hotfixes", mode="lite")
    assert walked not in str(lite["items"])  # spec RX-20: a mode never walks
