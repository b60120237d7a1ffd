"""Storage failures as one sentence a person can act on.

A failed statement reaches callers as SQLAlchemy's text: the driver's reason,
the SQL statement, the bound parameters (which are the caller's stored text)
and a documentation link. None of that belongs in an answer or in the log a
user reads. This module is the one place that turns such a failure into a
sentence ("the database is read-only: …", "the disk is full: nothing was
written", "the database is busy: … retry"); the tool call path, the CLI and the
services that report a rolled-back import or merge all ask here.

Classification uses the driver's own codes (SQLite's primary result code,
PostgreSQL's SQLSTATE), so it does not depend on the wording of a message.
"""

from __future__ import annotations

import errno
import logging
from typing import Any

from sqlalchemy.exc import SQLAlchemyError

# SQLite primary result codes (https://sqlite.org/rescode.html).
_SQLITE_PERM, _SQLITE_BUSY, _SQLITE_LOCKED, _SQLITE_READONLY = 3, 5, 6, 8
_SQLITE_IOERR, _SQLITE_CORRUPT, _SQLITE_FULL, _SQLITE_CANTOPEN, _SQLITE_NOTADB = 10, 11, 13, 14, 26

BUSY = "busy"
READ_ONLY = "read-only"
FULL = "full"
IO = "io"
DAMAGED = "damaged"
CANNOT_OPEN = "cannot-open"
NOT_A_DATABASE = "not-a-database"
UNREACHABLE = "unreachable"


class ReadOnlyDatabase(Exception):
    """A write was asked of a database this process can only read (found at start-up)."""

    def __init__(self, label: str, why: str) -> None:
        self.label = label
        self.why = why
        super().__init__(read_only_sentence(label, why))


class DatabaseBusy(Exception):
    """Another writer held the write lock for longer than this writer may wait.

    Its text is the sentence a client sees: nothing of this write was done.
    """

    def __init__(self, waited: float) -> None:
        self.reason = f"another writer has held the database for more than {waited:g} s"
        super().__init__(f"the database is busy: {self.reason}; nothing was written, retry in a moment")
        self.waited = waited


def read_only_sentence(label: str | None, why: str | None = None) -> str:
    where = f" {label}" if label else ""
    because = why or "this process may not write the file or its folder"
    return f"the database is read-only:{where} cannot be written ({because}); nothing was written"


def _sqlite_code(orig: Any) -> int | None:
    code = getattr(orig, "sqlite_errorcode", None)
    return code & 0xFF if isinstance(code, int) else None


def _sqlstate(orig: Any) -> str | None:
    state = getattr(orig, "sqlstate", None) or getattr(orig, "pgcode", None)
    return state if isinstance(state, str) else None


def kind(exc: BaseException) -> str | None:
    """Which storage condition ``exc`` is (one of the constants above), or None."""
    if isinstance(exc, ReadOnlyDatabase):
        return READ_ONLY
    if isinstance(exc, DatabaseBusy):
        return BUSY
    orig = getattr(exc, "orig", None) or exc
    code = _sqlite_code(orig)
    if code is not None:
        return {
            _SQLITE_BUSY: BUSY,
            _SQLITE_LOCKED: BUSY,
            _SQLITE_READONLY: READ_ONLY,
            _SQLITE_PERM: READ_ONLY,
            _SQLITE_FULL: FULL,
            _SQLITE_IOERR: IO,
            _SQLITE_CORRUPT: DAMAGED,
            _SQLITE_CANTOPEN: CANNOT_OPEN,
            _SQLITE_NOTADB: NOT_A_DATABASE,
        }.get(code)
    state = _sqlstate(orig)
    if state is not None:
        if state == "25006":
            return READ_ONLY
        if state in ("53100", "53000"):
            return FULL
        if state in ("55P03", "40P01", "40001"):
            return BUSY
        if state.startswith("08") or state in ("57P01", "57P02", "57P03"):
            return UNREACHABLE
        if state.startswith("XX"):
            return DAMAGED
        return None
    if isinstance(orig, OSError):
        return {errno.ENOSPC: FULL, errno.EDQUOT: FULL, errno.EROFS: READ_ONLY}.get(orig.errno)
    return None


def sentence(exc: BaseException, label: str | None = None) -> str | None:
    """The sentence for a storage failure we can name, or None for anything else.

    ``label`` names the database (its file or its URL without password).
    """
    found = kind(exc)
    if found is None:
        return None
    if isinstance(exc, (ReadOnlyDatabase, DatabaseBusy)):
        return str(exc)
    where = f" {label}" if label else ""
    return {
        BUSY: "the database is busy: another writer held the lock longer than this one waits; "
        "nothing was written, retry in a moment",
        READ_ONLY: read_only_sentence(label),
        FULL: f"the disk is full: nothing was written (database{where})",
        IO: f"the database{where} could not be read or written (disk I/O error); nothing was written",
        DAMAGED: f"the database{where} is damaged; restore it from a backup (see docs/operations.md)",
        CANNOT_OPEN: f"the database{where} cannot be opened (a missing folder, or a file this process may not read)",
        NOT_A_DATABASE: f"{label or 'the file'} is not a SQLite database",
        UNREACHABLE: f"the database server{where} cannot be reached; nothing was written, retry once it is back",
    }[found]


def reason(exc: BaseException, label: str | None = None) -> str:
    """One line for any failed statement: the sentence, else the driver's own reason.

    Never the SQL statement nor its parameters. psycopg appends CONTEXT / HINT
    lines (which function raised, where) that only a log should carry, so only
    its primary message is kept.
    """
    named = sentence(exc, label)
    if named is not None:
        return named
    orig = getattr(exc, "orig", None) or exc
    primary = getattr(getattr(orig, "diag", None), "message_primary", None)
    text = primary if primary else str(orig)
    return text.splitlines()[0] if text else type(orig).__name__


def is_storage_failure(exc: BaseException) -> bool:
    return isinstance(exc, (SQLAlchemyError, ReadOnlyDatabase, DatabaseBusy)) or kind(exc) is not None


def log_details(logger: logging.Logger, what: str, exc: BaseException) -> None:
    """The details of a storage failure, once, at debug level, without the stored content.

    The driver's class, code and reason, and the statement's first line: never
    the bound parameters (they are what was being stored).
    """
    if not logger.isEnabledFor(logging.DEBUG):
        return
    orig = getattr(exc, "orig", None) or exc
    code = getattr(orig, "sqlite_errorname", None) or _sqlstate(orig) or ""
    statement = getattr(exc, "statement", None) or ""
    first = statement.strip().splitlines()[0][:200] if statement.strip() else ""
    logger.debug(
        "%s: %s %s: %s%s",
        what,
        type(orig).__name__,
        code,
        str(orig).splitlines()[0] if str(orig) else "",
        f" [statement: {first}]" if first else "",
    )
