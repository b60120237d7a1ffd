"""Vector backfill: rows stored while the embedder was down get their vector later.

Real SQLite files and the real local embedding server of tests/embed_server.py;
its ``status`` knob takes the backend down and up, and its ``mutate`` hook runs
inside the server while a request is being answered (to act "during" an
embedding call).
"""

from __future__ import annotations

import pytest
from sqlalchemy import select, update

from cpersona.config import load_settings
from cpersona.embedding.client import build_embedder
from cpersona.embedding.vectors import to_blob
from cpersona.services.app import App
from cpersona.services.records.backfill import (
    BackfillWorker,
    backfill_pass,
    start_backfill,
    stop_backfill,
    unembedded_count,
)
from cpersona.services.records.episodes import archive_episode
from cpersona.services.records.memories import store
from cpersona.services.recall.service import recall
from cpersona.storage.models import Episode, Memory

pytestmark = pytest.mark.both_backends  # storage/service behaviour: run on SQLite and PostgreSQL


def embedding_app(db, server, **env: str) -> App:
    environ = {
        "CPERSONA_DB_PATH": str(db.path),
        "CPERSONA_EMBEDDING_MODE": "http",
        "CPERSONA_EMBEDDING_URL": server.url,
        **{f"CPERSONA_{k}": v for k, v in env.items()},
    }
    settings = load_settings(environ)
    return App(db=db, settings=settings, embedder=build_embedder(settings))


@pytest.fixture
def app(db, embed_server):
    application = embedding_app(db, embed_server)
    yield application
    stop_backfill(application)
    application.embedder.close()


def store_while_down(app: App, server, *texts: str) -> None:
    server.status = 503
    for text in texts:
        assert store(app, agent_id="a", content=text)["embedded"] is False  # spec ST-6
    server.status = 200


def vectors(db, model=Memory) -> dict[int, bytes | None]:
    with db.read() as session:
        return dict(session.execute(select(model.id, model.embedding)).all())


def test_rows_stored_while_down_get_the_vector_of_their_text(db, app, embed_server):  # spec ST-6, ST-11, AE-5
    store_while_down(app, embed_server, "first note", "second note", "third note")
    embed_server.status = 503
    assert archive_episode(app, agent_id="a", summary="we talked about notes")["ok"] is True
    embed_server.status = 200
    assert unembedded_count(app) == 4
    report = backfill_pass(app)
    assert (report.memories, report.episodes, report.remaining, report.stopped) == (3, 1, 0, None)
    assert vectors(db) == {
        i + 1: to_blob(embed_server.vector(t)) for i, t in enumerate(["first note", "second note", "third note"])
    }
    assert vectors(db, Episode) == {1: to_blob(embed_server.vector("we talked about notes"))}
    # The vector channel now sees them (spec VEC-2: only rows with a vector are scanned).
    why = recall(app, agent_id="a", query="second note")["messages"][-1]["match_reason"]
    assert why["signal"] == "cosine"


def test_embedding_happens_outside_the_write_lock(db, app, embed_server):  # issue: no network under the lock
    store_while_down(app, embed_server, "a note")
    lock_free_during_request = []

    def probe_lock(payload):
        free = app.db._write_lock.acquire(blocking=False)  # another thread holding it → False
        if free:
            app.db._write_lock.release()
        lock_free_during_request.append(free)
        return payload

    embed_server.mutate = probe_lock
    assert backfill_pass(app).memories == 1
    assert lock_free_during_request == [True]


def test_an_edit_made_during_the_embedding_wins(db, app, embed_server):  # guard: still NULL, text unchanged
    store_while_down(app, embed_server, "old text")

    def edit_meanwhile(payload):
        with db.write() as session:
            session.execute(update(Memory).where(Memory.id == 1).values(content="new text"))
        embed_server.mutate = None
        return payload

    embed_server.mutate = edit_meanwhile
    report = backfill_pass(app)
    assert report.memories == 0 and vectors(db) == {1: None}  # the stale vector was not written
    assert backfill_pass(app).memories == 1
    assert vectors(db) == {1: to_blob(embed_server.vector("new text"))}


def test_a_row_the_live_backend_refuses_is_set_aside_and_reported(db, app, embed_server):
    store_while_down(app, embed_server, "fine one", "POISON row", "fine two")

    def refuse_poison(payload):
        texts = embed_server.requests[-1].body["texts"]
        return {"embeddings": []} if any("POISON" in t for t in texts) else payload

    embed_server.mutate = refuse_poison
    skip: set = set()
    report = backfill_pass(app, skip=skip)
    assert (report.memories, report.refused, report.remaining) == (2, [("mem", 2)], 1)
    assert vectors(db)[2] is None and vectors(db)[1] is not None and vectors(db)[3] is not None
    sent = len(embed_server.embed_requests())
    again = backfill_pass(app, skip=skip)
    assert again.embedded == 0 and again.refused == [] and len(embed_server.embed_requests()) == sent


def test_a_pass_stops_at_once_when_the_backend_is_down(db, app, embed_server):
    store_while_down(app, embed_server, *(f"note {i}" for i in range(40)))
    embed_server.status = 503
    before = len(embed_server.embed_requests())
    report = backfill_pass(app)
    assert report.embedded == 0 and report.remaining == 40 and "unavailable" in report.stopped
    assert len(embed_server.embed_requests()) - before == 2  # one batch, one probe: no hammering


def test_row_cap_and_batch_size_bound_a_pass(db, app, embed_server):  # CPERSONA_REEMBED_ROW_CAP
    store_while_down(app, embed_server, *(f"note {i}" for i in range(5)))
    before = len(embed_server.embed_requests())
    report = backfill_pass(app, row_cap=3, batch_size=2)
    assert (report.memories, report.remaining) == (3, 2)
    assert [len(r.body["texts"]) for r in embed_server.embed_requests()[before:]] == [2, 1]


def test_the_worker_runs_passes_until_done(db, embed_server):
    app = embedding_app(db, embed_server, REEMBED_ROW_CAP="2")
    store_while_down(app, embed_server, *(f"note {i}" for i in range(5)))
    assert start_backfill(app) is True
    worker: BackfillWorker = app.backfill
    assert worker.wait(10)
    assert unembedded_count(app) == 0 and worker.passes == 3
    stop_backfill(app)
    assert worker.trigger("after close") is False
    app.embedder.close()


def test_startup_run_with_the_backend_down_then_recall_sees_it_return(db, app, embed_server):  # spec ADV-2
    store_while_down(app, embed_server, "remember the blue door")
    embed_server.status = 503
    assert start_backfill(app) is True
    worker: BackfillWorker = app.backfill
    assert worker.wait(10) and "unavailable" in worker.last_report.stopped
    recall(app, agent_id="a", query="blue door one")  # a failed query embedding
    embed_server.status = 200
    recall(app, agent_id="a", query="blue door two")  # success after failure: recovered
    assert worker.wait(10)
    assert unembedded_count(app) == 0 and worker.last_report.memories == 1


def test_a_healthy_recall_catches_rows_that_failed_only_at_store_time(db, app, embed_server):
    store_while_down(app, embed_server, "remember the red door")
    worker = app.backfill
    worker.check_interval = 0.0
    recall(app, agent_id="a", query="red door")  # healthy all along: no recovery, a backlog check
    assert worker.wait(10) and unembedded_count(app) == 0


def test_without_an_installed_worker_recall_repairs_nothing(db, app, embed_server):
    store_while_down(app, embed_server, "remember the green door")
    embed_server.status = 503
    recall(app, agent_id="a", query="green door one")
    embed_server.status = 200
    recall(app, agent_id="a", query="green door two")
    assert App.backfill.if_built(app) is None and unembedded_count(app) == 1


def test_nothing_to_do_without_an_embedder(db):
    app = App(db=db, settings=load_settings({"CPERSONA_DB_PATH": str(db.path)}))
    assert store(app, agent_id="a", content="plain")["embedded"] is False
    assert start_backfill(app) is False
    assert "no local vectors" in backfill_pass(app).stopped
