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
