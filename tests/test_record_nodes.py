"""Record nodes, the overflow tree (spec associations §6, §7 node ranges; storage §6.1).

A real embedding server on 127.0.0.1 (tests/embed_server.py) answers /embed and
/count_tokens; its tokenizer counts words and punctuation marks, and its window
is set per test. Builds run through the real task queue (drained in the test
thread) over a real SQLite file.

The division figures marked "reference" were produced by CPersona 2.6.14 run
against this same server (same texts, same windows) and read back from its
record_nodes table.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from sqlalchemy import text

from cpersona.config import load_settings
from cpersona.embedding.client import build_embedder
from cpersona.embedding.tokens import TokenInfo, build_token_reporter, parse_entry
from cpersona.services.records import nodes
from cpersona.services.records.admin import update_memory
from cpersona.services.app import App
from cpersona.services.records.contents import get_contents, revision_of
from cpersona.services.records.episodes import archive_episode
from cpersona.services.records.memories import store
from cpersona.services.records.nodes import DivisionFailed, build_record_nodes, current_nodes, divide
from cpersona.storage.engine import Database, open_sqlite
from cpersona.storage.migrate import upgrade
from conftest import refuse_inserts
from embed_server import EmbedServer, token_info, tokens_of

pytestmark = pytest.mark.both_backends  # storage/service behaviour: run on SQLite and PostgreSQL

MIXED = "Mixed! Questions? Yes... maybe.\n \t\nNew para: x.y.z and e.g. things!" * 6
PARAGRAPHS = (
    "gamma eta lambda alpha beta iota beta zeta kappa alpha iota delta alpha beta eta eta beta delta.\n\n"
    "iota eta alpha kappa beta delta lambda lambda kappa alpha.\n\n"
    "kappa eta alpha delta alpha iota gamma epsilon eta gamma iota beta kappa epsilon iota lambda gamma beta "
    "kappa kappa lambda delta zeta beta iota mu.\n\n"
    "kappa alpha kappa delta theta lambda iota eta zeta theta.\n\n"
    "theta zeta epsilon delta gamma mu delta beta kappa epsilon iota theta zeta mu theta epsilon kappa beta beta "
    "iota eta gamma zeta gamma theta eta.\n\n"
    "lambda beta iota kappa zeta zeta mu zeta kappa."
)
JAPANESE = "日本語の文章です。" * 40
LONG = " ".join(f"Sentence number {i} talks about the Atlas cluster." for i in range(30))


@pytest.fixture
def server() -> Iterator[EmbedServer]:
    running = EmbedServer(token_window=40).start()
    yield running
    running.stop()


def http_app(db: Database, server: EmbedServer, **env: str) -> App:
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
def app(db: Database, server: EmbedServer) -> Iterator[App]:
    made = http_app(db, server)
    yield made
    made.task_queue.stop()
    made.embedder.close()


def measure_with(window: int):
    return lambda piece: parse_entry(token_info(piece, window), piece)


def node_table(db: Database) -> list[tuple]:
    with db.read() as session:
        return [
            tuple(r)
            for r in session.execute(
                text(
                    'SELECT parent_kind, parent_id, node_index, start_char, end_char, token_count, "window", embedding_model '
                    "FROM record_nodes ORDER BY parent_kind, parent_id, node_index"
                )
            )
        ]


def tasks_table(db: Database) -> list[tuple]:
    with db.read() as session:
        return [
            tuple(r)
            for r in session.execute(
                text("SELECT task_type, agent_id, project_id, payload FROM pending_memory_tasks ORDER BY id")
            )
        ]


# -- the token report (OV-1) ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("entry", "ok"),
    [
        ({"count": 3, "window": 8, "truncated": False, "window_end_char": 10}, True),
        ({"count": 9, "window": 8, "truncated": True, "window_end_char": 7}, True),
        ({"count": 9, "window": 8, "truncated": True, "window_end_char": 0}, True),
        (
            {"count": 9, "window": 8, "truncated": False, "window_end_char": 10},
            False,
        ),  # truncated must be count > window
        ({"count": 3, "window": 8, "truncated": False, "window_end_char": 7}, False),  # fits: the end is the text's end
        ({"count": 9, "window": 8, "truncated": True, "window_end_char": 11}, False),  # past the text
        ({"count": 3, "window": 0, "truncated": True, "window_end_char": 10}, False),
        ({"count": -1, "window": 8, "truncated": False, "window_end_char": 10}, False),
        ({"count": True, "window": 8, "truncated": False, "window_end_char": 10}, False),
        ({"count": 3.0, "window": 8, "truncated": False, "window_end_char": 10}, False),
        ({"count": 3, "window": 8, "window_end_char": 10}, False),
        (None, False),
    ],
)
def test_token_report_entries_are_checked(entry: Any, ok: bool) -> None:  # spec OV-1
    assert (parse_entry(entry, "0123456789") is not None) is ok


def test_token_report_over_http(server: EmbedServer, db: Database) -> None:  # spec OV-1
    app = http_app(db, server)
    reporter = build_token_reporter(app.embedder)
    assert reporter.url == server.base_url + "/count_tokens"
    assert reporter.report(["a b c"]) == [TokenInfo(3, 40, False, 5)]
    assert server.token_requests()[-1].body == {"texts": ["a b c"]}
    # anything else is unknown, never "fits"
    server.mutate = lambda payload: {"token_info": None}
    assert reporter.report(["a b c"]) is None
    server.mutate = lambda payload: {"token_info": payload["token_info"] * 2}
    assert reporter.report(["a b c"]) is None
    server.mutate = None
    server.status = 503
    assert reporter.report(["a b c"]) is None
    server.reset_faults()
    server.token_window = None  # a server without the route
    assert reporter.report(["a b c"]) is None
    app.embedder.close()


def test_a_backend_without_the_route_is_not_asked_again_for_a_while(
    server: EmbedServer, db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:  # spec OV-1: a 404 is unknown, and it stays unknown without a request per store
    app = http_app(db, server)
    reporter = app.token_reporter  # the one every store asks (runs_past_window)
    server.token_window = None
    assert reporter.report(["a b c"]) is None
    for n in range(3):
        assert store(app, agent_id="a", content=f"one two three four {n}")["result"] == "stored"
    assert reporter.report(["a b c"]) is None
    assert len(server.token_requests()) == 1
    assert len(server.embed_requests()) == 3
    # A failure that is not a 404 is asked again each time.
    server.token_window = 40
    server.status = 503
    fresh = build_token_reporter(app.embedder)
    assert fresh.report(["a b c"]) is None and fresh.report(["a b c"]) is None
    assert len(server.token_requests()) == 3
    server.reset_faults()
    # Once the recheck time has passed the route is asked again, and its answer used.
    monkeypatch.setattr(reporter, "_absent_until", 1.0)  # a time long past
    assert reporter.report(["a b c"]) == [TokenInfo(3, 40, False, 5)]
    assert len(server.token_requests()) == 4
    app.embedder.close()


def test_a_store_sends_its_embedding_and_its_token_report_together(server: EmbedServer, db: Database) -> None:
    # spec ST-11, OV-4: both asks happen before the write lock, once each; they overlap in time.
    import time

    app = http_app(db, server)
    server.token_window = 40
    assert store(app, agent_id="a", content="warm up the connections")["result"] == "stored"
    server.delay = 0.5  # every answer of the server, /embed and /count_tokens alike
    started = time.monotonic()
    answer = store(app, agent_id="a", content="a b c d")
    took = time.monotonic() - started
    assert answer["result"] == "stored" and answer["embedded"] is True and "nodes" not in answer
    assert [r.body for r in server.token_requests()][-1] == {"texts": ["a b c d"]}
    assert len(server.embed_requests()) == 2 and len(server.token_requests()) == 2
    assert 0.5 <= took < 0.9, took  # one after the other it takes 1 s or more
    app.embedder.close()


def test_no_token_report_without_an_http_embed_url(db: Database, server: EmbedServer) -> None:  # spec OV-1
    api = load_settings(
        {
            "CPERSONA_DB_PATH": str(db.path),
            "CPERSONA_EMBEDDING_MODE": "api",
            "CPERSONA_EMBEDDING_API_URL": server.api_url,
        }
    )
    assert build_token_reporter(build_embedder(api)) is None
    other_path = load_settings(
        {
            "CPERSONA_DB_PATH": str(db.path),
            "CPERSONA_EMBEDDING_MODE": "http",
            "CPERSONA_EMBEDDING_URL": server.base_url + "/vectors",
        }
    )
    assert build_token_reporter(build_embedder(other_path)) is None
    assert build_token_reporter(None) is None


# -- division (OV-9, OV-11) ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("source", "window", "expected"),
    [
        # reference: CPersona 2.6.14 against this server
        (PARAGRAPHS, 40, [(0, 158, 30, 40), (158, 366, 38, 40), (366, 559, 37, 40)]),
        (
            PARAGRAPHS,
            13,
            [
                (0, 66, 12, 13),
                (66, 98, 7, 13),
                (98, 158, 11, 13),
                (158, 225, 12, 13),
                (225, 297, 12, 13),
                (297, 358, 12, 13),
                (358, 425, 12, 13),
                (425, 489, 12, 13),
                (489, 548, 12, 13),
                (548, 559, 3, 13),
            ],
        ),
        (MIXED, 40, [(0, 102, 35, 40), (102, 169, 25, 40), (169, 236, 25, 40), (236, 303, 25, 40), (303, 402, 40, 40)]),
        (
            MIXED,
            13,
            [
                (0, 35, 10, 13),
                (35, 59, 13, 13),
                (59, 102, 12, 13),
                (102, 126, 13, 13),
                (126, 169, 12, 13),
                (169, 193, 13, 13),
                (193, 236, 12, 13),
                (236, 260, 13, 13),
                (260, 303, 12, 13),
                (303, 327, 13, 13),
                (327, 370, 12, 13),
                (370, 394, 13, 13),
                (394, 402, 2, 13),
            ],
        ),
        (JAPANESE, 40, [(0, 180, 40, 40), (180, 360, 40, 40)]),
        (
            JAPANESE,
            13,
            [
                (0, 54, 12, 13),
                (54, 108, 12, 13),
                (108, 162, 12, 13),
                (162, 216, 12, 13),
                (216, 270, 12, 13),
                (270, 324, 12, 13),
                (324, 360, 8, 13),
            ],
        ),
    ],
)
def test_division_matches_the_reference(source: str, window: int, expected: list[tuple]) -> None:  # OV-9
    spans = divide(source, measure_with(window))
    assert [(s.start, s.end, s.token_count, s.window) for s in spans] == expected


@pytest.mark.parametrize("window", [3, 5, 8, 21, 64])
@pytest.mark.parametrize("source", [PARAGRAPHS, MIXED, JAPANESE, LONG])
def test_division_invariants(source: str, window: int) -> None:  # OV-11
    spans = divide(source, measure_with(window))
    assert spans[0].start == 0 and spans[-1].end == len(source)
    assert all(a.end == b.start for a, b in zip(spans, spans[1:]))  # a partition
    assert all(s.token_count <= s.window == window for s in spans)
    assert all(s.token_count == len(tokens_of(source[s.start : s.end])) for s in spans)
    assert divide(source, measure_with(window)) == spans  # deterministic


def test_boundary_classes_in_order() -> None:  # OV-9 step 2
    # a blank line (ending at 15) beats a later line feed and sentence ends, being past half the window
    assert nodes.choose_cut("aaaa bbbb cc.\n\nddd\neee. fff ggg", 24) == 15
    # a blank line before half the window is passed over for the next class
    assert nodes.choose_cut("a\n\nbbbbbbbbbbbbb ccc\nddd", 22) == 21
    # a half-width mark counts only before whitespace or the end; full-width always
    assert nodes.choose_cut("x.y.z and e.g.things more", 16) == 10  # whitespace class: after "and "
    assert nodes.choose_cut("文章です。次の文", 7) == 5
    # no boundary at all: the window's edge, and never an empty cut
    assert nodes.choose_cut("nospacenospace", 9) == 9
    assert nodes.choose_cut("abc", 0) == 1


def test_a_piece_that_still_overflows_is_shrunk() -> None:  # OV-9 step 3
    # A tokenizer whose report for the whole rest overstates the window's reach:
    # the piece cut there still runs over and the cut moves back.
    def measure(piece: str) -> TokenInfo:
        count, window = len(piece), 10  # one token per character
        end = min(len(piece), 15) if count > window else len(piece)  # claims 15 characters fit
        return TokenInfo(count, window, count > window, end)

    spans = divide("abcd efgh ijkl mnop qrst", measure)
    assert [(s.start, s.end) for s in spans] == [(0, 10), (10, 20), (20, 24)]
    assert all(s.token_count <= 10 for s in spans)


def test_division_fails_on_unknown_reports_and_impossible_cuts() -> None:  # OV-9
    with pytest.raises(DivisionFailed, match="unknown"):
        divide("some text", lambda piece: None)
    with pytest.raises(DivisionFailed, match="fits the window"):
        divide("abc", lambda piece: TokenInfo(5, 1, True, 0))  # not even one character fits


# -- the write side (OV-3, OV-4) -----------------------------------------------------------------


def test_store_of_a_long_text_queues_a_node_build(app: App, db: Database, server: EmbedServer) -> None:  # OV-3, OV-4
    # OV-7's shape without OV-5's blocks key: this server builds no blocks (spec §12 point 8)
    answer = store(app, agent_id="tree", content=LONG, project_id="P")
    assert answer == {"ok": True, "result": "stored", "id": 1, "embedded": True, "nodes": {"status": "queued"}}
    assert [(t, a, p, json.loads(payload)) for t, a, p, payload in tasks_table(db)] == [
        ("build_nodes", "tree", "P", {"kind": "mem", "id": 1})
    ]
    assert server.token_requests()[-1].body == {"texts": [LONG]}  # the stored text was measured
    short = store(app, agent_id="tree", content="A short note.")
    assert "nodes" not in short and len(tasks_table(db)) == 1
    # a duplicate writes nothing, so it queues nothing
    assert "nodes" not in store(app, agent_id="tree", content=LONG, project_id="P")


def test_archive_and_update_queue_builds_too(app: App, db: Database) -> None:  # OV-3, OV-7
    assert archive_episode(app, agent_id="tree", summary=LONG)["nodes"] == {"status": "queued"}
    store(app, agent_id="tree", content="short at first")
    assert update_memory(app, memory_id=1, content=LONG + " Edited.", agent_id="tree")["nodes"] == {"status": "queued"}
    assert "nodes" not in update_memory(app, memory_id=1, content="short again", agent_id="tree")
    assert [json.loads(t[3]) for t in tasks_table(db)] == [{"kind": "ep", "id": 1}, {"kind": "mem", "id": 1}]


@pytest.mark.parametrize("setup", ["queue_off", "no_route", "bad_report", "report_down"])
def test_no_queue_no_key_and_the_write_succeeds(db: Database, server: EmbedServer, setup: str) -> None:  # OV-4
    app = http_app(db, server, TASK_QUEUE_ENABLED="false" if setup == "queue_off" else "true")
    if setup == "no_route":
        server.token_window = None
    elif setup == "bad_report":
        server.mutate = lambda payload: (
            {"token_info": [{"count": 99, "window": 40, "truncated": False, "window_end_char": 1}]}
            if "token_info" in payload
            else payload
        )
    elif setup == "report_down":
        server.mutate = lambda payload: {"token_info": None} if "token_info" in payload else payload
    answer = store(app, agent_id="tree", content=LONG)
    assert answer["result"] == "stored" and "nodes" not in answer
    assert tasks_table(db) == []
    if setup == "queue_off":
        assert server.token_requests() == []  # nothing asked when nothing could be queued
    app.embedder.close()


def test_without_http_embeddings_nothing_is_asked_or_queued(db: Database) -> None:  # OV-1, OV-4
    from conftest import make_app

    app = make_app(db)
    assert "nodes" not in store(app, agent_id="tree", content=LONG)
    assert tasks_table(db) == []


def test_a_failed_enqueue_omits_the_key_and_keeps_the_write(app: App, db: Database) -> None:  # OV-4
    refuse_inserts(db, "pending_memory_tasks", "queue is full")
    answer = store(app, agent_id="tree", content=LONG)
    assert answer["result"] == "stored" and "nodes" not in answer
    with db.read() as session:
        assert session.execute(text("SELECT count(*) FROM memories")).scalar() == 1


# -- the build (OV-8, OV-10, OV-11) ---------------------------------------------------------------


def test_the_queued_build_writes_a_partition_with_vectors(app: App, db: Database, server: EmbedServer) -> None:
    # spec OV-8, OV-10, OV-11
    store(app, agent_id="tree", content=LONG)
    assert app.task_queue.drain() == 1
    assert tasks_table(db) == []
    rows = node_table(db)
    expected = divide(LONG, measure_with(40))
    assert [(r[3], r[4], r[5], r[6]) for r in rows] == [(s.start, s.end, s.token_count, s.window) for s in expected]
    assert {r[7] for r in rows} == {"text-embedding-3-small"}  # no fingerprint: the model name (open point 9)
    with db.read() as session:
        stored = current_nodes(session, "mem", 1, LONG, model_keys=nodes.accepted_model_keys(app))
        assert stored is not None and len(stored) == len(expected) > 1
        for row in stored:
            vector = np.frombuffer(row.embedding, dtype="<f4")
            assert np.allclose(vector, server.vector(LONG[row.start : row.end]), atol=1e-6)
        assert session.execute(text("SELECT content FROM memories")).scalar() == LONG  # the parent is untouched
    # a second build finds them current and asks nothing
    before = len(server.token_requests())
    assert build_record_nodes(app, "mem", 1) == "current"
    assert len(server.token_requests()) == before


def test_nodes_are_embedded_in_batches_of_32(db: Database, server: EmbedServer) -> None:  # spec OV-8
    server.token_window = 5
    app = http_app(db, server)
    store(app, agent_id="tree", content=LONG)
    before = len(server.embed_requests())
    app.task_queue.drain()
    count = len(node_table(db))
    assert count > 32
    sizes = [len(r.body["texts"]) for r in server.embed_requests()[before:]]
    assert sizes == [32] * (count // 32) + ([count % 32] if count % 32 else [])
    app.embedder.close()


def test_the_fingerprint_is_the_model_key_when_the_backend_reports_one(db: Database, server: EmbedServer) -> None:
    # spec OV-2 (d), OV-10
    server.capabilities = {"identity": {"model": "hash-64"}, "incomplete": [], "fingerprint": "fp-1"}
    app = http_app(db, server)
    archive_episode(app, agent_id="tree", summary=LONG)
    app.task_queue.drain()
    assert {r[7] for r in node_table(db)} == {"fp-1"}
    assert nodes.accepted_model_keys(app) == {"fp-1", "text-embedding-3-small"}
    app.embedder.close()


def test_nodes_of_another_model_are_rebuilt(app: App, db: Database) -> None:  # spec OV-2 (d), §6.2 (OV-6 repair)
    store(app, agent_id="tree", content=LONG)
    app.task_queue.drain()
    with db.write_connection() as conn:
        conn.exec_driver_sql("UPDATE record_nodes SET embedding_model = 'old-model'")
    assert build_record_nodes(app, "mem", 1) == "built"
    assert {r[7] for r in node_table(db)} == {"text-embedding-3-small"}


def test_a_text_that_fits_gets_no_nodes(app: App, db: Database) -> None:  # spec OV-8
    store(app, agent_id="tree", content="A short note.")
    assert build_record_nodes(app, "mem", 1) == "fits"
    assert build_record_nodes(app, "mem", 99) == "gone"
    assert node_table(db) == []


def test_a_build_for_a_changed_text_is_discarded(app: App, db: Database) -> None:  # spec OV-8
    store(app, agent_id="tree", content=LONG)
    real = app.embedder.embed_many

    def edit_meanwhile(texts, batch_size=32):
        with db.write_connection() as conn:
            conn.exec_driver_sql("UPDATE memories SET content = content || ' (edited)' WHERE id = 1")
        return real(texts, batch_size=batch_size)

    app.embedder.embed_many = edit_meanwhile
    assert build_record_nodes(app, "mem", 1) == "changed"
    assert node_table(db) == []


def test_failed_builds_are_retried_by_the_queue(app: App, db: Database, server: EmbedServer) -> None:  # OV-8, Q-6
    store(app, agent_id="tree", content=LONG)
    # the embedding route answers with no vectors: every attempt fails, and after
    # CPERSONA_TASK_MAX_RETRIES attempts the task is dropped, nothing written
    server.mutate = lambda payload: {"embeddings": []} if "embeddings" in payload else payload
    before = len(server.embed_requests())
    app.task_queue.drain()
    assert len(server.embed_requests()) - before == app.settings.task_max_retries == 3
    assert tasks_table(db) == [] and node_table(db) == []
    # an unknown token report fails the build the same way
    server.reset_faults()
    store(app, agent_id="tree", content=LONG + " Once more.")
    server.mutate = lambda payload: {"token_info": None} if "token_info" in payload else payload
    with pytest.raises(nodes.TaskFailed, match="token report is unknown"):
        build_record_nodes(app, "mem", 2)
    # with the backend back, a new build succeeds
    server.reset_faults()
    store(app, agent_id="tree", content=LONG + " Again.")
    app.task_queue.drain()
    assert {r[1] for r in node_table(db)} == {2, 3}  # the task left queued by the failed build ran too


def test_a_malformed_payload_is_discarded(app: App, db: Database) -> None:  # spec OV-8
    with db.write_connection() as conn:
        conn.exec_driver_sql(
            "INSERT INTO pending_memory_tasks (task_type, agent_id, payload) VALUES "
            "('build_nodes', 'tree', '{\"kind\": \"doc\", \"id\": 1}'), "
            "('build_nodes', 'tree', '{\"kind\": \"mem\", \"id\": true}')"
        )
    assert app.task_queue.drain() == 2
    assert tasks_table(db) == [] and node_table(db) == []


def test_a_queued_build_survives_a_restart(db_path, server: EmbedServer) -> None:  # spec §6 (queue in the DB), §11.1
    first_db = open_sqlite(db_path)
    upgrade(first_db)
    first = http_app(first_db, server)
    assert store(first, agent_id="tree", content=LONG)["nodes"] == {"status": "queued"}
    first.embedder.close()
    first_db.close()  # the process ends before any worker ran

    second_db = open_sqlite(db_path)
    upgrade(second_db)
    second = http_app(second_db, server)
    try:
        assert len(tasks_table(second_db)) == 1
        assert second.task_queue.drain() == 1
        assert len(node_table(second_db)) > 1
    finally:
        second.embedder.close()
        second_db.close()


def test_the_worker_thread_builds_in_the_background(app: App, db: Database) -> None:  # spec OV-3, Q-2
    import time

    from cpersona.services.operations.tasks import start_task_queue

    start_task_queue(app)
    store(app, agent_id="tree", content=LONG)
    deadline = time.monotonic() + 10
    # The nodes commit in the handler's transaction and the task row is settled in the
    # next one (derived work is idempotent), so wait for both before asserting.
    while not (node_table(db) and tasks_table(db) == []) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert node_table(db) and tasks_table(db) == []


# -- reading nodes: get_contents ranges (§7, GR-5, GR-10, GR-11) ----------------------------------


def test_node_ranges_after_the_build(app: App, db: Database) -> None:  # spec GR-5, GR-7, GR-10, GR-11
    store(app, agent_id="tree", content=LONG)
    assert get_contents(app, agent_id="tree", refs=[{"ref": "mem:1", "node": 0}])["unresolved"] == [
        {"ref": "mem:1", "reason": "no_current_nodes"}
    ]  # queued, not built yet (GR-10)
    app.task_queue.drain()
    spans = [(r[3], r[4]) for r in node_table(db)]
    count = len(spans)
    answer = get_contents(
        app,
        agent_id="tree",
        refs=[
            {"ref": "mem:1", "node": 0},
            {"ref": "mem:1", "node": [0, 1]},
            {"ref": "mem:1", "node": count},
            {"ref": "mem:1", "node": [1, count - 1], "revision": revision_of(LONG)},
        ],
    )
    first, pair, tail = answer["items"]
    assert first["content"] == LONG[spans[0][0] : spans[0][1]]
    assert first["range"] == {"span": list(spans[0]), "node": [0, 0], "of": count, "content_len": len(LONG)}
    assert pair["range"] == {"span": [0, spans[1][1]], "node": [0, 1], "of": count, "content_len": len(LONG)}
    assert tail["content"] == LONG[spans[1][0] :]
    assert answer["unresolved"] == [{"ref": "mem:1", "reason": "node_out_of_range"}]
    # an edit removes the nodes at once; the old revision is stale
    update_memory(app, memory_id=1, content=LONG + " Edited.", agent_id="tree")
    after = get_contents(
        app,
        agent_id="tree",
        refs=[{"ref": "mem:1", "node": 0}, {"ref": "mem:1", "node": 0, "revision": revision_of(LONG)}],
    )
    assert after["unresolved"] == [
        {"ref": "mem:1", "reason": "no_current_nodes"},
        {"ref": "mem:1", "reason": "stale_revision"},
    ]
    app.task_queue.drain()
    assert get_contents(app, agent_id="tree", refs=[{"ref": "mem:1", "node": 0}])["count"] == 1


def test_episode_node_offsets_are_in_the_summary(app: App, db: Database) -> None:  # spec GR-8
    archive_episode(app, agent_id="tree", summary=LONG)
    app.task_queue.drain()
    item = get_contents(app, agent_id="tree", refs=[{"ref": "ep:1", "node": 0}])["items"][0]
    assert item["content"] == LONG[: item["range"]["span"][1]]  # no '[Episode] ' label in a slice


def test_a_node_set_that_does_not_partition_the_text_is_not_current(app: App, db: Database) -> None:  # GR-5, OV-2
    store(app, agent_id="tree", content=LONG)
    app.task_queue.drain()
    with db.write_connection() as conn:
        conn.exec_driver_sql("DELETE FROM record_nodes WHERE node_index = 1")
    assert get_contents(app, agent_id="tree", refs=[{"ref": "mem:1", "node": 0}])["unresolved"] == [
        {"ref": "mem:1", "reason": "no_current_nodes"}
    ]
    assert build_record_nodes(app, "mem", 1) == "built"  # and the builder repairs it


def test_merge_queues_builds_for_long_rows_it_writes(app: App, db: Database) -> None:  # spec MG-8
    from sqlalchemy import select

    from cpersona.services.portability import merge_memories
    from cpersona.storage.models import Episode, Memory

    store(app, agent_id="src", content=LONG)
    store(app, agent_id="src", content="A short note.")
    archive_episode(app, agent_id="src", summary=LONG)
    before = len(tasks_table(db))
    answer = merge_memories(app, source_agent_id="src", target_agent_id="dst", mode="copy")
    assert answer["ok"] and answer["merged_memories"] == 2 and answer["merged_episodes"] == 1
    queued = [(t, a, json.loads(p)) for t, a, _, p in tasks_table(db)][before:]
    with db.read() as session:
        long_mem = session.scalar(select(Memory.id).where(Memory.agent_id == "dst", Memory.content == LONG))
        long_ep = session.scalar(select(Episode.id).where(Episode.agent_id == "dst"))
    assert sorted(queued, key=str) == sorted(
        [
            ("build_nodes", "dst", {"kind": "mem", "id": long_mem}),
            ("build_nodes", "dst", {"kind": "ep", "id": long_ep}),
        ],
        key=str,
    )
    # a dry run measures nothing and queues nothing
    assert merge_memories(app, source_agent_id="src", target_agent_id="dry", dry_run=True)["ok"]
    assert len(tasks_table(db)) == before + 2


def test_nodes_are_never_search_candidates(app: App, db: Database) -> None:  # spec OV-12
    from cpersona.services.reconstruct import reconstruct
    from cpersona.services.recall.service import recall

    store(app, agent_id="tree", content=LONG)
    app.task_queue.drain()
    assert len(node_table(db)) > 1  # the record has a node set
    out = reconstruct(app, agent_id="tree", query="Sentence number 17 Atlas cluster", trace=True)
    assert out["trace"]["candidate_refs"] == ["mem:1"]  # the record, once; no node of it
    found = recall(app, agent_id="tree", query="Sentence number 17 Atlas cluster")
    assert len(found["messages"]) == 1 and found["messages"][0]["content"].startswith("Sentence number 0 ")
