"""``trace: true`` audit fields beyond candidates and clusters: coverage and node_order (spec RX-43).

The expected parts, kinds and spans were measured on the reference with the
same queries.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from cpersona.config import load_settings
from cpersona.embedding.client import build_embedder
from cpersona.services.app import App
from cpersona.services.records.memories import store
from cpersona.services.reconstruct import reconstruct
from cpersona.services.reconstruct.audit import query_parts
from conftest import db_settings_env
from embed_server import EmbedServer

A = "agent"


def _put(app, content, stamp, source_id):
    out = store(app, content=content, agent_id=A, timestamp=stamp, source={"type": "User", "id": source_id, "name": ""})
    assert out.get("ok", True) is not False, out
    return f"mem:{out['id']}"


def test_query_parts_follow_the_reference_split():  # spec RX-43 coverage
    query = (
        "What did the apple pie do on 2023-05-07 at 5pm? 東京タワー CVE-2024-3094 e.g. x banana_bread A.B. dont-know"
    )
    folded, parts = query_parts(query)
    assert [(folded[s:e], kind) for (s, e), kind in ((p["span"], p["kind"]) for p in parts)] == [
        ("what", "identifier"),
        ("did", "identifier"),
        ("the", "identifier"),
        ("apple", "identifier"),
        ("pie", "identifier"),
        ("do", "identifier"),
        ("on", "identifier"),
        ("2023-05-07", "identifier"),
        ("at", "identifier"),
        ("5pm", "identifier"),
        ("東京", "kanji"),
        ("タワー", "katakana"),
        ("cve-2024-3094", "identifier"),
        ("e.g", "identifier"),
        ("banana_bread", "identifier"),
        ("a.b", "identifier"),
        ("dont-know", "identifier"),
    ]
    # single characters, hiragana and hangul are no parts; NFKC folds full-width letters; é breaks an identifier
    _, parts = query_parts("grape ape ice 猫 の ねこ 한국 x1 A Ünïcode ＡＢＣ")
    assert [p["span"] for p in parts] == [[0, 5], [6, 9], [10, 13], [24, 26], [32, 36], [37, 40]]


@pytest.mark.both_backends
def test_coverage_names_the_cited_records_holding_each_part(app):
    pie = _put(app, "Apple pie recipe from grandma", "2026-03-01T10:00:00+00:00", "a1")
    _put(app, "Banana bread baking notes", "2026-03-10T10:00:00+00:00", "b1")
    out = reconstruct(app, agent_id=A, query="grandma apple pie zebra", trace=True)
    cited = [c["ref"] for i in out["items"] for c in i["claims"]]
    assert cited == [pie]
    assert out["trace"]["coverage"] == {  # spec RX-43: substring of the folded stored text
        "normalization": "nfkc-lower",
        "parts": [
            {"span": [0, 7], "kind": "identifier"},
            {"span": [8, 13], "kind": "identifier"},
            {"span": [14, 17], "kind": "identifier"},
            {"span": [18, 23], "kind": "identifier"},
        ],
        "covered_by": [[pie], [pie], [pie], []],
        "uncovered": [3],
        "records": 1,
    }
    blank = reconstruct(app, agent_id=A, query="", trace=True)
    assert blank["trace"]["coverage"]["parts"] == [] and blank["trace"]["coverage"]["records"] == 2
    nothing = reconstruct(app, agent_id=A, query="zzzz qqqq", trace=True)
    assert nothing["items"] == [] and "coverage" not in nothing["trace"]  # no cited record, no coverage
    assert "node_order" not in out["trace"]  # nothing quoted from nodes
    assert "coverage" not in reconstruct(app, agent_id=A, query="grandma apple pie")  # trace only


@pytest.fixture
def server() -> Iterator[EmbedServer]:
    running = EmbedServer(token_window=40).start()
    yield running
    running.stop()


@pytest.fixture
def http_app(db, server) -> Iterator[App]:
    settings = load_settings(
        {
            **db_settings_env(db),
            "CPERSONA_EMBEDDING_MODE": "http",
            "CPERSONA_EMBEDDING_URL": server.url,
            "CPERSONA_TASK_RETRY_DELAY": "0",
        }
    )
    made = App(db=db, settings=settings, embedder=build_embedder(settings))
    yield made
    made.task_queue.stop()
    made.embedder.close()


def test_node_order_lists_the_best_nodes_of_records_quoted_from_nodes(http_app):
    long_text = " ".join(
        f"Sentence {i} is about the {'gateway cache eviction' if i == 17 else 'weather'}." for i in range(40)
    )
    # Same source within a minute: one item (adjacency); the long row is the excerpt, quoted from a node.
    first = _put(http_app, long_text, "2026-08-01T10:00:00+00:00", "s1")
    head = _put(http_app, "Follow-up on gateway cache eviction.", "2026-08-01T10:00:20+00:00", "s1")
    http_app.task_queue.drain()
    out = reconstruct(http_app, agent_id=A, query="gateway cache eviction", trace=True)
    item = next(i for i in out["items"] if i["head_ref"] == head)
    excerpt = next(e for e in item["excerpts"] if e["ref"] == first)
    assert "node" in excerpt  # spec RX-32: quoted from its node set
    order = out["trace"]["node_order"][first]
    assert order[0] == excerpt["node"]["index"]  # the quoted node is the best one (spec RX-43)
    assert 1 <= len(order) <= 3 and len(set(order)) == len(order)
    assert "gateway cache eviction" in excerpt["content"]
    assert head not in out["trace"]["node_order"]  # a whole-text head is not quoted from nodes
