"""The operator subcommands, run as the real ``python -m cpersona`` in a subprocess.

Databases are real SQLite files prepared through the services; every command
is judged by its exit status, its output and what it left in the files.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import select, update

from conftest import make_app
from cpersona.services.records.episodes import archive_episode
from cpersona.services.records.memories import store
from cpersona.services.records.profiles import update_profile
from cpersona.storage.engine import open_sqlite
from cpersona.storage.migrate import head_revision, upgrade
from cpersona.storage.models import Memory


def env_for(db_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CPERSONA_", "EMBEDDING_"))}
    env.update({"CPERSONA_DB_PATH": str(db_path), "CPERSONA_UPDATE_CHECK": "false"})
    env.update(extra)
    return env


def cli(db_path: Path, *args: str, timeout: float = 120, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cpersona", *args],
        env=env_for(db_path, **extra),
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def filled(db, tmp_path):
    """A database with two agents, projects and channels, an episode and a profile."""
    app = make_app(db)
    store(app, content="alpha fact", agent_id="kai", project_id="ops", channel="c1")
    store(app, content="beta fact", agent_id="kai", project_id="ops", channel="c1")
    store(app, content="gamma fact", agent_id="kai")
    store(app, content="delta fact", agent_id="zed", channel="c2")
    archive_episode(app, agent_id="kai", summary="we talked", project_id="ops")
    update_profile(app, agent_id="kai", profile="likes tea")
    with db.write() as session:  # one stored vector, to see --include-embeddings
        session.execute(update(Memory).where(Memory.content == "alpha fact").values(embedding=b"\x00\x00\x80?" * 4))
    return db


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


# --- stats -------------------------------------------------------------------------------------------


def test_stats_counts_per_bucket_size_and_revision(filled):
    done = cli(filled.path, "stats", "--json")
    assert done.returncode == 0, done.stderr
    stats = json.loads(done.stdout)
    assert (stats["memories"], stats["episodes"], stats["profiles"], stats["pending_tasks"]) == (4, 1, 1, 0)
    assert stats["memories_by_bucket"] == [
        {"agent_id": "kai", "project_id": "ops", "channel": "c1", "count": 2},
        {"agent_id": "kai", "project_id": "", "channel": "", "count": 1},
        {"agent_id": "zed", "project_id": "", "channel": "c2", "count": 1},
    ]
    assert stats["episodes_by_bucket"] == [{"agent_id": "kai", "project_id": "ops", "channel": "", "count": 1}]
    assert stats["schema_version"] == 13 and stats["alembic_revision"] == stats["head_revision"] == head_revision()
    assert stats["size_bytes"] == filled.path.stat().st_size > 0

    text = cli(filled.path, "stats")
    assert text.returncode == 0
    assert "schema_version  13" in text.stdout and f"{head_revision()} (head)" in text.stdout
    assert "memories        4" in text.stdout and "kai" in text.stdout and "ops" in text.stdout


def test_stats_never_creates_or_changes_a_database(tmp_path):
    missing = tmp_path / "none" / "x.db"
    done = cli(missing, "stats")
    assert done.returncode == 1 and "no database at" in done.stderr
    assert not missing.exists() and not missing.parent.exists()


def test_stats_reads_a_database_serve_refuses_without_touching_it(tmp_path):  # spec README decision 9
    from test_import_db import make_26_database

    source = make_26_database(tmp_path)
    before = digest(source)
    done = cli(source, "stats", "--json")
    assert done.returncode == 0, done.stderr
    stats = json.loads(done.stdout)
    assert stats["schema_version"] == 21 and stats["alembic_revision"] is None and stats["memories"] > 0
    assert digest(source) == before


# --- export -------------------------------------------------------------------------------------------


def test_export_every_agent_and_one_agent(filled, tmp_path):  # spec §6
    everything = tmp_path / "out" / "all.jsonl"
    done = cli(filled.path, "export", str(everything))
    assert done.returncode == 0, done.stderr
    assert f"exported to {everything}: memories 4, episodes 1, profiles 1" in done.stdout
    records = lines(everything)
    assert records[0]["_type"] == "header" and records[0]["memory_count"] == 4
    assert all("embedding_b64" not in r for r in records if r["_type"] == "memory")

    one = tmp_path / "kai.jsonl"
    done = cli(filled.path, "export", str(one), "--agent", "kai", "--include-embeddings", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["memories"] == 3
    memories = [r for r in lines(one) if r["_type"] == "memory"]
    assert {m["agent_id"] for m in memories} == {"kai"}
    assert [m["content"] for m in memories if m.get("embedding_b64")] == ["alpha fact"]


def test_export_refusals_exit_non_zero(filled, tmp_path):  # spec EX-1..EX-3
    done = cli(filled.path, "export", "../escape.jsonl")
    assert done.returncode == 1 and "path traversal" in done.stderr
    missing = tmp_path / "nothing.db"
    done = cli(missing, "export", str(tmp_path / "x.jsonl"))
    assert done.returncode == 1 and "no database at" in done.stderr and not missing.exists()


# --- import -------------------------------------------------------------------------------------------


def test_import_round_trip_is_idempotent_and_dry_run_writes_nothing(filled, tmp_path):  # spec §7
    exported = tmp_path / "all.jsonl"
    assert cli(filled.path, "export", str(exported)).returncode == 0
    target = tmp_path / "fresh" / "target.db"

    dry = cli(target, "import", str(exported), "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "would import 4 memories (skipped 0), 1 episodes (skipped 0)" in dry.stdout
    assert json.loads(cli(target, "stats", "--json").stdout)["memories"] == 0

    first = cli(target, "import", str(exported))
    assert first.returncode == 0, first.stderr
    assert "imported 4 memories (skipped 0), 1 episodes (skipped 0), profile updated: yes" in first.stdout
    again = cli(target, "import", str(exported), "--json")
    answer = json.loads(again.stdout)
    assert (answer["imported_memories"], answer["skipped_memories"]) == (0, 4)

    retargeted = cli(tmp_path / "other.db", "import", str(exported), "--target-agent", "solo")
    assert retargeted.returncode == 0, retargeted.stderr
    database = open_sqlite(tmp_path / "other.db")
    try:
        with database.read() as session:
            assert set(session.scalars(select(Memory.agent_id)).all()) == {"solo"}
    finally:
        database.close()


def test_import_refusals_exit_non_zero(tmp_path):  # spec IM-1
    done = cli(tmp_path / "t.db", "import", str(tmp_path / "absent.jsonl"))
    assert done.returncode == 1 and "File not found" in done.stderr


def write_big_export(path: Path, count: int = 5000) -> None:
    with path.open("w", encoding="utf-8") as handle:
        handle.write(
            json.dumps(
                {
                    "_type": "header",
                    "version": "cpersona-export/1.1",
                    "agent_id": "",
                    "exported_at": "2026-01-01T00:00:00",
                    "memory_count": count,
                    "episode_count": 0,
                    "profile_count": 0,
                }
            )
            + "\n"
        )
        for i in range(count):
            handle.write(
                json.dumps(
                    {
                        "_type": "memory",
                        "agent_id": "bulk",
                        "project_id": "",
                        "channel": "",
                        "content": f"bulk memory {i} " + "x" * 400,
                        "timestamp": "2026-01-01T00:00:00",
                        "source": {},
                        "metadata": {},
                    }
                )
                + "\n"
            )


def test_large_import_shows_progress_on_stderr(tmp_path):
    big = tmp_path / "big.jsonl"
    write_big_export(big)
    assert big.stat().st_size > 2_000_000
    done = cli(tmp_path / "t.db", "import", str(big), timeout=300)
    assert done.returncode == 0, done.stderr
    assert "imported 5000 memories" in done.stdout
    assert "import: pass 2/2 importing" in done.stderr and "% (" in done.stderr
    assert "import:" not in done.stdout  # progress never mixes into the result

    quiet = cli(tmp_path / "t.db", "import", str(big), "--no-progress", "--dry-run", timeout=300)
    assert quiet.returncode == 0 and "import:" not in quiet.stderr


def test_small_import_shows_no_progress(filled, tmp_path):
    exported = tmp_path / "small.jsonl"
    cli(filled.path, "export", str(exported))
    done = cli(tmp_path / "t.db", "import", str(exported))
    assert done.returncode == 0 and "import: pass" not in done.stderr


# --- import-db ----------------------------------------------------------------------------------------


def test_import_db_copies_and_prints_the_counts(tmp_path):  # README decision 9
    from test_import_db import make_26_database

    source = make_26_database(tmp_path)
    before = digest(source)
    target = tmp_path / "ours" / "cpersona.db"
    done = cli(target, "import-db", str(source))
    assert done.returncode == 0, done.stderr
    assert f"copied from {source.resolve()} (schema_version 21)" in done.stdout
    assert "memories" in done.stdout and "copied" in done.stdout
    assert digest(source) == before

    again = cli(target, "import-db", str(source), "--json")
    answer = json.loads(again.stdout)
    assert again.returncode == 0 and answer["memories"]["copied"] == 0 and answer["memories"]["skipped"] > 0


def test_import_db_failures_exit_non_zero(filled, tmp_path):
    done = cli(filled.path, "import-db", str(filled.path))
    assert done.returncode == 1 and "the database being copied" in done.stderr
    done = cli(tmp_path / "new.db", "import-db", str(tmp_path / "absent.db"))
    assert done.returncode == 1 and "File not found" in done.stderr
    assert not (tmp_path / "new.db").exists()  # a mistyped source leaves no empty target behind


def _run_shell(command: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``command`` as a user would paste it, with this venv's cpersona first on PATH."""
    env = env_for(Path("unused"))
    del env["CPERSONA_DB_PATH"]
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return subprocess.run(
        ["bash", "-c", command], env=env, cwd=cwd, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL
    )


def _quoted_command(message: str) -> str:
    import re

    [command] = re.findall(r"`(CPERSONA_DB_PATH=[^`]+ cpersona import-db [^`]+)`", message)
    return command


def test_import_db_names_the_target_and_reports_each_stage(tmp_path):  # issue 13 item 8
    from test_import_db import make_26_database

    source = make_26_database(tmp_path)
    target = tmp_path / "ours" / "copy.db"
    done = cli(target, "import-db", str(source))
    assert done.returncode == 0, done.stderr
    err = done.stderr.splitlines()
    assert err[0] == f"import-db: copying {source.resolve()} into {target} (CPERSONA_DB_PATH)"
    assert err[1].startswith(f"import-db: {source.resolve()} (schema_version 21): ") and " memories, " in err[1]
    stages = [line.split()[1] for line in err[2:]]
    assert stages[:4] == ["memories", "episodes", "profiles", "associations"], err
    memories = int(err[1].split(": ")[-1].split()[0])
    assert err[2] == f"import-db: memories  {memories} read: {memories} copied, 0 already present"
    assert err[-1] == f"import-db: done; serve the copy with CPERSONA_DB_PATH={target}"
    assert f"into {target} (CPERSONA_DB_PATH):" in done.stdout


def test_import_db_without_the_variable_says_where_it_writes(tmp_path):
    from test_import_db import make_26_database

    source = make_26_database(tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    done = _run_shell(f"cpersona import-db {source}", work)
    assert done.returncode == 0, done.stderr
    default = work / "data" / "cpersona.db"
    assert f"into {default} (CPERSONA_DB_PATH is unset: the default, under the working directory)" in done.stderr
    assert default.is_file()


def test_import_db_into_its_own_source_gives_the_command_that_works(tmp_path):
    # The server's refusal names import-db; following it with CPERSONA_DB_PATH still on the 2.6
    # file is refused with the exact next command, which then copies it, and the copy serves.
    from test_import_db import make_26_database

    source = make_26_database(tmp_path).resolve()
    before = digest(source)
    served = cli(source, "stats", "--json")  # (stats only reads: the same file is still fine)
    assert served.returncode == 0
    refused_serve = cli(source, "export", str(tmp_path / "x.jsonl"))
    assert refused_serve.returncode == 3
    command = _quoted_command(refused_serve.stderr)
    again = cli(source, "import-db", str(source))
    assert again.returncode == 1 and len(again.stderr.strip().splitlines()) == 1
    assert _quoted_command(again.stderr) == command
    assert digest(source) == before
    copied = _run_shell(command, tmp_path)
    assert copied.returncode == 0, copied.stderr
    target = source.with_name(f"{source.stem}-cpersona.db")
    assert f"serve the copy with CPERSONA_DB_PATH={target}" in copied.stderr
    assert cli(target, "export", str(tmp_path / "y.jsonl")).returncode == 0
    assert digest(source) == before


# --- configuration and databases a command must not open ----------------------------------------------


def test_bad_configuration_exits_2(filled, tmp_path):  # spec CFG-2..CFG-4, exit codes of serve
    for args in (("stats",), ("export", str(tmp_path / "x.jsonl")), ("import", str(tmp_path / "x.jsonl"))):
        done = cli(filled.path, *args, CPERSONA_MAX_CONTENT_LENGTH="lots")
        assert done.returncode == 2 and "CPERSONA_MAX_CONTENT_LENGTH" in done.stderr


def test_a_too_new_database_is_refused_with_exit_3(tmp_path):  # spec README decision 9
    from test_import_db import make_26_database

    newer = make_26_database(tmp_path)
    before = digest(newer)
    exported = tmp_path / "x.jsonl"
    done = cli(newer, "export", str(exported))
    assert done.returncode == 3 and "import-db" in done.stderr
    assert digest(newer) == before and not exported.exists()


def test_help_lists_the_subcommands():
    done = subprocess.run([sys.executable, "-m", "cpersona", "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0
    for name in ("serve", "export", "import", "stats", "import-db"):
        assert name in done.stdout


def test_serve_drains_the_task_queue_at_start(db_path):  # spec Q-2, wiring of serve
    database = open_sqlite(db_path)
    upgrade(database)
    from sqlalchemy import insert

    from cpersona.storage.models import PendingMemoryTask

    with database.write() as session:
        session.execute(
            insert(PendingMemoryTask).values(
                task_type="update_profile", agent_id="kai", payload=json.dumps("left by an older run")
            )
        )
    database.close()

    sys.path.insert(0, str(Path(__file__).parent / "e2e"))
    from stdio_harness import RawSession, server_env

    session = RawSession(server_env(db_path))
    try:
        session.initialize()
        import time

        deadline = time.monotonic() + 10
        while True:
            reply = session.call("get_profile", '{"agent_id": "kai"}')
            profile = json.loads(reply["result"]["content"][0]["text"])["profile"]
            if profile or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert profile == "left by an older run"
        status = json.loads(session.call("get_queue_status", "{}")["result"]["content"][0]["text"])
        assert status == {"enabled": True, "pending": 0, "max_retries": 3, "retry_delay": 30}
    finally:
        session.close()
