"""The degraded advisory's fault path: measured by recall's own query embedding (spec §5.17).

The embedding backend is the real local HTTP server of tests/embed_server.py;
its ``status`` knob makes it answer 503, and an address nothing listens on
gives a real connection failure.
"""

from __future__ import annotations

import socket

import pytest
from sqlalchemy import insert

from cpersona.config import load_settings
from cpersona.embedding.client import build_embedder
from cpersona.services.app import App
from cpersona.services.records.memories import store
from cpersona.services.recall.service import recall
from cpersona.services.recall.with_context import recall_with_context
from cpersona.storage.models import Memory

pytestmark = pytest.mark.both_backends  # storage/service behaviour: run on SQLite and PostgreSQL


def embedding_app(db, url: str | None, **env: str) -> App:
    environ = {
        "CPERSONA_DB_PATH": str(db.path),
        "CPERSONA_EMBEDDING_MODE": "http",
        **{f"CPERSONA_{k}": v for k, v in env.items()},
    }
    if url is not None:
        environ["CPERSONA_EMBEDDING_URL"] = url
    settings = load_settings(environ)
    return App(db=db, settings=settings, embedder=build_embedder(settings))


@pytest.fixture
def app(db, embed_server):
    application = embedding_app(db, embed_server.url)
    with db.write() as session:  # one row the keyword channel can always find
        session.execute(insert(Memory).values(agent_id="a", content="the deploy key lives in vault", timestamp=""))
    yield application
    application.embedder.close()


def ask(app: App, n: int, session_key: str = "", **kw) -> dict:
    """A recall with a query never asked before (a cached query would not be an observation)."""
    return recall(app, agent_id="a", query=f"deploy question {n}", session_key=session_key, **kw)


def closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/embed"


def test_reference_sequence_while_the_endpoint_is_down(app, embed_server):  # spec ADV-2, ADV-4, ADV-6
    embed_server.status = 503
    answers = [ask(app, 1), ask(app, 2, "s1"), ask(app, 3), ask(app, 4), ask(app, 5, "s1"), ask(app, 6, "s2")]
    advisories = [a.get("advisory") for a in answers]
    assert advisories[0] is None  # one failure changes nothing visible
    full, short = advisories[1]["runbook"], advisories[3]["runbook"]
    assert [a["runbook"] for a in advisories[1:]] == [full, full, short, short, full]
    assert len(short) < 300 < len(full) and "still unavailable" in short
    notice = advisories[1]
    assert notice["degraded"] is True and notice["severity"] == "fault"
    assert "unreachable" in notice["reason"] and notice["advisory_scope"] == "session"
    assert notice["evidence"].startswith(f"mode=http / POST {embed_server.url} failed: HTTPStatusError: 503")
    assert notice["evidence"] in full and "CPERSONA_DEGRADED_ADVISORY=false" in full
    # Degraded, not broken: every answer still carries the keyword match (spec RC-9).
    assert all([m["ref"] for m in a["messages"]] == ["mem:1"] for a in answers)


def test_a_single_failure_between_successes_shows_nothing(app, embed_server):  # spec ADV-2
    for n, status in enumerate([503, 200, 503, 200, 503]):
        embed_server.status = status
        assert "advisory" not in ask(app, n)
    health = app.embedding_health
    assert (health.state, health.failures) == ("healthy", 1)


def test_recovery_clears_the_fault_and_a_new_fault_rearms_the_full_notice(app, embed_server):  # spec ADV-2, ADV-6
    embed_server.status = 503
    ask(app, 1, "s1")
    first = ask(app, 2, "s1")["advisory"]["runbook"]
    assert ask(app, 3, "s1")["advisory"]["runbook"] != first  # already told: short
    embed_server.status = 200
    assert "advisory" not in ask(app, 4, "s1")
    assert app.embedding_health.state == "healthy"
    embed_server.status = 503
    assert "advisory" not in ask(app, 5, "s1")
    assert ask(app, 6, "s1")["advisory"]["runbook"] == first  # a new episode: told in full again


def test_a_cache_hit_is_no_observation(app, embed_server):  # spec ADV-2, EMB-4
    recall(app, agent_id="a", query="cached question")  # embedded and cached while healthy
    embed_server.status = 503
    assert "advisory" not in ask(app, 1)  # failure 1
    assert "advisory" not in recall(app, agent_id="a", query="cached question")  # no observation
    assert app.embedding_health.failures == 1
    assert "advisory" in ask(app, 2)  # failure 2 latches


def test_store_failures_are_not_observations(app, embed_server):  # spec ADV-2, ST-6
    embed_server.status = 503
    for n in range(3):
        assert store(app, agent_id="a", content=f"note {n}")["embedded"] is False
    assert app.embedding_health.state == "unknown"
    embed_server.status = 200
    assert "advisory" not in ask(app, 1)


def test_a_closed_port_is_unreachable(db):  # spec ADV-4
    app = embedding_app(db, closed_port_url(), EMBEDDING_TIMEOUT_SECS="2")
    ask(app, 1)
    notice = ask(app, 2)["advisory"]
    assert notice["severity"] == "fault" and "unreachable" in notice["reason"]
    assert "ConnectError" in notice["evidence"] and "is the embedding server process running" in notice["runbook"]
    app.embedder.close()


def test_no_usable_url_is_a_misconfiguration(db):  # spec ADV-2 (misconfigured), ADV-5
    app = embedding_app(db, None)
    ask(app, 1)
    notice = ask(app, 2)["advisory"]
    assert "configuration" in notice["reason"] and notice["evidence"].startswith("mode=http / POST")
    assert "CPERSONA_EMBEDDING_URL" in notice["runbook"] and "port reachable" not in notice["runbook"]
    app.embedder.close()


def test_shared_transport_always_tells_keyless_callers_in_full(app, embed_server):  # spec ADV-6
    app.settings = app.settings.model_copy(update={"transport": "streamable-http"})
    embed_server.status = 503
    ask(app, 1)
    notices = [ask(app, n)["advisory"] for n in (2, 3, 4)]
    assert len({n["runbook"] for n in notices}) == 1 and all(n["advisory_scope"] == "process" for n in notices)
    keyed = [ask(app, n, "s1")["advisory"] for n in (5, 6)]
    assert keyed[0]["runbook"] == notices[0]["runbook"] != keyed[1]["runbook"]
    assert keyed[0]["advisory_scope"] == "session"


def test_the_advisory_can_be_silenced_in_a_fault(db, embed_server):  # spec ADV-3
    app = embedding_app(db, embed_server.url, DEGRADED_ADVISORY="false")
    embed_server.status = 503
    assert all("advisory" not in ask(app, n) for n in range(4))
    assert app.embedding_health.state == "fault"  # measured all the same
    app.embedder.close()


def test_blank_and_zero_limit_recalls_report_a_latched_fault_without_a_request(app, embed_server):  # spec ADV-2
    embed_server.status = 503
    ask(app, 1)
    ask(app, 2)
    sent = len(embed_server.embed_requests())
    assert recall(app, agent_id="a", query="  ")["advisory"]["severity"] == "fault"
    assert recall(app, agent_id="a", query="deploy", limit=0)["advisory"]["severity"] == "fault"
    assert len(embed_server.embed_requests()) == sent


def test_recall_with_context_forwards_the_advisory(app, embed_server):  # spec ADV-7
    embed_server.status = 503
    ask(app, 1)
    answer = recall_with_context(app, agent_id="a", query="deploy question 2", session_key="s9")
    assert answer["advisory"]["severity"] == "fault"


def test_a_query_that_does_not_measure_leaves_the_health_alone(app, embed_server):  # spec ADV-2
    from cpersona.services.recall.retrievers import Query, exclusion, retrieve, search_backend
    from cpersona.storage.scope import Scope

    embed_server.status = 503
    for n in range(3):  # e.g. calibration pseudo-queries
        retrieve(app, search_backend(app), Query("a", f"pseudo {n}", Scope("a"), measure=False), 10, exclusion(()))
    assert app.embedding_health.state == "unknown" and app.embedding_health.failures == 0
    assert "advisory" not in ask(app, 1)
