"""A consistent copy of a live SQLite database.

``VACUUM INTO`` reads one snapshot, so the copy is whole even while the server
keeps writing (WAL lets readers and the writer run side by side), and the
result is a single self-contained file with no ``-wal`` beside it. Copying the
``.db`` with ``cp`` while the server runs is not safe: the newest commits may
still sit in ``<db>-wal``.
"""

from __future__ import annotations

import os
from pathlib import Path

from cpersona.storage import errors as storage_errors
from cpersona.storage.engine import Database, sqlite_module


class BackupError(Exception):
    pass


def backup_to(db: Database, destination: Path) -> Path:
    if not db.is_sqlite:
        raise BackupError("backup copies SQLite files; use pg_dump for PostgreSQL")
    destination = Path(destination).expanduser().resolve()
    if destination.exists():
        raise BackupError(f"{destination} already exists; choose a new file name")
    try:
        destination.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as exc:
        raise BackupError(f"cannot create the folder of {destination}: {exc.strerror}") from None
    if not os.access(destination.parent, os.W_OK | os.X_OK):
        raise BackupError(f"cannot write {destination}: its folder is read-only for this user")
    # VACUUM cannot run inside a transaction and SQLAlchemy begins one on first
    # use, so this goes straight to the driver connection (autocommit there).
    raw = db.engine.raw_connection()
    try:
        raw.driver_connection.execute("VACUUM INTO ?", (str(destination),))
    except sqlite_module().Error as exc:
        raise BackupError(f"could not write {destination}: {storage_errors.reason(exc)}") from None
    finally:
        raw.close()
    os.chmod(destination, 0o600)
    return destination
