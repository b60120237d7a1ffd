"""Shared fixtures: a real SQLite file (WAL) migrated to head, and an App on it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from cpersona.config import load_settings
from cpersona.services.app import App
from cpersona.storage.engine import Database, open_sqlite
from cpersona.storage.migrate import upgrade
from embed_server import embed_server  # noqa: F401  (a real local embedding server, as a fixture)

LEGACY_DIR = Path(__file__).resolve().parents[2] / "shared" / "data" / "legacy"


def legacy_fixture(name: str, tmp_path: Path) -> Path:
    """Copy a legacy CPersona database into tmp_path (never open the originals)."""
    src = LEGACY_DIR / name
    if not src.exists():
        pytest.skip(f"legacy fixture {src} not available")
    dst = tmp_path / name
    shutil.copyfile(src, dst)
    return dst


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "mem" / "cpersona.db"


@pytest.fixture
def db(db_path: Path) -> Database:
    database = open_sqlite(db_path)
    upgrade(database)
    yield database
    database.close()


def make_app(db: Database, **env: str) -> App:
    environ = {"CPERSONA_DB_PATH": str(db.path)}
    environ.update({k if k.startswith("CPERSONA_") else f"CPERSONA_{k.upper()}": v for k, v in env.items()})
    return App(db=db, settings=load_settings(environ))


@pytest.fixture
def app(db: Database) -> App:
    return make_app(db)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
