"""Storage failures reach users as one sentence, never as SQLAlchemy's text (issue 13 item 7).

Every condition is produced for real on a SQLite file: a full database (SQLite's
own page limit, which answers SQLITE_FULL exactly as a full disk does), a lock
another connection holds, a read-only file, a file that is not a database. The
read-only server runs as a real process under a user chmod applies to (tests
run as root, whom file modes do not stop): ``setpriv`` to ``nobody``.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, event, text

from conftest import make_app
from e2e.stdio_harness import RawSession, server_env
from cpersona.mcp.dispatch import call_tool
from cpersona.mcp.gates import GateChain
from cpersona.mcp.tools import default_registry
from cpersona.services.records.memories import store
from cpersona.storage import errors
from cpersona.storage.engine import sqlite_module
from cpersona.storage.migrate import open_and_upgrade

pytestmark = pytest.mark.anyio

SECRET = "the private words of the user"
LEAKS = ("[SQL", "[parameters", "sqlalche.me", "INSERT INTO", SECRET)


def assert_clean(text_out: str) -> None:
    for leak in LEAKS:
        assert leak not in text_out, f"{leak!r} leaked: {text_out[:500]}"


# -- the translation, on real driver errors ------------------------------------------------------


def _raw_engine(path: Path, uri_suffix: str = "", busy_ms: int = 0):
    module = sqlite_module()
    engine = create_engine(
        "sqlite+pysqlite://",
        module=module,
        creator=lambda: module.connect(f"file:{path}{uri_suffix}", uri=True, check_same_thread=False),
    )

    @event.listens_for(engine, "connect")
    def _connect(conn, _record):
        conn.execute(f"PRAGMA busy_timeout={busy_ms}")

    return engine


def _failure_of(engine, sql: str, params: dict) -> Exception:
    with pytest.raises(Exception) as caught:
        with engine.begin() as conn:
            conn.execute(text(sql), params)
    return caught.value


INSERT = "INSERT INTO memories (agent_id, content) VALUES (:a, :c)"


def test_a_held_lock_reads_as_busy(db_path: Path):
    open_and_upgrade(db_path).close()
    holder = sqlite_module().connect(str(db_path), isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        exc = _failure_of(_raw_engine(db_path), INSERT, {"a": "a", "c": SECRET})
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    said = errors.sentence(exc, str(db_path))
    assert said.startswith("the database is busy: ") and said.endswith("retry in a moment")
    assert_clean(said)


def test_a_read_only_connection_reads_as_read_only(db_path: Path):
    open_and_upgrade(db_path).close()
    exc = _failure_of(_raw_engine(db_path, "?mode=ro"), INSERT, {"a": "a", "c": SECRET})
    said = errors.sentence(exc, str(db_path))
    assert said.startswith(f"the database is read-only: {db_path} cannot be written") and "nothing was written" in said


def test_a_text_file_reads_as_not_a_database(tmp_path: Path):
    notes = tmp_path / "notes.txt"
    notes.write_text("hello, this is not a database\n" * 50)
    exc = _failure_of(_raw_engine(notes), "SELECT * FROM memories", {})
    assert errors.sentence(exc, str(notes)) == f"{notes} is not a SQLite database"


def test_a_failure_nobody_named_keeps_the_drivers_reason_without_sql(db_path: Path):
    open_and_upgrade(db_path).close()
    exc = _failure_of(_raw_engine(db_path), "INSERT INTO no_such_table VALUES (:c)", {"c": SECRET})
    assert errors.sentence(exc) is None
    assert errors.reason(exc) == "no such table: no_such_table"


# -- the call path: a full database --------------------------------------------------------------


def _fill_to_the_brim(db) -> None:
    """Every connection of ``db`` may grow the file no further (SQLITE_FULL, as on a full disk)."""
    with db.read() as session:
        pages = session.execute(text("PRAGMA page_count")).scalar()

    @event.listens_for(db.engine, "connect")
    def _cap(conn, _record):
        conn.execute(f"PRAGMA max_page_count={pages}")

    db.engine.dispose()


@pytest.fixture
def full_app(db_path: Path):
    db = open_and_upgrade(db_path)
    app = make_app(db)
    store(app, agent_id="a", content="one small row")
    _fill_to_the_brim(db)
    yield app
    db.close()


async def test_a_full_disk_is_one_sentence_in_the_tools_own_shape(full_app, caplog):
    caplog.set_level(logging.INFO)
    big = SECRET + " " + "x" * 200_000
    outcome = await call_tool(full_app, default_registry(), GateChain([]), "store", {"agent_id": "a", "content": big})
    assert outcome.payload["ok"] is False and outcome.payload["result"] == "rejected"
    assert outcome.payload["reason"] == f"the disk is full: nothing was written (database {full_app.db.label})"
    assert_clean(json.dumps(outcome.payload))
    shown = [r for r in caplog.records if r.levelno >= logging.INFO]
    assert [r.getMessage() for r in shown] == [f"tool store: {outcome.payload['reason']}"]
    assert all(r.exc_info is None for r in shown)  # no traceback (it would print the statement)
    assert_clean(caplog.text)


async def test_the_details_are_logged_once_at_debug_without_content(full_app, caplog):
    caplog.set_level(logging.DEBUG, logger="cpersona.mcp.dispatch")
    await call_tool(
        full_app, default_registry(), GateChain([]), "store", {"agent_id": "a", "content": SECRET + " " + "y" * 200_000}
    )
    debug = [r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG]
    assert len(debug) == 1 and "SQLITE_FULL" in debug[0]
    assert SECRET not in caplog.text and "[parameters" not in caplog.text


def test_sqlalchemy_text_never_carries_the_parameters(db_path: Path):
    # Belt and braces for any log line that prints an exception: the engine hides them.
    db = open_and_upgrade(db_path)
    try:
        with pytest.raises(Exception) as caught:
            with db.write() as session:
                session.execute(text("INSERT INTO no_such_table VALUES (:c)"), {"c": SECRET})
        assert SECRET not in str(caught.value)
    finally:
        db.close()


# -- a database this process may not write ------------------------------------------------------------

NOBODY = 65534


def as_other_user(argv: list[str]) -> list[str]:
    """Run ``argv`` as a user file modes apply to: ``nobody`` when we are root, else ourselves."""
    if os.geteuid() != 0:
        return argv
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.fail("tests run as root need setpriv (util-linux) to drop to a user chmod applies to")
    return [setpriv, f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", *argv]


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A folder outside pytest's root-only tmp tree, which the other user can reach."""
    path = Path(tempfile.mkdtemp(prefix="cpersona-ro-", dir="/tmp"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        for root, dirs, _files in os.walk(path):
            for name in dirs:
                os.chmod(os.path.join(root, name), 0o755)
        shutil.rmtree(path)


def _other_user_owns(path: Path) -> None:
    if os.geteuid() == 0:
        os.chown(path, NOBODY, NOBODY)


def seeded_database(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    db = open_and_upgrade(path)
    try:
        store(make_app(db), agent_id="a", content="already here")
    finally:
        db.close()
    path.chmod(0o644)


def read_only_file(base: Path) -> Path:
    """A 0444 database in a folder the user may write (SQLite can make its -shm there)."""
    path = base / "rofile" / "memory.db"
    seeded_database(path)
    _other_user_owns(path.parent)
    path.chmod(0o444)
    return path


def read_only_folder(base: Path) -> Path:
    """A database the user owns in a folder nobody but root may change: no -wal, no -shm, none creatable."""
    path = base / "rodir" / "memory.db"
    seeded_database(path)
    _other_user_owns(path)
    path.parent.chmod(0o555)
    assert not any(path.parent.glob("memory.db-*"))
    return path


LOCATIONS = {"chmod-0444 file": read_only_file, "read-only folder": read_only_folder}


def tool_body(reply: dict) -> dict:
    return json.loads(reply["result"]["content"][0]["text"])


@pytest.mark.parametrize("location", list(LOCATIONS))
def test_a_read_only_database_is_served_for_reading_and_refuses_writes_in_one_sentence(shared_dir, location):
    path = LOCATIONS[location](shared_dir)
    before = path.read_bytes()
    home = shared_dir / "home"
    home.mkdir()
    _other_user_owns(home)
    stderr_path = home / "stderr.txt"
    with stderr_path.open("w") as stderr_file:
        server = RawSession(
            server_env(path, HOME=str(home)), stderr=stderr_file, argv=as_other_user([sys.executable, "-m", "cpersona"])
        )
        try:
            server.initialize()
            calls = [
                ("store", {"agent_id": "a", "content": SECRET}),
                ("update_profile", {"agent_id": "a", "profile": SECRET}),
                ("list_memories", {"agent_id": "a"}),
                ("recall", {"agent_id": "a", "query": "already"}),
                ("check_health", {"agent_id": "a"}),
            ]
            stored, edited, listed, recalled, health = [
                tool_body(server.call(name, json.dumps(arguments))) for name, arguments in calls
            ]
        finally:
            server.close()
    stderr = stderr_path.read_text()
    assert stored["ok"] is False and stored["result"] == "rejected"
    assert stored["reason"].startswith(f"the database is read-only: {path} cannot be written (")
    assert edited["ok"] is False and edited["reason"].startswith("the database is read-only: ")
    assert_clean(json.dumps([stored, edited]))
    assert [m["content"] for m in listed["memories"]] == ["already here"]
    assert recalled.get("ok", True) is not False and "already here" in json.dumps(recalled), recalled
    assert health.get("ok", True) is not False and health["status"] in ("healthy", "degraded"), health
    assert sum("read-only" in line for line in stderr.splitlines()) == 1, stderr  # said once, at start-up
    assert "Traceback" not in stderr
    assert_clean(stderr)
    assert path.read_bytes() == before
