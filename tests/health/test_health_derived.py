"""missing_nodes (spec R-49) against a real embedding server on 127.0.0.1 that answers /embed and /count_tokens.

The server's tokenizer counts words and punctuation marks; its window is set
per test. Builds run through the real task queue, drained in the test thread.
"""

from __future__ import annotations

from health_seed import h  # noqa: F401  (the seeding fixture)

from collections.abc import Iterator

import pytest

from cpersona.config import load_settings
from cpersona.embedding.client import build_embedder
from cpersona.services.app import App
from cpersona.services.health.check_health import check_health
from embed_server import EmbedServer

pytestmark = pytest.mark.both_backends  # storage/service behaviour: run on SQLite and PostgreSQL

LONG = " ".join(f"Sentence number {i} talks about the Atlas cluster." for i in range(12))  # ~100 tokens


@pytest.fixture
def server() -> Iterator[EmbedServer]:
    running = EmbedServer(token_window=40).start()
    yield running
    running.stop()


def http_app(db, server: EmbedServer, **env: str) -> App:
    settings = load_settings(
        {
            "CPERSONA_DB_PATH": str(db.path),
            "CPERSONA_EMBEDDING_MODE": "http",
            "CPERSONA_EMBEDDING_URL": server.url,
            "CPERSONA_TASK_RETRY_DELAY": "0",
            **{f"CPERSONA_{k}": v for k, v in env.items()},
        }
    )
    return App(db=db, settings=settings, embedder=build_embedder(settings))


@pytest.fixture
def napp(db, server) -> Iterator[App]:
    made = http_app(db, server)
    yield made
    made.task_queue.stop()
    made.embedder.close()


def nodes_issue(app: App, **kwargs) -> list[dict]:
    return [i for i in check_health(app, checks=["missing_nodes"], **kwargs)["issues"] if i["check"] == "missing_nodes"]


def test_clean_database_has_no_missing_nodes(napp, h):
    # spec R-49: short records fit the window; nothing to report
    h.insert_memory(napp, "short text that fits")
    assert nodes_issue(napp) == []


def test_long_records_without_nodes_are_found_queued_and_built(napp, h, server):
    # spec R-49, H-4, H-14
    long_id = h.insert_memory(napp, LONG, locked=1)  # locked records are included: nodes never modify them
    h.insert_memory(napp, "short one")
    h.execute(
        napp,
        "INSERT INTO episodes (agent_id, summary, start_time, end_time) VALUES ('a', :s, '', '')",
        s=LONG + " episode",
    )
    report = nodes_issue(napp)
    assert report == [
        {
            "type": "missing_nodes",
            "count": 2,
            "memories": 1,
            "episodes": 1,
            "repairable": 2,
            "severity": "info",
            "check": "missing_nodes",
        }
    ]
    assert h.query(napp, "SELECT COUNT(*) FROM pending_memory_tasks")[0][0] == 0  # the report wrote nothing

    fixed = nodes_issue(napp, fix=True)[0]
    assert fixed["queued"] == 2 and fixed["built"] == 0 and fixed["remaining"] == 0
    tasks = h.query(napp, "SELECT task_type, payload FROM pending_memory_tasks ORDER BY id")
    assert [t[0] for t in tasks] == ["build_nodes", "build_nodes"] and f'"id": {long_id}' in tasks[0][1]

    # a second fix before the queue ran queues nothing twice
    again = nodes_issue(napp, fix=True)[0]
    assert again["already_queued"] == 2 and again["repairable"] == 0 and again["queued"] == 0
    assert h.query(napp, "SELECT COUNT(*) FROM pending_memory_tasks")[0][0] == 2

    napp.task_queue.drain()
    assert h.query(napp, "SELECT COUNT(DISTINCT parent_kind || parent_id) FROM record_nodes")[0][0] == 2
    assert nodes_issue(napp) == [] and nodes_issue(napp, fix=True) == []


def test_repair_is_bounded_to_50_per_run(napp, h):
    # spec R-49, H-14: repairable = min(count, 50); remaining says what is left
    for i in range(53):
        h.insert_memory(napp, f"{i} {LONG}")
    issue = nodes_issue(napp)[0]
    assert issue["count"] == 53 and issue["repairable"] == 50
    fixed = nodes_issue(napp, fix=True)[0]
    assert fixed["queued"] == 50 and fixed["remaining"] == 3 and "re-run" in fixed["hint"]


def test_token_report_expected_but_not_returned(napp, h, server):
    # spec R-49: an http backend that returns no token counts -> count null, repairable 0
    h.insert_memory(napp, LONG)
    server.token_window = None
    issue = nodes_issue(napp)[0]
    assert issue["count"] is None and issue["repairable"] == 0 and issue["needs_human_review"] is True


def test_no_token_report_backend_reports_nothing(app, h):
    # spec R-49: without a backend that reports tokens the check is silent
    h.insert_memory(app, LONG)
    assert nodes_issue(app) == []


def test_stale_nodes_after_model_change_count_as_missing(napp, h):
    # spec R-49 + OV-2: nodes by a model that is no longer accepted are not current
    h.insert_memory(napp, LONG)
    nodes_issue(napp, fix=True)
    napp.task_queue.drain()
    assert nodes_issue(napp) == []
    h.execute(napp, "UPDATE record_nodes SET embedding_model = 'old-model'")
    assert nodes_issue(napp)[0]["count"] == 1


def test_rewrite_repair_queues_node_builds_after_commit(napp, h):
    # spec H-6: a repair that rewrites a record's text queues its node build once the fix committed
    h.insert_memory(napp, "[Memory from bot] " + LONG)
    h.insert_memory(napp, "[Memory from bot] short")
    h.execute(napp, "DELETE FROM pending_memory_tasks")
    check_health(napp, checks=["memory_annotation"], fix=True)
    tasks = h.query(napp, "SELECT task_type, payload FROM pending_memory_tasks")
    assert [t.task_type for t in tasks] == ["build_nodes"]  # only the rewrite still past the window
    napp.task_queue.drain()
    assert nodes_issue(napp) == []
