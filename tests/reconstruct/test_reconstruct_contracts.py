"""reconstruct contract points the first test module left open (spec associations-and-reconstruct §8).

Real SQLite files throughout; where a point can only fire on a database the
reference's own dedup index would forbid (RX-14, spec §12 point 3) the test
drops that index first, as such a legacy database would lack it.
"""

from __future__ import annotations

import json
import sqlite3

import pytest
from sqlalchemy import text

from cpersona.services.graph.associations import declare_associations
from cpersona.services.records.episodes import archive_episode
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
    return f"mem:{out['id']}"


def _clone_with_msg_id(app, ref, content, stamp, msg_id):
    """A second row under the same caller id: only possible without the dedup index (RX-14 R note)."""
    ident = int(ref.split(":")[1])
    with app.db.write_connection() as conn:
        conn.exec_driver_sql("DROP INDEX IF EXISTS idx_memories_dedup_msg_id")
        conn.execute(text("UPDATE memories SET msg_id = :m WHERE id = :i"), {"m": msg_id, "i": ident})
        new_id = conn.execute(
            text(
                "INSERT INTO memories (agent_id, msg_id, content, source, timestamp, metadata, project_id, channel)"
                " SELECT agent_id, msg_id, :c, source, :s, metadata, project_id, channel FROM memories WHERE id = :i"
                " RETURNING id"
            ),
            {"c": content, "s": stamp, "i": ident},
        ).scalar_one()
    return f"mem:{new_id}"


def _item_with(out, ref):
    return next(i for i in out["items"] if any(c["ref"] == ref for c in i.get("claims", [])))


def test_msg_id_bundles_newest_version_heads_and_older_is_superseded(app):
    old = _put(app, "Quarterly budget review moved to room 4.", "2026-05-01T09:00:00+00:00", source_id="q1")
    new = _clone_with_msg_id(
        app, old, "Quarterly budget review moved to room 7.", "2026-05-03T09:00:00+00:00", "note-42"
    )
    out = reconstruct(app, agent_id=A, query="quarterly budget review room")
    item = _item_with(out, old)
    assert item["independence_reason"] == "cluster:msg_id"  # spec RX-14, RX-28
    assert item["head_ref"] == new  # spec RX-23: the newest version of the record heads the item
    claims = {c["ref"]: c for c in item["claims"]}
    assert [c["ref"] for c in item["claims"]] == [new, old]  # spec RX-25: newest first
    assert claims[old]["roles"] == [{"ref": new, "role": "supersedes"}]  # spec RX-26 (1)
    assert "roles" not in claims[new]  # spec RX-41: empty roles omitted
    assert all(c["why"] == "cluster:msg_id" for c in item["claims"])
    assert "conflicts" not in item  # different timestamps can be ordered


def test_same_msg_id_same_timestamp_is_a_conflict(app):
    first = _put(app, "Door code for the lab is 1234.", "2026-05-01T09:00:00+00:00", source_id="q1")
    second = _clone_with_msg_id(app, first, "Door code for the lab is 9876.", "2026-05-01T09:00:00+00:00", "code")
    item = _item_with(reconstruct(app, agent_id=A, query="door code lab"), first)
    assert item["conflicts"] == [
        {"refs": sorted([first, second]), "reason": "same_msg_id_same_timestamp", "msg_id": "code"}
    ]  # spec RX-27
    assert all("roles" not in c for c in item["claims"])  # equal timestamps: no successor (RX-26 (1))


def test_episode_bundles_memories_in_its_span_and_supports_them(app):
    inside = _put(app, "Standup: the migration window is Tuesday night.", "2026-06-02T10:05:00+00:00", source_id="m1")
    outside = _put(
        app, "Standup: the migration window was discussed again later.", "2026-06-20T10:05:00+00:00", source_id="m2"
    )
    ep = archive_episode(
        app,
        agent_id=A,
        summary="Standup about the migration window",
        history=[
            {"role": "user", "content": "migration window", "timestamp": "2026-06-02T10:00:00+00:00"},
            {"role": "user", "content": "ok", "timestamp": "2026-06-02T10:30:00+00:00"},
        ],
    )
    assert ep["ok"] is True, ep
    ep_ref = f"ep:{ep['episode_id']}"
    out = reconstruct(app, agent_id=A, query="standup migration window")
    item = next(i for i in out["items"] if any(c["ref"] == ep_ref for c in i["claims"]))
    refs = [c["ref"] for c in item["claims"]]
    assert inside in refs and outside not in refs  # spec RX-15: only memories inside [start, end] join
    assert item["independence_reason"] == "cluster:episode"  # spec RX-28
    claim = next(c for c in item["claims"] if c["ref"] == inside)
    assert claim["why"] == "cluster:episode"
    assert claim["roles"] == [{"ref": ep_ref, "role": "supports"}]  # spec RX-26 (2)
    assert refs.index(inside) < refs.index(ep_ref) or claim["as_of"] > item["claims"][-1]["as_of"]  # RX-25


def test_declared_record_relation_bundles_and_gives_a_role(app):
    wrong = _put(app, "The backup bucket is s3://alpha-backups.", "2026-04-01T08:00:00+00:00", source_id="b1")
    fix = _put(app, "Correction: the backup bucket is s3://beta-backups.", "2026-04-03T08:00:00+00:00", source_id="b2")
    plain = reconstruct(app, agent_id=A, query="backup bucket")
    assert len(plain["items"]) == 2  # not bundled before the declaration
    declared = declare_associations(
        app,
        agent_id=A,
        associations={
            "relations": [
                {"subject": fix, "predicate": "Corrects", "object": wrong},
                {"subject": fix, "predicate": "mentions_bucket", "object": wrong},
            ]
        },
    )
    assert declared["ok"] is True and len(declared["relations"]) == 2, declared
    out = reconstruct(app, agent_id=A, query="backup bucket")
    assert len(out["items"]) == 1  # spec RX-17: a record → record relation between candidates joins them
    item = out["items"][0]
    assert item["independence_reason"] == "cluster:relation"  # spec RX-28
    claims = {c["ref"]: c for c in item["claims"]}
    assert claims[wrong]["roles"] == [{"ref": fix, "role": "corrects"}]  # spec RX-26 (3), predicate folded
    assert "roles" not in claims[fix]  # the role is on the object; the non-role predicate gives none
    assert claims[wrong]["why"].startswith("relation:")


NAMES = ("alpha", "bravo", "charlie", "delta", "echo")


def _burst(app, n, source="burst"):
    return [
        _put(
            app,
            f"Restart log: cache node {NAMES[i]} restarted after the incident.",
            f"2026-03-01T10:00:{i:02d}+00:00",
            source_id=source,
        )
        for i in range(n)
    ]


def test_max_evidence_cuts_claims_and_says_so(app):
    _burst(app, 4)
    out = reconstruct(app, agent_id=A, query="cache node restarted", max_evidence=2, deep=True)
    item = out["items"][0]
    assert len(item["claims"]) == 2 and item["claims_omitted"] == 2  # spec RX-24 (4 rows, 2 kept)
    assert out["bounds"]["omitted"] == ["max_evidence"]  # spec RX-42
    assert out["bounds"]["max_evidence"] == 2 and out["bounds"]["top_k"] == 20
    full = reconstruct(app, agent_id=A, query="cache node restarted", deep=True)
    assert len(full["items"][0]["claims"]) == 4  # deep admits all four (GATE-4)
    assert "claims_omitted" not in full["items"][0]
    assert "bounds" not in full  # spec RX-40


def test_top_k_reached(app):
    for i in range(3):
        _put(app, f"Printer on floor {i} is out of toner.", f"2026-02-0{i + 1}T10:00:00+00:00", source_id=f"p{i}")
    out = reconstruct(app, agent_id=A, query="printer toner", top_k=2, deep=True)
    assert "top_k" in out["bounds"]["reached"] and out["bounds"]["top_k"] == 2  # spec RX-11, RX-42
    wide = reconstruct(app, agent_id=A, query="printer toner", top_k=50, deep=True)
    assert "bounds" not in wide


def test_walk_meeting_the_per_entity_read_bound_reports_reached_max_evidence(app):
    head = _put(app, "Mina approves hotfixes during the deploy freeze.", "2026-07-01T10:00:00+00:00", source_id="x0")
    walked = [
        _put(app, f"Calendar note {i} for ops.", f"2026-07-0{i + 2}T10:00:00+00:00", source_id=f"c{i}")
        for i in range(3)
    ]
    declare_associations(
        app,
        agent_id=A,
        anchor_ref=head,
        associations={
            "entities": [{"name": "Mina"}],
            "relations": [{"subject": "Mina", "predicate": "owns", "object": "Release calendar"}],
        },
    )
    for ref in walked:
        declare_associations(app, agent_id=A, anchor_ref=ref, associations={"entities": [{"name": "Release calendar"}]})
    out = reconstruct(app, agent_id=A, query="deploy freeze hotfixes", max_evidence=2)
    assert "max_evidence" in out["bounds"]["reached"]  # spec RX-22, RX-42: 3 records > max_evidence 2
    wide = reconstruct(app, agent_id=A, query="deploy freeze hotfixes", max_evidence=10)
    assert "bounds" not in wide
    assert sum(1 for c in wide["items"][0]["claims"] if c.get("hops") == 1) == 3


def test_declared_names_widen_the_lexical_search(app):
    only_alias = _put(app, "M. Tanaka signs off the quarterly audit.", "2026-01-05T10:00:00+00:00", source_id="t1")
    _put(app, "Unrelated note about parking.", "2026-01-06T10:00:00+00:00", source_id="t2")
    before = reconstruct(app, agent_id=A, query="who is Mina")
    assert all(i["head_ref"] != only_alias for i in before["items"])
    declare_associations(app, agent_id=A, associations={"entities": [{"name": "Mina", "aliases": ["M. Tanaka"]}]})
    out = reconstruct(app, agent_id=A, query="who is Mina", trace=True)
    assert only_alias in [i["head_ref"] for i in out["items"]]  # spec RX-7, RX-8
    assert out["trace"]["cues"] == {"entities": ["Mina"], "terms": ["M. Tanaka"]}  # spec RX-43


def test_lowered_bounds_are_reported_with_the_applied_values(app):
    _burst(app, 2)
    out = reconstruct(app, agent_id=A, query="incident cache", max_hops=9, max_evidence=500)  # outside the schema
    assert out["bounds"] == {"top_k": 20, "max_hops": 5, "max_evidence": 100}  # spec RX-6


def test_nothing_declared_is_byte_identical_to_a_database_without_association_tables(tmp_path):
    from cpersona.storage.migrate import open_and_upgrade

    outputs = []
    for name in ("with", "without"):
        db = open_and_upgrade(tmp_path / f"{name}.db")
        app = make_app(db)
        _burst(app, 3)
        _put(app, "Cache node replaced on Friday.", "2026-03-05T10:00:00+00:00", source_id="other")
        if name == "without":
            with sqlite3.connect(db.path) as con:
                for table in ("relations", "entity_mentions", "entity_aliases", "entities"):
                    con.execute(f"DROP TABLE {table}")
        out = reconstruct(app, agent_id=A, query="cache node", trace=True)
        out.pop("advisory", None)
        outputs.append(json.dumps(out, ensure_ascii=False, sort_keys=False))
    assert outputs[0] == outputs[1]  # spec RX-51


def test_excerpt_from_a_node_set_ranked_without_a_query_vector_says_lexical_only(app):
    # Two adjacent rows: the older one is an excerpt of the item and carries a node set (OV-2 partition).
    first_part = "Weather notes for the week. " * 10
    second_part = "The vault rotation key lives in the HSM."
    long_text = first_part + second_part
    older = _put(app, long_text, "2026-09-01T10:00:00+00:00", source_id="v")
    _put(app, "Vault rotation key HSM follow-up.", "2026-09-01T10:00:10+00:00", source_id="v")
    plain = reconstruct(app, agent_id=A, query="vault rotation key HSM", deep=True)
    assert "quote_selection" not in plain  # no node set used yet
    cut = len(first_part)
    with app.db.write_connection() as conn:
        conn.execute(
            text(
                "INSERT INTO record_nodes (parent_kind, parent_id, node_index, start_char, end_char,"
                ' token_count, "window", embedding, embedding_model)'
                " VALUES ('mem', :p, :n, :a, :b, 1, 256, NULL, '')"
            ),
            [
                {"p": int(older.split(":")[1]), "n": 0, "a": 0, "b": cut},
                {"p": int(older.split(":")[1]), "n": 1, "a": cut, "b": len(long_text)},
            ],
        )
    out = reconstruct(app, agent_id=A, query="vault rotation key HSM", deep=True)
    excerpt = next(e for i in out["items"] for e in i.get("excerpts", []) if e["ref"] == older)
    assert excerpt["content"] == second_part  # spec RX-32: the lexically best node is quoted
    assert excerpt["node"] == {"index": 1, "of": 2, "span": [cut, len(long_text)]}
    assert out["quote_selection"] == "lexical_only"  # spec RX-33: keyword-only server, no query vector


def test_a_multi_word_declared_name_is_searched_as_one_phrase(app):
    phrase = _put(
        app, "Project North Star shipped its beta to the pilot users.", "2026-01-05T10:00:00+00:00", source_id="n1"
    )
    scattered = _put(
        app,
        "North of the river, the star festival project needs volunteers.",
        "2026-01-06T10:00:00+00:00",
        source_id="n2",
    )
    declare_associations(
        app, agent_id=A, associations={"entities": [{"name": "Orion", "aliases": ["Project North Star"]}]}
    )
    out = reconstruct(app, agent_id=A, query="status of Orion", trace=True)
    assert out["trace"]["cues"]["terms"] == ["Project North Star"]  # spec RX-7
    # spec RX-8: the alias is one quoted phrase, not "Project" OR "North" OR "Star"
    assert phrase in out["trace"]["candidate_refs"]
    assert scattered not in out["trace"]["candidate_refs"]
