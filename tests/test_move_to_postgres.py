"""Moving a SQLite memory into PostgreSQL with the operator commands (docs/operations.md).

The exact commands the guide gives, run as the real ``python -m cpersona``:
``export --include-embeddings`` on the SQLite file, ``import`` with
CPERSONA_DATABASE_URL, then ``stats`` on both must agree on every count, and an
export of the PostgreSQL copy must hold the same records (spec JL-9 round trip).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
from sqlalchemy import text, update

from conftest import make_app
from cpersona.services.records.episodes import archive_episode
from cpersona.services.records.memories import store
from cpersona.services.records.profiles import update_profile
from cpersona.storage.engine import open_postgres
from cpersona.storage.migrate import open_and_upgrade
from cpersona.storage.models import Memory
from cpersona.storage.vectors_postgres import VECTOR_COLUMN, pgvector_serves
from pg_support import fresh_pg_url, pg_server_url


def cpersona(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("CPERSONA_", "EMBEDDING_"))}
    clean.update({"CPERSONA_UPDATE_CHECK": "false", **env})
    done = subprocess.run(
        [sys.executable, "-m", "cpersona", *args],
        env=clean,
        capture_output=True,
        text=True,
        timeout=180,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, done.stderr
    return done


def _sqlite_memory(path: Path) -> None:
    db = open_and_upgrade(path)
    app = make_app(db)
    store(app, content="The deploy freeze starts on Friday at 18:00 UTC.", agent_id="rc")
    store(app, content="東京タワーの夜景がとても綺麗だった", agent_id="rc", project_id="travel")
    store(app, content="Hotfixes need two approvals during a freeze.", agent_id="ops", channel="c1")
    archive_episode(app, agent_id="rc", summary="Planning session: the freeze was agreed.")
    update_profile(app, agent_id="rc", profile="Prefers concise answers.")
    vector = np.arange(1, 9, dtype="<f4").tobytes()
    with db.write() as session:
        session.execute(update(Memory).where(Memory.agent_id == "rc").values(embedding=vector))
    db.close()


def _records(path: Path) -> list[dict]:
    lines = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    for line in lines:
        line.pop("exported_at", None)  # the header's clock
    return lines


def test_export_then_import_moves_every_record_into_postgresql(tmp_path):
    pg_server_url()  # skips, with the reason, when no cluster is configured
    lite = tmp_path / "memory.db"
    _sqlite_memory(lite)
    cpersona("export", str(tmp_path / "memory.jsonl"), "--include-embeddings", CPERSONA_DB_PATH=str(lite))
    with fresh_pg_url() as url:
        cpersona("import", str(tmp_path / "memory.jsonl"), "--no-progress", CPERSONA_DATABASE_URL=url)
        before = json.loads(cpersona("stats", "--json", CPERSONA_DB_PATH=str(lite)).stdout)
        after = json.loads(cpersona("stats", "--json", CPERSONA_DATABASE_URL=url).stdout)
        for key in ("path", "size_bytes", "wal_bytes"):
            before.pop(key), after.pop(key)
        assert after == before and after["memories"] == 3 and after["profiles"] == 1
        cpersona("export", str(tmp_path / "back.jsonl"), "--include-embeddings", CPERSONA_DATABASE_URL=url)
        assert _records(tmp_path / "back.jsonl") == _records(tmp_path / "memory.jsonl")
        db = open_postgres(url)
        try:
            if pgvector_serves(db):  # imported vectors are rankable by pgvector straight away
                with db.read() as session:
                    filled = session.execute(text(f"SELECT count({VECTOR_COLUMN}) FROM memories")).scalar_one()
                assert filled == 2
        finally:
            db.close()
