"""Database.snapshot(): the reads of one pipeline share one session and one snapshot.

Recall wraps its pipeline in it (one session instead of five or six). These
tests pin what that may and may not change: reads inside see one consistent
state (spec PG-4 read snapshots), writes still commit on their own connection,
nothing leaks to other threads or outlives the block, and a failed statement
does not poison the reads after it.
"""

from __future__ import annotations

import threading

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from cpersona.storage.engine import Database

pytestmark = pytest.mark.both_backends


def _count(db: Database) -> int:
    with db.read() as session:
        return int(session.execute(text("SELECT count(*) FROM profiles")).scalar_one())


def _add_profile(db: Database, agent: str) -> None:
    with db.write() as session:
        session.execute(text("INSERT INTO profiles (agent_id, user_id, content) VALUES (:a, '', 'p')"), {"a": agent})


def test_reads_inside_share_one_session(db: Database) -> None:
    with db.snapshot():
        with db.read() as first, db.read() as second:
            shared = first is second
    assert shared
    with db.read() as first:
        with db.read() as second:
            assert first is not second  # outside a snapshot nothing is shared


def test_one_snapshot_for_the_whole_block(db: Database) -> None:
    _add_profile(db, "a")
    with db.snapshot():
        before = _count(db)
        _add_profile(db, "b")  # committed on the writer's own connection
        during = _count(db)
    after = _count(db)
    assert (before, during, after) == (1, 1, 2)


def test_not_shared_with_other_threads(db: Database) -> None:
    seen: list[object] = []

    def other() -> None:
        with db.read() as session:
            seen.append(session)

    with db.snapshot():
        with db.read() as mine:
            worker = threading.Thread(target=other)
            worker.start()
            worker.join()
    assert seen and seen[0] is not mine


def test_nested_snapshot_is_the_outer_one_and_the_block_ends_cleanly(db: Database) -> None:
    with db.snapshot():
        with db.read() as outer:
            with db.snapshot():
                with db.read() as inner:
                    assert inner is outer
    with db.read() as later:
        assert later is not outer


def test_a_failed_statement_leaves_later_reads_working(db: Database) -> None:
    _add_profile(db, "a")
    with db.snapshot():
        with pytest.raises(DBAPIError):
            with db.read() as session:
                session.execute(text("SELECT no_such_column FROM profiles"))
        assert _count(db) == 1
        assert _count(db) == 1  # and the one after it (PostgreSQL: a new transaction, not an aborted one)


def test_the_statement_deadline_holds_for_every_read_of_a_shared_transaction(db: Database) -> None:
    """PostgreSQL: set once per transaction, and again after a failure ended one."""
    if db.is_sqlite:
        pytest.skip("SQLite's deadline is a progress handler, not a transaction setting")
    from cpersona.storage.search_postgres import SEQSCAN_BACK, with_deadline

    def setting(session, name: str) -> str:
        return session.execute(text(f"SELECT current_setting('{name}')")).scalar_one()

    with db.snapshot():
        with db.read() as session:
            with_deadline(session)
            assert setting(session, "statement_timeout") == "2s"
        with db.read() as session:
            with_deadline(session, indexed=True)
            assert setting(session, "enable_seqscan") == "off"
            session.execute(SEQSCAN_BACK)
        with pytest.raises(DBAPIError):
            with db.read() as session:
                session.execute(text("SELECT no_such_column FROM profiles"))
        with db.read() as session:
            assert setting(session, "statement_timeout") == "0"  # a new transaction: nothing carried over
            with_deadline(session)
            assert (setting(session, "statement_timeout"), setting(session, "enable_seqscan")) == ("2s", "on")


def test_an_error_in_the_block_propagates_and_releases_the_session(db: Database) -> None:
    with pytest.raises(RuntimeError):
        with db.snapshot():
            _count(db)
            raise RuntimeError("boom")
    _add_profile(db, "a")
    assert _count(db) == 1
