"""PostgreSQL for tests: a fresh, empty database per test on the CI cluster.

The cluster comes from tests/pg_cluster.sh (started by .ci/run), named by
CPERSONA_TEST_PG_URL. Without that variable every PostgreSQL test skips with
a reason that says how to run them.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

SKIP_REASON = (
    "CPERSONA_TEST_PG_URL is not set: start a cluster with "
    "`tests/pg_cluster.sh start DIR` and export the URL it prints (.ci/run does this)"
)


def pg_server_url() -> str:
    url = os.environ.get("CPERSONA_TEST_PG_URL", "").strip()
    if not url:
        pytest.skip(SKIP_REASON)
    return url


def skip_without_pgvector() -> None:
    """Skip a test that needs pgvector; fail instead where CI promised a cluster with it.

    .ci/run sets CPERSONA_TEST_PG_REQUIRE_PGVECTOR=1 after starting a cluster
    that has pgvector, so losing the extension there is a red run, not a quiet skip.
    """
    reason = "the PostgreSQL cluster has no pgvector extension (`tests/pg_cluster.sh pgvector-bin DIR` gives one)"
    if os.environ.get("CPERSONA_TEST_PG_REQUIRE_PGVECTOR", "").strip() == "1":
        pytest.fail(reason + ", and CPERSONA_TEST_PG_REQUIRE_PGVECTOR=1 says it must have it")
    pytest.skip(reason)


def _admin_engine(server_url: str):
    from sqlalchemy import create_engine

    return create_engine(server_url, isolation_level="AUTOCOMMIT", poolclass=None)


@contextmanager
def fresh_pg_url() -> Iterator[str]:
    """The URL of a new empty database, dropped (with its connections) afterwards."""
    from sqlalchemy.engine import make_url

    server = pg_server_url()
    name = "cp_" + uuid.uuid4().hex[:16]
    admin = _admin_engine(server)
    try:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
        yield make_url(server).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()


# Catalogue objects of the current schema (tables with their column counts,
# indexes, sequences, triggers, functions): if a test changed any of them,
# the shared database is rebuilt rather than emptied.
_SCHEMA_FINGERPRINT = """
SELECT md5(string_agg(x, ',' ORDER BY x)) FROM (
  SELECT c.relname::text || ':' || c.relkind::text || ':' || count(a.attnum)::text AS x
    FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
    LEFT JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
   WHERE n.nspname = current_schema() GROUP BY c.relname, c.relkind
  UNION ALL SELECT 'trigger:' || tgname::text FROM pg_trigger WHERE NOT tgisinternal
  UNION ALL SELECT 'function:' || proname::text FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
   WHERE n.nspname = current_schema()
) s
"""

# Rows the migrations themselves write; everything else is test data.
_KEPT_TABLES = ("alembic_version", "schema_version")
_CHANGE_LOG_TABLES = ("vector_changes", "vector_change_state")


class PgSessionDatabase:
    """One PostgreSQL database at head per test session, emptied before each test.

    Creating a database (even from a template) costs about a second on the CI
    machine and running the Alembic history about three, where deleting the
    rows and restarting the id sequences costs a few tens of milliseconds: that
    is what keeps the PostgreSQL half of the suite affordable. Each lease
    starts from the state a fresh migrated database has — no rows, ids from 1,
    the migrations' own bookkeeping rows — and a test that changed the schema
    gets the database rebuilt for the next one.
    """

    def __init__(self) -> None:
        self._server: str | None = None
        self._name: str | None = None
        self._fingerprint: str | None = None
        self._kept_rows: dict[str, list[tuple]] = {}
        self._reset_sql = ""
        self._admin = None
        self.rebuilds = 0  # leases that found the schema changed by the test before
        self._baseline_triggers: set[str] = set()
        self._baseline_functions: set[str] = set()

    def _url(self) -> str:
        from sqlalchemy.engine import make_url

        return make_url(self._server).set(database=self._name).render_as_string(hide_password=False)

    def _build(self) -> None:
        from cpersona.storage.engine import open_postgres
        from cpersona.storage.migrate import upgrade

        if self._server is None:
            self._server = pg_server_url()
            self._admin = _admin_engine(self._server)
        self._drop()
        self._name = "cp_session_" + uuid.uuid4().hex[:12]
        with self._admin.connect() as conn:
            conn.exec_driver_sql(f'CREATE DATABASE "{self._name}"')
        db = open_postgres(self._url())
        try:
            upgrade(db)
        finally:
            db.close()
        from sqlalchemy import create_engine

        engine = create_engine(self._url(), isolation_level="AUTOCOMMIT")
        try:
            with engine.connect() as conn:
                self._fingerprint = conn.exec_driver_sql(_SCHEMA_FINGERPRINT).scalar()
                self._baseline_triggers = {
                    r[0] for r in conn.exec_driver_sql("SELECT tgname FROM pg_trigger WHERE NOT tgisinternal")
                }
                self._baseline_functions = {
                    r[0]
                    for r in conn.exec_driver_sql(
                        "SELECT p.proname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
                        "WHERE n.nspname = current_schema()"
                    )
                }
                tables = [
                    r[0]
                    for r in conn.exec_driver_sql("SELECT tablename FROM pg_tables WHERE schemaname = current_schema()")
                ]
                sequences = [
                    r[0]
                    for r in conn.exec_driver_sql(
                        "SELECT sequencename FROM pg_sequences WHERE schemaname = current_schema()"
                    )
                ]
                self._kept_rows = {
                    t: [tuple(r) for r in conn.exec_driver_sql(f'SELECT * FROM "{t}"')]
                    for t in _KEPT_TABLES
                    if t in tables
                }
        finally:
            engine.dispose()
        # Revision 0009's change log last: emptying memories / episodes writes to it, and a
        # sequence restarted under rows left there would collide with the next entry.
        # Its state row stays, reset, as the revision left it.
        logs = [t for t in tables if t in _CHANGE_LOG_TABLES]
        self._reset_sql = "; ".join(
            [f'DELETE FROM "{t}"' for t in tables if t != "alembic_version" and t not in logs]
            + [f'DELETE FROM "{t}"' for t in logs if t == "vector_changes"]
            + [f"UPDATE \"{t}\" SET pruned = '0'" for t in logs if t == "vector_change_state"]
            + [f'ALTER SEQUENCE "{s}" RESTART' for s in sequences]
        )

    def _reset(self) -> None:
        """Empty the database for the next test, or rebuild it if its schema moved."""
        from sqlalchemy import create_engine, text

        with self._admin.connect() as conn:
            # A test may have left an engine open; its sessions would hold locks.
            conn.execute(
                text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = :d AND pid <> pg_backend_pid()"
                ),
                {"d": self._name},
            )
        engine = create_engine(self._url(), isolation_level="AUTOCOMMIT")
        try:
            with engine.connect() as conn:
                rebuild = conn.exec_driver_sql(_SCHEMA_FINGERPRINT).scalar() != self._fingerprint
                if rebuild:
                    self._drop_added_triggers(conn)  # the common change: a fault-injection trigger
                    rebuild = conn.exec_driver_sql(_SCHEMA_FINGERPRINT).scalar() != self._fingerprint
                if not rebuild:
                    conn.exec_driver_sql(self._reset_sql)
                    for row in self._kept_rows.get("schema_version", []):
                        conn.execute(text("INSERT INTO schema_version VALUES (:v, :a)"), {"v": row[0], "a": row[1]})
        finally:
            engine.dispose()
        if rebuild:
            self.rebuilds += 1
            self._build()

    def _drop_added_triggers(self, conn) -> None:
        """Drop triggers and functions a test added (tests/conftest.py refuse_inserts), keeping the migrations'."""
        for table, trigger in conn.exec_driver_sql(
            "SELECT c.relname, t.tgname FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid "
            "JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE NOT t.tgisinternal AND n.nspname = current_schema()"
        ).all():
            if trigger not in self._baseline_triggers:
                conn.exec_driver_sql(f'DROP TRIGGER "{trigger}" ON "{table}"')
        for (function,) in conn.exec_driver_sql(
            "SELECT p.proname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
            "WHERE n.nspname = current_schema()"
        ).all():
            if function not in self._baseline_functions:
                conn.exec_driver_sql(f'DROP FUNCTION IF EXISTS "{function}" CASCADE')

    @contextmanager
    def lease(self) -> Iterator[str]:
        """The URL of the session's database, empty and at head, for one test."""
        if self._name is None:
            self._build()
        else:
            self._reset()
        yield self._url()

    def _drop(self) -> None:
        if self._name is None:
            return
        with self._admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{self._name}" WITH (FORCE)')
        self._name = None

    def close(self) -> None:
        if self._admin is not None:
            self._drop()
            self._admin.dispose()
