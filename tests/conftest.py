"""Shared fixtures: a migrated database on each backend, and an App on it.

The ``db`` fixture (and so ``app``) is a real SQLite file in WAL migrated to
head. A test module that holds storage or service behaviour opts into the
second backend with ``pytestmark = pytest.mark.both_backends``: its tests then
run twice, ``[sqlite]`` and ``[postgres]``, the PostgreSQL half on a fresh
database (one per session, emptied before each test) (skipped without CPERSONA_TEST_PG_URL).
A test in such a module that is about SQLite itself (file bytes, WAL, PRAGMAs,
FTS5 or sqlite-vec internals, legacy files) opts out with
``@pytest.mark.sqlite_only``.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from cpersona.config import load_settings
from cpersona.services.app import App
from cpersona.storage.engine import Database, open_postgres, open_sqlite
from cpersona.storage.migrate import upgrade
from embed_server import embed_server  # noqa: F401  (a real local embedding server, as a fixture)
from pg_support import PgSessionDatabase

# Databases and exports written by CPersona itself (provenance: tests/fixtures/README.md).
LEGACY_DIR = Path(__file__).resolve().parent / "fixtures" / "legacy"

BACKENDS = ("sqlite", "postgres")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "both_backends: run the test's db/app fixtures on SQLite and on PostgreSQL")
    config.addinivalue_line(
        "markers", "sqlite_only(reason): about SQLite itself; not run on PostgreSQL in a both_backends module"
    )
    config.addinivalue_line("markers", "postgres: the PostgreSQL half of a both_backends test")
    config.addinivalue_line("markers", "docker: builds and runs the Dockerfile; skipped when no docker daemon answers")
    config.addinivalue_line(
        "markers", "xfail_on_postgres(reason): a known behavioural difference; the PostgreSQL half must fail"
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    kept, dropped = [], []
    for item in items:
        callspec = getattr(item, "callspec", None)
        if callspec is None or callspec.params.get("backend") != "postgres":
            kept.append(item)
            continue
        # A sqlite_only mark on a parameter is only visible here: its PostgreSQL twin never existed.
        if item.get_closest_marker("sqlite_only"):
            dropped.append(item)
            continue
        # strict: the day the difference goes away, the marker has to go too.
        if known := item.get_closest_marker("xfail_on_postgres"):
            item.add_marker(pytest.mark.xfail(reason=known.args[0], strict=True))
        kept.append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    # Only tests that reach the database through the fixtures are doubled.
    if "backend" not in metafunc.fixturenames:
        return
    if metafunc.definition.get_closest_marker("both_backends") is None:
        return
    if metafunc.definition.get_closest_marker("sqlite_only") is not None:
        return
    metafunc.parametrize(
        "backend",
        ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)],
        indirect=True,
    )


def legacy_fixture(name: str, tmp_path: Path) -> Path:
    """Copy a legacy CPersona database into tmp_path (never open the originals)."""
    dst = tmp_path / name
    shutil.copyfile(LEGACY_DIR / name, dst)
    return dst


@pytest.fixture
def backend(request: pytest.FixtureRequest) -> str:
    """Which engine the db fixture opens: "sqlite" unless the test was doubled."""
    return getattr(request, "param", "sqlite")


_PG_SHARED: list[PgSessionDatabase] = []


@pytest.fixture(scope="session")
def pg_session_db() -> PgSessionDatabase:
    """The PostgreSQL database the doubled tests share, emptied before each one."""
    shared = PgSessionDatabase()
    _PG_SHARED.append(shared)
    yield shared
    shared.close()


def pytest_terminal_summary(terminalreporter: Any) -> None:
    # Each rebuild costs seconds: a test that changes the schema should say so in its name.
    rebuilds = sum(shared.rebuilds for shared in _PG_SHARED)
    if rebuilds:
        terminalreporter.write_line(f"PostgreSQL test database rebuilt {rebuilds} time(s): tests changed its schema")


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "mem" / "cpersona.db"


# Where files beside the database go (calibration sidecar, update-check cache)
# when the database itself is not a file: keyed by the Database object.
_SIDE_FILES: dict[int, Path] = {}


@pytest.fixture
def db(backend: str, db_path: Path, request: pytest.FixtureRequest) -> Database:
    if backend == "postgres":
        shared: PgSessionDatabase = request.getfixturevalue("pg_session_db")
        with shared.lease() as url:
            database = open_postgres(url)
            db_path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            _SIDE_FILES[id(database)] = db_path
            try:
                yield database
            finally:
                _SIDE_FILES.pop(id(database), None)
                database.close()
        return
    database = open_sqlite(db_path)
    upgrade(database)
    yield database
    database.close()


def db_settings_env(db: Database) -> dict[str, str]:
    """The CPERSONA_* variables that name ``db`` (for an App or a child process)."""
    if db.is_sqlite:
        return {"CPERSONA_DB_PATH": str(db.path)}
    return {
        "CPERSONA_DB_PATH": str(_SIDE_FILES.get(id(db), Path("data/cpersona.db"))),
        "CPERSONA_DATABASE_URL": db.engine.url.render_as_string(hide_password=False),
    }


def make_app(db: Database, **env: str) -> App:
    environ = db_settings_env(db)
    environ.update({k if k.startswith("CPERSONA_") else f"CPERSONA_{k.upper()}": v for k, v in env.items()})
    return App(db=db, settings=load_settings(environ))


@pytest.fixture
def app(db: Database) -> App:
    return make_app(db)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def refuse_inserts(db: Database, table: str, message: str, *, when: tuple[str, str] | None = None) -> None:
    """Make the database itself refuse INSERTs into ``table`` with ``message`` (a failing disk's stand-in).

    ``when`` = (column, value) limits the refusal to new rows holding that value.
    A trigger on either engine, so a test of rollback runs unchanged on both.
    """
    name = f"refuse_{table}"
    if db.is_sqlite:
        condition = f"WHEN new.{when[0]} = '{when[1]}' " if when else ""
        ddl = [f"CREATE TRIGGER {name} BEFORE INSERT ON {table} {condition}BEGIN SELECT RAISE(ABORT, '{message}'); END"]
    else:
        condition = f"WHEN (NEW.{when[0]} = '{when[1]}') " if when else ""
        ddl = [
            f"CREATE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql AS "
            f"$$ BEGIN RAISE EXCEPTION '{message}'; END $$",
            f"CREATE TRIGGER {name} BEFORE INSERT ON {table} FOR EACH ROW {condition}EXECUTE FUNCTION {name}()",
        ]
    with db.write_connection() as conn:
        for statement in ddl:
            conn.exec_driver_sql(statement)
