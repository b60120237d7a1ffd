"""The coarse vector index (revision 0007): in step with the float vectors, isolated, reaching old rows.

``memories_coarse`` / ``episodes_coarse`` hold each vector's sign bits beside
copies of the isolation columns (storage/coarse_sqlite.py). The invariant is
checked against the rows themselves after every write path of the table
below, each driven through its real service on a real SQLite file, with the
real local embedding server of tests/embed_server.py answering over HTTP.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from alembic import command
from sqlalchemy import text

from cpersona.embedding.vectors import to_blob
from cpersona.services.app import App
from cpersona.services.portability.export import export_memories
from cpersona.services.portability.import_db import import_db
from cpersona.services.portability.importer import import_memories
from cpersona.services.portability.merge import merge_memories
from cpersona.services.records.admin import delete_agent_data, delete_episode, delete_memory, update_memory
from cpersona.services.records.backfill import backfill_pass
from cpersona.services.records.episodes import archive_episode
from cpersona.services.records.memories import store
from cpersona.services.recall.retrievers import search_backend
from cpersona.services.recall.service import recall
from cpersona.storage import coarse_sqlite
from cpersona.storage.engine import open_sqlite
from cpersona.storage.migrate import alembic_config, upgrade
from cpersona.storage.repositories.embedding_identity import EmbeddingIdentityRepository
from cpersona.storage.scope import Scope
from cpersona.storage.vectors_sqlite import scan_parameters
from embed_server import EmbedServer, embed_text
from test_vector_channel import DIM, add_memories, embedding_app, refs, stamp, unit

pytestmark = pytest.mark.sqlite_only  # the coarse index is SQLite's (PostgreSQL has pgvector's own)


@pytest.fixture
def server():
    srv = EmbedServer(dimension=DIM).start()
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture
def app(db, server):
    application = embedding_app(db, server, DEGRADED_ADVISORY="false")
    yield application
    application.embedder.close()


def rows(db, sql: str, **params: Any) -> list[tuple]:
    with db.read() as session:
        return [tuple(r) for r in session.execute(text(sql), params).all()]


def expected(db, table: str) -> set[tuple]:
    """What the coarse table must hold, derived in Python from the rows' own vectors."""
    source = ", CAST(CASE WHEN json_valid(source) THEN json_extract(source, '$.id') END AS TEXT)" \
        if table == "memories" else ""
    found = set()
    for row in rows(db, f"SELECT agent_id, created_at, id, project_id, channel{source}, embedding FROM {table}"):
        blob = row[-1]
        if not isinstance(blob, bytes) or not blob or len(blob) % 32:
            continue
        bits = np.packbits(np.frombuffer(blob, dtype="<f4") > 0, bitorder="little").tobytes()
        found.add((*row[:-1], bits))
    return found


def actual(db, table: str) -> set[tuple]:
    source = ", source_key" if table == "memories" else ""
    return set(rows(db, f"SELECT agent_id, created_at, id, project_id, channel{source}, bits FROM {table}_coarse"))


def snapshot(db) -> tuple[set[tuple], set[tuple]]:
    return actual(db, "memories"), actual(db, "episodes")


def assert_in_step(db) -> None:
    for table in ("memories", "episodes"):
        assert actual(db, table) == expected(db, table), table


# -- the write paths -----------------------------------------------------------------------------


def _seed(app: App) -> dict[str, int]:
    ids = {}
    for i, content in enumerate(["alpha apples", "beta bananas", "gamma grapes"]):
        ids[content] = store(app, agent_id="a", content=content, id=f"m{i}",
                             source={"type": "User", "id": "u1", "name": "U"})["id"]
    store(app, agent_id="b", content="delta dates", channel="c1", project_id="p1")
    assert archive_episode(app, agent_id="a", summary="we ate fruit")["ok"] is True
    ids["ep"] = rows(app.db, "SELECT max(id) FROM episodes")[0][0]
    return ids


def path_store(app, db, ids, tmp_path, server):
    assert store(app, agent_id="a", content="epsilon elderberries", channel="c2")["ok"] is True


def path_edit(app, db, ids, tmp_path, server):
    assert update_memory(app, memory_id=ids["alpha apples"], content="alpha apricots", agent_id="a")["ok"] is True


def path_delete(app, db, ids, tmp_path, server):
    assert delete_memory(app, memory_id=ids["beta bananas"], agent_id="a")["ok"] is True


def path_archive_episode(app, db, ids, tmp_path, server):
    assert archive_episode(app, agent_id="b", summary="a second episode", project_id="p1")["ok"] is True


def path_delete_episode(app, db, ids, tmp_path, server):
    assert delete_episode(app, episode_id=ids["ep"], agent_id="a")["ok"] is True


def path_delete_agent_data(app, db, ids, tmp_path, server):
    assert delete_agent_data(app, agent_id="a")["ok"] is True


def path_merge_copy(app, db, ids, tmp_path, server):
    assert merge_memories(app, source_agent_id="a", target_agent_id="c", mode="copy")["ok"] is True


def path_merge_move(app, db, ids, tmp_path, server):
    assert merge_memories(app, source_agent_id="a", target_agent_id="c", mode="move")["ok"] is True


def path_import(app, db, ids, tmp_path, server):
    out = tmp_path / "export.jsonl"
    assert export_memories(app, agent_id="a", output_path=str(out), include_embeddings=True)["ok"] is True
    assert import_memories(app, input_path=str(out), target_agent_id="imported")["ok"] is True


def path_import_db(app, db, ids, tmp_path, server):
    other = open_sqlite(tmp_path / "other" / "other.db")
    try:
        upgrade(other)
        with other.write_connection() as conn:
            conn.execute(text("INSERT INTO memories (agent_id, content, timestamp, embedding) "
                              "VALUES ('z', 'from another file', '2026-01-01', :e)"), {"e": to_blob(unit(1.0, 2.0))})
    finally:
        other.close()
    assert import_db(app, str(tmp_path / "other" / "other.db"))["ok"] is True


def path_backfill(app, db, ids, tmp_path, server):
    server.status = 503
    assert store(app, agent_id="a", content="zeta zucchini")["embedded"] is False
    server.status = 200
    assert backfill_pass(app).memories == 1


def path_model_change(app, db, ids, tmp_path, server):
    # What reconcile() does when the live model differs from the recorded one (it asks the
    # backend's capability report, which this server does not give): clear every vector.
    with db.write() as session:
        assert EmbeddingIdentityRepository(session).clear_vectors() == 5
    assert_in_step(db)
    assert actual(db, "memories") == set()


def path_reembed_after_model_change(app, db, ids, tmp_path, server):
    path_model_change(app, db, ids, tmp_path, server)
    server.vector = lambda text: embed_text("another model: " + text, DIM)  # its vectors differ
    report = backfill_pass(app)  # the new model's vectors: every coarse row comes back, rewritten
    assert (report.memories, report.episodes) == (4, 1)


def path_raw_sql(app, db, ids, tmp_path, server):
    # Any statement, not only ours: scope columns, the stamp and the source move the coarse copy too.
    with db.write_connection() as conn:
        conn.execute(text("UPDATE memories SET channel = 'moved', project_id = 'p9', created_at = '2020-01-01 00:00:00', "
                          "source = '{\"id\": \"u2\"}' WHERE id = :i"), {"i": ids["gamma grapes"]})
        conn.execute(text("UPDATE memories SET embedding = x'0000' WHERE id = :i"), {"i": ids["alpha apples"]})


WRITE_PATHS: dict[str, Callable[..., None]] = {
    name.removeprefix("path_"): fn for name, fn in dict(globals()).items() if name.startswith("path_")
}


@pytest.mark.parametrize("path", sorted(WRITE_PATHS))
def test_coarse_index_is_in_step_after_every_write_path(db, app, server, tmp_path, path):
    ids = _seed(app)
    assert_in_step(db)
    before = snapshot(db)
    WRITE_PATHS[path](app, db, ids, tmp_path, server)
    assert snapshot(db) != before, "the path changed no coarse row: it was not exercised"
    assert_in_step(db)


def test_the_table_of_write_paths_is_complete():
    assert set(WRITE_PATHS) == {
        "store", "edit", "delete", "archive_episode", "delete_episode", "delete_agent_data", "merge_copy",
        "merge_move", "import", "import_db", "backfill", "model_change", "reembed_after_model_change", "raw_sql"}


# -- the far list through the coarse index -------------------------------------------------------


def far(app, scope: Scope, query: list[float], *, window: tuple[int, int], depth: int = 5, source_id: str = "",
        kind: str = "mem") -> list[int]:
    hits = search_backend(app).vector_candidates(kind, scope, to_blob(query), depth, threshold=-1.0,
                                                 window=window, source_id=source_id)
    return [h.record.id for h in hits]


def test_isolation_is_inside_the_coarse_scan(db, app):  # spec ISO-2, ISO-3
    # Far more rows of other scopes lie nearer the query than the coarse index keeps candidates
    # for: a filter applied after the Hamming ranking would leave agent a's row out.
    crowd = coarse_sqlite.MIN_CANDIDATES + 100
    rng = np.random.default_rng(7)
    query = rng.normal(size=DIM)
    near = [list(query + rng.normal(0, 0.05, DIM)) for _ in range(crowd)]  # the query's sign bits, nearly all
    add_memories(db, *({"agent_id": "b", "content": f"b {i}", "embedding": v, "created_at": stamp(i)}
                       for i, v in enumerate(near)))
    add_memories(db, *({"agent_id": "a", "content": f"a other project {i}", "project_id": "p2",
                        "embedding": v, "created_at": stamp(i)} for i, v in enumerate(near)))
    add_memories(db, *({"agent_id": "a", "content": f"a other user {i}", "source": '{"id": "u2"}',
                        "embedding": v, "created_at": stamp(i)} for i, v in enumerate(near)))
    mine = add_memories(db, {"agent_id": "a", "content": "mine, farther from the query", "source": '{"id": "u1"}',
                             "embedding": list(query + rng.normal(0, 1.0, DIM)), "created_at": stamp(-5)},
                        {"agent_id": "a", "content": "mine, newest", "source": '{"id": "u1"}',
                         "embedding": unit(0.0, 1.0), "created_at": stamp(9999)})
    q = list(query)
    scope = Scope(agent_id="a", project_id="p1")
    assert far(app, scope, q, window=(1, 10**9), source_id="u1") == [mine[0]]  # project and source axes
    assert far(app, Scope(agent_id="a", project_id="p1"), q, window=(1, 10**9), source_id="u2")[0] > 2 * crowd
    assert far(app, Scope(agent_id="c"), q, window=(1, 10**9)) == []


def test_old_rows_beyond_the_window_are_found_by_recall(db, server):  # spec VEC-7
    add_memories(db, *({"content": f"filler note {i}", "embedding": unit(0.0, 1.0, float(i)),
                        "created_at": stamp(100 + i)} for i in range(300)))
    old = add_memories(db, {"content": "the oldest, closest", "embedding": unit(1.0, 0.1), "created_at": stamp(0)})[0]
    query = "zz"  # no keyword term: only the vector lists can find anything
    server.vector = lambda text: unit(1.0)  # the query embeds to the old row's direction
    app = embedding_app(db, server, MAX_MEMORIES="20", VECTOR_REACH="1000000", DEGRADED_ADVISORY="false")
    try:
        assert f"mem:{old}" in refs(recall(app, agent_id="a", query=query))
    finally:
        app.embedder.close()
    plain = embedding_app(db, server, MAX_MEMORIES="20", DEGRADED_ADVISORY="false")
    try:
        assert f"mem:{old}" not in refs(recall(plain, agent_id="a", query=query))
    finally:
        plain.embedder.close()


def test_far_list_matches_the_exact_scan_when_the_window_fits_the_candidates(db, app):  # spec VEC-5, VEC-7
    rng = np.random.default_rng(3)
    add_memories(db, *({"content": f"r{i}", "embedding": list(rng.normal(size=DIM)), "created_at": stamp(i % 40)}
                       for i in range(300)))
    backend = search_backend(app)
    for seed in range(5):
        q = to_blob(list(np.random.default_rng(100 + seed).normal(size=DIM)))
        where, params = "m.agent_id = 'a'", {}
        params.update(scan_parameters(q, window=(10, 310), threshold=-1.0, depth=10))
        exact = backend._vector_scan("mem", where, dict(params), q)
        coarse = backend._coarse_scan("mem", Scope(agent_id="a"), "", where, dict(params), q)
        assert coarse == exact


def test_migration_backfills_vectors_stored_before_it(db_path):
    db = open_sqlite(db_path)
    try:
        upgrade(db)
        with db.write_connection() as conn:
            command.downgrade(alembic_config(conn), "0006_word_index")
        assert not rows(db, "SELECT name FROM sqlite_master WHERE name LIKE '%coarse%'")
        add_memories(db, {"content": "before", "embedding": unit(1.0), "source": json.dumps({"id": "u"})},
                     {"content": "unembedded"}, {"content": "odd width", "embedding": [1.0, 2.0, 3.0]})
        with db.write_connection() as conn:
            conn.execute(text("INSERT INTO episodes (agent_id, summary, embedding) VALUES ('a', 'ep', :e)"),
                         {"e": to_blob(unit(0.0, 1.0))})
        upgrade(db)  # the real migration, 0006 -> head
        assert len(actual(db, "memories")) == 1 and len(actual(db, "episodes")) == 1
        assert_in_step(db)
    finally:
        db.close()


def test_a_query_of_an_unquantisable_width_falls_back_to_the_exact_far_scan(db, app):  # spec VEC-3
    add_memories(db, *({"content": f"w{i}", "embedding": [1.0, float(i), 0.5], "created_at": stamp(i)}
                       for i in range(5)))
    assert rows(db, "SELECT count(*) FROM memories_coarse") == [(0,)]
    assert len(far(app, Scope(agent_id="a"), [1.0, 0.0, 0.0], window=(1, 100))) == 4
