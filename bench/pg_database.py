"""A fresh PostgreSQL database for the `ours-pg` benchmark server.

`ours-pg` is our server with CPERSONA_DATABASE_URL set, so the benchmarks can
put PostgreSQL next to SQLite with nothing else changed. Each server start gets
a new, empty database, dropped afterwards. The cluster is the one named by
CPERSONA_BENCH_PG_URL (any database URL on it; the user must be allowed to
CREATE DATABASE), else a throwaway cluster started once per benchmark process
with tests/pg_cluster.sh and stopped at exit. That cluster runs with fsync off
(it is a test cluster), so its commits cost less than a durable server's.
"""

from __future__ import annotations

import atexit
import os
import subprocess
import tempfile
import uuid
from pathlib import Path

REPO_DIR = Path(__file__).resolve().parent.parent
CLUSTER_SCRIPT = REPO_DIR / "tests" / "pg_cluster.sh"
POSTGRES_SERVERS = {"ours-pg"}

_cluster_url: str | None = None


def _server_url() -> str:
    """The URL of a cluster to create databases on, starting one if none is named."""
    global _cluster_url
    named = os.environ.get("CPERSONA_BENCH_PG_URL", "").strip()
    if named:
        return named
    if _cluster_url is None:
        directory = tempfile.mkdtemp(prefix="cpersona-bench-pg-")
        started = subprocess.run(
            ["bash", str(CLUSTER_SCRIPT), "start", directory], check=True, capture_output=True, text=True
        )
        atexit.register(subprocess.run, ["bash", str(CLUSTER_SCRIPT), "stop", directory], capture_output=True)
        _cluster_url = started.stdout.strip().splitlines()[-1]
    return _cluster_url


def _admin(server_url: str):
    from sqlalchemy import create_engine

    return create_engine(server_url, isolation_level="AUTOCOMMIT")


class BenchDatabase:
    """One empty database on the cluster; `url` is what the server is given."""

    def __init__(self) -> None:
        from sqlalchemy.engine import make_url

        server = _server_url()
        self.name = "cpersona_bench_" + uuid.uuid4().hex[:12]
        self._server = server
        engine = _admin(server)
        with engine.connect() as conn:
            conn.exec_driver_sql(f'CREATE DATABASE "{self.name}"')
        engine.dispose()
        self.url = make_url(server).set(database=self.name).render_as_string(hide_password=False)

    def drop(self) -> None:
        engine = _admin(self._server)
        with engine.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')
        engine.dispose()


def database_for(server_name: str) -> BenchDatabase | None:
    """A fresh database when `server_name` runs on PostgreSQL, else None (SQLite file)."""
    return BenchDatabase() if server_name in POSTGRES_SERVERS else None
