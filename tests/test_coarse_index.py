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
    source = (
        ", CAST(CASE WHEN json_valid(source) THEN json_extract(source, '$.id') END AS TEXT)"
        if table == "memories"
        else ""
    )
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
        ids[content] = store(
            app, agent_id="a", content=content, id=f"m{i}", source={"type": "User", "id": "u1", "name": "U"}
        )["id"]
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
            conn.execute(
                text(
                    "INSERT INTO memories (agent_id, content, timestamp, embedding) "
                    "VALUES ('z', 'from another file', '2026-01-01', :e)"
                ),
                {"e": to_blob(unit(1.0, 2.0))},
            )
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
        conn.execute(
            text(
                "UPDATE memories SET channel = 'moved', project_id = 'p9', created_at = '2020-01-01 00:00:00', "
                'source = \'{"id": "u2"}\' WHERE id = :i'
            ),
            {"i": ids["gamma grapes"]},
        )
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
        "store",
        "edit",
        "delete",
        "archive_episode",
        "delete_episode",
        "delete_agent_data",
        "merge_copy",
        "merge_move",
        "import",
        "import_db",
        "backfill",
        "model_change",
        "reembed_after_model_change",
        "raw_sql",
    }


# -- the far list through the coarse index -------------------------------------------------------


def far(
    app,
    scope: Scope,
    query: list[float],
    *,
    window: tuple[int, int],
    depth: int = 5,
    source_id: str = "",
    kind: str = "mem",
) -> list[int]:
    hits = search_backend(app).vector_candidates(
        kind, scope, to_blob(query), depth, threshold=-1.0, window=window, source_id=source_id
    )
    return [h.record.id for h in hits]


def test_isolation_is_inside_the_coarse_scan(db, app):  # spec ISO-2, ISO-3
    # Far more rows of other scopes lie nearer the query than the coarse index keeps candidates
    # for: a filter applied after the Hamming ranking would leave agent a's row out.
    crowd = coarse_sqlite.MIN_CANDIDATES + 100
    rng = np.random.default_rng(7)
    query = rng.normal(size=DIM)
    near = [list(query + rng.normal(0, 0.05, DIM)) for _ in range(crowd)]  # the query's sign bits, nearly all
    add_memories(
        db,
        *({"agent_id": "b", "content": f"b {i}", "embedding": v, "created_at": stamp(i)} for i, v in enumerate(near)),
    )
    add_memories(
        db,
        *(
            {
                "agent_id": "a",
                "content": f"a other project {i}",
                "project_id": "p2",
                "embedding": v,
                "created_at": stamp(i),
            }
            for i, v in enumerate(near)
        ),
    )
    add_memories(
        db,
        *(
            {
                "agent_id": "a",
                "content": f"a other user {i}",
                "source": '{"id": "u2"}',
                "embedding": v,
                "created_at": stamp(i),
            }
            for i, v in enumerate(near)
        ),
    )
    mine = add_memories(
        db,
        {
            "agent_id": "a",
            "content": "mine, farther from the query",
            "source": '{"id": "u1"}',
            "embedding": list(query + rng.normal(0, 1.0, DIM)),
            "created_at": stamp(-5),
        },
        {
            "agent_id": "a",
            "content": "mine, newest",
            "source": '{"id": "u1"}',
            "embedding": unit(0.0, 1.0),
            "created_at": stamp(9999),
        },
    )
    q = list(query)
    scope = Scope(agent_id="a", project_id="p1")
    assert far(app, scope, q, window=(1, 10**9), source_id="u1") == [mine[0]]  # project and source axes
    assert far(app, Scope(agent_id="a", project_id="p1"), q, window=(1, 10**9), source_id="u2")[0] > 2 * crowd
    assert far(app, Scope(agent_id="c"), q, window=(1, 10**9)) == []


def test_old_rows_beyond_the_window_are_found_by_recall(db, server):  # spec VEC-7
    add_memories(
        db,
        *(
            {"content": f"filler note {i}", "embedding": unit(0.0, 1.0, float(i)), "created_at": stamp(100 + i)}
            for i in range(300)
        ),
    )
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
    add_memories(
        db,
        *(
            {"content": f"r{i}", "embedding": list(rng.normal(size=DIM)), "created_at": stamp(i % 40)}
            for i in range(300)
        ),
    )
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
        add_memories(
            db,
            {"content": "before", "embedding": unit(1.0), "source": json.dumps({"id": "u"})},
            {"content": "unembedded"},
            {"content": "odd width", "embedding": [1.0, 2.0, 3.0]},
        )
        with db.write_connection() as conn:
            conn.execute(
                text("INSERT INTO episodes (agent_id, summary, embedding) VALUES ('a', 'ep', :e)"),
                {"e": to_blob(unit(0.0, 1.0))},
            )
        upgrade(db)  # the real migration, 0006 -> head
        assert len(actual(db, "memories")) == 1 and len(actual(db, "episodes")) == 1
        assert_in_step(db)
    finally:
        db.close()


def test_a_query_of_an_unquantisable_width_falls_back_to_the_exact_far_scan(db, app):  # spec VEC-3
    add_memories(
        db, *({"content": f"w{i}", "embedding": [1.0, float(i), 0.5], "created_at": stamp(i)} for i in range(5))
    )
    assert rows(db, "SELECT count(*) FROM memories_coarse") == [(0,)]
    assert len(far(app, Scope(agent_id="a"), [1.0, 0.0, 0.0], window=(1, 100))) == 4


# -- a writer without sqlite-vec (the sqlite3 shell, CPersona 2.6 without the extension) ----------


def plain_writer(db) -> Any:
    """A connection to the same file that never loads sqlite-vec: what any other program has."""
    import sqlean

    conn = sqlean.connect(str(db.path), isolation_level=None)
    conn.execute("PRAGMA busy_timeout=5000")
    with pytest.raises(sqlean.OperationalError, match="no such function"):
        conn.execute("SELECT vec_quantize_binary(x'00000000')")  # it really lacks the extension
    return conn


def outside_writes(conn, ids: dict[str, int]) -> None:
    """Every kind of write an outside program may make to memories and episodes."""
    blob = to_blob(unit(1.0, -1.0, 0.5))
    conn.execute("INSERT INTO memories (agent_id, content, timestamp) VALUES ('a', 'plain, no vector', '2026-01-01')")
    conn.execute(
        "INSERT INTO memories (agent_id, content, timestamp, embedding) VALUES ('a', 'plain, vector', '2026-01-01', ?)",
        (blob,),
    )
    conn.execute("UPDATE memories SET content = 'alpha, edited outside' WHERE id = ?", (ids["alpha apples"],))
    conn.execute("UPDATE memories SET embedding = ?, agent_id = 'moved' WHERE id = ?", (blob, ids["gamma grapes"]))
    conn.execute("DELETE FROM memories WHERE id = ?", (ids["beta bananas"],))
    conn.execute("INSERT INTO episodes (agent_id, summary, embedding) VALUES ('a', 'plain episode', ?)", (blob,))
    conn.execute("UPDATE episodes SET summary = 'edited outside' WHERE id = ?", (ids["ep"],))
    conn.execute("DELETE FROM episodes WHERE id = ?", (ids["ep"],))


def test_a_writer_without_sqlite_vec_writes_memories_and_episodes_of_a_migrated_file(db, app):
    ids = _seed(app)
    conn = plain_writer(db)
    try:
        outside_writes(conn, ids)  # pre-fix: "no such function: vec_quantize_binary" at the first insert
    finally:
        conn.close()
    assert rows(db, "SELECT count(*) FROM memories WHERE content LIKE 'plain%'") == [(2,)]


def test_the_sqlite3_shell_writes_a_migrated_file(db, app):
    import shutil
    import subprocess

    shell = shutil.which("sqlite3")
    if shell is None:
        pytest.skip("no sqlite3 shell on this machine")
    _seed(app)
    script = (
        "INSERT INTO memories (agent_id, content, timestamp, embedding) VALUES ('a', 'from the shell', "
        "'2026-01-01', zeroblob(32));\nUPDATE memories SET channel = 'x';\nDELETE FROM memories "
        "WHERE content = 'delta dates';\nINSERT INTO episodes (agent_id, summary) VALUES ('a', 'shell');\n"
    )
    done = subprocess.run([shell, str(db.path)], input=script, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and not done.stderr, done.stderr
    assert rows(db, "SELECT count(*) FROM memories WHERE content = 'from the shell'") == [(1,)]


def test_the_file_schema_holds_no_trigger_calling_an_extension_function(db, app):
    _seed(app)
    stored = rows(db, "SELECT name, sql FROM sqlite_master WHERE type = 'trigger'")
    assert stored and not [name for name, sql in stored if "vec_" in sql.lower()]
    # ...while our own connections do carry them, as TEMP triggers.
    temp = {r[0] for r in rows(db, "SELECT name FROM sqlite_temp_master WHERE type = 'trigger'")}
    assert temp == set(coarse_sqlite.TRIGGER_NAMES)


def test_the_migration_drops_triggers_a_pre_release_build_stored(db_path):
    db = open_sqlite(db_path)
    try:
        upgrade(db)
        with db.write_connection() as conn:
            command.downgrade(alembic_config(conn), "0006_word_index")
            for ddl in (*coarse_sqlite.TABLES_DDL, *coarse_sqlite.TEMP_TRIGGERS_DDL):
                # What that build stored: the same triggers, in the file.
                conn.execute(text(ddl.replace("CREATE TEMP TRIGGER", "CREATE TRIGGER").replace(" ON main.", " ON ")))
        assert len(rows(db, "SELECT name FROM sqlite_master WHERE type = 'trigger' AND name LIKE '%coarse%'")) == 6
        upgrade(db)
        # Only revision 0008's change-log triggers remain: they call no extension function.
        left = {
            r[0] for r in rows(db, "SELECT name FROM sqlite_master WHERE type = 'trigger' AND name LIKE '%coarse%'")
        }
        assert left == set(coarse_sqlite.CHANGE_LOG_TRIGGER_NAMES)
        add_memories(db, {"content": "after", "embedding": unit(1.0)})
        assert_in_step(db)
    finally:
        db.close()


def test_reconcile_brings_the_index_back_after_outside_writes(db, app):
    ids = _seed(app)
    conn = plain_writer(db)
    try:
        outside_writes(conn, ids)
    finally:
        conn.close()
    with db.read() as session:
        found = coarse_sqlite.drift(session.connection())
    # memories: one row lost (deleted), one moved and re-embedded (stale), one inserted (missing + the moved);
    # episodes: one deleted (stale), one inserted (missing).
    assert found == {"memories": {"stale": 2, "missing": 2}, "episodes": {"stale": 1, "missing": 1}}
    assert coarse_sqlite.reconcile_database(db) == found
    assert_in_step(db)
    assert coarse_sqlite.reconcile_database(db) == {}  # in step: nothing found, no write taken


def test_start_up_reconciles_in_the_background_when_the_far_list_reads_the_index(db, server):
    from cpersona.background import BackgroundWork

    app = embedding_app(db, server, DEGRADED_ADVISORY="false", MAX_MEMORIES="10", VECTOR_REACH="1000000")
    try:
        ids = _seed(app)
        conn = plain_writer(db)
        try:
            outside_writes(conn, ids)
        finally:
            conn.close()
        work = BackgroundWork(app)
        work.start()
        work.stop()  # waits for the reconcile pass
        assert_in_step(db)
    finally:
        app.embedder.close()


def test_start_up_leaves_the_index_alone_when_nothing_reads_it(db, app):
    from cpersona.background import BackgroundWork

    ids = _seed(app)
    conn = plain_writer(db)
    try:
        outside_writes(conn, ids)
    finally:
        conn.close()
    work = BackgroundWork(app)
    work.start()
    work.stop()
    with db.read() as session:
        assert coarse_sqlite.drift(session.connection())  # the default reach never reads it: no start-up pass


def test_the_coarse_index_health_check_reports_and_fixes_drift(db, server):
    from cpersona.services.health.check_health import check_health

    app = embedding_app(db, server, DEGRADED_ADVISORY="false", MAX_MEMORIES="10", VECTOR_REACH="1000000")
    try:
        ids = _seed(app)
        conn = plain_writer(db)
        try:
            outside_writes(conn, ids)
        finally:
            conn.close()
        report = [i for i in check_health(app, checks=["coarse_index"])["issues"] if i["check"] == "coarse_index"]
        assert {(i["type"], i["table"], i["stale_rows"], i["missing_rows"]) for i in report} == {
            ("coarse_index_drift", "memories", 2, 2),
            ("coarse_index_drift", "episodes", 1, 1),
        }
        fixed = [
            i for i in check_health(app, checks=["coarse_index"], fix=True)["issues"] if i["check"] == "coarse_index"
        ]
        assert fixed and all(i["fixed"] for i in fixed)
        assert_in_step(db)
        assert [i for i in check_health(app, checks=["coarse_index"])["issues"] if i["check"] == "coarse_index"] == []
    finally:
        app.embedder.close()


def test_isolation_holds_against_a_stale_coarse_copy(db, app):  # spec ISO-2, ISO-3
    # The coarse copy claims rows for agent a / user u1 that the real rows no longer give them, and
    # keeps a row that is gone: the re-rank tests the real row, so none of them is answered.
    q = unit(1.0, 0.2)
    theirs = add_memories(db, {"agent_id": "b", "content": "b's", "embedding": q, "created_at": stamp(1)})[0]
    other_user = add_memories(
        db, {"content": "u2's", "embedding": q, "source": '{"id": "u2"}', "created_at": stamp(2)}
    )[0]
    gone = add_memories(db, {"content": "gone", "embedding": q, "source": '{"id": "u1"}', "created_at": stamp(3)})[0]
    mine = add_memories(
        db, {"content": "mine", "embedding": unit(1.0, 0.9), "source": '{"id": "u1"}', "created_at": stamp(0)}
    )[0]
    add_memories(
        db,
        {
            "content": "newest, the exact window",
            "embedding": unit(0.0, 1.0),
            "source": '{"id": "u1"}',
            "created_at": stamp(9),
        },
    )
    with db.write_connection() as conn:
        conn.execute(text("UPDATE memories_coarse SET agent_id = 'a', source_key = 'u1' WHERE id = :i"), {"i": theirs})
        conn.execute(text("UPDATE memories_coarse SET source_key = 'u1' WHERE id = :i"), {"i": other_user})
    plain = plain_writer(db)
    try:
        plain.execute("DELETE FROM memories WHERE id = ?", (gone,))  # its coarse row stays
    finally:
        plain.close()
    assert len(rows(db, "SELECT id FROM memories_coarse WHERE agent_id = 'a' AND source_key = 'u1'")) == 5
    backend = search_backend(app)
    query = to_blob(q)
    by_source, source_params = backend.source_filter("u1")
    where = f"m.agent_id = 'a' AND {by_source}"
    params = {**source_params, **scan_parameters(query, window=(1, 100), threshold=-1.0, depth=10)}
    # The statement itself, not only the hydration after it (which re-checks scope too).
    assert [i for _, i in backend._coarse_scan("mem", Scope(agent_id="a"), "u1", where, params, query)] == [mine]
    assert far(app, Scope(agent_id="a"), q, window=(1, 100), source_id="u1") == [mine]
