"""Remote vector mode: the embedding service's own index serves the vector channel (spec EMB-6).

Every test runs on a real SQLite file against the real local HTTP server of
tests/embed_server.py with its in-memory remote index switched on, so the
requests checked here are the bytes the server really received. Wire shapes
are the ones CPersona 2.6.14 sends (observed over MCP against a logging
server): ``/index {namespace, items:[{id, text}]}``, ``/remove {namespace,
ids}``, ``/purge {namespace}``, ``/search {namespace, query, limit,
min_similarity}``.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from sqlalchemy import insert, select

from conftest import db_settings_env
from cpersona.config import load_settings
from cpersona.embedding.client import build_embedder
from cpersona.embedding.remote import RemoteIndex, build_remote_index, parse_ref, results_from_search
from cpersona.embedding.validate import EmbeddingResponseError
from cpersona.services.records.admin import delete_agent_data, delete_episode, delete_memory, update_memory
from cpersona.services.app import App
from cpersona.services.records.episodes import archive_episode
from cpersona.services.records.memories import store
from cpersona.services.recall.service import recall
from cpersona.services.recall.retrievers import Query, exclusion, retrieve, search_backend
from cpersona.storage.models import Episode, Memory
from cpersona.storage.scope import Scope
from embed_server import REMOTE_ROUTES, EmbedServer

NS = "cpersona:a"


@pytest.fixture
def server():
    srv = EmbedServer(remote_index=True).start()
    try:
        yield srv
    finally:
        srv.stop()


def remote_app(db, server: EmbedServer, *, url: str | None = None, **env: str) -> App:
    environ = {
        **db_settings_env(db),
        "CPERSONA_EMBEDDING_MODE": "http",
        "CPERSONA_EMBEDDING_URL": url or server.url,
        "CPERSONA_VECTOR_SEARCH_MODE": "remote",
        **{f"CPERSONA_{k}": v for k, v in env.items()},
    }
    settings = load_settings(environ)
    return App(db=db, settings=settings, embedder=build_embedder(settings))


@pytest.fixture
def rapp(db, server):
    app = remote_app(db, server)
    yield app
    app.embedder.close()


@pytest.fixture
def blobless(db, server):
    """Remote mode keeping no local vectors (CPERSONA_STORE_BLOB=false)."""
    app = remote_app(db, server, STORE_BLOB="false")
    yield app
    app.embedder.close()


def bodies(server: EmbedServer, route: str) -> list[Any]:
    return [r.body for r in server.route_requests(route)]


def embedding_of(db, memory_id: int) -> bytes | None:
    with db.read() as session:
        return session.scalar(select(Memory.embedding).where(Memory.id == memory_id))


def vector_list(app: App, query: Query, depth: int = 10) -> list[tuple[str, int]]:
    found = retrieve(app, search_backend(app), query, depth, exclusion([]))
    return [key for lst in found.lists if lst.channel in ("vector", "far") for key in (e.key for e in lst.entries)]


def add_memory(db, **row: Any) -> int:
    values = {
        "agent_id": "a",
        "content": "x",
        "source": '{"type": "Agent", "id": "a", "name": ""}',
        "timestamp": "2026-06-02T00:00:00+00:00",
        **row,
    }
    with db.write() as session:
        return session.execute(insert(Memory).values(**values)).inserted_primary_key[0]


def add_episode(db, **row: Any) -> int:
    values = {"agent_id": "a", "summary": "x", "created_at": "2026-06-01 12:00:00", **row}
    with db.write() as session:
        return session.execute(insert(Episode).values(**values)).inserted_primary_key[0]


# -- writes push to /index; embedded says whether a vector was kept (ST-6) ----------------------


def test_store_pushes_the_text_and_keeps_a_local_blob_by_default(rapp, db, server):  # spec ST-6, EMB-6
    answer = store(rapp, agent_id="a", content="the cat sat on the mat")
    assert answer["embedded"] is True
    assert bodies(server, "/index") == [
        {"namespace": NS, "items": [{"id": f"mem:{answer['id']}", "text": "the cat sat on the mat"}]}
    ]
    assert embedding_of(db, answer["id"]) is not None  # CPERSONA_STORE_BLOB=true: the local fallback exists
    assert server.indexed(NS) == {f"mem:{answer['id']}": "the cat sat on the mat"}


def test_index_failure_with_a_local_blob_is_still_embedded(rapp, db, server):  # spec ST-6
    server.route_status["/index"] = 500
    answer = store(rapp, agent_id="a", content="dogs bark loudly")
    assert answer == {**answer, "ok": True, "result": "stored", "embedded": True}
    assert embedding_of(db, answer["id"]) is not None


def test_without_blobs_embedded_is_exactly_the_push_outcome(blobless, db, server):  # spec ST-6
    pushed = store(blobless, agent_id="a", content="birds fly south")
    server.route_status["/index"] = 500
    failed = store(blobless, agent_id="a", content="fish swim deep")
    server.route_status["/index"] = 404  # an index without the route: tolerated, nothing kept
    absent = store(blobless, agent_id="a", content="owls hoot late")
    assert (pushed["embedded"], failed["embedded"], absent["embedded"]) == (True, False, False)
    assert all(a["ok"] and a["result"] == "stored" for a in (pushed, failed, absent))
    assert server.embed_requests() == []  # no local vector is kept, so none is asked for
    assert [embedding_of(db, a["id"]) for a in (pushed, failed, absent)] == [None, None, None]


def test_a_skipped_store_pushes_nothing(rapp, server):  # spec ST-4
    store(rapp, agent_id="a", content="same text")
    store(rapp, agent_id="a", content="same text")
    assert len(bodies(server, "/index")) == 1


def test_archive_and_update_push_their_text(rapp, server):  # spec EMB-6, AE-5, UM-6
    episode = archive_episode(rapp, agent_id="a", summary="we talked about cats", keywords="cat")
    memory = store(rapp, agent_id="a", content="old words")
    assert update_memory(rapp, memory_id=memory["id"], content="new words", agent_id="a")["ok"] is True
    assert bodies(server, "/index") == [
        {"namespace": NS, "items": [{"id": f"ep:{episode['episode_id']}", "text": "we talked about cats"}]},
        {"namespace": NS, "items": [{"id": f"mem:{memory['id']}", "text": "old words"}]},
        {"namespace": NS, "items": [{"id": f"mem:{memory['id']}", "text": "new words"}]},
    ]
    assert server.indexed(NS)[f"mem:{memory['id']}"] == "new words"


# -- deletes reach /remove and /purge (admin DM, DE-2, DAD-2) ------------------------------------


def test_deletes_remove_from_the_owner_namespace(rapp, server):  # spec admin-and-safety DE-2, §3 delete order
    memory = store(rapp, agent_id="owner", content="to be deleted")["id"]
    episode = archive_episode(rapp, agent_id="owner", summary="episode to delete")["episode_id"]
    # Unscoped deletes (no agent_id) still name the owner's namespace, read before the delete.
    assert delete_memory(rapp, memory_id=memory)["ok"] is True
    assert delete_episode(rapp, episode_id=episode)["ok"] is True
    assert bodies(server, "/remove") == [
        {"namespace": "cpersona:owner", "ids": [f"mem:{memory}"]},
        {"namespace": "cpersona:owner", "ids": [f"ep:{episode}"]},
    ]
    assert server.indexed("cpersona:owner") == {}


def test_a_refused_delete_removes_nothing(rapp, server):  # spec DM-2, DE-1
    memory = store(rapp, agent_id="a", content="locked row", lock=True)["id"]
    assert delete_memory(rapp, memory_id=memory, agent_id="a")["ok"] is False
    assert delete_episode(rapp, episode_id=4242, agent_id="a")["ok"] is False
    assert bodies(server, "/remove") == []


def test_remove_and_purge_failures_are_tolerated(rapp, server):  # spec EMB-6, DAD-2 (failure logged only)
    memory = store(rapp, agent_id="a", content="row one")["id"]
    store(rapp, agent_id="a", content="row two")
    server.route_status.update({"/remove": 404, "/purge": 500})
    assert delete_memory(rapp, memory_id=memory, agent_id="a") == {"ok": True, "deleted_id": memory}
    answer = delete_agent_data(rapp, agent_id="a")
    assert answer["ok"] is True and answer["deleted_memories"] == 1
    assert bodies(server, "/purge") == [{"namespace": NS}]


def test_delete_agent_data_purges_only_that_namespace(rapp, server):  # spec DAD-2
    store(rapp, agent_id="a", content="mine")
    store(rapp, agent_id="b", content="theirs")
    delete_agent_data(rapp, agent_id="a")
    assert server.indexed(NS) == {} and list(server.indexed("cpersona:b").values()) == ["theirs"]


# -- recall: the remote answer replaces the local scan ------------------------------------------


def test_search_request_shape_and_no_query_embedding(rapp, server):  # spec EMB-6, VEC-4
    store(rapp, agent_id="a", content="the cat sat on the mat")
    server.requests.clear()
    recall(rapp, agent_id="a", query="cat on a mat", limit=7)
    # rrf: the arm's threshold is t × CPERSONA_RRF_THRESHOLD_FACTOR = 0.3 × 0.5
    assert bodies(server, "/search") == [
        {"namespace": NS, "query": "cat on a mat", "limit": 7, "min_similarity": pytest.approx(0.15)}
    ]
    assert server.embed_requests() == []  # an answer makes the local query vector unnecessary


def test_the_answer_replaces_the_local_scan(rapp, db, server):  # spec EMB-6
    near = store(rapp, agent_id="a", content="the cat sat on the mat")["id"]
    far = store(rapp, agent_id="a", content="quarterly tax filing deadline")["id"]
    # The service ranks the unrelated row first; the local blobs would say the opposite.
    server.search_results = [{"id": f"mem:{far}", "score": 0.91}, {"id": f"mem:{near}", "score": 0.4}]
    assert vector_list(rapp, Query("a", "cat mat", Scope("a"))) == [("mem", far), ("mem", near)]
    messages = recall(rapp, agent_id="a", query="quarterly", limit=5)["messages"]
    top = next(m for m in messages if m["ref"] == f"mem:{far}")
    assert top["match_reason"]["cosine"] == pytest.approx(0.91)  # VEC-6: the service's score is the cosine


def test_an_empty_answer_is_an_answer(rapp, server):  # spec EMB-6: no fallback scan on a valid reply
    store(rapp, agent_id="a", content="the cat sat on the mat")
    server.requests.clear()
    server.search_results = []
    assert vector_list(rapp, Query("a", "the cat sat on the mat", Scope("a"))) == []
    assert server.embed_requests() == []


def test_the_far_list_is_not_read_in_remote_mode(db, server):  # spec VEC-7, EMB-6
    app = remote_app(db, server, MAX_MEMORIES="1", VECTOR_REACH="50")
    ids = [store(app, agent_id="a", content=f"note about cats number {i}")["id"] for i in range(4)]
    server.search_results = [{"id": f"mem:{i}", "score": 0.8} for i in ids]
    found = retrieve(app, search_backend(app), Query("a", "cats", Scope("a")), 10, exclusion([]))
    assert [lst.channel for lst in found.lists if lst.channel in ("vector", "far")] == ["vector"]
    assert [e.key[1] for lst in found.lists if lst.channel == "vector" for e in lst.entries] == ids
    app.embedder.close()


def test_scores_below_the_arm_threshold_are_dropped(rapp, server):  # spec VEC-4
    keep = store(rapp, agent_id="a", content="kept row")["id"]
    low = store(rapp, agent_id="a", content="weak row")["id"]
    server.search_results = [{"id": f"mem:{keep}", "score": 0.2}, {"id": f"mem:{low}", "score": 0.05}]
    assert vector_list(rapp, Query("a", "row", Scope("a"))) == [("mem", keep)]


def test_a_remote_answer_counts_as_healthy(rapp, server):  # spec ADV-2
    server.search_results = []
    recall(rapp, agent_id="a", query="anything at all", limit=3)
    assert rapp.embedding_health.snapshot()[0] == "healthy"
    assert server.embed_requests() == []


# -- isolation: a remote id is only a candidate until the local scope says so ----------------------


@pytest.mark.both_backends  # the hydration is SQL each backend runs
def test_remote_ids_outside_the_scope_never_leak(rapp, db, server):  # spec ISO-2, AX-1, EMB-6
    mine = add_memory(db, content="mine, global project")
    mine_project = add_memory(db, content="mine, project p", project_id="p")
    other_project = add_memory(db, content="mine, project q", project_id="q")
    other_channel = add_memory(db, content="mine, channel d", channel="d")
    same_channel = add_memory(db, content="mine, channel c", channel="c")
    other_agent = add_memory(db, agent_id="b", content="agent b's row")
    deleted = add_memory(db, content="deleted soon")
    my_episode = add_episode(db, summary="my episode")
    their_episode = add_episode(db, agent_id="b", summary="their episode")
    assert delete_memory(rapp, memory_id=deleted, agent_id="a")["ok"] is True
    server.search_results = [
        {"id": f"mem:{i}", "score": 0.9}
        for i in (mine, mine_project, other_project, other_channel, same_channel, other_agent, deleted, 999_999)
    ] + [
        {"id": f"ep:{my_episode}", "score": 0.85},
        {"id": f"ep:{their_episode}", "score": 0.85},
        {"id": "bogus", "score": 0.99},
        {"id": "mem:0", "score": 0.99},
        {"id": "note:1", "score": 0.99},
    ]
    got = vector_list(rapp, Query("a", "rows", Scope("a", project_id="p", channel="c"), channel="c"))
    assert got == [("mem", mine), ("mem", mine_project), ("mem", same_channel), ("ep", my_episode)]
    # Through the whole recall, too: nothing outside the scope reaches the answer.
    answer = recall(rapp, agent_id="a", query="rows", project_id="p", channel="c", limit=20)
    leaked = {f"mem:{i}" for i in (other_project, other_channel, other_agent, deleted, 999_999)} | {
        f"ep:{their_episode}"
    }
    assert not leaked & {m.get("ref") for m in answer["messages"]}


@pytest.mark.both_backends
def test_source_filter_applies_to_remote_memories_and_skips_episodes(rapp, db, server):  # spec ISO-3, ISO-4
    u1 = add_memory(db, content="from u1", source='{"type": "User", "id": "u1", "name": ""}')
    u2 = add_memory(db, content="from u2", source='{"type": "User", "id": "u2", "name": ""}')
    episode = add_episode(db, summary="an episode")
    server.search_results = [
        {"id": f"mem:{u2}", "score": 0.9},
        {"id": f"mem:{u1}", "score": 0.8},
        {"id": f"ep:{episode}", "score": 0.95},
    ]
    assert vector_list(rapp, Query("a", "from", Scope("a"), source_id="u1")) == [("mem", u1)]
    # A source filter with a channel named still admits episodes (ISO-4).
    assert vector_list(rapp, Query("a", "from", Scope("a", channel="c"), source_id="u1", channel="c")) == [
        ("ep", episode),
        ("mem", u1),
    ]


# -- failures fall back to the local scan ---------------------------------------------------------


@pytest.mark.parametrize(
    "break_search",
    [
        lambda s: s.route_status.update({"/search": 404}),  # a service without the route
        lambda s: s.route_status.update({"/search": 503}),
        lambda s: setattr(s, "search_results", [{"id": "mem:1"}]),  # no score: nothing can rank it
        lambda s: setattr(s, "search_results", [{"id": "mem:1", "score": True}]),
        lambda s: setattr(s, "search_results", [{"id": "mem:1", "score": "0.9"}]),
    ],
)
def test_a_failed_search_falls_back_to_the_local_scan(rapp, server, break_search):  # spec EMB-6
    row = store(rapp, agent_id="a", content="the cat sat on the mat")["id"]
    break_search(server)
    server.requests.clear()
    assert vector_list(rapp, Query("a", "cat sat on the mat", Scope("a"))) == [("mem", row)]
    assert len(server.embed_requests()) == 1  # the local scan needed the query's own vector


def test_a_slow_search_times_out_and_falls_back(db, server):  # spec EMB-6, CPERSONA_REMOTE_SEARCH_TIMEOUT_SECS
    app = remote_app(db, server, REMOTE_SEARCH_TIMEOUT_SECS="0.2")
    row = store(app, agent_id="a", content="the cat sat on the mat")["id"]
    server.route_delay["/search"] = 1.0
    assert vector_list(app, Query("a", "the cat sat on the mat", Scope("a"))) == [("mem", row)]
    app.embedder.close()


def test_without_blobs_a_failed_search_leaves_no_vector_rows(blobless, server):  # spec health R-42 (the hint's case)
    store(blobless, agent_id="a", content="the cat sat on the mat")
    server.route_status["/search"] = 500
    assert vector_list(blobless, Query("a", "the cat sat on the mat", Scope("a"))) == []


# -- routes exist only beside an /embed URL --------------------------------------------------------


def test_no_sibling_routes_unless_the_url_ends_in_embed(db, server):  # spec EMB-6
    app = remote_app(db, server, url=f"{server.base_url}/embedder")
    assert build_remote_index(app.settings, app.embedder) is None
    answer = store(app, agent_id="a", content="stored without any index")
    recall(app, agent_id="a", query="stored without any index", limit=3)
    delete_memory(app, memory_id=answer["id"], agent_id="a")
    delete_agent_data(app, agent_id="a")
    assert answer["embedded"] is False  # /embedder is not served: no vector anywhere
    assert [r.path for r in server.requests if r.path.split("?")[0] in REMOTE_ROUTES] == []
    app.embedder.close()


def test_local_mode_never_touches_the_index(db, server):  # spec EMB-6: the routes are for remote mode only
    app = remote_app(db, server, VECTOR_SEARCH_MODE="local")
    answer = store(app, agent_id="a", content="local only")
    recall(app, agent_id="a", query="local only", limit=3)
    delete_memory(app, memory_id=answer["id"], agent_id="a")
    assert [r.path for r in server.requests if r.path.split("?")[0] in REMOTE_ROUTES] == []
    app.embedder.close()


def test_sibling_urls_keep_the_query_and_replace_only_the_last_segment():  # spec EMB-6
    index = RemoteIndex(embed_url="http://h:1/svc/embed?k=v")
    assert [index.url(r) for r in ("search", "index", "remove", "purge")] == [
        "http://h:1/svc/search?k=v",
        "http://h:1/svc/index?k=v",
        "http://h:1/svc/remove?k=v",
        "http://h:1/svc/purge?k=v",
    ]
    assert not RemoteIndex(embed_url="http://h:1/svc/embeddings").available
    assert not RemoteIndex(embed_url="ftp://h/embed").available
    index.close()


# -- the client's answer checks --------------------------------------------------------------------


def test_answer_checks():  # spec EMB-6 (answer shape), EMB-3 discipline
    hits = results_from_search(
        {
            "results": [
                {"id": "mem:3", "score": 0.5},
                {"id": "mem:3", "score": 0.9},
                {"id": "ep:2", "score": -0.1},
                {"id": 7, "score": 0.9},
            ]
        }
    )
    assert [(h.kind, h.id, h.score) for h in hits] == [("mem", 3, 0.5), ("ep", 2, -0.1)]
    for broken in (
        {},
        {"results": {}},
        {"results": ["mem:1"]},
        {"results": [{"id": "mem:1", "score": None}]},
        {"results": [{"id": "mem:1", "score": float("nan")}]},
    ):
        with pytest.raises(EmbeddingResponseError):
            results_from_search(broken)
    assert [parse_ref(v) for v in ("mem:12", "ep:1", "mem:012", "mem:-1", "mem: 1", "MEM:1", "ep:1x")] == [
        ("mem", 12),
        ("ep", 1),
        None,
        None,
        None,
        None,
        None,
    ]


def test_index_batches_and_namespace_per_agent(server):  # spec EMB-6
    index = RemoteIndex(embed_url=server.url)
    items = [(f"mem:{i}", f"text {i}") for i in range(1, 600)]
    assert index.index("agent with spaces", items) is True
    sent = bodies(server, "/index")
    assert [len(b["items"]) for b in sent] == [512, 87]
    assert {b["namespace"] for b in sent} == {"cpersona:agent with spaces"}
    assert json.loads(json.dumps(sent[0]["items"][0])) == {"id": "mem:1", "text": "text 1"}
    index.close()


# -- bulk writes: merge and import push after commit (MG-7, MG-8, IM-13, IM-14) ----------------------


def test_merge_copy_pushes_to_the_target_and_move_purges_an_emptied_source(rapp, db, server):
    from cpersona.services.portability import merge_memories

    store(rapp, agent_id="a", content="first fact")
    archive_episode(rapp, agent_id="a", summary="an episode of a")
    server.requests.clear()
    assert merge_memories(rapp, source_agent_id="a", target_agent_id="b", dry_run=True)["ok"] is True
    assert bodies(server, "/index") == []  # a dry run writes nowhere
    assert merge_memories(rapp, source_agent_id="a", target_agent_id="b")["ok"] is True  # MG-8
    assert sorted(server.indexed("cpersona:b").values()) == ["an episode of a", "first fact"]
    with db.read() as session:
        b_ids = {f"mem:{i}" for i in session.scalars(select(Memory.id).where(Memory.agent_id == "b"))}
    assert b_ids <= set(server.indexed("cpersona:b"))
    assert merge_memories(rapp, source_agent_id="a", target_agent_id="c", mode="move")["ok"] is True  # MG-7
    assert bodies(server, "/purge") == [{"namespace": NS}]


def test_merge_move_that_leaves_rows_removes_only_the_moved_ones(rapp, server):  # spec MG-7
    from cpersona.services.portability import merge_memories

    moved = store(rapp, agent_id="a", content="moves over")["id"]
    store(rapp, agent_id="a", content="already there")
    store(rapp, agent_id="b", content="already there")  # skipped by the merge, so it stays at a
    server.requests.clear()
    answer = merge_memories(rapp, source_agent_id="a", target_agent_id="b", mode="move")
    assert answer["left_at_source"]["memories"] == 1
    assert bodies(server, "/remove") == [{"namespace": NS, "ids": [f"mem:{moved}"]}]
    assert bodies(server, "/purge") == []


def test_import_pushes_inserted_rows_after_commit_and_dry_run_does_not(rapp, db, server, tmp_path):  # IM-13/14
    from cpersona.services.portability import export_memories, import_memories

    store(rapp, agent_id="a", content="exported fact")
    out = tmp_path / "a.jsonl"
    assert export_memories(rapp, agent_id="a", output_path=str(out))["ok"] is True
    server.requests.clear()
    assert import_memories(rapp, input_path=str(out), target_agent_id="z", dry_run=True)["ok"] is True
    assert bodies(server, "/index") == []
    answer = import_memories(rapp, input_path=str(out), target_agent_id="z")
    assert answer["imported_memories"] == 1
    with db.read() as session:
        new_id = session.scalar(select(Memory.id).where(Memory.agent_id == "z"))
    assert bodies(server, "/index") == [
        {"namespace": "cpersona:z", "items": [{"id": f"mem:{new_id}", "text": "exported fact"}]}
    ]


def test_health_rewrites_reach_the_remote_index(rapp, db, server):  # spec health H-6
    from cpersona.services.health.check_health import check_health

    row = add_memory(db, content="hello <@123456789> there, see you")
    answer = check_health(rapp, agent_id="a", fix=True, checks=["discord_mention"])
    assert answer.get("ok", True) is not False
    with db.read() as session:
        now = session.scalar(select(Memory.content).where(Memory.id == row))
    assert now != "hello <@123456789> there, see you"  # the repair did rewrite it
    assert bodies(server, "/index") == [{"namespace": NS, "items": [{"id": f"mem:{row}", "text": now}]}]


# -- the real server process, over stdio ---------------------------------------------------------


@pytest.mark.anyio
async def test_remote_mode_end_to_end_over_stdio(tmp_path, server):  # spec EMB-6, ST-6, DM (remove)
    import os
    import sys

    from mcp import Client, StdioServerParameters

    env = {k: v for k, v in os.environ.items() if not k.startswith(("CPERSONA_", "EMBEDDING_"))}
    env.update(
        {
            "CPERSONA_DB_PATH": str(tmp_path / "data" / "memory.db"),
            "CPERSONA_UPDATE_CHECK": "false",
            "CPERSONA_EMBEDDING_MODE": "http",
            "CPERSONA_EMBEDDING_URL": server.url,
            "CPERSONA_VECTOR_SEARCH_MODE": "remote",
            "CPERSONA_STORE_BLOB": "false",
        }
    )
    params = StdioServerParameters(command=sys.executable, args=["-m", "cpersona"], env=env, cwd=os.getcwd())

    async def call(client: Client, tool: str, **arguments: Any) -> dict:
        result = await client.call_tool(tool, arguments)
        assert result.is_error is False, result.content
        return json.loads(result.content[0].text)

    async with Client(params) as client:
        stored = await call(client, "store", agent_id="a", content="The orchard apples ripen in late September")
        assert stored["embedded"] is True  # no local blob: the accepted push is the kept vector
        found = await call(client, "recall", agent_id="a", query="when do orchard apples ripen", limit=5)
        row = next(m for m in found["messages"] if m["ref"] == f"mem:{stored['id']}")
        assert row["match_reason"]["cosine"] > 0.3  # scored by the service's index, not a local blob
        assert (await call(client, "delete_memory", agent_id="a", memory_id=stored["id"]))["ok"] is True
    assert bodies(server, "/search")[0]["namespace"] == NS
    assert server.indexed(NS) == {}  # pushed, then removed


def test_health_deletes_leave_the_remote_index(rapp, db, server):  # spec health H-6
    from cpersona.services.health.check_health import check_health
    from cpersona.services.health.content import clean_mentions
    from cpersona.services.health.deep_check import deep_check

    raw = "hello <@123456789> there, see you"
    twin = add_memory(db, content=clean_mentions(raw))
    folded = add_memory(db, content=raw)  # its cleaned text equals the twin's: the repair folds it away
    short = add_memory(db, content="ok")
    kept = add_memory(db, content="said twice")
    covered = add_memory(db, content="said twice", channel="d")  # covered by the channel-less copy
    check_health(rapp, agent_id="a", fix=True, checks=["discord_mention", "duplicate_content"])
    deep_check(rapp, agent_id="a", fix=True, checks=["short_content"])
    with db.read() as session:
        left = set(session.scalars(select(Memory.id)))
    assert left == {twin, kept}  # the repairs really deleted their rows
    assert bodies(server, "/remove") == [
        {"namespace": NS, "ids": sorted([f"mem:{folded}", f"mem:{covered}"])},
        {"namespace": NS, "ids": [f"mem:{short}"]},
    ]


def test_update_with_the_same_text_pushes_a_row_again(blobless, server):  # the operations guide's re-push
    server.route_status["/index"] = 503
    row = store(blobless, agent_id="a", content="pushed later")
    assert row["embedded"] is False
    server.route_status.clear()
    assert update_memory(blobless, memory_id=row["id"], content="pushed later", agent_id="a")["ok"] is True
    assert server.indexed(NS) == {f"mem:{row['id']}": "pushed later"}
