"""The engine on PostgreSQL: backend choice, and writers that cannot lose updates
across processes (spec PG-4: writes are serialised, reads see committed data)."""

from __future__ import annotations

import threading
import time

import pytest
from sqlalchemy import text

from cpersona.config import load_settings
from cpersona.storage.engine import open_database, open_postgres
from pg_support import fresh_pg_url


@pytest.fixture
def pg_url():
    with fresh_pg_url() as url:
        yield url


def test_database_url_selects_postgres_and_its_absence_sqlite(tmp_path, pg_url):
    pg = open_database(load_settings({"CPERSONA_DATABASE_URL": pg_url}))
    lite = open_database(load_settings({"CPERSONA_DB_PATH": str(tmp_path / "m.db")}))
    try:
        assert pg.dialect == "postgresql" and not pg.is_sqlite and pg.path is None
        assert "@" in pg.label and pg.label.startswith("postgresql+psycopg://")
        assert lite.is_sqlite and lite.path == (tmp_path / "m.db").resolve()
    finally:
        pg.close()
        lite.close()


def test_a_non_postgres_url_is_refused():
    with pytest.raises(ValueError, match="postgresql"):
        open_postgres("mysql://x@127.0.0.1/db")


def test_concurrent_read_modify_write_from_two_databases_loses_nothing(pg_url):
    # spec PG-4: two Database objects stand for two server processes (separate
    # pools, separate in-process locks); only the cluster-wide writer lock
    # serialises them. Each increments a counter by read-then-write.
    first, second = open_postgres(pg_url), open_postgres(pg_url)
    with first.write_connection() as conn:
        conn.exec_driver_sql("CREATE TABLE counter (n INTEGER NOT NULL)")
        conn.exec_driver_sql("INSERT INTO counter VALUES (0)")
    rounds = 40

    def bump(db):
        for _ in range(rounds):
            with db.write() as session:
                n = session.execute(text("SELECT n FROM counter")).scalar_one()
                session.execute(text("UPDATE counter SET n = :n"), {"n": n + 1})

    threads = [threading.Thread(target=bump, args=(d,)) for d in (first, second, first, second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    with first.read() as session:
        assert session.execute(text("SELECT n FROM counter")).scalar_one() == 4 * rounds
    first.close()
    second.close()


def test_a_read_session_sees_one_snapshot(pg_url):
    db = open_postgres(pg_url)
    with db.write_connection() as conn:
        conn.exec_driver_sql("CREATE TABLE t (v INTEGER)")
        conn.exec_driver_sql("INSERT INTO t VALUES (1)")
    with db.read() as session:
        assert session.execute(text("SELECT count(*) FROM t")).scalar_one() == 1
        with db.write_connection() as conn:
            conn.exec_driver_sql("INSERT INTO t VALUES (2)")
        # REPEATABLE READ: the same answer inside the read session, as in a WAL read.
        assert session.execute(text("SELECT count(*) FROM t")).scalar_one() == 1
    with db.read() as session:
        assert session.execute(text("SELECT count(*) FROM t")).scalar_one() == 2
    db.close()


def test_a_writer_waits_for_the_cluster_lock_then_answers_busy(pg_url):
    # Issue 13 item 3 on PostgreSQL: the advisory lock waits lock_wait_seconds
    # (lock_timeout), then the same DatabaseBusy sentence as on SQLite.
    from cpersona.storage.engine import PG_WRITER_LOCK_KEY, DatabaseBusy

    holder, waiter = open_postgres(pg_url), open_postgres(pg_url)
    waiter.lock_wait_seconds = 1
    try:
        with holder.write_connection() as held:
            held.exec_driver_sql("CREATE TABLE t (n INTEGER)")
            with pytest.raises(
                DatabaseBusy,
                match="the database is busy: another writer has held the database "
                "for more than 1 s; nothing was written",
            ):
                with waiter.write() as session:
                    session.execute(text("INSERT INTO t VALUES (1)"))
        with waiter.write() as session:  # the lock freed: the same writer now writes
            session.execute(text("INSERT INTO t VALUES (2)"))
            # lock_timeout was only for the wait: later statements keep the server's default.
            assert session.execute(text("SHOW lock_timeout")).scalar_one() == "0"
        with waiter.read() as session:
            assert session.execute(text("SELECT n FROM t")).scalars().all() == [2]
            assert (
                session.execute(
                    text(
                        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' "
                        f"AND objid = {PG_WRITER_LOCK_KEY & 0xFFFFFFFF}"
                    )
                ).scalar_one()
                == 0
            )
    finally:
        holder.close()
        waiter.close()


def test_write_batches_release_the_cluster_lock_between_batches(pg_url):
    # A bulk write on PostgreSQL commits in batches too: another Database (another
    # process) that starts waiting after the first batch writes before the last one.
    first, second = open_postgres(pg_url), open_postgres(pg_url)
    with first.write_connection() as conn:
        conn.exec_driver_sql("CREATE TABLE log (id SERIAL PRIMARY KEY, who TEXT NOT NULL)")
    first_batch = threading.Event()

    def other_writer():
        first_batch.wait(60)
        with second.write() as session:
            session.execute(text("INSERT INTO log (who) VALUES ('other')"))

    other = threading.Thread(target=other_writer)
    other.start()
    try:
        with first.write_batches(rows=10) as batches:
            batches.after_commit = first_batch.set
            for _ in range(60):
                batches.connection.exec_driver_sql("INSERT INTO log (who) VALUES ('bulk')")
                batches.tick()
                if first_batch.is_set():
                    time.sleep(0.01)  # the other writer is queued on the lock by now
        other.join(60)
        with first.read() as session:
            order = session.execute(text("SELECT who FROM log ORDER BY id")).scalars().all()
        assert order.count("bulk") == 60 and order.count("other") == 1
        assert 10 <= order.index("other") < 60  # between batches, not after the whole run
    finally:
        first.close()
        second.close()
