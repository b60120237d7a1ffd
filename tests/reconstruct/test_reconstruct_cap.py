"""The modes' token cap at its lower edge: fewer claims, then cap_below_minimum (spec RX-46, RX-47)."""

from __future__ import annotations

import pytest

from cpersona.services.records.memories import store
from cpersona.services.reconstruct import reconstruct
from cpersona.services.reconstruct.tokens import count_tokens
from cpersona.services.reconstruct.shape import CAPS

pytestmark = pytest.mark.both_backends

A = "agent"


def _burst(app, n):
    """``n`` notes of one source within one minute: a single adjacency cluster (RX-16)."""
    for i in range(n):
        out = store(
            app,
            agent_id=A,
            content=f"incident cache note {i} about the outage",
            timestamp=f"2026-08-01T10:00:{i // 2:02d}.{(i % 2) * 5}00000+00:00",
            source={"type": "User", "id": "s1", "name": ""},
        )
        assert out.get("ok", True) is not False, out


def test_a_first_item_over_the_cap_keeps_the_most_claims_that_fit(app):
    _burst(app, 100)
    args = dict(query="incident cache outage", top_k=100, deep=True, max_evidence=100)
    full = reconstruct(app, agent_id=A, **args)
    assert len(full["items"]) == 1
    total = len(full["items"][0]["claims"])
    # A fresh session gets the no-embeddings advisory in full: with it, all the claims are over the cap.
    out = reconstruct(app, agent_id=A, mode="lite", session_key="first-call", **args)
    item = out["items"][0]
    assert out["returned_count"] == 1 and item["head_ref"] == full["items"][0]["head_ref"]
    kept = item["claims"]
    assert 1 <= len(kept) < total  # spec RX-47: fewer claims, at least one
    assert item["claims_omitted"] == total - len(kept)
    assert any(c["ref"] == item["head_ref"] for c in kept)  # the head is kept first (RX-24)
    assert [c["ref"] for c in kept] == [c["ref"] for c in full["items"][0]["claims"] if c in kept]  # claim order
    assert out["used_tokens"] <= out["cap"] == 3000
    assert count_tokens(out) == out["used_tokens"]  # counted on the final JSON (RX-44)
    pro = reconstruct(app, agent_id=A, mode="pro", session_key="another-first-call", **args)
    assert len(pro["items"][0]["claims"]) >= len(kept)  # a larger cap never removes (RX-46)


def test_nothing_fits_is_cap_below_minimum(app, monkeypatch):
    # Under a mode a head shows passages of at most 800 characters, so no real record is over
    # 3,000 tokens with one claim: the cap itself is lowered to reach the refusal.
    monkeypatch.setitem(CAPS, "lite", 60)
    _burst(app, 3)
    out = reconstruct(app, agent_id=A, query="incident cache outage", mode="lite")
    assert out["ok"] is False and out["error"] == "cap_below_minimum"  # spec RX-47
    assert out["items"] == [] and out["returned_count"] == 0
    assert out["mode"] == "lite" and out["cap"] == 60 and out["detail"]
    assert "advisory" in out  # the candidate recall's notices ride along
