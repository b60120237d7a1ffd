"""``cpersona hook session-start | session-end`` with Claude Code's hook protocol, as real subprocesses.

Input and output follow Claude Code's hooks reference: one JSON object on
stdin (session_id, transcript_path, cwd, hook_event_name, source / reason),
and for SessionStart one JSON object on stdout whose
hookSpecificOutput.additionalContext is the added context. The database is a
real SQLite file filled through the services.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import select

from conftest import make_app
from cpersona.hooks import BOUNDARY_KEYWORD, CONTEXT_CHAR_CAP
from cpersona.services.reconstruct.tokens import count_tokens
from cpersona.services.records.episodes import archive_episode
from cpersona.services.records.memories import store
from cpersona.services.records.profiles import update_profile
from cpersona.storage.models import Episode
from test_admin_cli import env_for


def hook_input(event: str = "SessionStart", cwd: str = "/home/someone/src/webshop", **fields: str) -> str:
    base = {"session_id": "abc-123", "transcript_path": "", "cwd": cwd, "hook_event_name": event}
    if event == "SessionStart":
        base["source"] = "startup"
    return json.dumps({**base, **fields})


def run_hook(
    db_path: Path, event: str, stdin: bytes | str | None, *args: str, agent: str = "alice", **extra: str
) -> subprocess.CompletedProcess[bytes]:
    data = stdin.encode() if isinstance(stdin, str) else stdin
    return subprocess.run(
        [sys.executable, "-m", "cpersona", "hook", event, "--agent", agent, *args, "--db", str(db_path)],
        env=env_for(db_path.with_name("decoy.db"), TZ="UTC", **extra),
        capture_output=True,
        timeout=120,
        input=data,
        stdin=subprocess.DEVNULL if data is None else None,
    )


def context_of(done: subprocess.CompletedProcess[bytes]) -> str:
    assert done.returncode == 0, done.stderr.decode()
    output = json.loads(done.stdout)
    assert set(output) == {"hookSpecificOutput"}
    assert output["hookSpecificOutput"]["hookEventName"] == "SessionStart"
    return output["hookSpecificOutput"]["additionalContext"]


def one_note(done: subprocess.CompletedProcess[bytes]) -> str:
    lines = [line for line in done.stderr.decode().splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("cpersona hook: "), done.stderr.decode()
    return lines[0]


@pytest.fixture
def memory(db):
    app = make_app(db)
    update_profile(app, agent_id="alice", profile="alice prefers terse answers")
    ids = {
        "web": store(app, content="webshop checkout uses the stripe sandbox key", agent_id="alice", project_id="web")[
            "id"
        ],
        "mobile": store(
            app, content="webshop mobile app ships through testflight", agent_id="alice", project_id="mobile"
        )["id"],
        "bob": store(app, content="webshop admin password lives in bob's vault", agent_id="bob")["id"],
        "episode": archive_episode(app, agent_id="alice", summary="paired on the webshop cart bug")["episode_id"],
    }
    archive_episode(app, agent_id="bob", summary="bob's private webshop chat")
    update_profile(app, agent_id="bob", profile="bob is secretive")
    db.ids = ids
    return db


def test_session_start_prints_the_agents_context_as_hook_output(memory):
    done = run_hook(memory.path, "session-start", hook_input())
    context = context_of(done)
    assert "alice prefers terse answers" in context  # the profile
    assert f"mem:{memory.ids['web']}" in context and "stripe sandbox" in context  # reconstruct on 'webshop'
    assert f"ep:{memory.ids['episode']}" in context and "cart bug" in context  # recent episodes
    assert "bob" not in context and "vault" not in context and "secretive" not in context  # isolation
    assert done.stderr.decode().strip() == ""


def test_session_start_for_an_agent_with_nothing_stored_says_so(memory):
    assert "Nothing is stored for this agent yet." in context_of(
        run_hook(memory.path, "session-start", hook_input(), agent="nobody")
    )


def test_the_operating_contexts_default_project_scopes_the_context(memory, tmp_path):
    everything = context_of(run_hook(memory.path, "session-start", hook_input()))
    assert "stripe sandbox" in everything and "testflight" in everything  # no project rule: every project
    rules = tmp_path / "operating-context.toml"
    rules.write_text('version = 1\n[registry]\nproject_ids = ["", "web", "mobile"]\n[defaults]\nalice = "web"\n')
    scoped = context_of(
        run_hook(memory.path, "session-start", hook_input(), CPERSONA_OPERATING_CONTEXT_PATH=str(rules))
    )
    assert "project 'web'" in scoped and "stripe sandbox" in scoped and "testflight" not in scoped
    explicit = context_of(
        run_hook(
            memory.path,
            "session-start",
            hook_input(),
            "--project",
            "mobile",
            CPERSONA_OPERATING_CONTEXT_PATH=str(rules),
        )
    )
    assert "testflight" in explicit and "stripe sandbox" not in explicit


@pytest.fixture
def crowded(db):
    app = make_app(db)
    update_profile(app, agent_id="alice", profile="alice profile " + "detail " * 200)
    for i in range(30):
        store(app, content=f"webshop note {i}: " + f"fact {i} about the checkout flow. " * 40, agent_id="alice")
    for i in range(12):
        archive_episode(app, agent_id="alice", summary=f"webshop session {i}: " + "we worked on it. " * 100)
    return db


@pytest.mark.parametrize("budget", [40, 150, 600, 2000, 50_000])
def test_the_context_stays_within_the_token_budget_and_is_deterministic(crowded, budget):
    first = run_hook(crowded.path, "session-start", hook_input(), "--budget", str(budget))
    context = context_of(first)
    assert count_tokens(context) <= budget
    assert len(context) <= CONTEXT_CHAR_CAP  # Claude Code's inline cap is 10,000 characters
    assert "token budget" in context or budget < 60  # the cut is said (a tiny budget holds only the header)
    if budget >= 600:
        assert "alice profile" in context and "## Stored about 'webshop'" in context
    again = run_hook(crowded.path, "session-start", hook_input(), "--budget", str(budget))
    assert again.stdout == first.stdout


BROKEN_INPUTS = [
    (None, "no hook input"),
    (b"", "no hook input"),
    (b"   \n", "no hook input"),
    (b"{not json", "not JSON"),
    (b"\xff\xfe{}", "not JSON"),
    (b"[1, 2, 3]", "not an object"),
    (b'"startup"', "not an object"),
]


@pytest.mark.parametrize("event", ["session-start", "session-end"])
@pytest.mark.parametrize(("stdin", "said"), BROKEN_INPUTS)
def test_broken_input_adds_nothing_and_exits_zero(memory, event, stdin, said):
    done = run_hook(memory.path, event, stdin)
    assert done.returncode == 0 and done.stdout == b""
    assert said in one_note(done) and b"Traceback" not in done.stderr
    with memory.read() as session:  # session-end recorded nothing either
        assert session.execute(select(Episode.id).where(Episode.keywords.contains(BOUNDARY_KEYWORD))).first() is None


def test_input_for_another_event_is_left_alone(memory):
    start = run_hook(memory.path, "session-start", hook_input("SessionEnd"))
    assert start.returncode == 0 and start.stdout == b"" and "SessionEnd" in one_note(start)
    end = run_hook(memory.path, "session-end", hook_input("SessionStart"))
    assert end.returncode == 0 and end.stdout == b"" and "SessionStart" in one_note(end)


def test_stdin_left_open_after_the_object_does_not_hang_the_hook(memory):
    child = subprocess.Popen(
        [sys.executable, "-m", "cpersona", "hook", "session-start", "--agent", "alice", "--db", str(memory.path)],
        env=env_for(memory.path, TZ="UTC"),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        child.stdin.write(hook_input().encode())
        child.stdin.flush()  # and never closed while the hook runs
        assert child.wait(timeout=120) == 0
        assert "stripe sandbox" in json.loads(child.stdout.read())["hookSpecificOutput"]["additionalContext"]
    finally:
        child.stdin.close()
        child.kill()
        child.wait()
        child.stdout.close()
        child.stderr.close()


def test_a_missing_database_adds_nothing_and_a_broken_one_fails_in_one_line(tmp_path):
    missing = run_hook(tmp_path / "none.db", "session-start", hook_input())
    assert missing.returncode == 0 and missing.stdout == b"" and "no database" in one_note(missing)
    assert not (tmp_path / "none.db").exists()
    broken = tmp_path / "broken.db"
    broken.write_bytes(b"this is not a database" * 100)
    done = run_hook(broken, "session-start", hook_input())
    assert done.returncode == 1 and done.stdout == b"" and b"Traceback" not in done.stderr
    one_note(done)


def test_session_end_records_the_boundary_and_the_next_start_shows_it(memory, tmp_path):
    transcript = tmp_path / "abc-123.jsonl"
    transcript.write_text(
        "\n".join(
            json.dumps(line)
            for line in [
                {"type": "summary", "summary": "no timestamp here"},
                {"type": "user", "timestamp": "2026-11-30T09:00:00.000Z", "message": {"content": "hi"}},
                {"type": "assistant", "timestamp": "2026-11-30T09:45:10.500Z", "message": {"content": "bye"}},
            ]
        )
        + "\n"
    )
    done = run_hook(
        memory.path,
        "session-end",
        hook_input("SessionEnd", reason="prompt_input_exit", transcript_path=str(transcript)),
    )
    assert done.returncode == 0 and done.stdout == b"", done.stderr.decode()
    with memory.read() as session:
        rows = session.execute(select(Episode).where(Episode.keywords.contains(BOUNDARY_KEYWORD))).scalars().all()
        assert len(rows) == 1
        row = rows[0]
        assert row.agent_id == "alice"
        assert "abc-123" in row.summary and "prompt_input_exit" in row.summary
        assert "/home/someone/src/webshop" in row.summary and str(transcript) in row.summary
        assert (row.start_time, row.end_time) == ("2026-11-30T09:00:00.000Z", "2026-11-30T09:45:10.500Z")
        boundary = row.id
    context = context_of(run_hook(memory.path, "session-start", hook_input()))
    recent = context.split("## Recent episodes", 1)[1].split("## Last session", 1)
    assert f"ep:{boundary}" not in recent[0]  # not listed as a conversation episode
    assert f"ep:{boundary}, ended 2026-11-30T09:45:10.500Z" in recent[1]
    bob = subprocess.run(
        [sys.executable, "-m", "cpersona", "list", "--agent", "bob", "--json", "--db", str(memory.path)],
        env=env_for(memory.path, TZ="UTC"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert f"ep:{boundary}" not in {row["ref"] for row in json.loads(bob.stdout)["rows"]}
