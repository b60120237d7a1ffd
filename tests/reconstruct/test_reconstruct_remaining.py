"""reconstruct contract points no other module pinned: RX-2, RX-5, RX-18, RX-29, RX-30, RX-34, RX-37, RX-48, RX-52, RX-53."""

from __future__ import annotations

import pytest

from cpersona.config import load_settings
from cpersona.mcp.acl import access_for
from cpersona.mcp.tools import default_registry
from cpersona.services.records.contents import get_contents
from cpersona.services.records.memories import store
from cpersona.services.reconstruct import reconstruct
from cpersona.services.reconstruct import service as service_module
from cpersona.services.reconstruct.quote import rank_spans
from conftest import make_app

pytestmark = pytest.mark.both_backends

A = "agent"
WORDS = (
    "amber basalt cobalt dahlia ember fennel garnet hazel indigo jasper kelp lilac marble nectar onyx pewter "
    "quartz russet saffron topaz umber violet walnut xenon yarrow zinnia"
).split()


def _put(app, content, stamp, source_id):
    out = store(app, content=content, agent_id=A, timestamp=stamp, source={"type": "User", "id": source_id, "name": ""})
    assert out.get("ok", True) is not False, out
    return f"mem:{out['id']}"


def _long(seed: int, chars: int) -> str:
    words, i = [], seed
    while sum(len(w) + 1 for w in words) < chars:
        words.append(f"{WORDS[i % len(WORDS)]}{i}")
        i += 7
    return "Ledger entry. " + " ".join(words)[:chars]


def test_an_unreadable_cue_is_refused_before_any_retrieval(app, monkeypatch):  # spec RX-2
    _put(app, "ledger entry for the audit", "2026-01-05T10:00:00+00:00", "s1")

    def no_retrieval(*_args, **_kwargs):
        raise AssertionError("the candidate recall ran")

    monkeypatch.setattr(service_module, "candidate_pool", no_retrieval)
    out = reconstruct(app, agent_id=A, query="ledger", time_cue={"confidence": "sure", "after": "not a date"})
    assert out == {
        "ok": False,
        "error": "time_cue.after is not a date or timestamp: 'not a date'",
        "items": [],
        "returned_count": 0,
    }  # spec RX-1 shape


def test_pro_without_a_budget_is_bounded_by_tokens_only(app):  # spec RX-5, RX-44
    for i in range(15):
        _put(app, _long(i, 380), f"2026-01-{i + 1:02d}T10:00:00+00:00", f"s{i}")  # each quoted whole
    pro = reconstruct(app, agent_id=A, query="ledger entry", mode="pro", top_k=20, deep=True)
    assert len(pro["items"]) == 15
    quoted = sum(len(i["content"]) for i in pro["items"])
    assert quoted > 4000  # past the configured default budget (RX-4) and lite's 2,800
    assert "budget_policy" not in pro and "effective_budget" not in pro
    assert pro["used_tokens"] <= pro["cap"] == 5000
    capped = reconstruct(app, agent_id=A, query="ledger entry", mode="pro", top_k=20, deep=True, budget=2000)
    assert len(capped["items"]) < len(pro["items"])  # a caller's budget still binds under pro


def test_held_items_and_no_chain_key(app):  # spec RX-18, RX-29
    head = _put(app, "Ledger audit passed for the Atlas project.", "2026-01-05T10:00:00+00:00", "s1")
    _put(app, "Unrelated ledger remark.", "2026-01-09T10:00:00+00:00", "s2")
    out = reconstruct(app, agent_id=A, query="ledger audit Atlas", trace=True)
    for item in out["items"]:
        assert item.get("admission") in (None, "reservation")  # RX-29: only held items say how they came in
        assert item["independence_reason"] != "cluster:chain"  # RX-18: reserved, never fires
        assert all(c.get("why") != "cluster:chain" for c in item["claims"])
    assert out["items"][0]["head_ref"] == head


def test_span_ranking_fuses_trigrams_and_closeness_by_dense_rank():  # spec RX-30
    text = "alpha beta. gamma delta. alpha gamma."
    spans = [(0, 11), (12, 24), (25, 37)]
    # lexical only: "gamma" trigrams are in spans 1 and 2 equally → tie goes to the earlier span
    assert rank_spans(text, spans, "gamma", 60) == [1, 2, 0]
    # more distinct query trigrams wins
    assert rank_spans(text, spans, "alpha gamma", 60)[0] == 2
    # closeness fused in: equal lexical ranks, the closer span first
    assert rank_spans(text, spans, "gamma", 60, closeness=[0.1, 0.2, 0.9]) == [2, 1, 0]
    # a query shorter than 3 characters is its own single trigram
    assert rank_spans("ab cd", [(0, 2), (3, 5)], "cd", 60) == [1, 0]


def test_quote_chars_zero_makes_heads_follow_the_excerpt_rules(db):  # spec RX-34
    app = make_app(db, RECONSTRUCT_QUOTE_CHARS="0")
    text = _long(3, 1200)
    ref = _put(app, text, "2026-01-05T10:00:00+00:00", "s1")
    out = reconstruct(app, agent_id=A, query="ledger entry")
    item = out["items"][0]
    assert item["head_ref"] == ref
    assert item["content"] == text[:500]  # the preview size, from the record's start
    assert item["content_len"] == len(text) and item["node_unavailable"] == "no_nodes"  # RX-32 third case
    assert "ranges" not in item


def test_the_items_sequence_heads_first_then_excerpts_round_by_round(app):  # spec RX-37 (items)
    # Two items of two rows each (adjacency bursts of distinct sources, a day apart).
    a_head = _put(app, "Ledger close for January: balanced.", "2026-01-05T10:00:30+00:00", "s1")
    a_old = _put(app, "Ledger close draft " + "x" * 200, "2026-01-05T10:00:00+00:00", "s1")
    b_head = _put(app, "Ledger close for February: balanced.", "2026-02-05T10:00:30+00:00", "s2")
    b_old = _put(app, "Ledger close notes " + "y" * 200, "2026-02-05T10:00:00+00:00", "s2")
    full = reconstruct(app, agent_id=A, query="ledger close balanced", deep=True, trace=True)
    heads = [i["head_ref"] for i in full["items"]]
    assert sorted(heads) == sorted([a_head, b_head]) and len(heads) == 2
    head_chars = sum(len(i["content"]) for i in full["items"])
    first_excerpt = len(full["items"][0]["excerpts"][0]["content"])
    # Room for both heads and the first item's excerpt, not the second's: the sequence stops there.
    out = reconstruct(
        app, agent_id=A, query="ledger close balanced", deep=True, budget=max(800, head_chars + first_excerpt)
    )
    assert [i["head_ref"] for i in out["items"]] == heads
    first, second = out["items"]
    if head_chars + first_excerpt >= 800:
        assert len(first["excerpts"]) == 1 and second["excerpts_omitted"] == 1
        assert out["used_budget"] == head_chars + first_excerpt
    assert {a_old, b_old} >= {e["ref"] for i in out["items"] for e in i.get("excerpts", [])}


def test_trace_under_a_mode_is_the_full_response_with_the_capped_tokens(app):  # spec RX-48
    _put(app, "Ledger audit passed for the Atlas project.", "2026-01-05T10:00:00+00:00", "s1")
    # distinct sessions: both answers carry the same (first-call) advisory notice
    traced = reconstruct(app, agent_id=A, query="ledger audit", mode="lite", trace=True, session_key="one")
    plain = reconstruct(app, agent_id=A, query="ledger audit", mode="lite", session_key="two")
    assert traced["mode"] == "lite" and traced["cap"] == 3000
    assert traced["used_tokens"] == plain["used_tokens"]  # the capped shape's count
    assert "ranges" in traced["items"][0] and "claims" in traced["items"][0]  # uncompacted, unlike RX-45
    assert "trace" in traced and "bounds" in traced


def test_an_expand_reads_on_with_get_contents(app):  # spec RX-52
    text = "Ledger. " + " ".join(f"{WORDS[i % 26]}{i}" for i in range(600))  # one long sentence: a severed quote
    ref = _put(app, text, "2026-01-05T10:00:00+00:00", "s1")
    item = reconstruct(app, agent_id=A, query="ledger " + WORDS[5])["items"][0]
    expand = item["expand"]
    assert expand["ref"] == ref and item.get("content_len") == len(text)
    read = get_contents(app, agent_id=A, refs=[expand])
    assert "unresolved" not in read
    start, end = expand["span"]
    assert read["items"][0]["content"] == text[start:end]
    assert item["content"] == text[start : start + len(item["content"])]  # the quote is the range's start


def test_reconstruct_needs_what_recall_needs_under_acl():  # spec RX-53
    settings = load_settings({})
    for arguments in ({"agent_id": "alice", "query": "x"}, {"agent_id": "", "query": ""}):
        registry = default_registry()
        assert [(d.agent, d.level) for d in access_for(registry.get("reconstruct")).demands(arguments, settings)] == [
            (d.agent, d.level) for d in access_for(registry.get("recall")).demands(arguments, settings)
        ]
