"""``cpersona search | list | show | delete`` and ``--db``, run as the real ``python -m cpersona``.

The database is a real SQLite file filled through the services. Every run
points CPERSONA_DB_PATH at a file that does not exist, so only ``--db`` can
find the data: a command that ignored the flag would fail.
"""

from __future__ import annotations

import argparse
import json
import os
import pty
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import select, update

from conftest import make_app
from cpersona.cli import NO_DATABASE, apply_database_option, build_parser
from cpersona.services.records.episodes import archive_episode
from cpersona.services.records.admin import lock_memory
from cpersona.services.records.memories import store
from cpersona.services.records.profiles import update_profile
from cpersona.storage.models import Episode, Memory
from test_admin_cli import env_for

LONG = "The release checklist: " + " ".join(f"step {i} is verified by hand." for i in range(200))


def run(
    db_path: Path | None, *args: str, stdin: str | None = "", timeout: float = 120, **extra: str
) -> subprocess.CompletedProcess[str]:
    decoy = Path(os.environ.get("TMPDIR", "/tmp")) / "cpersona-no-such-dir" / "decoy.db"
    env = env_for(decoy, TZ="UTC", **extra)
    where = ["--db", str(db_path)] if db_path is not None else []
    return subprocess.run(
        [sys.executable, "-m", "cpersona", *args, *where],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        input=stdin,
    )


def one_line_failure(done: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in done.stderr.splitlines() if line.strip() and not line.startswith("note:")]
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    return lines[0]


def assert_human(text: str) -> None:
    """Plain text: no Python dict or list reprs leaked into the output."""
    assert "{'" not in text and "['" not in text and "': " not in text, text


@pytest.fixture
def people(db):
    """Two agents with memories about deploys, an episode, a profile, a long memory and a locked one."""
    app = make_app(db)
    ids = {
        "a_deploy": store(
            app,
            content="deploy with make release on the build host",
            agent_id="alice",
            project_id="web",
            channel="ops",
            associations={
                "entities": [{"name": "BuildHost"}],
                "relations": [{"subject": "BuildHost", "predicate": "runs", "object": "make release"}],
            },
        )["id"],
        "a_tea": store(app, content="alice drinks green tea", agent_id="alice")["id"],
        "a_long": store(app, content=LONG, agent_id="alice")["id"],
        "a_old": store(app, content="deploy notes from January", agent_id="alice")["id"],
        "a_locked": store(app, content="locked deploy rule", agent_id="alice")["id"],
        "b_deploy": store(app, content="bob deploy secret: the staging password hint", agent_id="bob")["id"],
    }
    ids["a_episode"] = archive_episode(app, agent_id="alice", summary="we fixed the deploy pipeline")["episode_id"]
    ids["b_episode"] = archive_episode(app, agent_id="bob", summary="bob's private deploy chat")["episode_id"]
    update_profile(app, agent_id="alice", profile="alice prefers terse answers")
    lock_memory(app, agent_id="alice", memory_id=ids["a_locked"])
    with db.write() as session:  # one old row, for --since
        session.execute(update(Memory).where(Memory.id == ids["a_old"]).values(created_at="2026-01-05 08:00:00"))
    db.ids = ids
    return db


# --- --db on every command that opens a database ----------------------------------------------


def _database_parsers() -> list[tuple[str, argparse.ArgumentParser]]:
    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    found = []
    for name, sub in commands.choices.items():
        nested = [a for a in sub._actions if isinstance(a, argparse._SubParsersAction)]
        found += [(f"{name} {n}", p) for a in nested for n, p in a.choices.items()] or [(name, sub)]
    return [(name, sub) for name, sub in found if name.split()[0] not in NO_DATABASE]


def test_every_database_command_takes_db_and_it_names_the_file(tmp_path, monkeypatch):
    commands = _database_parsers()
    names = {name for name, _ in commands}
    assert {
        "serve",
        "export",
        "import",
        "stats",
        "backup",
        "import-db",
        "checkup",
        "search",
        "list",
        "show",
        "delete",
        "hook session-start",
        "hook session-end",
    } <= names
    for name, sub in commands:
        assert "--db" in sub._option_string_actions, name
        monkeypatch.setenv("CPERSONA_DB_PATH", "/elsewhere.db")
        monkeypatch.setenv("CPERSONA_DATABASE_URL", "postgresql://nowhere/db")
        apply_database_option(argparse.Namespace(db=str(tmp_path / "chosen.db")))
        assert os.environ["CPERSONA_DB_PATH"] == str(tmp_path / "chosen.db"), name
        assert "CPERSONA_DATABASE_URL" not in os.environ, name


def test_db_selects_the_database_for_the_operator_commands(people, tmp_path):
    stats = run(people.path, "stats", "--json")
    assert stats.returncode == 0, stats.stderr
    assert json.loads(stats.stdout)["memories"] == 6
    export = run(people.path, "export", str(tmp_path / "out.jsonl"))
    assert export.returncode == 0 and (tmp_path / "out.jsonl").stat().st_size > 0, export.stderr
    backup = run(people.path, "backup", str(tmp_path / "copy.db"))
    assert backup.returncode == 0 and (tmp_path / "copy.db").exists(), backup.stderr
    restored = run(tmp_path / "fresh.db", "import", str(tmp_path / "out.jsonl"))
    assert restored.returncode == 0 and "imported 6 memories" in restored.stdout, restored.stderr


# --- search -----------------------------------------------------------------------------------


def test_search_prints_the_agents_rows_in_plain_text_and_never_another_agents(people):
    done = run(people.path, "search", "make release", "--agent", "alice")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"1. mem:{people.ids['a_deploy']}  ") and "make release" in done.stdout
    assert_human(done.stdout)
    theirs = run(people.path, "search", "staging password", "--agent", "alice")
    assert theirs.returncode == 0 and theirs.stdout.startswith("no match")
    assert f"mem:{people.ids['b_deploy']}" not in theirs.stdout and "hint" not in theirs.stdout
    own = run(people.path, "search", "staging password", "--agent", "bob")
    assert "staging password" in own.stdout  # the row exists: alice's search was kept from it


def test_search_json_is_the_recall_answer_and_limit_applies(people):
    everything = json.loads(run(people.path, "search", "deploy", "--agent", "alice", "--json").stdout)
    refs = [row["ref"] for row in everything["messages"]]
    assert len(refs) >= 2 and all(ref.split(":")[0] in ("mem", "ep") for ref in refs)
    assert not {f"mem:{people.ids['b_deploy']}", f"ep:{people.ids['b_episode']}"} & set(refs)
    one = json.loads(run(people.path, "search", "deploy", "--agent", "alice", "--json", "--limit", "1").stdout)
    assert len(one["messages"]) == 1


def test_search_project_filter_keeps_the_project_and_the_global_pool(people):
    other = json.loads(
        run(people.path, "search", "make release", "--agent", "alice", "--project", "mobile", "--json").stdout
    )
    assert f"mem:{people.ids['a_deploy']}" not in {row["ref"] for row in other["messages"]}
    web = json.loads(
        run(people.path, "search", "make release", "--agent", "alice", "--project", "web", "--json").stdout
    )
    assert f"mem:{people.ids['a_deploy']}" in {row["ref"] for row in web["messages"]}


def test_search_with_no_match_says_so(people):
    done = run(people.path, "search", "zebra", "--agent", "alice")
    assert done.returncode == 0 and "no match" in done.stdout, done.stderr


# --- list -------------------------------------------------------------------------------------


def test_list_every_agent_then_one_agent(people):
    everyone = run(people.path, "list")
    assert everyone.returncode == 0, everyone.stderr
    assert "staging password" in everyone.stdout and "green tea" in everyone.stdout
    assert_human(everyone.stdout)
    alice = run(people.path, "list", "--agent", "alice")
    assert "green tea" in alice.stdout and "[locked]" in alice.stdout
    assert "bob" not in alice.stdout and "staging password" not in alice.stdout  # isolation


def test_list_since_type_and_json(people):
    since = json.loads(run(people.path, "list", "--agent", "alice", "--since", "2026-06-01", "--json").stdout)
    refs = {row["ref"] for row in since["rows"]}
    assert f"mem:{people.ids['a_old']}" not in refs and f"mem:{people.ids['a_tea']}" in refs
    assert f"ep:{people.ids['a_episode']}" in refs and since["complete"] is True
    assert {row["agent_id"] for row in since["rows"]} == {"alice"}
    old = json.loads(run(people.path, "list", "--agent", "alice", "--since", "2026-01-01", "--json").stdout)
    assert f"mem:{people.ids['a_old']}" in {row["ref"] for row in old["rows"]}
    for when in ("today", "7d", "24h", "1w"):
        recent = json.loads(run(people.path, "list", "--since", when, "--json").stdout)
        assert f"mem:{people.ids['a_old']}" not in {row["ref"] for row in recent["rows"]}, when
        assert f"mem:{people.ids['a_tea']}" in {row["ref"] for row in recent["rows"]}, when
    episodes = json.loads(run(people.path, "list", "--agent", "alice", "--type", "episode", "--json").stdout)
    assert [row["ref"] for row in episodes["rows"]] == [f"ep:{people.ids['a_episode']}"]
    memories = json.loads(run(people.path, "list", "--type", "memory", "--json").stdout)
    assert {row["type"] for row in memories["rows"]} == {"memory"} and memories["count"] == 6


def test_list_limit_says_when_rows_were_left_out_and_offset_pages_on(people):
    done = run(people.path, "list", "--limit", "2")
    assert done.returncode == 0 and len(done.stdout.splitlines()) == 2
    assert "more rows follow" in done.stderr and "--offset 2" in done.stderr
    capped = json.loads(run(people.path, "list", "--limit", "2", "--json").stdout)
    assert capped["complete"] is False and capped["count"] == 2 and capped["next_offset"] == 2
    seen = [row["ref"] for row in capped["rows"]]
    offset = 2
    while offset is not None:
        page = json.loads(run(people.path, "list", "--limit", "3", "--offset", str(offset), "--json").stdout)
        seen += [row["ref"] for row in page["rows"]]
        offset = page["next_offset"]
    assert len(seen) == len(set(seen)) == 8  # 6 memories, 2 episodes: every row once, newest first
    for bad in (("--limit", "0"), ("--limit", "501"), ("--offset", "-1")):
        refused = run(people.path, "list", *bad)
        assert refused.returncode == 2 and bad[0] in one_line_failure(refused), bad


def test_list_since_is_applied_in_storage_so_an_older_day_is_never_cut_off(people):
    """600 newer rows of the same agent do not push the day asked for out of the answer."""
    with people.write() as session:
        session.add_all(
            Memory(
                agent_id="alice",
                content=f"later note {i}",
                timestamp="2026-03-01T10:00:00Z",
                created_at=f"2026-03-{1 + i % 28:02d} 10:{i % 60:02d}:00",
            )
            for i in range(600)
        )
        session.execute(update(Memory).where(Memory.id == people.ids["a_old"]).values(created_at="2026-02-10 08:00:00"))
    first = json.loads(
        run(
            people.path,
            "list",
            "--agent",
            "alice",
            "--type",
            "memory",
            "--since",
            "2026-02-10",
            "--limit",
            "500",
            "--json",
        ).stdout
    )
    assert first["count"] == 500 and first["complete"] is False and first["next_offset"] == 500
    rest = json.loads(
        run(
            people.path,
            "list",
            "--agent",
            "alice",
            "--type",
            "memory",
            "--since",
            "2026-02-10",
            "--limit",
            "500",
            "--offset",
            "500",
            "--json",
        ).stdout
    )
    assert rest["complete"] is True and rest["rows"][-1]["ref"] == f"mem:{people.ids['a_old']}"
    assert first["count"] + rest["count"] == 600 + 5  # the 600, the old row and alice's four of today
    # The bound is an instant, compared in storage (TZ=UTC here): 08:00 is before 09:00, after 07:30.
    late = json.loads(
        run(
            people.path,
            "list",
            "--agent",
            "alice",
            "--since",
            "2026-02-10T09:00",
            "--limit",
            "500",
            "--offset",
            "500",
            "--json",
        ).stdout
    )
    assert f"mem:{people.ids['a_old']}" not in {row["ref"] for row in late["rows"]}
    early = json.loads(
        run(
            people.path,
            "list",
            "--agent",
            "alice",
            "--since",
            "2026-02-10T07:30",
            "--limit",
            "500",
            "--offset",
            "500",
            "--json",
        ).stdout
    )
    assert early["rows"][-1]["ref"] == f"mem:{people.ids['a_old']}"


def test_list_refuses_an_unreadable_since(people):
    done = run(people.path, "list", "--since", "last tuesday")
    assert done.returncode == 2 and done.stdout == ""
    assert "--since" in one_line_failure(done)


# --- show -------------------------------------------------------------------------------------


def test_show_prints_the_whole_record(people):
    ref = f"mem:{people.ids['a_long']}"
    done = run(people.path, "show", ref, "--agent", "alice")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == ref and LONG in done.stdout  # whole, not the preview
    assert_human(done.stdout)
    answer = json.loads(run(people.path, "show", ref, "--agent", "alice", "--json").stdout)
    assert answer["items"][0]["content"] == LONG
    assert answer["record"]["fields"]["content"] == LONG and "ranges" in answer["record"]


def test_show_gives_what_a_person_expects_of_a_record(people):
    deploy = f"mem:{people.ids['a_deploy']}"
    done = run(people.path, "show", deploy, "--agent", "alice")
    assert done.returncode == 0, done.stderr
    assert_human(done.stdout)
    fields = {
        line.split(None, 1)[0]: line.split(None, 1)[1]
        for line in done.stdout.splitlines()[1:]
        if line.strip() and not line.startswith(" ") and " " in line.strip()
    }
    assert fields["project"] == "web" and fields["channel"] == "ops" and fields["locked"] == "no"
    assert fields["recalled"].startswith("0 time(s), last never") and fields["stored"].startswith("20")
    assert "BuildHost" in fields["entities"] and "BuildHost --runs--> make release" in done.stdout
    record = json.loads(run(people.path, "show", deploy, "--agent", "alice", "--json").stdout)["record"]
    assert record["fields"]["project_id"] == "web" and record["recall"] == {"count": 0, "last_recalled_at": None}
    locked = run(people.path, "show", f"mem:{people.ids['a_locked']}", "--agent", "alice")
    assert "locked     yes" in locked.stdout
    episode = run(people.path, "show", f"ep:{people.ids['a_episode']}", "--agent", "alice")
    assert episode.returncode == 0 and "resolved   " in episode.stdout and "fixed the deploy" in episode.stdout
    assert_human(episode.stdout)


def test_show_does_not_reveal_another_agents_record(people):
    for ref in (f"mem:{people.ids['b_deploy']}", f"ep:{people.ids['b_episode']}"):
        done = run(people.path, "show", ref, "--agent", "alice")
        assert done.returncode == 1 and "staging" not in done.stdout + done.stderr
        assert "has no such record" in one_line_failure(done)


def test_show_refuses_what_is_not_a_ref(people):
    done = run(people.path, "show", "12", "--agent", "alice")
    assert done.returncode == 2 and "not a record ref" in one_line_failure(done)


# --- delete -----------------------------------------------------------------------------------


def memory_exists(db, memory_id: int) -> bool:
    with db.read() as session:
        return session.execute(select(Memory.id).where(Memory.id == memory_id)).first() is not None


def test_delete_without_yes_and_without_a_terminal_deletes_nothing(people):
    done = run(people.path, "delete", f"mem:{people.ids['a_tea']}", "--agent", "alice")
    assert done.returncode == 2 and "--yes" in one_line_failure(done)
    assert memory_exists(people, people.ids["a_tea"])


def test_delete_with_yes_removes_the_agents_own_row_only(people):
    theirs = run(people.path, "delete", f"mem:{people.ids['b_deploy']}", "--agent", "alice", "--yes")
    assert theirs.returncode == 1 and memory_exists(people, people.ids["b_deploy"])
    one_line_failure(theirs)
    locked = run(people.path, "delete", f"mem:{people.ids['a_locked']}", "--agent", "alice", "--yes")
    assert locked.returncode == 1 and memory_exists(people, people.ids["a_locked"])
    mine = run(people.path, "delete", f"mem:{people.ids['a_tea']}", "--agent", "alice", "--yes")
    assert mine.returncode == 0 and mine.stdout.strip() == f"deleted mem:{people.ids['a_tea']}", mine.stderr
    assert not memory_exists(people, people.ids["a_tea"])
    episode = run(people.path, "delete", f"ep:{people.ids['a_episode']}", "--yes", "--json")
    assert episode.returncode == 0 and json.loads(episode.stdout)["ok"] is True, episode.stderr
    with people.read() as session:
        assert session.execute(select(Episode.id).where(Episode.id == people.ids["a_episode"])).first() is None


def _delete_on_a_terminal(db_path: Path, ref: str, answer: str) -> tuple[int, str]:
    """Run delete with a pseudo-terminal as stdin and type ``answer`` at its prompt."""
    leader, follower = pty.openpty()
    try:
        child = subprocess.Popen(
            [sys.executable, "-m", "cpersona", "delete", ref, "--agent", "alice", "--db", str(db_path)],
            env=env_for(db_path.with_name("decoy.db"), TZ="UTC"),
            stdin=follower,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        os.write(leader, answer.encode() + b"\n")
        out, err = child.communicate(timeout=120)
    finally:
        os.close(leader)
        os.close(follower)
    return child.returncode, out + err


def test_delete_on_a_terminal_asks_and_honours_the_answer(people):
    ref = f"mem:{people.ids['a_tea']}"
    code, text = _delete_on_a_terminal(people.path, ref, "n")
    assert code == 1 and "green tea" in text and "[y/N]" in text  # the record was shown before asking
    assert memory_exists(people, people.ids["a_tea"])
    code, text = _delete_on_a_terminal(people.path, ref, "y")
    assert code == 0 and f"deleted {ref}" in text
    assert not memory_exists(people, people.ids["a_tea"])


# --- the tools' rules -------------------------------------------------------------------------


def test_the_acl_file_binds_the_command_line_as_it_binds_a_stdio_client(people, tmp_path):
    acl = tmp_path / "acl.json"
    acl.write_text(json.dumps({"clients": [{"client_id": "local", "grants": {"alice": "read"}}]}))
    acl.chmod(0o600)
    mine = run(people.path, "search", "make release", "--agent", "alice", CPERSONA_ACL_FILE=str(acl))
    assert mine.returncode == 0 and "make release" in mine.stdout, mine.stderr
    theirs = run(people.path, "search", "staging password", "--agent", "bob", CPERSONA_ACL_FILE=str(acl))
    assert theirs.returncode == 1 and "staging" not in theirs.stdout
    assert "recall" in one_line_failure(theirs)
    write = run(
        people.path, "delete", f"mem:{people.ids['a_tea']}", "--agent", "alice", "--yes", CPERSONA_ACL_FILE=str(acl)
    )
    assert write.returncode == 1 and memory_exists(people, people.ids["a_tea"])


def test_a_missing_database_is_one_line_and_creates_nothing(tmp_path):
    missing = tmp_path / "none.db"
    for args in (
        ("search", "x", "--agent", "a"),
        ("list",),
        ("show", "mem:1", "--agent", "a"),
        ("delete", "mem:1", "--yes"),
    ):
        done = run(missing, *args)
        assert done.returncode == 1 and "no database" in one_line_failure(done), args
        assert not missing.exists()
