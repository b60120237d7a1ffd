"""The direct (stdio) start: what it loads, when it opens without Alembic, how it ends.

Real processes throughout: the server is ``python -m cpersona`` on a real
SQLite file; a terminal is a real pseudo-terminal. Nothing here measures time
(bench/startup.py does); the waits are generous liveness bounds.
"""

from __future__ import annotations

import asyncio
import json
import os
import pty
import signal
import sqlite3
import subprocess
import sys
import termios
from pathlib import Path

import pytest

from cpersona.background import BackgroundWork
from cpersona.storage import migrate

sys.path.insert(0, str(Path(__file__).parent / "e2e"))
from stdio_harness import RawSession, server_env  # noqa: E402

HERE = Path(__file__).resolve().parent

# Modules a stdio start must not load: the HTTP transport, OAuth and ACL code
# (no ACL file is set), Alembic (the database is at head), the 2.6 and JSONL
# importers, the health services (no health tool was called), httpx
# (embeddings are off; the SDK itself brings httpx2, not httpx), and numpy with
# the sqlite_vec package that imports it (no vector is compared with embeddings
# off; the extension itself is found and loaded without the package), and the
# standard library's sqlite3 (a second SQLite: the engine's driver is sqlean),
# and SQLAlchemy's PostgreSQL dialect (see cpersona.storage.tables._partial),
# and SQLAlchemy's ORM with the mapped classes (the start and the first recall
# run Core statements on Core sessions: cpersona.storage.tables, .sessions),
# and jsonschema with what it brings (a sound call is accepted by
# cpersona.mcp.schema_check; jsonschema words complaints only), and the
# maintenance commands' modules (`cpersona` alone builds only serve's parser),
# and what only another configuration runs: the embedding client and the vector
# backfill (embeddings are off), the update check (CPERSONA_UPDATE_CHECK=false),
# the remote vector index (not remote mode), the task handlers (the queue is
# empty), the calibration state (no sidecar file to restore betas from), and
# difflib (no unknown variable to suggest a name for).
# pydantic-settings stays on the path: it is the stack's configuration library.
NOT_ON_A_STDIO_START = (
    "tomllib",  # the operating-context sidecar's parser: no sidecar file here
    "difflib",
    "cpersona.embedding.client",
    "cpersona.services.records.backfill",
    "cpersona.services.records.remote_vectors",
    "cpersona.services.operations.update_check",
    "cpersona.services.operations.install",
    "cpersona.services.records.nodes",
    "cpersona.services.records.profiles",
    "cpersona.services.calibration.state",
    "cpersona.services.calibration.sidecar",
    "jsonschema",
    "jsonschema.validators",
    "referencing",
    "jsonschema_specifications",
    "cpersona.admin_cli",
    "cpersona.checkup",
    "cpersona.people_cli",
    "cpersona.hooks",
    "cpersona.model_cli",
    "cpersona.ui.cli",
    "sqlalchemy.orm",
    "sqlalchemy.orm.session",
    "sqlalchemy.orm.decl_api",
    "cpersona.storage.models",
    "cpersona.storage.models_associations",
    "alembic",
    "mako",
    "cpersona.mcp.http",
    "cpersona.mcp.oauth",
    "cpersona.mcp.acl",
    "jwt",
    "cpersona.services.portability",
    "cpersona.services.portability.importer",
    "cpersona.services.portability.import_db",
    "cpersona.services.health.registry",
    "cpersona.services.health.deep_check",
    "cpersona.storage.vectors_postgres",
    "httpx",
    "numpy",
    "cpersona.storage.vector_index_sqlite",  # the far list's in-process copy: numpy, vectors on only
    "sqlite_vec",
    "sqlite3",
    "sqlalchemy.dialects.postgresql",
    "mcp_types.methods",  # the per-version surfaces: only a method the stdio session does not serve needs them
)


def test_the_head_constant_is_the_migration_scripts_head() -> None:
    # A new revision that does not move HEAD_REVISION would make every start
    # skip Alembic on a database that still needs upgrading.
    assert migrate.HEAD_REVISION == migrate.head_revision()


def _start_once(db_path: Path) -> None:
    """A first start creates the file and brings it to head (this one loads Alembic)."""
    session = RawSession(server_env(db_path, CPERSONA_EMBEDDING_MODE="none"))
    session.initialize()
    assert session.close() == 0


def test_a_stdio_start_loads_only_what_it_runs(tmp_path: Path) -> None:
    db_path = tmp_path / "memory.db"
    _start_once(db_path)
    modules_file = tmp_path / "modules.txt"
    env = server_env(db_path, CPERSONA_EMBEDDING_MODE="none", CPERSONA_TEST_MODULES_FILE=str(modules_file))
    session = RawSession(env, args=[str(HERE / "modules_at_exit.py"), "cpersona"])
    session.initialize()
    answer = session.call("recall", '{"agent_id":"a","query":"anything at all"}')
    assert "result" in answer
    assert session.close() == 0
    loaded = set(modules_file.read_text(encoding="utf-8").split())
    assert "cpersona.services.recall.service" in loaded  # the file is the server's, after a recall
    assert sorted(loaded & set(NOT_ON_A_STDIO_START)) == []
    third_party = _third_party(loaded)
    assert {"mcp_types", "sqlalchemy", "sqlean", "pydantic_settings"} <= third_party  # the filter keeps packages
    assert sorted(third_party - _third_party(_stack_floor(env))) == []
    # The session is ours on the SDK's wire types: no part of the SDK package, whose
    # __init__ loads its client, HTTP stack and cryptography (55 MiB), is imported.
    assert sorted(name for name in loaded if name == "mcp" or name.startswith("mcp.")) == []
    # The start runs with the collector off, then freezes what it built and turns it
    # back on before serving (cli._collector_on); a start that skipped that would
    # serve with nothing frozen, and its collections would rescan the whole start.
    frozen = next(int(token.split("=")[1]) for token in loaded if token.startswith("#gc-frozen="))
    assert frozen > 50_000  # the SDK's models, SQLAlchemy, our declarations


# What the stack a stdio start is built on loads by itself, before cpersona's first
# line runs: the SDK's wire types (mcp_types; not the mcp package, whose __init__
# brings its client and HTTP halves too), SQLAlchemy Core with its SQLite dialect,
# pydantic-settings, SQLite (sqlean) and anyio's asyncio backend. A start that
# loads a third-party package outside it pays for something the wire types and
# the storage layer did not ask for (docs/benchmarks.md issue 16).
STACK_FLOOR = (
    "import mcp_types, sqlalchemy, sqlalchemy.dialects.sqlite, pydantic_settings, sqlean, anyio._backends._asyncio"
)


def _stack_floor(env: dict[str, str]) -> set[str]:
    code = f"import sys\n{STACK_FLOOR}\nprint('\\n'.join(sys.modules))"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return set(done.stdout.split())


def _third_party(modules: set[str]) -> set[str]:
    """Top-level package names that are neither the standard library's nor ours."""
    tops = {name.split(".")[0] for name in modules if not name.startswith("#")}
    return {top for top in tops if top not in sys.stdlib_module_names and top != "cpersona" and top != "__main__"}


# A host lists the tools right after initialize: the health tools' descriptions then
# import the health registry (cpersona.mcp.tools.health), which must not bring the
# PostgreSQL code with numpy and SQLAlchemy's PostgreSQL dialect (+15 MiB of peak RSS
# before, docs/benchmarks.md issue 16 eighth round), nor a second SQLite.
NOT_LOADED_BY_A_LISTING = (
    "numpy",
    "sqlite_vec",
    "sqlite3",
    "sqlalchemy.dialects.postgresql",
    "cpersona.storage.search_postgres",
    "cpersona.storage.vectors_postgres",
)


def test_listing_the_tools_loads_no_postgresql_code_and_no_numpy(tmp_path: Path) -> None:
    db_path = tmp_path / "memory.db"
    _start_once(db_path)
    modules_file = tmp_path / "modules.txt"
    env = server_env(db_path, CPERSONA_EMBEDDING_MODE="none", CPERSONA_TEST_MODULES_FILE=str(modules_file))
    session = RawSession(env, args=[str(HERE / "modules_at_exit.py"), "cpersona"])
    session.initialize()
    listed = session.reply(session.request("tools/list"))
    assert "check_health" in {tool["name"] for tool in listed["result"]["tools"]}
    assert "result" in session.call("recall", '{"agent_id":"a","query":"anything at all"}')
    assert session.close() == 0
    loaded = set(modules_file.read_text(encoding="utf-8").split())
    assert "cpersona.services.health.registry" in loaded  # the descriptions were rendered
    assert sorted(loaded & set(NOT_LOADED_BY_A_LISTING)) == []


def test_a_database_below_head_is_still_upgraded(tmp_path: Path) -> None:
    # The skip is for a database at head only: one stamped at an older
    # revision takes the Alembic path and reaches head.
    db_path = tmp_path / "memory.db"
    _start_once(db_path)
    with sqlite3.connect(db_path) as conn:
        conn.execute("DROP TABLE record_nodes") if _has(conn, "record_nodes") else None
        conn.execute("UPDATE alembic_version SET version_num = '0003_associations'")
    _start_once(db_path)
    with sqlite3.connect(db_path) as conn:
        assert conn.execute("SELECT version_num FROM alembic_version").fetchall() == [(migrate.HEAD_REVISION,)]
        assert _has(conn, "record_nodes")


def _has(conn: sqlite3.Connection, table: str) -> bool:
    return conn.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name=?", (table,)).fetchone() is not None


def _memories(db_path: Path) -> list[str]:
    with sqlite3.connect(db_path) as conn:
        return [row[0] for row in conn.execute("SELECT content FROM memories ORDER BY id")]


def test_closing_stdin_ends_the_server_with_every_write_committed(tmp_path: Path) -> None:
    db_path = tmp_path / "memory.db"
    session = RawSession(server_env(db_path, CPERSONA_EMBEDDING_MODE="none"))
    session.initialize()
    for n in range(3):
        answer = session.call("store", '{"agent_id":"a","content":"answered row %d"}' % n)
        assert "result" in answer
    # The last store is sent and stdin closed at once, without waiting for its answer.
    session.request("tools/call", {"name": "store", "arguments": {"agent_id": "a", "content": "unanswered row"}})
    assert session.close() == 0
    assert _memories(db_path) == ["answered row 0", "answered row 1", "answered row 2", "unanswered row"]


INITIALIZE = (
    b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25",'
    b'"capabilities":{},"clientInfo":{"name":"t","version":"0"}}}\n'
)


def _initialize(write_fd: int, read_fd: int) -> None:
    """Answered initialize: the server is inside its serving loop, reading stdin."""
    os.write(write_fd, INITIALIZE)
    seen = b""
    while b'"id":1' not in seen:
        chunk = os.read(read_fd, 65536)
        assert chunk, f"the server ended before answering: {seen[-2000:]!r}"
        seen += chunk


@pytest.mark.parametrize("stdin_kind", ["terminal", "pipe"])
def test_sigint_stops_a_serving_server(tmp_path: Path, stdin_kind: str) -> None:
    # issue 13: Ctrl-C in a terminal left the README's start command running
    # (the SDK's stdin reader thread had to return first, i.e. wait for Enter).
    env = server_env(tmp_path / "memory.db", CPERSONA_EMBEDDING_MODE="none")
    command = [sys.executable, "-m", "cpersona"]
    if stdin_kind == "terminal":
        controller, terminal = pty.openpty()
        attrs = termios.tcgetattr(terminal)
        attrs[3] &= ~termios.ECHO  # the controller reads only the server's output
        termios.tcsetattr(terminal, termios.TCSANOW, attrs)
        proc = subprocess.Popen(command, stdin=terminal, stdout=terminal, stderr=subprocess.DEVNULL, env=env)
        os.close(terminal)
        write_fd = read_fd = controller
    else:
        controller = None
        proc = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env
        )
        write_fd, read_fd = proc.stdin.fileno(), proc.stdout.fileno()
    try:
        _initialize(write_fd, read_fd)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if controller is not None:
            os.close(controller)


def test_background_work_starts_once_and_never_after_stop(app) -> None:
    started = []
    work = BackgroundWork(app)
    work._start_parts = lambda: started.append(1)  # type: ignore[method-assign]
    work.start()
    work.start()
    assert started == [1]
    late = BackgroundWork(app)
    late._start_parts = lambda: started.append(2)  # type: ignore[method-assign]
    late.stop()  # the server ended before its first answer
    late.start()
    assert started == [1]


def test_preparing_puts_the_sidecar_betas_in_force_and_without_one_builds_nothing(app) -> None:
    # spec SC-5: the betas are preferences, restored before the first call in every
    # embedding mode; prepare checks the file before importing the calibration code.
    from cpersona.services.app import App

    BackgroundWork(app).prepare()
    assert App.calibration.if_built(app) is None  # no sidecar: nothing restored, nothing built
    app.settings.calibration_sidecar.write_text(
        json.dumps({"embedding_dim": 64, "embedding_model": "", "agent_betas": {"g": 2.0}}), encoding="utf-8"
    )
    BackgroundWork(app).prepare()
    assert app.calibration.beta_override("g") == 2.0
    assert app.calibration.beta_override("other") is None


def test_the_first_answer_hook_runs_once_after_the_first_message() -> None:
    from mcp.shared.message import SessionMessage
    import mcp.types as types

    from cpersona.mcp.stdio import AnswerTracker

    sent: list[object] = []
    calls: list[int] = []

    class Sink:
        async def send(self, item: object) -> None:
            sent.append(item)

        async def aclose(self) -> None:
            pass

    async def run() -> None:
        hook = AnswerTracker(Sink(), lambda: calls.append(len(sent)))
        message = SessionMessage(types.JSONRPCResponse(jsonrpc="2.0", id=1, result={}))
        await hook.send(message)
        await hook.send(message)

    asyncio.run(run())
    assert calls == [1]  # once, and only after the first message was handed over
