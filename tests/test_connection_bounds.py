"""How many SQLite connections a server keeps warm, and how big their caches are (issue 17, RSS).

Each serving connection's page cache grows to 64 MiB (engine.PRAGMAS), so the
process's memory is about one cache per connection the pool keeps. Start-up
background work (coarse reconcile, backfill, calibration, the task queue) and
the recall counters' flush run on their own small-cache connections
(Database.background), and the serving pool hands out its most recently used
connection first, so a sequential client keeps one warm connection.
"""

from __future__ import annotations

import threading

import pytest
from sqlalchemy import event

from cpersona.background import BackgroundWork
from cpersona.services.recall.service import recall
from cpersona.services.records.memories import store
from cpersona.storage.engine import BACKGROUND_CACHE_KIB, HELD_VECTORS_CACHE_KIB, SERVING_CACHE_KIB, open_sqlite
from cpersona.storage.migrate import upgrade
from test_vector_channel import embedding_app

pytestmark = pytest.mark.sqlite_only  # the page cache and the pools are SQLite's


def _cache_size(db) -> int:
    with db.read() as session:
        return session.connection().exec_driver_sql("PRAGMA cache_size").scalar()


@pytest.mark.parametrize("reach", [0, 10_000, 10_001, 1_000_000_000])
def test_the_serving_cache_is_smaller_where_the_process_holds_the_vector_index(tmp_path, reach):
    # A reach past the exact window loads the vector index into the process, which then serves
    # both vector lists: the cache no longer holds the window's vectors, and at 1M rows its
    # 64 MiB were 48 MB of a 300 MB budget (docs/benchmarks.md, Scale, fifth round).
    from cpersona.config import load_settings
    from cpersona.storage.migrate import open_database_and_upgrade

    settings = load_settings(
        {
            "CPERSONA_DB_PATH": str(tmp_path / "c.db"),
            "CPERSONA_MAX_MEMORIES": "10000",
            "CPERSONA_VECTOR_REACH": str(reach),
        }
    )
    db = open_database_and_upgrade(settings)
    try:
        held = reach > 10_000
        assert _cache_size(db) == -(HELD_VECTORS_CACHE_KIB if held else SERVING_CACHE_KIB)
        assert HELD_VECTORS_CACHE_KIB <= 32768 and SERVING_CACHE_KIB == 65536
        with db.background():  # background work keeps its own small cache either way
            assert _cache_size(db) == -BACKGROUND_CACHE_KIB
    finally:
        db.close()


def test_background_threads_get_small_cache_connections_that_do_not_stay(tmp_path):
    db = open_sqlite(tmp_path / "c.db")
    upgrade(db)
    try:
        assert _cache_size(db) == -SERVING_CACHE_KIB  # serving: the larger cache stays
        seen: list[int] = []
        together = threading.Barrier(4)

        def work() -> None:
            with db.background():
                with db.read() as session:
                    seen.append(session.connection().exec_driver_sql("PRAGMA cache_size").scalar())
                    together.wait(timeout=10)  # four background connections open at once
                with db.write_connection() as conn:
                    conn.exec_driver_sql("UPDATE schema_version SET version = version")

        threads = [threading.Thread(target=work) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert seen == [-BACKGROUND_CACHE_KIB] * 4
        pool = db.background_engine.pool
        assert pool.checkedout() == 0 and pool.checkedin() <= 1  # the overlap's extra connections were closed
        assert db.engine.pool.checkedin() == 1  # none of that went through the serving pool
    finally:
        db.close()


def test_a_sequential_client_is_served_by_one_warm_connection(tmp_path):
    db = open_sqlite(tmp_path / "c.db")
    upgrade(db)
    try:
        # Two reads overlap once (the pool now holds two connections) ...
        with db.read() as first, db.read() as second:
            first.connection().exec_driver_sql("SELECT 1").all()
            second.connection().exec_driver_sql("SELECT 1").all()
        assert db.engine.pool.checkedin() == 2
        used: list[int] = []

        @event.listens_for(db.engine, "checkout")
        def _seen(dbapi_conn, _record, _proxy):
            used.append(id(dbapi_conn))

        # ... then calls come one at a time, from different worker threads as anyio's are.
        for _ in range(6):
            thread = threading.Thread(target=_cache_size, args=(db,))
            thread.start()
            thread.join()
        assert len(used) == 6 and len(set(used)) == 1  # FIFO would alternate and warm both caches
    finally:
        db.close()


def test_start_up_work_and_counter_flushes_stay_off_the_serving_pool(db, embed_server):
    # The far list reads the coarse index (reach past the window), so start-up reconciles it;
    # with embeddings on, calibration and the backfill run too.
    app = embedding_app(db, embed_server, DEGRADED_ADVISORY="false", MAX_MEMORIES="10", VECTOR_REACH="1000000")
    serving: list[str] = []

    @event.listens_for(db.engine, "checkout")
    def _seen(_dbapi_conn, _record, _proxy):
        serving.append(threading.current_thread().name)

    try:
        for i in range(30):
            store(app, agent_id="a", content=f"row {i} about apples and pears", id=f"m{i}")
        work = BackgroundWork(app)
        work.prepare()
        work.start()
        for _ in range(5):
            recall(app, agent_id="a", query="apples", limit=5)
        work.stop()
        flusher = app.recall_counters.flusher if hasattr(app, "recall_counters") else None
        if flusher is not None:
            flusher.join(5)
        background = {t for t in serving if t.startswith("cpersona-") or t == "recall-counters"}
        assert background == set(), f"background threads took serving connections: {background}"
        assert db.background_engine is not None  # they ran, on their own engine
        with db.background_engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA cache_size").scalar() == -BACKGROUND_CACHE_KIB
        assert db.background_engine.pool.checkedin() <= 1
    finally:
        app.embedder.close()
