"""Checks of the benchmark's own arithmetic and plumbing (no server needed).

Run: .venv/bin/pytest bench/tests
"""

from __future__ import annotations

import http.client
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

BENCH_DIR = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(BENCH_DIR))

from bm25 import BM25Index  # noqa: E402
from minilm_server import DIMENSIONS, stub_embed  # noqa: E402
from locomo import TurnLookup, ranked_dia_ids  # noqa: E402
from locomo_data import DEFAULT_DATA_DIR, load_conversation, normalize_evidence, session_timestamp  # noqa: E402
from metrics import ndcg_at, percentile, reciprocal_rank, score_question  # noqa: E402


def test_metrics_on_a_hand_computed_ranking():
    ranked = ["x", "e1", "y", "z", "w", "v", "u", "t", "s", "e2"]
    scores = score_question(ranked, ["e1", "e2", "e3"])
    assert scores["recall@5"] == pytest.approx(1 / 3)
    assert scores["recall@10"] == pytest.approx(2 / 3)
    assert scores["hit@10"] == 1.0
    assert scores["mrr"] == pytest.approx(1 / 2)
    dcg = 1 / math.log2(3) + 1 / math.log2(11)
    ideal = 1 / math.log2(2) + 1 / math.log2(3) + 1 / math.log2(4)
    assert scores["ndcg@10"] == pytest.approx(dcg / ideal)


def test_metrics_ignore_rows_past_ten_and_score_a_miss_as_zero():
    ranked = [f"n{i}" for i in range(10)] + ["e"]
    assert score_question(ranked, ["e"]) == {
        "recall@5": 0.0,
        "recall@10": 0.0,
        "hit@10": 0.0,
        "mrr": 0.0,
        "ndcg@10": 0.0,
    }
    assert reciprocal_rank(["e"], {"e"}) == 1.0
    assert ndcg_at(["e"], {"e"}, 10) == 1.0


def test_a_question_without_evidence_is_refused():
    with pytest.raises(ValueError):
        score_question(["a"], [])


def test_percentile_nearest_rank():
    assert percentile([5.0, 1.0, 3.0], 0.5) == 3.0
    assert percentile(list(range(1, 101)), 0.95) == 95
    assert percentile([], 0.5) == 0.0


def test_recall_rows_are_reversed_to_best_first_and_mapped_back():
    # spec RC-1: the LAST row of a recall answer is the best match
    lookup = TurnLookup(
        by_ref={"mem:1": "D1:1", "mem:2": "D1:2"},
        by_content={"Caroline: hi": "D1:1", "Melanie: yo": "D1:2", "Caroline: third": "D1:3"},
        dia_ids=frozenset({"D1:1", "D1:2", "D1:3"}),
    )
    messages = [
        {"ref": "ep:1", "content": "[Episode] something"},  # not a turn
        {"ref": "mem:9", "content": "Caroline: third"},  # unknown ref: found by content
        {"ref": "mem:7", "id": "D1:2", "content": "cut preview"},  # found by caller id
        {"ref": "mem:1", "content": "Caroline: hi"},
    ]
    ranked, unmapped = ranked_dia_ids(messages, lookup)
    assert ranked == ["D1:1", "D1:2", "D1:3"]
    assert unmapped == 1


def test_session_dates_become_iso_8601():
    assert session_timestamp("1:56 pm on 8 May, 2023") == "2023-05-08T13:56:00+00:00"
    assert session_timestamp("12:09 am on 13 September, 2023") == "2023-09-13T00:09:00+00:00"


def test_evidence_ids_are_repaired_and_unknown_ones_dropped():
    known = {"D8:6", "D9:17", "D11:26"}
    assert normalize_evidence(["D8:6; D9:17", "D:11:26", "D", "D10:19"], known) == ("D8:6", "D9:17", "D11:26")


def test_a_conversation_loads_with_adversarial_questions_skipped():
    conversation = load_conversation(DEFAULT_DATA_DIR / "30.json")
    assert len(conversation.turns) == 369
    assert all(q.category != 5 for q in conversation.questions)
    assert conversation.turns[0].content.startswith(conversation.turns[0].speaker + ": ")
    ids = {t.dia_id for t in conversation.turns}
    assert all(set(q.evidence) <= ids for q in conversation.questions)


def test_bm25_prefers_the_document_with_the_rare_query_term():
    index = BM25Index(["a", "b", "c"], ["we went to the lake", "the pottery class was fun", "the lake and the pottery"])
    assert index.search("pottery class", 3)[0] == "b"
    assert index.search("what did they do", 3) == []  # stop words only: nothing matches


def test_stub_vectors_are_deterministic_unit_vectors():
    first, again, other, empty = stub_embed(["I painted a sunrise", "I painted a sunrise", "pottery class", ""])
    assert first == again
    assert len(first) == DIMENSIONS
    assert sum(x * x for x in first) == pytest.approx(1.0)
    assert sum(x * x for x in empty) == pytest.approx(1.0)
    assert first != other


def test_stub_server_answers_bad_input_clearly_and_keeps_the_connection_usable():
    process = subprocess.Popen(
        [sys.executable, str(BENCH_DIR / "minilm_server.py"), "--stub", "--port", "0"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        line = process.stdout.readline().strip()
        assert line.startswith("listening on http://127.0.0.1:")
        port = int(line.rsplit(":", 1)[1].split("/")[0])
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)

        def post(path: str, body: bytes) -> tuple[int, dict]:
            connection.request("POST", path, body=body, headers={"Content-Type": "application/json"})
            response = connection.getresponse()
            return response.status, json.loads(response.read())

        # An unknown route with a body must not desynchronise the keep-alive connection.
        assert post("/count_tokens", json.dumps({"texts": ["a b c"]}).encode())[0] == 404
        status, answer = post("/embed", json.dumps({"texts": ["one", "two"]}).encode())
        assert status == 200 and len(answer["embeddings"]) == 2
        status, answer = post("/embed", b"not json")
        assert status == 400 and "not JSON" in answer["error"]
        status, answer = post("/embed", json.dumps({"texts": "one"}).encode())
        assert status == 400 and "list of strings" in answer["error"]
    finally:
        process.terminate()
        process.wait(timeout=10)


def test_our_servers_get_the_callers_pythonpath_and_the_reference_never(monkeypatch, tmp_path):
    # Without it `PYTHONPATH=<tree> python bench/latency.py` measured the installed package.
    from mcp_driver import server_environment

    monkeypatch.setenv("PYTHONPATH", "/some/tree")
    assert server_environment("ours", {}, tmp_path)["PYTHONPATH"] == "/some/tree"
    assert server_environment("ours-pg", {}, tmp_path)["PYTHONPATH"] == "/some/tree"
    assert "PYTHONPATH" not in server_environment("ref", {}, tmp_path)
    assert server_environment("ours", {"PYTHONPATH": "/other"}, tmp_path)["PYTHONPATH"] == "/other"
    monkeypatch.delenv("PYTHONPATH")
    assert "PYTHONPATH" not in server_environment("ours", {}, tmp_path)
