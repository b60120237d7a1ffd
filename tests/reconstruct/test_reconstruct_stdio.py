"""reconstruct over the real stdio process: the declared schema, a full call, and a lone-surrogate refusal."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))

from stdio_harness import RawSession, e2e_db_path, raw_session  # noqa: E402,F401 (fixtures)


def _body(reply: dict) -> tuple[dict, bool]:
    result = reply["result"]
    return json.loads(result["content"][0]["text"]), result.get("isError", False)


def test_reconstruct_end_to_end_over_stdio(raw_session: RawSession):
    listed = raw_session.reply(raw_session.request("tools/list"))["result"]["tools"]
    tool = next(t for t in listed if t["name"] == "reconstruct")
    assert tool["annotations"]["readOnlyHint"] is True  # spec §8: read-only
    for i, (text, stamp) in enumerate(
        [
            ("The eviction trigger for the gateway cache is owned by the platform team.", "2026-08-12T10:00:00+00:00"),
            ("Cache eviction notes for the gateway service.", "2026-08-01T10:00:00+00:00"),
            ("Follow-up on cache eviction for the gateway.", "2026-08-01T10:00:20+00:00"),
        ]
    ):
        source = {"type": "User", "id": "a" if i == 0 else "c", "name": ""}
        stored, _ = _body(
            raw_session.call(
                "store", json.dumps({"agent_id": "e2e", "content": text, "timestamp": stamp, "source": source})
            )
        )
        assert stored["ok"] is True
    out, is_error = _body(
        raw_session.call(
            "reconstruct", json.dumps({"agent_id": "e2e", "query": "cache eviction gateway", "deep": True})
        )
    )
    assert is_error is False
    assert out["returned_count"] == len(out["items"]) == 2 and out["effective_count"] == 10  # spec RX-3, RX-35
    bundled = next(i for i in out["items"] if i.get("independence_reason") == "cluster:adjacent")  # spec RX-16
    assert [c["as_of"] for c in bundled["claims"]] == ["2026-08-01T10:00:20+00:00", "2026-08-01T10:00:00+00:00"]
    # verbatim (RX-50). Both rows hold the three query words; since the word channel (issue 14)
    # joined the ranking their order changed, and with it which of the two is quoted as the excerpt.
    assert bundled["excerpts"][0]["content"] == "Follow-up on cache eviction for the gateway."
    refused = raw_session.call("reconstruct", '{"agent_id":"e2e","query":"x","top_k":101}')["result"]
    assert refused["isError"] is True  # spec §0.2: a schema violation is the MCP layer's
    assert "Input validation error: 101 is greater than the maximum of 100" in refused["content"][0]["text"]


def test_lone_surrogate_is_refused_in_reconstructs_shape(raw_session: RawSession):  # spec §0.2, G-6
    out, is_error = _body(raw_session.call("reconstruct", '{"agent_id":"e2e","query":"bad \\ud800 query"}'))
    assert is_error is False
    assert out["ok"] is False and out["items"] == [] and out["returned_count"] == 0
    assert "lone UTF-16 surrogate" in out["error"]
    assert set(out) == {"ok", "error", "items", "returned_count"}
