"""check_update against a real PEP 691 index served on 127.0.0.1 by the test itself.

The index server's knobs (status, delay, raw body) are set per test; it records
every request, so "no network" is checked by counting. Apply runs real
processes: a stand-in interpreter script for pip installs and a real git
checkout with a local upstream for checkout installs — never this repository.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from conftest import make_app
from cpersona import DISTRIBUTION, __version__
from cpersona.services.operations.install import Installation, detect_install, run_steps
from cpersona.services.operations.update_check import (
    ACCEPT,
    UpdateChecker,
    check_update,
    decide,
    start_update_check,
    update_notice,
)

RUNNING = "0.6.14"


def index_doc(
    versions: list[str], yanked: dict[str, Any] | None = None, *, project: str = DISTRIBUTION
) -> dict[str, Any]:
    """A PEP 691 project page: one wheel and one sdist per version, named as PyPI names them."""
    yanked = yanked or {}
    files = []
    stem = project.replace("-", "_")  # wheels and modern sdists escape the name
    for v in versions:
        for name in (f"{stem}-{v}-py3-none-any.whl", f"{stem}-{v}.tar.gz"):
            files.append(
                {"filename": name, "url": f"https://files.example/{name}", "hashes": {}, "yanked": yanked.get(v, False)}
            )
    return {"meta": {"api-version": "1.1"}, "name": project, "versions": versions, "files": files}


@dataclass
class IndexServer:
    url: str = ""
    documents: list[Any] = field(default_factory=list)  # served in turn; the last one repeats
    status: int = 200
    delays: list[float] = field(default_factory=list)  # per request, in turn
    raw_body: bytes | None = None
    requests: list[dict[str, str]] = field(default_factory=list)

    def next_body(self) -> bytes:
        if self.raw_body is not None:
            return self.raw_body
        doc = self.documents.pop(0) if len(self.documents) > 1 else self.documents[0]
        return json.dumps(doc).encode()


@pytest.fixture
def index() -> Iterator[IndexServer]:
    state = IndexServer(documents=[index_doc([RUNNING])])

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            state.requests.append({"path": self.path, "accept": self.headers.get("Accept", "")})
            delay = state.delays.pop(0) if state.delays else 0.0
            body = state.next_body()
            time.sleep(delay)
            try:
                self.send_response(state.status)
                self.send_header("Content-Type", ACCEPT)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            except (BrokenPipeError, ConnectionResetError):
                pass

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    state.url = f"http://127.0.0.1:{server.server_address[1]}/simple/cpersona-server/"
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield state
    server.shutdown()
    server.server_close()


PIP = Installation("pip", "/srv/venv/bin/python3")


def checker_app(db, index: IndexServer, *, installation: Installation = PIP, running: str = RUNNING, **env: str):
    app = make_app(db, UPDATE_CHECK_URL=index.url, **env)
    app.update_checker = UpdateChecker(app, running=running, installation=installation)
    return app


def cache_file(app) -> Path:
    return app.settings.update_check_cache


# --- UP-3: the decision ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("versions", "yanked", "running", "expected"),
    [
        (["0.6.13", "0.6.14"], {}, "0.6.14", ("ok", None, None, None)),
        (["0.6.14", "0.7.0"], {}, "0.6.14", ("newer", "newer", "0.7.0", None)),
        (["0.6.14", "0.7.0", "0.8.0rc1", "0.9.0.dev1"], {}, "0.6.14", ("newer", "newer", "0.7.0", None)),
        (["0.6.14", "0.8.0rc1", "0.9.0.dev1"], {}, "0.6.14", ("ok", None, None, None)),  # never propose pre/dev
        (["0.7.0rc1", "0.7.0"], {}, "0.7.0rc1", ("newer", "prerelease_final", "0.7.0", None)),
        (["0.7.0rc1", "0.7.1"], {}, "0.7.0rc1", ("newer", "newer", "0.7.1", None)),
        (["0.6.14", "0.7"], {}, "0.6.14.0", ("newer", "newer", "0.7", None)),  # trailing zeros do not count
        (["0.6.14", "0.6.14.post1"], {}, "0.6.14", ("newer", "newer", "0.6.14.post1", None)),
        (["0.6.14", "1!0.1"], {}, "0.6.14", ("newer", "newer", "1!0.1", None)),  # the epoch wins
        (["0.6.13", "not-a-version"], {}, "0.6.14", ("unlisted", None, None, None)),
        (
            ["0.6.14", "0.6.15"],
            {"0.6.14": "  data loss on import  "},
            "0.6.14",
            ("yanked", "yanked", "0.6.15", "data loss on import"),
        ),
        (["0.6.14"], {"0.6.14": True}, "0.6.14", ("yanked", "yanked", None, None)),
        (["0.6.14"], {"0.6.14": ""}, "0.6.14", ("yanked", "yanked", None, None)),  # any string, even empty
        (
            ["0.6.14", "0.6.15", "0.6.16"],
            {"0.6.14": "bad", "0.6.16": "worse"},
            "0.6.14",
            ("yanked", "yanked", "0.6.15", "bad"),
        ),  # a withdrawn newer release is not offered
    ],
)
def test_decision_from_the_index(versions, yanked, running, expected):  # spec UP-3
    verdict = decide(index_doc(versions, yanked), running)
    assert (verdict.state, verdict.kind, verdict.available, verdict.reason) == expected


def test_one_live_file_means_not_yanked_and_reasons_are_capped():  # spec UP-3
    doc = index_doc(["0.6.14"])
    doc["files"][0]["yanked"] = "x" * 500
    assert decide(doc, "0.6.14").state == "ok"  # the sdist is still offered
    doc["files"][1]["yanked"] = True
    assert len(decide(doc, "0.6.14").reason) == 200


def test_versions_come_from_files_when_the_list_is_missing():  # spec UP-3
    doc = index_doc(["0.6.14", "0.7.0"])
    del doc["versions"]
    assert decide(doc, "0.6.14").available == "0.7.0"
    assert decide({"files": "nope"}, "0.6.14") is None and decide([], "0.6.14") is None


# --- UP-1: disabled -----------------------------------------------------------------------------


def test_disabled_means_no_request_no_file_no_notice(db, index):  # spec UP-1, UP-7
    app = checker_app(db, index, UPDATE_CHECK="false")
    start_update_check(app)
    answer = check_update(app, refresh=True, apply=True)
    assert answer == {
        "enabled": False,
        "state": "disabled",
        "kind": None,
        "running": RUNNING,
        "available": None,
        "reason": None,
        "checked_at": None,
        "unknown_reason": None,
        "refreshed": True,
        "install": {
            "method": "pip",
            "command": "/srv/venv/bin/python3 -m pip install --upgrade cpersona-server",
            "note": "",
            "restart_required": True,
        },
        "_meta": {"server_version": __version__},
        "apply_result": {
            "applied": False,
            "reason": "update checking is disabled (CPERSONA_UPDATE_CHECK=false), so there is no verdict to act on",
        },
    }
    time.sleep(0.2)
    assert index.requests == [] and not cache_file(app).exists()
    assert update_notice(app) is None


# --- UP-2, UP-4, UP-5: fetch, cache, refresh --------------------------------------------------------------


def test_a_bare_call_touches_neither_network_nor_disk(db, index):  # spec UP-5
    app = checker_app(db, index)
    answer = check_update(app)
    assert (answer["state"], answer["checked_at"], answer["refreshed"]) == ("unknown", None, False)
    assert index.requests == [] and not cache_file(app).exists()


def test_refresh_fetches_decides_and_caches(db, index):  # spec UP-2, UP-4, §13.4
    index.documents = [index_doc([RUNNING, "0.7.0"])]
    app = checker_app(db, index)
    answer = check_update(app, refresh=True)
    assert index.requests == [{"path": "/simple/cpersona-server/", "accept": ACCEPT}]
    assert (answer["enabled"], answer["state"], answer["kind"], answer["available"], answer["refreshed"]) == (
        True,
        "newer",
        "newer",
        "0.7.0",
        True,
    )
    assert answer["install"]["command"] == "/srv/venv/bin/python3 -m pip install --upgrade cpersona-server==0.7.0"
    assert answer["release_notes"] == "https://pypi.org/project/cpersona-server/0.7.0/"
    assert "0.7.0" in answer["message"] and answer["install"]["command"] in answer["message"]
    assert "restart" in answer["message"]

    cached = json.loads(cache_file(app).read_text())
    assert cached == {
        "fetched_at": answer["checked_at"],
        "running": RUNNING,
        "url": index.url,
        "verdict": {"state": "newer", "running": RUNNING, "kind": "newer", "available": "0.7.0", "reason": None},
    }
    assert stat.S_IMODE(cache_file(app).stat().st_mode) == 0o600

    again = check_update(app)  # a bare call now answers from memory
    assert (again["state"], again["checked_at"], again["refreshed"]) == ("newer", answer["checked_at"], False)
    assert len(index.requests) == 1


@pytest.mark.parametrize("fault", ["status", "json", "size", "slow"])
def test_a_failed_fetch_keeps_the_known_verdict(db, index, fault):  # spec UP-2, UP-4, UP-5
    app = checker_app(db, index)
    first = check_update(app, refresh=True)
    assert first["state"] == "ok"
    written = cache_file(app).read_text()

    if fault == "status":
        index.status = 503
    elif fault == "json":
        index.raw_body = b"{not json"
    elif fault == "size":
        index.raw_body = json.dumps({"files": [], "pad": "x" * (1 << 20)}).encode()
    else:
        index.delays = [6.0]
    started = time.monotonic()
    answer = check_update(app, refresh=True)
    assert time.monotonic() - started < 4.0  # the 3 s budget, whatever the index does
    assert (answer["state"], answer["checked_at"]) == ("ok", first["checked_at"])
    assert cache_file(app).read_text() == written  # a failure is never cached


def test_with_no_network_the_state_is_unknown_and_nothing_hangs(db):  # spec UP-3 (unknown), UP-2
    app = make_app(db, UPDATE_CHECK_URL="http://127.0.0.1:9/simple/cpersona-server/")  # discard port: refused
    app.update_checker = UpdateChecker(app, running=RUNNING, installation=PIP)
    started = time.monotonic()
    answer = check_update(app, refresh=True)
    assert answer["state"] == "unknown" and answer["checked_at"] is None and "message" not in answer
    assert time.monotonic() - started < 4.0


def test_start_uses_a_fresh_cache_without_a_request(db, index):  # spec UP-2, UP-4
    app = checker_app(db, index)
    stamp = (datetime.now(timezone.utc) - timedelta(minutes=10)).isoformat()
    cache_file(app).write_text(
        json.dumps(
            {
                "fetched_at": stamp,
                "running": RUNNING,
                "url": index.url,
                "verdict": {
                    "state": "yanked",
                    "running": RUNNING,
                    "kind": "yanked",
                    "available": "0.6.15",
                    "reason": "data loss on import",
                },
            }
        )
    )
    start_update_check(app)._background.join(5)
    answer = check_update(app)
    assert (answer["state"], answer["reason"], answer["checked_at"]) == ("yanked", "data loss on import", stamp)
    assert index.requests == []


def test_start_fetches_when_the_cache_is_stale_or_for_another_version(db, index):  # spec UP-2
    app = checker_app(db, index, UPDATE_CHECK_INTERVAL_SECONDS="60")
    old = "2020-01-01T00:00:00+00:00"
    cache_file(app).write_text(
        json.dumps(
            {"fetched_at": old, "running": RUNNING, "url": index.url, "verdict": {"state": "ok", "running": RUNNING}}
        )
    )
    start_update_check(app)._background.join(5)
    assert len(index.requests) == 1 and check_update(app)["checked_at"] != old

    other = checker_app(db, index)
    now = json.loads(cache_file(app).read_text())["fetched_at"]
    cache_file(other).write_text(
        json.dumps(
            {"fetched_at": now, "running": "1.0.0", "url": index.url, "verdict": {"state": "ok", "running": "1.0.0"}}
        )
    )
    start_update_check(other)._background.join(5)
    assert len(index.requests) == 2


def test_start_returns_at_once_even_when_the_index_is_slow(db, index):  # spec UP-2
    index.delays = [2.0]
    app = checker_app(db, index)
    started = time.monotonic()
    checker = start_update_check(app)
    assert time.monotonic() - started < 0.5
    assert check_update(app)["state"] == "unknown"  # nothing waited for the fetch
    checker._background.join(5)
    assert check_update(app)["state"] == "ok"


def test_a_slow_earlier_fetch_never_overwrites_a_later_verdict(db, index):  # spec UP-4
    index.documents = [index_doc([RUNNING, "9.0.0"]), index_doc([RUNNING])]
    index.delays = [1.5, 0.0]
    app = checker_app(db, index)
    checker = app.update_checker
    slow = threading.Thread(target=checker.refresh)
    slow.start()
    # The later call must reach the index after the slow one did (a fixed sleep loses that race under load).
    deadline = time.monotonic() + 10
    while not index.requests and time.monotonic() < deadline:
        time.sleep(0.01)
    assert index.requests, "the slow fetch never reached the index"
    assert checker.refresh()  # issued later, answers first
    slow.join(5)
    assert check_update(app)["state"] == "ok"
    assert json.loads(cache_file(app).read_text())["verdict"]["state"] == "ok"


# --- UP-6: install detection ----------------------------------------------------------------------------


def test_install_detection(tmp_path):  # spec UP-6
    python = "/opt/py/bin/python3"
    uvx = detect_install(tmp_path / "cpersona", prefix=str(tmp_path / "archive-v0" / "abc"), python=python)
    # uvx's short `cpersona@X` form would fetch the distribution `cpersona`, another program
    assert uvx.describe("0.7.0")["command"] == "uvx --from cpersona-server==0.7.0 cpersona"
    assert uvx.describe(None)["command"] == "uvx --from cpersona-server@latest cpersona" and uvx.describe(None)["note"]

    pip = detect_install(tmp_path / "lib" / "site-packages" / "cpersona", prefix="/opt/py", python=python)
    assert pip.describe("0.7.0")["command"] == "/opt/py/bin/python3 -m pip install --upgrade cpersona-server==0.7.0"
    assert pip.describe("1.0; rm -rf /")["command"] == "/opt/py/bin/python3 -m pip install --upgrade cpersona-server"

    repo = tmp_path / "repo"
    (repo / ".git").mkdir(parents=True)
    (repo / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    on_branch = detect_install(repo / "cpersona", prefix="/opt/py", python=python)
    assert on_branch.method == "checkout" and not on_branch.detached
    assert on_branch.command("0.7.0").startswith(f"git -C {repo} pull && ")
    (repo / ".git" / "HEAD").write_text("0123456789abcdef0123456789abcdef01234567\n")
    parked = detect_install(repo / "cpersona", prefix="/opt/py", python=python)
    assert parked.detached
    assert parked.command("0.7.0").startswith(f"git -C {repo} fetch --tags && git -C {repo} checkout v0.7.0 && ")


# --- UP-7, UP-8: apply ------------------------------------------------------------------------------------


def fake_python(tmp_path: Path, exit_code: int = 0, lines: int = 3) -> str:
    script = tmp_path / "python"
    script.write_text(
        f'#!/bin/sh\necho "args: $*"\necho "prompt=$GIT_TERMINAL_PROMPT/$PIP_NO_INPUT"\n'
        f"i=0; while [ $i -lt {lines} ]; do echo line $i; i=$((i+1)); done\nexit {exit_code}\n"
    )
    script.chmod(0o755)
    return str(script)


def test_apply_runs_the_pip_command_as_argv(db, index, tmp_path):  # spec UP-7, UP-8
    index.documents = [index_doc([RUNNING, "0.7.0"])]
    app = checker_app(db, index, installation=Installation("pip", fake_python(tmp_path, lines=100)))
    check_update(app, refresh=True)
    result = check_update(app, apply=True)["apply_result"]
    assert (result["applied"], result["exit_code"], result["restart_required"]) == (True, 0, True)
    assert len(result["output_tail"]) == 40 and result["output_tail"][-1] == "line 99"
    assert result["install"]["method"] == "pip"

    (tmp_path / "failing").mkdir()
    app2 = checker_app(db, index, installation=Installation("pip", fake_python(tmp_path / "failing", exit_code=3)))
    check_update(app2, refresh=True)
    failed = check_update(app2, apply=True)["apply_result"]
    assert (failed["applied"], failed["exit_code"]) == (False, 3)
    assert "args: -m pip install --upgrade cpersona-server==0.7.0" in failed["output_tail"]
    assert "prompt=0/1" in failed["output_tail"]


def test_apply_refusals(db, index, tmp_path):  # spec UP-7
    app = checker_app(db, index)
    assert check_update(app, apply=True)["apply_result"] == {
        "applied": False,
        "reason": "nothing newer to install (state=unknown)",
        "install": {
            "method": "pip",
            "command": "/srv/venv/bin/python3 -m pip install --upgrade cpersona-server",
            "note": "",
            "restart_required": True,
        },
    }
    check_update(app, refresh=True)
    assert check_update(app, apply=True)["apply_result"]["reason"] == "nothing newer to install (state=ok)"

    index.documents = [index_doc([RUNNING, "0.7.0"])]
    uvx = checker_app(db, index, installation=Installation("uvx", "/x/python"))
    check_update(uvx, refresh=True)
    assert "uvx --from cpersona-server==0.7.0 cpersona" in check_update(uvx, apply=True)["apply_result"]["reason"]
    unknown = checker_app(db, index, installation=Installation("unknown", "/x/python"))
    check_update(unknown, refresh=True)
    assert check_update(unknown, apply=True)["apply_result"]["reason"] == "apply is not available for a unknown install"


def test_only_one_apply_at_a_time(db, index, tmp_path):  # spec UP-7
    index.documents = [index_doc([RUNNING, "0.7.0"])]
    script = tmp_path / "python"
    script.write_text("#!/bin/sh\nsleep 1\n")
    script.chmod(0o755)
    app = checker_app(db, index, installation=Installation("pip", str(script)))
    check_update(app, refresh=True)
    results: list[dict[str, Any]] = []
    threads = [
        threading.Thread(target=lambda: results.append(check_update(app, apply=True)["apply_result"])) for _ in range(2)
    ]
    for t in threads:
        t.start()
        time.sleep(0.2)
    for t in threads:
        t.join(10)
    assert sorted(r["applied"] for r in results) == [False, True]
    assert any("another apply is still running" in r.get("reason", "") for r in results)


def git(*args: str, cwd: Path) -> str:
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
    }
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout


def test_apply_on_a_checkout_pulls_then_reinstalls(db, index, tmp_path):  # spec UP-6, UP-8
    upstream, clone = tmp_path / "upstream", tmp_path / "clone"
    upstream.mkdir()
    git("init", "-q", "-b", "main", cwd=upstream)
    (upstream / "README").write_text("v1\n")
    git("add", "README", cwd=upstream)
    git("commit", "-q", "-m", "v1", cwd=upstream)
    git("clone", "-q", str(upstream), str(clone), cwd=tmp_path)
    (upstream / "README").write_text("v2\n")
    git("commit", "-q", "-am", "v2", cwd=upstream)

    index.documents = [index_doc([RUNNING, "0.7.0"])]
    python = fake_python(tmp_path)
    install = Installation("checkout", python, clone, installer=(python, "-m", "pip", "install"))
    app = checker_app(db, index, installation=install)
    check_update(app, refresh=True)
    result = check_update(app, apply=True)["apply_result"]
    assert result["applied"] is True, result
    assert (clone / "README").read_text() == "v2\n"  # the pull happened
    assert f"args: -m pip install {clone}" in result["output_tail"]  # then the reinstall

    git("checkout", "-q", "--detach", "HEAD", cwd=clone)  # parked: refused before anything runs
    refused = check_update(app, apply=True)["apply_result"]
    assert refused["applied"] is False and "not on a branch" in refused["reason"]
    assert f"git -C {clone} checkout v0.7.0" in refused["reason"]


def test_run_steps_stops_at_the_first_failure_and_reports_a_missing_program(tmp_path):  # spec UP-8
    code, tail = run_steps([["sh", "-c", "echo one; exit 2"], ["sh", "-c", "echo never"]])
    assert code == 2 and "one" in tail and "never" not in tail
    code, tail = run_steps([[str(tmp_path / "no-such-program")]])
    assert code == 127 and "could not start" in tail[-1]


# --- UP-9, UP-10: the verdict for other surfaces ----------------------------------------------------------


def test_notice_only_when_there_is_something_to_say(db, index):  # spec UP-9, UP-10
    app = checker_app(db, index)
    assert update_notice(app) is None
    check_update(app, refresh=True)
    assert update_notice(app) is None  # ok
    index.documents = [index_doc([RUNNING, "0.6.15"], {RUNNING: "data loss"})]
    check_update(app, refresh=True)
    notice = update_notice(app)
    assert (notice["kind"], notice["available"], notice["reason"]) == ("yanked", "0.6.15", "data loss")
    assert notice["install"] == {
        "method": "pip",
        "restart_required": True,
        "command": "/srv/venv/bin/python3 -m pip install --upgrade cpersona-server==0.6.15",
    }


# --- the tool declaration ------------------------------------------------------------------------


def test_description_carries_the_facts():  # spec §14
    from cpersona.mcp.tools import default_registry

    description = default_registry().get("check_update").description
    for fact in (
        "ok",
        "newer",
        "yanked",
        "unlisted",
        "unknown",
        "disabled",
        "once per process start",
        "24 hours",
        "neither the network nor the disk",
        "refresh=true",
        "3 seconds",
        "argument list",
        "never through a shell",
        "pip and checkout installs only",
        "uvx --from cpersona-server@latest cpersona",
        "detached HEAD",
        "git fetch --tags && git checkout",
        "One apply runs at a time",
        "automatically",
        "restart is always required",
        "pause_persistence",
        "CPERSONA_UPDATE_CHECK=false",
    ):
        assert fact in description, fact


@pytest.mark.anyio
async def test_through_the_facade(db, index):  # spec C-3, §13.4
    from cpersona.mcp.dispatch import call_tool
    from cpersona.mcp.gates import GateChain
    from cpersona.mcp.tools import default_registry

    app = checker_app(db, index)
    bad = await call_tool(app, default_registry(), GateChain(), "check_update", {"refresh": "yes"})
    assert bad.is_error and "Input validation error" in bad.payload["error"]
    answer = await call_tool(app, default_registry(), GateChain(), "check_update", {"refresh": True})
    assert answer.payload["state"] == "ok" and answer.payload["refreshed"] is True


def test_recall_carries_the_notice_once_per_session(db, index):  # spec UP-10
    from cpersona.services.recall.service import recall

    index.documents = [index_doc([RUNNING, "0.7.0"])]
    app = checker_app(db, index)
    assert "update" not in recall(app, agent_id="a", query="x")  # no verdict yet
    check_update(app, refresh=True)

    first = recall(app, agent_id="a", query="x")
    assert first["update"]["kind"] == "newer" and first["update"]["available"] == "0.7.0"
    assert first["update"]["install"]["restart_required"] is True and "reason" not in first["update"]
    assert "update" not in recall(app, agent_id="a", query="x")  # keyless callers: once per process
    assert "update" not in recall(app, agent_id="a", query="x", session_key="transport")
    assert "update" in recall(app, agent_id="a", query="x", session_key="s1")  # each key once
    assert "update" not in recall(app, agent_id="a", query="x", session_key=" s1 ")

    index.documents = [index_doc([RUNNING, "0.7.0"], {RUNNING: "broken"})]
    check_update(app, refresh=True)  # a changed verdict re-arms everyone
    again = recall(app, agent_id="a", query="x")
    assert again["update"]["kind"] == "yanked" and again["update"]["reason"] == "broken"


def test_recall_has_no_notice_when_disabled(db, index):  # spec UP-1
    from cpersona.services.recall.service import recall

    app = checker_app(db, index, UPDATE_CHECK="false")
    check_update(app, refresh=True)
    assert "update" not in recall(app, agent_id="a", query="x")


# --- only this program's releases (issue 19) ------------------------------------------------------------
# `cpersona` on PyPI is CPersona 2.6, another program. These tests serve its page, as PyPI does, from the
# real index server above.

REFERENCE_PAGE = index_doc(["2.6.13", "2.6.14", "2.7.0"], project="cpersona")
# An install of the distribution `cpersona`: `pip install --upgrade cpersona==X`, `pip install 'cpersona[local]'`,
# `uvx cpersona@latest` (`uvx --from cpersona-server==X cpersona` runs our command from our distribution).
FOREIGN_INSTALL = r"(?:pip install(?: --upgrade)?|uvx(?: --from)?) ['\"]?cpersona(?![\w-])"


def assert_nothing_to_announce(app, answer: dict[str, Any]) -> None:
    assert (answer["state"], answer["kind"], answer["available"], answer["checked_at"]) == ("unknown", None, None, None)
    assert "message" not in answer and "release_notes" not in answer
    assert update_notice(app) is None
    assert not cache_file(app).exists()  # a page that is not ours is never cached as a verdict


@pytest.mark.parametrize("running", [RUNNING, "2.6.14"])  # even if our version string were one of theirs
def test_the_reference_page_is_never_read_as_ours(db, index, running):
    index.documents = [REFERENCE_PAGE]
    app = checker_app(db, index, running=running)
    answer = check_update(app, refresh=True)
    assert_nothing_to_announce(app, answer)
    assert "'cpersona', not cpersona-server" in answer["unknown_reason"]
    assert answer["install"]["command"] == "/srv/venv/bin/python3 -m pip install --upgrade cpersona-server"


def test_files_of_another_distribution_on_our_page_do_not_count(db, index):
    doc = index_doc([RUNNING])
    doc["files"] += REFERENCE_PAGE["files"]  # e.g. a mirror that merged pages
    index.documents = [doc]
    app = checker_app(db, index)
    assert check_update(app, refresh=True)["state"] == "ok"  # not "newer" with the reference's 2.7.0
    doc["files"] = REFERENCE_PAGE["files"]
    del doc["versions"]
    assert check_update(app, refresh=True)["state"] == "unlisted"  # none of these files is ours


def test_our_releases_are_reported_with_a_command_naming_our_distribution(db, index):
    # The page's name in another spelling is still our project (PEP 503 normalisation).
    index.documents = [index_doc([RUNNING, "0.7.0"], project="CPersona_Server")]
    app = checker_app(db, index)
    answer = check_update(app, refresh=True)
    assert (answer["state"], answer["available"], answer["unknown_reason"]) == ("newer", "0.7.0", None)
    assert answer["install"]["command"] == "/srv/venv/bin/python3 -m pip install --upgrade cpersona-server==0.7.0"
    assert answer["release_notes"] == "https://pypi.org/project/cpersona-server/0.7.0/"
    assert answer["message"].startswith("cpersona-server 0.7.0 is available")


@pytest.mark.parametrize(
    ("fault", "because"),
    [
        ("refused", "could not be read: ConnectError"),
        ("404", "answered HTTP 404"),  # what PyPI answers for a name nobody has published
        ("not json", "did not answer JSON"),
        ("a list", "not a PEP 691 project page"),
        ("no name", "does not name its project"),
        ("files not a list", "not a PEP 691 project page"),
    ],
)
def test_when_it_cannot_tell_it_says_unknown_and_why_and_announces_nothing(db, index, fault, because):
    url = index.url
    if fault == "refused":
        url = "http://127.0.0.1:9/simple/cpersona-server/"  # the discard port: connection refused
    elif fault == "404":
        index.status = 404
    elif fault == "not json":
        index.raw_body = b"<html>Not Found</html>"
    elif fault == "a list":
        index.raw_body = b"[1, 2]"
    elif fault == "no name":
        doc = index_doc([RUNNING, "0.7.0"])
        del doc["name"]
        index.documents = [doc]
    else:
        index.documents = [{"name": DISTRIBUTION, "files": "0.7.0"}]
    app = make_app(db, UPDATE_CHECK_URL=url)
    app.update_checker = UpdateChecker(app, running=RUNNING, installation=PIP)
    assert check_update(app)["unknown_reason"] is None  # no check ran yet: nothing to explain
    answer = check_update(app, refresh=True)
    assert_nothing_to_announce(app, answer)
    assert because in answer["unknown_reason"], answer["unknown_reason"]

    from cpersona.services.recall.service import recall

    assert "update" not in recall(app, agent_id="a", query="x")  # no nagging on recall either

    index.status, index.raw_body, index.documents = 200, None, [index_doc([RUNNING])]
    if fault != "refused":
        assert check_update(app, refresh=True)["state"] == "ok"  # a readable page of ours settles it
        assert check_update(app)["unknown_reason"] is None


def test_a_cached_verdict_from_another_page_is_not_used(db, index):
    # An earlier build read https://pypi.org/simple/cpersona/ (the reference's page) and cached "unlisted".
    app = checker_app(db, index)
    stamp = (datetime.now(timezone.utc) - timedelta(minutes=10)).isoformat()
    cache_file(app).write_text(
        json.dumps({"fetched_at": stamp, "running": RUNNING, "verdict": {"state": "unlisted", "running": RUNNING}})
    )
    start_update_check(app)._background.join(5)
    assert len(index.requests) == 1 and check_update(app)["state"] == "ok"


@pytest.mark.parametrize("method", ["pip", "uvx", "checkout", "unknown"])
def test_no_offered_command_installs_another_program(db, index, tmp_path, method):
    # The whole table: every install method, every state the index can lead to, with and without a version.
    import re

    from cpersona.embedding.local_model import INSTALL_HINT

    install = Installation(
        method,
        "/srv/venv/bin/python3",
        tmp_path if method == "checkout" else None,
        installer=("/srv/venv/bin/python3", "-m", "pip", "install"),
    )
    pages = [
        index_doc([RUNNING]),
        index_doc([RUNNING, "0.7.0"]),
        index_doc([RUNNING, "0.7.0"], {RUNNING: "x"}),
        index_doc(["0.7.0"]),
        REFERENCE_PAGE,
    ]
    texts = [INSTALL_HINT, install.command("0.7.0"), install.command(None)]
    for page in pages:
        index.documents = [page]
        app = checker_app(db, index, installation=install)
        answer = check_update(app, refresh=True)
        texts += [answer["install"]["command"], answer.get("message", ""), json.dumps(update_notice(app))]
    for text in texts:
        assert not re.search(FOREIGN_INSTALL, text), text
    if method in ("pip", "uvx"):
        assert DISTRIBUTION in install.command("0.7.0") and DISTRIBUTION in install.command(None)
