"""cpersona ui: the token, escaping, read-only refusals and the tools' rules, over Starlette's TestClient.

The page runs on a real migrated SQLite file (the ``app`` fixture) with the
server's own registry and gate chain (the one ``cpersona ui`` builds), so a
change made here is a tool call with every rule of the tools.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit

import anyio
import pytest
from starlette.testclient import TestClient

from conftest import make_app
from cpersona.mcp.dispatch import call_tool
from cpersona.mcp.tools import default_registry
from cpersona.services.app import App
from cpersona.services.records import browse
from cpersona.storage.repositories.nodes import NodeRepository
from cpersona.ui import pages
from cpersona.ui.cli import _gates
from cpersona.ui.server import COOKIE, SECURITY_HEADERS, UiState, build_ui_app

pytestmark = pytest.mark.both_backends  # the browse repository's SQL runs on SQLite and PostgreSQL

TOKEN = "test-token-not-secret"
HOSTILE = '<script>document.title="pwned"</script><img src=x onerror="alert(1)">'
HOSTILE_AGENT = "<i>eve</i>"


def tool(app: App, name: str, **arguments: Any) -> dict[str, Any]:
    gates, context = _gates(app.settings)
    return anyio.run(call_tool, app, default_registry(), gates, name, arguments, context).payload


def seed(app: App) -> dict[str, int]:
    """Two agents, a hostile memory with entities, an episode, a profile, a long memory with nodes."""
    ids = {}
    ids["hostile"] = tool(
        app,
        "store",
        agent_id="alice",
        content=f"Kirari keeps MizEye running {HOSTILE}",
        channel="dev",
        project_id="p1",
        associations={
            "entities": [{"name": "MizEye"}, {"name": "<b>Kirari</b>"}],
            "relations": [{"subject": "<b>Kirari</b>", "predicate": "maintains", "object": "MizEye"}],
        },
    )["id"]
    ids["plain"] = tool(
        app,
        "store",
        agent_id="alice",
        content="The deploy window is Friday noon",
        associations={
            "relations": [
                {"subject": "MizEye", "predicate": "depends_on", "object": "OpenCV"},
                {"subject": "OpenCV", "predicate": "written_in", "object": "C++"},
            ]
        },
    )["id"]
    ids["bob"] = tool(app, "store", agent_id="bob", content="Bob prefers green tea", channel="ops")["id"]
    ids["eve"] = tool(
        app, "store", agent_id=HOSTILE_AGENT, content="Eve was here", project_id="<u>p</u>", channel="<s>c</s>"
    )["id"]  # names are stored text too: filters, tables and charts show them
    ids["episode"] = tool(
        app, "archive_episode", agent_id="alice", summary=f"Talked about MizEye {HOSTILE}", keywords="mizeye"
    )["episode_id"]
    assert tool(app, "update_profile", agent_id="alice", profile=f"Alice, engineer {HOSTILE}")["ok"] is True
    with app.db.write() as session:
        NodeRepository(session).replace(
            "mem",
            ids["plain"],
            [
                {
                    "node_index": 0,
                    "start_char": 0,
                    "end_char": 10,
                    "token_count": 3,
                    "window": 256,
                    "embedding": None,
                    "embedding_model": "",
                }
            ],
        )
    return ids


def client_for(app: App, *, write: bool = False) -> TestClient:
    gates, context = _gates(app.settings)
    state = UiState(app=app, registry=default_registry(), gates=gates, token=TOKEN, write=write, context=context)
    client = TestClient(build_ui_app(state), base_url="http://127.0.0.1")
    answer = client.get(f"/?token={TOKEN}", follow_redirects=False)
    assert answer.status_code == 303 and COOKIE in answer.cookies
    return client


def memory_row(app: App, memory_id: int) -> tuple[str, int] | None:
    found = browse.record(app, "mem", memory_id)
    return None if found is None else (found["fields"]["content"], found["fields"]["locked"])


# Every page a browser reaches, with the query that makes it show stored text.
def page_urls(ids: dict[str, int]) -> list[str]:
    return [
        "/?q=MizEye&agent=alice",
        "/timeline",
        f"/record/mem/{ids['hostile']}",
        f"/record/ep/{ids['episode']}",
        "/profile?agent=alice",
        "/graph?agent=alice&entity=MizEye",
        "/graph?agent=alice",
        "/health",
        "/stats",
    ]


def test_every_route_refuses_a_request_without_the_token(app):
    ids = seed(app)
    gates, context = _gates(app.settings)
    state = UiState(app=app, registry=default_registry(), gates=gates, token=TOKEN, write=True, context=context)
    client = TestClient(build_ui_app(state), base_url="http://127.0.0.1")
    concrete = {"{kind}": "mem", "{record_id}": str(ids["plain"]), "{action}": "delete"}
    routes = [
        (re.sub(r"\{\w+\}", lambda m: concrete[m.group(0)], path), methods[0]) for path, _, methods in pages.ROUTES
    ]
    routes.append(("/static/ui.css", "GET"))
    assert len(routes) == len(pages.ROUTES) + 1
    for path, method in routes:
        for cookies in ({}, {COOKIE: "wrong"}, {COOKIE: TOKEN[:-1]}):
            client.cookies.clear()
            client.cookies.update(cookies)
            answer = client.request(method, path, data={"confirm": "yes", "csrf": state.csrf})
            assert answer.status_code == 401, (path, method, cookies)
            assert "Bobby" not in answer.text and "Friday" not in answer.text
        client.cookies.clear()
        answer = client.request(method, f"{path}?token=wrong", follow_redirects=False)
        assert answer.status_code == 401, path
    assert memory_row(app, ids["plain"]) is not None  # the refused delete reached nothing


def test_the_token_in_the_query_becomes_a_cookie_and_leaves_the_url(app):
    seed(app)
    gates, context = _gates(app.settings)
    state = UiState(app=app, registry=default_registry(), gates=gates, token=TOKEN, context=context)
    client = TestClient(build_ui_app(state), base_url="http://127.0.0.1")
    answer = client.get(f"/timeline?agent=alice&token={TOKEN}", follow_redirects=False)
    assert answer.status_code == 303
    assert urlsplit(answer.headers["location"]).query == "agent=alice"
    cookie = answer.headers["set-cookie"].lower()
    assert "httponly" in cookie and "samesite=strict" in cookie
    page = client.get("/timeline?agent=alice")
    assert page.status_code == 200 and "Friday" in page.text and "Bob prefers" not in page.text


def test_pages_load_and_carry_the_security_headers(app):
    ids = seed(app)
    client = client_for(app)
    for url in page_urls(ids):
        answer = client.get(url)
        assert answer.status_code == 200, url
        for key, value in SECURITY_HEADERS.items():
            assert answer.headers[key] == value, (url, key)
    assert client.get("/static/ui.js").status_code == 200
    assert client.get("/record/mem/999999").status_code == 404
    assert client.get("/record/xx/1").status_code == 404


def test_every_page_escapes_stored_text(app):
    ids = seed(app)
    client = client_for(app)
    for url in page_urls(ids):
        text = client.get(url).text
        assert "<script>document" not in text and "<img src=x" not in text and "<b>Kirari" not in text, url
        assert "<i>eve" not in text and "<u>p</u>" not in text and "<s>c</s>" not in text, url
    # Shown, as text, where the page shows that record.
    for url in page_urls(ids)[:5]:
        assert "&lt;script&gt;document.title=&quot;pwned&quot;&lt;/script&gt;" in client.get(url).text, url
    assert "&lt;b&gt;Kirari&lt;/b&gt;" in client.get("/graph?agent=alice&entity=MizEye").text
    timeline = client.get("/timeline").text
    assert all(name in timeline for name in ("&lt;i&gt;eve&lt;/i&gt;", "&lt;u&gt;p&lt;/u&gt;", "&lt;s&gt;c&lt;/s&gt;"))
    assert "&lt;i&gt;eve&lt;/i&gt;" in client.get("/stats").text


def test_search_is_the_recall_tool_with_match_reason_and_notices(app):
    ids = seed(app)
    client = client_for(app)
    text = client.get("/?q=deploy+window&agent=alice").text
    assert f'href="/record/mem/{ids["plain"]}"' in text and "Friday noon" in text
    assert "match_reason" in text and '<span class="chip">signal rrf</span>' in text
    assert "advisory" in text and "keyword" in text  # the no-embedder notice recall gives an agent
    assert "Bob prefers" not in client.get("/?q=tea&agent=alice").text  # isolation: alice's recall
    assert "Bob prefers" in client.get("/?q=tea&agent=bob").text
    refused = client.get("/?q=" + "x" * 20000 + "&agent=alice")  # the tool's own bound
    assert refused.status_code == 200


def test_a_search_from_the_page_leaves_recall_counters_alone(db):
    app = make_app(db, CONFIDENCE_ENABLED="true")
    ids = seed(app)
    client = client_for(app)
    for _ in range(3):
        assert "Friday noon" in client.get("/?q=deploy+window&agent=alice").text
    assert "recalled 0 time(s); last never" in client.get(f"/record/mem/{ids['plain']}").text
    # An agent's recall counts, and the record's history and the charts show it.
    assert tool(app, "recall", agent_id="alice", query="deploy window")["messages"]
    assert "recalled 1 time(s); last 20" in client.get(f"/record/mem/{ids['plain']}").text
    charts = client.get("/stats").text
    assert f'href="/record/mem/{ids["plain"]}"' in charts.split("Most recalled memories")[1]


def test_the_timeline_filters_by_agent_project_channel_kind_and_date(app):
    ids = seed(app)
    client = client_for(app)

    def refs(query: str) -> set[str]:
        return set(re.findall(r'href="/record/(mem|ep)/(\d+)"', client.get(f"/timeline?{query}").text))

    hostile, plain, bob, episode, eve = (
        ("mem", str(ids["hostile"])),
        ("mem", str(ids["plain"])),
        ("mem", str(ids["bob"])),
        ("ep", str(ids["episode"])),
        ("mem", str(ids["eve"])),
    )
    assert refs("") == {hostile, plain, bob, episode, eve}
    assert refs("agent=alice") == {hostile, plain, episode}
    assert refs("agent=bob") == {bob}
    assert refs("channel=dev") == {hostile}
    assert refs("channel=ops") == {bob}
    assert refs("channel=(global)") == {plain, episode}
    assert refs("project=p1") == {hostile}
    assert refs("kind=ep") == {episode}
    assert refs("agent=alice&kind=mem") == {hostile, plain}
    today = datetime.now(timezone.utc).date()
    assert refs(f"since={today}&until={today}") == {hostile, plain, bob, episode, eve}
    assert refs(f"since={today + timedelta(days=1)}") == set()
    assert refs(f"until={today - timedelta(days=1)}") == set()
    assert refs("since=not-a-date") == {hostile, plain, bob, episode, eve}  # an unreadable date filters nothing
    assert refs(urlencode({"agent": HOSTILE_AGENT, "channel": "<s>c</s>", "project": "<u>p</u>"})) == {eve}


def test_a_record_shows_its_ranges_entities_relations_and_recall_history(app):
    ids = seed(app)
    client = client_for(app)
    text = client.get(f"/record/mem/{ids['plain']}").text
    assert "0–10" in text and "The deploy" in text  # the node's range and its span of text
    assert "recalled 0 time(s); last never" in text
    graph = client.get(f"/record/mem/{ids['hostile']}").text
    assert "MizEye" in graph and "maintains" in graph and "/graph?agent=alice&amp;entity=MizEye" in graph
    assert "no nodes" in graph


def test_profile_graph_health_and_charts_show_their_tools_answers(app):
    seed(app)
    client = client_for(app)
    assert "Alice, engineer" in client.get("/profile?agent=alice").text
    assert "no profile for bob" in client.get("/profile?agent=bob").text
    graph = client.get("/graph?agent=alice&entity=MizEye").text
    assert '<svg id="graph"' in graph and graph.count('class="node') == 5 and graph.count('class="edge"') == 3
    health = client.get("/health").text
    assert "null_embedding" in health and "CPERSONA_EMBEDDING_MODE" in health  # a finding with its fix hint
    charts = client.get("/stats").text
    assert charts.count('<figure class="chart">') == 5 and "database size" in charts
    assert ">alice<" in charts and ">bob<" in charts


def _post(client: TestClient, path: str, **form: str) -> Any:
    return client.post(path, data=form)


def test_without_write_every_change_is_refused_and_nothing_changes(app):
    ids = seed(app)
    client = client_for(app)
    csrf = UiState(app=app, registry=default_registry(), gates=None, token=TOKEN).csrf
    before = memory_row(app, ids["plain"])
    for kind, action in pages.ACTIONS:
        record_id = ids["episode"] if kind == "ep" else ids["plain"]
        answer = _post(client, f"/record/{kind}/{record_id}/{action}", csrf=csrf, confirm="yes", content="changed")
        assert answer.status_code == 403 and "read-only" in answer.text, (kind, action)
    assert client.get(f"/record/mem/{ids['plain']}/delete").status_code == 403
    assert "Save edit" not in client.get(f"/record/mem/{ids['plain']}").text
    assert memory_row(app, ids["plain"]) == before
    assert tool(app, "get_contents", agent_id="alice", refs=[f"ep:{ids['episode']}"])["count"] == 1


def test_with_write_changes_go_through_the_tools_rules(app):
    ids = seed(app)
    client = client_for(app, write=True)
    csrf = UiState(app=app, registry=default_registry(), gates=None, token=TOKEN).csrf
    base = f"/record/mem/{ids['plain']}"
    assert _post(client, f"{base}/edit", content="new text").status_code == 403  # no CSRF value
    assert _post(client, f"{base}/edit", csrf=csrf, content="The deploy window is Monday").status_code == 200
    assert memory_row(app, ids["plain"]) == ("The deploy window is Monday", 0)
    assert _post(client, f"{base}/lock", csrf=csrf).status_code == 200
    assert memory_row(app, ids["plain"]) == ("The deploy window is Monday", 1)
    # The lock holds against the page as against an agent: the tool's own refusal, nothing changed.
    for action, extra in (("edit", {"content": "overwritten"}), ("delete", {"confirm": "yes"})):
        answer = _post(client, f"{base}/{action}", csrf=csrf, **extra)
        assert answer.status_code == 409 and "locked" in answer.text, action
    assert memory_row(app, ids["plain"]) == ("The deploy window is Monday", 1)
    assert _post(client, f"{base}/unlock", csrf=csrf).status_code == 200
    confirm = client.get(f"{base}/delete")
    assert confirm.status_code == 200 and "Yes, delete it" in confirm.text and 'name="confirm"' in confirm.text
    assert _post(client, f"{base}/delete", csrf=csrf).status_code == 400  # no confirmation step
    assert memory_row(app, ids["plain"]) is not None
    assert _post(client, f"{base}/delete", csrf=csrf, confirm="yes").status_code == 200
    assert memory_row(app, ids["plain"]) is None
    episode = f"/record/ep/{ids['episode']}"
    assert _post(client, f"{episode}/delete", csrf=csrf, confirm="yes").status_code == 200
    assert tool(app, "get_contents", agent_id="alice", refs=[f"ep:{ids['episode']}"])["count"] == 0
    assert _post(client, f"{episode}/lock", csrf=csrf).status_code == 404  # episodes have no lock


def test_a_paused_bucket_turns_the_pages_writes_into_no_ops(app):
    ids = seed(app)
    client = client_for(app, write=True)
    csrf = UiState(app=app, registry=default_registry(), gates=None, token=TOKEN).csrf
    assert tool(app, "pause_persistence", ttl_seconds=600)["paused"] is True
    answer = _post(client, f"/record/mem/{ids['plain']}/edit", csrf=csrf, content="during the pause")
    assert answer.status_code == 409 and "persisted" in answer.text
    assert memory_row(app, ids["plain"])[0] == "The deploy window is Friday noon"


def test_the_acl_grants_of_local_apply_to_the_page(tmp_path, db):
    acl = tmp_path / "acl.json"
    acl.write_text(json.dumps({"clients": [{"client_id": "local", "grants": {"alice": "read-write", "bob": "read"}}]}))
    acl.chmod(0o600)
    app = make_app(db, ACL_FILE=str(acl))
    ids = seed_without_acl(db, app)
    client = client_for(app, write=True)
    csrf = UiState(app=app, registry=default_registry(), gates=None, token=TOKEN).csrf
    denied = _post(client, f"/record/mem/{ids['bob']}/delete", csrf=csrf, confirm="yes")
    assert denied.status_code == 409 and "permission_denied" in denied.text
    assert _post(client, f"/record/mem/{ids['plain']}/delete", csrf=csrf, confirm="yes").status_code == 200
    with db.read() as session:
        assert NodeRepository(session).of_record("mem", ids["plain"]) == []


def seed_without_acl(db: Any, app: App) -> dict[str, int]:
    """The seed written by an App without the ACL file (bob's row needs a writer local is not)."""
    return seed(make_app(db))


def _ui_process(*argv: str, db: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CPERSONA_")}
    if db is not None:
        env["CPERSONA_DB_PATH"] = db
    return subprocess.run(
        [sys.executable, "-m", "cpersona", "ui", *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )


@pytest.mark.parametrize("target", ["directory", "text file", "missing file"])
def test_ui_refuses_a_bad_database_in_one_line(tmp_path, target):
    path = {"directory": tmp_path, "text file": tmp_path / "notes.txt", "missing file": tmp_path / "none.db"}[target]
    if target == "text file":
        path.write_text("not a database\n" * 50)
    for argv, db in ((["--db", str(path), "--port", "0"], None), (["--port", "0"], str(path))):
        done = _ui_process(*argv, db=db)
        assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1 and done.stdout == "", done.stderr
    assert target != "missing file" or not path.exists()  # the page never creates a database


@pytest.mark.sqlite_only  # the command line names the file
def test_ui_refuses_a_bad_or_busy_port_in_one_line(db):
    done = _ui_process("--db", str(db.path), "--port", "70000")
    assert done.returncode == 2 and "not a port number" in done.stderr and done.stdout == ""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        done = _ui_process("--db", str(db.path), "--port", str(busy.getsockname()[1]))
    assert done.returncode == 1 and "cannot listen on 127.0.0.1" in done.stderr and "Traceback" not in done.stderr


def test_ui_files_ship_in_the_package():
    import tomllib

    project = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
    patterns = project["tool"]["setuptools"]["package-data"]["cpersona.ui"]
    static = Path(pages.__file__).parent / "static"
    shipped = {p.name for pattern in patterns for p in static.glob(pattern.removeprefix("static/"))}
    assert shipped == {p.name for p in static.iterdir()} == {"ui.css", "ui.js"}


def test_the_page_takes_its_gate_chain_from_the_one_helper_serve_uses(tmp_path, db, monkeypatch):
    """One place assembles the gates (cpersona.cli.tool_gates): a change there reaches the page too."""
    from cpersona import cli

    acl = tmp_path / "acl.json"
    acl.write_text(json.dumps({"clients": [{"client_id": "local", "grants": {"alice": "read"}}]}))
    acl.chmod(0o600)
    app = make_app(db, ACL_FILE=str(acl))
    seen: list[tuple[Any, str]] = []
    real = cli.tool_gates

    def recording(policy: Any, settings: Any, transport: str) -> Any:
        seen.append((policy, transport))
        return real(policy, settings, transport)

    monkeypatch.setattr(cli, "tool_gates", recording)
    gates, context = _gates(app.settings)
    assert len(seen) == 1 and seen[0][0] is not None and seen[0][1] == "stdio"
    assert context["principal"].client_id == "local"
    assert tool(app, "recall", agent_id="bob", query="x")["error"] == "permission_denied"
