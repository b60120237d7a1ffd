"""Export and import never write over (or read) the server's own files, nor anything but an export (spec decision 12).

Every protected kind of destination is tried through ``export_memories``; each
must be refused in one sentence and be exactly as it was afterwards (same
inode, same bytes, same file type). The same refusals hold for ``cpersona
export`` and ``cpersona backup``; over streamable HTTP paths are confined to
``<database directory>/exports/``; over stdio any path still works.
"""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import stat
import sys
import threading
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path
from typing import Any

import pytest

from conftest import make_app
from cpersona.services.app import App
from cpersona.services.portability import export_memories, import_memories
from cpersona.services.records.memories import store
from cpersona.services.responses import ToolFailure
from cpersona.storage.engine import Database
from test_admin_cli import cli
from test_http_transport import HttpServer, mcp_call

EXPORT_LINE = (
    json.dumps(
        {"_type": "header", "version": "cpersona-export/1.1", "agent_id": "old", "memory_count": 0, "episode_count": 0}
    )
    + "\n"
)


# --- the server's own files -------------------------------------------------------------


@pytest.fixture
def served(db: Database, tmp_path: Path) -> tuple[App, dict[str, Path]]:
    """An App whose every side file exists (the journal excepted: WAL mode keeps none)."""
    acl = tmp_path / "etc" / "acl.json"
    context = tmp_path / "etc" / "operating-context.toml"
    acl.parent.mkdir()
    app = make_app(db, ACL_FILE=str(acl), OPERATING_CONTEXT_PATH=str(context))
    store(app, agent_id="alice", content="the row that must survive")
    s = app.settings
    files = {
        "database": Path(db.path),
        "wal": Path(f"{db.path}-wal"),
        "shm": Path(f"{db.path}-shm"),
        "journal": Path(f"{db.path}-journal"),
        "calibration sidecar": s.calibration_sidecar,
        "update-check cache": s.update_check_cache,
        "ACL file": acl,
        "alias ledger": s.alias_ledger_path,
        "operating-context file": context,
    }
    for name in ("calibration sidecar", "update-check cache", "alias ledger"):
        files[name].write_text(json.dumps({"kept": name}) + "\n")
    acl.write_text(json.dumps({"clients": []}) + "\n")
    context.write_text("summary = 'kept'\n")
    assert files["wal"].exists() and files["shm"].exists() and not files["journal"].exists()
    return app, files


def snapshot(path: Path) -> tuple[Any, ...] | None:
    """What a refusal must leave unchanged: file type, inode, and the bytes of a regular file."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None
    content = path.read_bytes() if stat.S_ISREG(info.st_mode) else None
    return stat.S_IFMT(info.st_mode), info.st_dev, info.st_ino, content


def database_is_whole(app: App, db_path: Path) -> None:
    check = sqlite3.connect(db_path)
    try:
        assert check.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        assert check.execute("SELECT content FROM memories").fetchall() == [("the row that must survive",)]
    finally:
        check.close()


PROTECTED = {  # spec decision 12: each of these is never written over
    "database": "the memory database",
    "wal": "write-ahead log",
    "shm": "shared-memory index",
    "journal": "rollback journal",
    "calibration sidecar": "the calibration sidecar",
    "update-check cache": "the update-check cache",
    "ACL file": "the ACL file",
    "alias ledger": "the alias ledger",
    "operating-context file": "the operating-context file",
}


@pytest.mark.parametrize("kind", list(PROTECTED))
def test_export_never_writes_over_a_server_file(served, kind: str) -> None:
    app, files = served
    target = files[kind]
    # The -shm index is rewritten by SQLite itself; its inode and type are what must hold.
    before = {name: snapshot(path) for name, path in files.items() if name != "shm"}
    shm_inode = os.stat(files["shm"]).st_ino
    answer = export_memories(app, agent_id="", output_path=str(target))
    assert answer == {
        "ok": False,
        "error": f"output_path refused: {target} is {_what(kind)}, which is never written over; choose another file",
    }
    assert {name: snapshot(path) for name, path in files.items() if name != "shm"} == before
    assert os.stat(files["shm"]).st_ino == shm_inode
    assert [p.name for p in target.parent.iterdir() if p.name.endswith(".tmp")] == []
    database_is_whole(app, files["database"])
    assert store(app, agent_id="alice", content="still writable")["ok"] is True


def _what(kind: str) -> str:
    phrase = PROTECTED[kind]
    return phrase if phrase.startswith("the ") else f"the database's {phrase}"


def test_a_hard_link_of_the_database_is_the_database(served, tmp_path: Path) -> None:
    # Inode identity, not the name: a second name of the file is the file.
    app, files = served
    alias = tmp_path / "innocent.jsonl"
    os.link(files["database"], alias)
    answer = export_memories(app, agent_id="", output_path=str(alias))
    assert answer["ok"] is False and answer["error"] == (
        f"output_path refused: {alias} is the memory database, which is never written over; choose another file"
    )
    assert os.stat(alias).st_ino == os.stat(files["database"]).st_ino
    database_is_whole(app, files["database"])


def test_another_spelling_of_a_server_file_is_that_file(served, tmp_path: Path, monkeypatch) -> None:
    # Resolved paths are compared: a relative name, a `.` segment, a symlinked parent directory.
    app, files = served
    (tmp_path / "via").symlink_to(files["database"].parent)
    monkeypatch.chdir(files["database"].parent)
    spellings = [
        files["database"].name,
        f"./{files['calibration sidecar'].name}",
        str(tmp_path / "via" / files["database"].name),
        str(tmp_path / "via" / "alias_ledger.json"),
    ]
    for spelling in spellings:
        answer = export_memories(app, agent_id="", output_path=spelling)
        assert answer["ok"] is False and "which is never written over" in answer["error"], spelling
    database_is_whole(app, files["database"])


# --- anything that is not a regular export ---------------------------------------------


def char_device(tmp_path: Path) -> Path:
    """A character device to aim at. Made in tmp_path when we may (root), so a regression
    cannot turn the machine's /dev/null into a file; otherwise /dev/null, which such a
    user cannot replace."""
    node = tmp_path / "null-device"
    try:
        os.mknod(node, stat.S_IFCHR | 0o666, os.makedev(1, 3))
        return node
    except OSError:
        return Path("/dev/null")


def make_socket(path: Path) -> Path:
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    server.close()  # the socket file stays
    return path


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def _export_file(path: Path) -> Path:
    return _write(path, EXPORT_LINE)


# (name, make the target, what the refusal says)
NOT_AN_EXPORT: list[tuple[str, Callable[[Path, dict[str, Path]], Path], str]] = [
    (
        "symlink to an export",
        lambda d, f: _symlink(d / "link.jsonl", _export_file(d / "real.jsonl")),
        "is a symbolic link, which is never written through; name the file itself",
    ),
    (
        "dangling symlink",
        lambda d, f: _symlink(d / "dangling.jsonl", d / "nowhere"),
        "is a symbolic link, which is never written through; name the file itself",
    ),
    (
        "symlink to the database",
        lambda d, f: _symlink(d / "db-link.jsonl", f["database"]),
        "is the memory database, which is never written over; choose another file",
    ),
    ("FIFO", lambda d, f: _fifo(d / "pipe"), "is a FIFO, not a regular file, so nothing was written"),
    ("socket", lambda d, f: make_socket(d / "s.sock"), "is a socket, not a regular file, so nothing was written"),
    ("directory", lambda d, f: _mkdir(d / "adir"), "is a directory, not a regular file, so nothing was written"),
    (
        "character device",
        lambda d, f: char_device(d),
        "is a character device, not a regular file, so nothing was written",
    ),
    (
        "a document",
        lambda d, f: _write(d / "notes.txt", "my notes\n"),
        "already exists and is not a cpersona export, so it was not replaced; choose a new file name",
    ),
    (
        "an empty file",
        lambda d, f: _write(d / "empty.jsonl", ""),
        "already exists and is not a cpersona export, so it was not replaced; choose a new file name",
    ),
    (
        "JSON that is not a header",
        lambda d, f: _write(d / "rec.jsonl", '{"_type": "memory", "content": "x"}\n'),
        "already exists and is not a cpersona export, so it was not replaced; choose a new file name",
    ),
    (
        "a header of another format",
        lambda d, f: _write(d / "other.jsonl", '{"_type": "header", "version": "x/1"}\n'),
        "already exists and is not a cpersona export, so it was not replaced; choose a new file name",
    ),
]


def _symlink(link: Path, target: Path) -> Path:
    link.symlink_to(target)
    return link


def _fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


def _mkdir(path: Path) -> Path:
    path.mkdir()
    return path


@pytest.mark.parametrize("name,make,says", NOT_AN_EXPORT, ids=[case[0] for case in NOT_AN_EXPORT])
def test_export_writes_over_nothing_but_an_export(served, tmp_path: Path, name: str, make, says: str) -> None:
    app, files = served
    place = tmp_path / "targets"
    place.mkdir()
    target = make(place, files)
    before = snapshot(target), sorted(os.listdir(place))
    answer = export_memories(app, agent_id="", output_path=str(target))
    assert answer == {"ok": False, "error": f"output_path refused: {target} {says}"}
    assert (snapshot(target), sorted(os.listdir(place))) == before  # no temp file left either
    if name == "character device":
        assert stat.S_ISCHR(os.lstat(target).st_mode)
    database_is_whole(app, files["database"])


def test_an_existing_export_is_replaced(served, tmp_path: Path) -> None:  # spec EX-5
    app, _ = served
    old = _export_file(tmp_path / "previous.jsonl")
    answer = export_memories(app, agent_id="alice", output_path=str(old))
    assert answer["ok"] is True and answer["memories"] == 1
    header = json.loads(old.read_text().splitlines()[0])
    assert header["agent_id"] == "alice" and header["memory_count"] == 1
    assert stat.S_IMODE(os.stat(old).st_mode) == 0o600


def test_a_new_file_in_new_directories_is_written(served, tmp_path: Path) -> None:  # spec EX-3, EX-5
    app, _ = served
    target = tmp_path / "new" / "deeper" / "dump.jsonl"
    assert export_memories(app, agent_id="", output_path=str(target))["path"] == str(target)
    assert stat.S_IMODE(os.stat(tmp_path / "new").st_mode) == 0o700
    assert target.read_text().count("\n") == 2


# --- the destination is checked again right before the rename --------------------------


def test_a_file_that_appears_during_the_export_is_not_replaced(served, tmp_path: Path) -> None:
    from cpersona.services.portability.paths import write_atomically

    app, _ = served
    target = tmp_path / "late.jsonl"
    with pytest.raises(ToolFailure, match="already exists and is not a cpersona export"):
        with write_atomically(app, target) as out:
            out.write(EXPORT_LINE)
            target.write_text("written by someone else meanwhile\n")
    assert target.read_text() == "written by someone else meanwhile\n"
    assert sorted(os.listdir(tmp_path)) == ["etc", "late.jsonl", "mem"]  # the temp file is gone


def test_a_parent_swapped_for_a_symlink_cannot_redirect_the_write(served, tmp_path: Path) -> None:
    # The write stays in the directory that was checked, whatever its path points to by the rename.
    from cpersona.services.portability.paths import write_atomically

    app, files = served
    checked = tmp_path / "out"
    checked.mkdir()
    target = checked / files["database"].name  # the database's own name, in another directory
    with write_atomically(app, target) as out:
        out.write(EXPORT_LINE)
        checked.rename(tmp_path / "moved")
        checked.symlink_to(files["database"].parent)
    assert (tmp_path / "moved" / files["database"].name).read_text() == EXPORT_LINE
    database_is_whole(app, files["database"])


# --- import never reads them ------------------------------------------------------------


def run_bounded(call: Callable[[], dict[str, Any]], timeout: float = 30) -> dict[str, Any]:
    """The answer of ``call``, which must come (a FIFO or /dev/zero would hold it forever)."""
    box: list[dict[str, Any]] = []
    worker = threading.Thread(target=lambda: box.append(call()), daemon=True)
    worker.start()
    worker.join(timeout)
    assert box, f"no answer within {timeout} s"
    return box[0]


@pytest.mark.parametrize("kind", [k for k in PROTECTED if k != "journal"])
def test_import_never_reads_a_server_file(served, kind: str) -> None:
    app, files = served
    target = files[kind]
    answer = run_bounded(lambda: import_memories(app, input_path=str(target)))
    assert answer == {
        "ok": False,
        "error": f"input_path refused: {target} is {_what(kind)}, not an export; import reads only export files",
    }
    database_is_whole(app, files["database"])


@pytest.mark.parametrize("make", ["fifo", "dev-zero", "directory", "symlink to a FIFO"])
def test_import_refuses_what_would_hang_or_never_end(served, tmp_path: Path, make: str) -> None:  # spec IM-1
    app, _ = served
    target = {
        "fifo": lambda: _fifo(tmp_path / "pipe"),
        "dev-zero": lambda: Path("/dev/zero"),
        "directory": lambda: _mkdir(tmp_path / "adir"),
        "symlink to a FIFO": lambda: _symlink(tmp_path / "l.jsonl", _fifo(tmp_path / "p2")),
    }[make]()
    answer = run_bounded(lambda: import_memories(app, input_path=str(target)))
    assert answer == {"ok": False, "error": f"input_path is not a regular file: {target}"}


def test_a_fifo_swapped_in_after_vetting_does_not_hang_the_reader(tmp_path: Path) -> None:
    # The reader judges what it actually opened, without blocking on it (IM-1 checked once more).
    from cpersona.services.portability import jsonl

    pipe = _fifo(tmp_path / "swapped.jsonl")

    def read() -> dict[str, Any]:
        try:
            list(jsonl.read_lines(pipe, 1000))
        except ToolFailure as refused:
            return refused.as_response()
        return {"ok": True}

    try:
        assert run_bounded(read, timeout=10) == {"ok": False, "error": f"input_path is not a regular file: {pipe}"}
    finally:
        with suppress(OSError):  # a reader stuck in open() (the old code) is let go
            os.close(os.open(pipe, os.O_WRONLY | os.O_NONBLOCK))


def test_import_of_a_hard_link_of_the_database_is_refused(served, tmp_path: Path) -> None:
    app, files = served
    alias = tmp_path / "dump.jsonl"
    os.link(files["database"], alias)
    assert import_memories(app, input_path=str(alias))["error"] == (
        f"input_path refused: {alias} is the memory database, not an export; import reads only export files"
    )


# --- confined for remote callers --------------------------------------------------------


def test_remote_callers_are_confined_to_the_exports_directory(served, tmp_path: Path) -> None:
    app, files = served
    remote = App(db=app.db, settings=app.settings, remote_callers=True)
    root = files["database"].parent / "exports"
    written = export_memories(remote, agent_id="", output_path="dump.jsonl")  # relative: inside the root
    assert written["ok"] is True and written["path"] == str(root / "dump.jsonl")
    assert stat.S_IMODE(os.stat(root).st_mode) == 0o700
    (root / "escape").symlink_to(tmp_path)
    for bad in (str(tmp_path / "x.jsonl"), "../x.jsonl", "escape/x.jsonl", str(files["database"]), "/dev/null"):
        answer = export_memories(remote, agent_id="", output_path=bad)
        assert answer["ok"] is False and answer["error"].startswith(
            f"output_path rejected (path traversal or outside export dir): {bad} — over streamable HTTP"
        ), bad
        assert import_memories(remote, input_path=bad)["error"].startswith("input_path rejected"), bad
    assert not (tmp_path / "x.jsonl").exists()
    assert import_memories(remote, input_path="dump.jsonl", dry_run=True)["ok"] is True
    # CPERSONA_EXPORT_DIR, when set, is the root instead (spec EX-2)
    chosen = tmp_path / "chosen"
    chosen.mkdir()
    configured = App(db=app.db, settings=make_app(app.db, EXPORT_DIR=str(chosen)).settings, remote_callers=True)
    assert export_memories(configured, agent_id="", output_path=str(chosen / "a.jsonl"))["ok"] is True
    assert export_memories(configured, agent_id="", output_path=str(root / "b.jsonl"))["ok"] is False


@pytest.mark.anyio
async def test_http_export_and_import_stay_in_the_exports_directory(tmp_path: Path) -> None:
    server = HttpServer(tmp_path, CPERSONA_AUTH_TOKEN="tok")
    try:
        stored = await mcp_call(server.url, "tok", "store", {"agent_id": "a", "content": "over http"})
        assert stored["ok"] is True
        root = tmp_path / "exports"
        written = await mcp_call(server.url, "tok", "export_memories", {"agent_id": "", "output_path": "d.jsonl"})
        assert written["ok"] is True and written["path"] == str(root / "d.jsonl") and (root / "d.jsonl").is_file()
        (root / "out").symlink_to(tmp_path)
        for bad in (str(tmp_path / "x.jsonl"), str(server.db_path), "../http.db", "out/x.jsonl"):
            refused = await mcp_call(server.url, "tok", "export_memories", {"agent_id": "", "output_path": bad})
            assert refused["ok"] is False and refused["error"].startswith(
                f"output_path rejected (path traversal or outside export dir): {bad}"
            ), bad
            imported = await mcp_call(server.url, "tok", "import_memories", {"input_path": bad})
            assert imported["ok"] is False and imported["error"].startswith("input_path rejected"), bad
        assert not (tmp_path / "x.jsonl").exists()
        again = await mcp_call(server.url, "tok", "import_memories", {"input_path": "d.jsonl"})
        assert again["ok"] is True and again["skipped_memories"] == 1
    finally:
        server.stop()
    check = sqlite3.connect(server.db_path)
    assert check.execute("SELECT content FROM memories").fetchall() == [("over http",)]
    check.close()


@pytest.mark.anyio
async def test_stdio_keeps_any_path_minus_the_refusals(tmp_path: Path) -> None:  # spec EX-3
    from mcp import Client, StdioServerParameters
    from mcp.client.stdio import stdio_client

    db_path = tmp_path / "data" / "stdio.db"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CPERSONA_", "EMBEDDING_"))}
    env.update({"CPERSONA_DB_PATH": str(db_path), "CPERSONA_UPDATE_CHECK": "false"})
    params = StdioServerParameters(command=sys.executable, args=["-m", "cpersona"], env=env)
    anywhere = tmp_path / "somewhere" / "else.jsonl"
    async with Client(stdio_client(params)) as client:
        await client.call_tool("store", {"agent_id": "a", "content": "over stdio"})
        written = await client.call_tool("export_memories", {"agent_id": "", "output_path": str(anywhere)})
        onto_db = await client.call_tool("export_memories", {"agent_id": "", "output_path": str(db_path)})
    assert written.structured_content["ok"] is True and anywhere.is_file()
    assert onto_db.structured_content["error"].startswith(f"output_path refused: {db_path} is the memory database")
    check = sqlite3.connect(db_path)
    assert check.execute("SELECT content FROM memories").fetchall() == [("over stdio",)]
    check.close()


# --- the same refusals in the CLI -------------------------------------------------------


def test_cli_export_and_backup_refuse_in_one_line(served, tmp_path: Path) -> None:
    app, files = served
    acl = str(files["ACL file"])
    extra = {"CPERSONA_ACL_FILE": acl, "CPERSONA_OPERATING_CONTEXT_PATH": str(files["operating-context file"])}
    document = _write(tmp_path / "notes.txt", "mine\n")
    dangling = _symlink(tmp_path / "dangling.db", tmp_path / "nowhere.db")
    # A CLI process closing the database may checkpoint the WAL away: the database is judged by its rows.
    side_files = [name for name in files if name not in ("database", "wal", "shm")]
    before = {name: snapshot(files[name]) for name in side_files}
    cases = [
        ("export", str(files["database"]), "is the memory database"),
        ("export", str(document), "is not a cpersona export"),
        ("export", acl, "is the ACL file"),
        ("backup", str(files["journal"]), "is the database's rollback journal"),
        ("backup", str(files["operating-context file"]), "is the operating-context file"),
        ("backup", str(dangling), "already exists (a symbolic link)"),
    ]
    for command, target, says in cases:
        done = cli(files["database"], command, target, **extra)
        assert done.returncode == 1, (command, target, done.stderr)
        assert done.stderr.count("\n") == 1 and says in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert {name: snapshot(files[name]) for name in side_files} == before
    assert document.read_text() == "mine\n" and not (tmp_path / "nowhere.db").exists()
    database_is_whole(app, files["database"])
