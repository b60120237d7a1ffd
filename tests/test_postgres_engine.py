"""The engine on PostgreSQL: backend choice, and writers that cannot lose updates
across processes (spec PG-4: writes are serialised, reads see committed data)."""

from __future__ import annotations

import threading

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
