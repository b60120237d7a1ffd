"""Passage sequences: `whole` under the modes, `evidence` / `whole` by setting (spec RX-37, RX-43 sequence, §7.4).

The expected passages, spans and ranks are the reference's answers (CPersona
2.6.14 over MCP, embeddings off) on the same three rows.
"""

from __future__ import annotations

import pytest

from cpersona.services.records.contents import revision_of
from cpersona.services.records.memories import store
from cpersona.services.reconstruct import reconstruct
from cpersona.services.reconstruct.quote import divide
from conftest import make_app

pytestmark = pytest.mark.both_backends

A = "a"
WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa".split()
PARA = "\n\n".join(" ".join(f"{WORDS[(i * 3 + j) % 10]}{j}" for j in range(60 + 7 * i)) + "." for i in range(8))
FIRST, SECOND = "Ledger intro. " + PARA, "Ledger two. " + PARA[::-1]

REFERENCE_TAKEN = [
    ("mem:2", [0, 41], 0, 0),
    ("mem:1", [13, 466], 1, 0),
    ("mem:3", [0, 11], 2, 0),
    ("mem:1", [466, 974], 1, 1),
    ("mem:1", [974, 1534], 1, 2),
    ("mem:3", [11, 811], 2, 1),
    ("mem:1", [1534, 2150], 1, 3),
    ("mem:3", [1590, 2351], 2, 2),
    ("mem:1", [2150, 2820], 1, 4),
    ("mem:3", [2351, 3151], 2, 3),
    ("mem:1", [2820, 3541], 1, 5),
    ("mem:3", [3637, 4437], 2, 4),
    ("mem:1", [3541, 4320], 1, 6),
    ("mem:1", [4320, 5120], 1, 7),
    ("mem:1", [0, 13], 1, 8),
]


def _rows(app):
    for content, stamp in (
        (FIRST, "2026-09-01T10:00:00+00:00"),
        ("Short ledger note about kappa3 and beta1.", "2026-09-02T10:00:00+00:00"),
        (SECOND, "2026-09-03T10:00:00+00:00"),
    ):
        assert store(app, agent_id=A, content=content, timestamp=stamp).get("ok", True) is not False


def test_a_blank_line_cuts_after_each_line_feed():  # spec §7.4: every end of every class is a cut
    # cuts after each "\n" (4 and 5); the lone "\n" piece joins the next block
    assert divide("one\n\n.two") == [(0, 4), (4, 9)]
    blocks = divide(SECOND)
    assert (744, 851) in blocks and any(start == 851 for start, _ in blocks)  # the lone "\n" joins the next block


def test_pro_orders_every_passage_of_every_item(app):  # spec RX-37, RX-43
    _rows(app)
    out = reconstruct(app, agent_id=A, query="ledger kappa3 beta1", mode="pro", deep=True, trace=True)
    sequence = out["trace"]["sequence"]
    assert sequence["mode"] == "whole" and sequence["candidates"] == 15
    assert [
        (t["ref"], t["span"], t["ranks"]["record"], t["ranks"]["inside"]) for t in sequence["taken"]
    ] == REFERENCE_TAKEN
    assert all(t["ranks"]["cosine"] is None for t in sequence["taken"])  # no block vectors here
    items = {i["head_ref"]: i for i in out["items"]}
    assert items["mem:1"]["ranges"] == [[0, 5120]] and items["mem:1"]["content_len"] == 5160
    assert items["mem:1"]["expand"] == {"ref": "mem:1", "span": [4320, 5160], "revision": revision_of(FIRST)}
    assert items["mem:3"]["ranges"] == [[0, 811], [1590, 3151], [3637, 4437]]
    assert items["mem:3"]["expand"] == {"ref": "mem:3", "span": [11, 851], "revision": revision_of(SECOND)}
    assert items["mem:3"]["context_incomplete"] is True and items["mem:3"]["quote_basis"] == "lexical"
    assert items["mem:3"]["content"] == " \u2026 ".join(SECOND[s:e] for s, e in items["mem:3"]["ranges"])
    assert out["budget_policy"] == {"source": "server_default", "clamped": False, "reason": "bounded_by_the_cap"}
    assert out["effective_budget"] == out["used_budget"] == sum(len(i["content"]) for i in out["items"])  # RX-5


def test_lite_takes_the_longest_prefix_that_fits(app):  # spec RX-36, RX-37, RX-45
    _rows(app)
    full = reconstruct(app, agent_id=A, query="ledger kappa3 beta1", mode="lite", deep=True)
    assert [(i["head_ref"], len(i["content"])) for i in full["items"]] == [
        ("mem:2", 41),
        ("mem:1", 1521),
        ("mem:3", 811),
    ]
    assert full["items"][2]["expand"] == {"ref": "mem:3", "span": [11, 851], "revision": revision_of(SECOND)}
    tight = reconstruct(app, agent_id=A, query="ledger kappa3", mode="lite", budget=900, deep=True)
    assert [(i["head_ref"], len(i["content"])) for i in tight["items"]] == [
        ("mem:2", 41),
        ("mem:1", 466),
        ("mem:3", 11),
    ]
    assert all("ranges" not in i for i in tight["items"])  # the mode shape (RX-45)


def test_the_sequence_setting_applies_without_a_mode(db):  # spec RX-34, RX-37
    app = make_app(db, RECONSTRUCT_SEQUENCE="evidence")
    _rows(app)
    out = reconstruct(app, agent_id=A, query="ledger kappa3 beta1", deep=True, trace=True)
    sequence = out["trace"]["sequence"]
    assert sequence["mode"] == "evidence" and sequence["candidates"] == 15
    # evidence: plain fusion of item and passage positions, no whole-records-first step
    first = [(t["ranks"]["record"], t["ranks"]["inside"]) for t in sequence["taken"][:4]]
    assert first == [(0, 0), (1, 0), (2, 0), (1, 1)]
    assert "ranges" in out["items"][0]  # the full shape, not the mode's
    items_sequence = reconstruct(make_app(db), agent_id=A, query="ledger kappa3 beta1", deep=True, trace=True)
    assert "sequence" not in items_sequence["trace"]  # the default `items` sequence uses head quotes


def test_pro_moves_the_later_passages_of_long_held_records_to_the_end():  # spec RX-37 (pro)
    from cpersona.services.reconstruct.sequence import Passage, order

    texts = ["y" * 7000, "x" * 900, "z" * 300]  # item 0 is held and longer than 6,000 characters
    passages = [
        [Passage(0, 0, 0, 800, 800), Passage(0, 1, 800, 1600, 1600)],
        [Passage(1, 0, 0, 800, 800), Passage(1, 1, 800, 900, 900)],
        [Passage(2, 0, 0, 300, 300, whole=True)],
    ]
    held = [True, False, False]
    pro = order(passages, texts, held, kind="whole", pro=True, rrf_k=60)
    assert [(p.item, p.inside) for p in pro] == [(2, 0), (0, 0), (1, 0), (1, 1), (0, 1)]
    lite = order(passages, texts, held, kind="whole", pro=False, rrf_k=60)
    assert [(p.item, p.inside) for p in lite] == [(2, 0), (0, 0), (0, 1), (1, 0), (1, 1)]
    evidence = order(passages, texts, held, kind="evidence", pro=False, rrf_k=60)
    assert [(p.item, p.inside) for p in evidence] == [(0, 0), (0, 1), (1, 0), (2, 0), (1, 1)]
