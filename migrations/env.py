"""Alembic environment for cpersona.

Two ways in:
- the server (cpersona.storage.migrate) passes the open, transaction-holding
  Connection in ``config.attributes["connection"]``; that connection has
  sqlite-vec loaded and the writer lock held, and the caller commits it;
- tooling (the alembic CLI, pytest helpers) passes an Engine there, or nothing,
  in which case an engine is built on the database named by ``-x db=PATH`` or
  CPERSONA_DB_PATH with the project's own driver wiring.
"""

from __future__ import annotations

import os
from logging.config import fileConfig

from alembic import context
from sqlalchemy import Connection, Engine, text

from cpersona.storage.models import Base

config = context.config
if config.config_file_name is not None and config.attributes.get("connection") is None:
    fileConfig(config.config_file_name, disable_existing_loggers=False)
target_metadata = Base.metadata


def _virtual_tables(connection: Connection) -> set[str]:
    if connection.dialect.name != "sqlite":
        return set()
    rows = connection.execute(
        text("SELECT name FROM sqlite_master WHERE type = 'table' AND sql LIKE 'CREATE VIRTUAL TABLE%'")
    )
    return {row[0] for row in rows}


def _include_name_filter(connection: Connection):
    """Hide what the ORM does not describe: FTS5/vec0 tables, their shadow tables,
    SQLite's own bookkeeping, and Alembic's version table (spec IMPL-4)."""
    virtual = _virtual_tables(connection)

    def include_name(name, type_, parent_names):
        if type_ != "table" or name is None:
            return True
        if name == "sqlite_sequence" or name.startswith("sqlite_"):
            return False
        return not (name in virtual or any(name.startswith(v + "_") for v in virtual))

    return include_name


def _include_object_filter(connection: Connection):
    from cpersona.storage.migrate import include_object_for

    return include_object_for(connection.dialect.name)


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        include_name=_include_name_filter(connection),
        include_object=_include_object_filter(connection),
        # Batch mode exists for tools; our revisions must not use it on tables
        # carrying triggers (spec IMPL-3).
        render_as_batch=connection.dialect.name == "sqlite",
    )
    with context.begin_transaction():
        context.run_migrations()


def _engine_from_environment() -> Engine:
    from cpersona.storage.engine import sqlite_engine

    path = context.get_x_argument(as_dictionary=True).get("db") or os.environ.get("CPERSONA_DB_PATH")
    if not path:
        raise SystemExit("name the database: alembic -x db=PATH ... or set CPERSONA_DB_PATH")
    return sqlite_engine(path)


def _refuse_unadopted(connection: Connection) -> None:
    """The CLI does not run the legacy adoption ladder; the server does."""
    if connection.dialect.name != "sqlite":
        return
    names = {
        row[0]
        for row in connection.execute(text("SELECT name FROM sqlite_master WHERE type = 'table'"))
    }
    if "schema_version" in names and "alembic_version" not in names:
        raise SystemExit(
            "this is a CPersona database not yet adopted by cpersona; "
            "open it once with the cpersona server (it adopts it) before using alembic on it"
        )


def run_migrations_online() -> None:
    connectable = config.attributes.get("connection")
    if isinstance(connectable, Connection):
        _run(connectable)
        return
    engine = connectable if isinstance(connectable, Engine) else _engine_from_environment()
    with engine.begin() as connection:
        _refuse_unadopted(connection)
        _run(connection)


if context.is_offline_mode():
    raise SystemExit("offline (--sql) mode is not supported: the v13 revision is raw SQLite DDL")
run_migrations_online()
