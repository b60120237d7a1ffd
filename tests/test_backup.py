"""`cpersona backup`: a whole, self-contained copy even while another writer is busy."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

from conftest import make_app
from test_admin_cli import cli

from cpersona.services.records.memories import store
from cpersona.storage.backup import BackupError, backup_to


def test_backup_while_a_writer_runs_is_consistent(db, tmp_path: Path):
    app = make_app(db)
    for i in range(200):
        store(app, content=f"fact number {i}", agent_id="a")
    stop = threading.Event()

    def keep_writing() -> None:
        i = 0
        while not stop.is_set():
            store(app, content=f"late fact {i}", agent_id="a")
            i += 1

    writer = threading.Thread(target=keep_writing)
    writer.start()
    try:
        copy = backup_to(db, tmp_path / "copy.db")
    finally:
        stop.set()
        writer.join()
    con = sqlite3.connect(copy)
    assert con.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    count = con.execute("SELECT count(*) FROM memories").fetchone()[0]
    assert count >= 200
    # the FTS index travelled with the rows: every copied row is findable
    assert con.execute("SELECT count(*) FROM memories_fts WHERE memories_fts MATCH '\"fact\"'").fetchone()[0] == count
    assert not Path(str(copy) + "-wal").exists()
    assert oct(copy.stat().st_mode & 0o777) == "0o600"


def test_backup_refuses_to_overwrite(db, tmp_path: Path):
    target = tmp_path / "exists.db"
    target.write_bytes(b"keep me")
    try:
        backup_to(db, target)
    except BackupError as exc:
        assert "already exists" in str(exc)
    else:
        raise AssertionError("an existing file was overwritten")
    assert target.read_bytes() == b"keep me"


def test_backup_command(db, tmp_path: Path):
    store(make_app(db), content="remember the backup drill", agent_id="ops")
    ok = cli(db.path, "backup", str(tmp_path / "b.db"))
    assert ok.returncode == 0, ok.stderr
    assert sqlite3.connect(tmp_path / "b.db").execute("SELECT content FROM memories").fetchall() == [
        ("remember the backup drill",)
    ]
    again = cli(db.path, "backup", str(tmp_path / "b.db"))
    assert again.returncode != 0 and "already exists" in again.stderr
