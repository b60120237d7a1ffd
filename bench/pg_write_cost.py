"""What pgvector costs an import on PostgreSQL: the same export imported with and without the extension.

    python bench/pg_write_cost.py --pg-url postgresql+psycopg://... [--rows 2000] [--rounds 3]
                                  [--vectors stub|random]

An export of ``--rows`` memories with 384-d vectors (bench/latency.py's rows;
``stub``: the feature-hashing stub of bench/minilm_server.py, sparse, as
bench/scale.py stores; ``random``: Gaussian, as dense as a sentence model's) is
written once from a SQLite file. Each round then creates two fresh databases
on the cluster, migrated by our engine: ``pgvector`` as a start leaves it
(extension, derived ``embedding_vec`` column, its trigger), and ``plain`` with
the extension dropped again (no column, no trigger: what a server without
pgvector writes), and runs ``import_memories`` of the file into each, in
alternating order. Reported per database kind: wall time per imported row
(median over rounds) and this process's CPU per row (the client's share:
parsing, formatting, SQLAlchemy); PostgreSQL's own CPU is not in it (a
backend process), so read wall times on a quiet machine or alternated rounds.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

from harness_python import ensure_harness_python

ensure_harness_python()

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent))

from latency import Corpus  # noqa: E402


def export_file(rows: int, vectors: str, workdir: Path) -> Path:
    import numpy as np
    from sqlalchemy import insert

    from cpersona.config import load_settings
    from cpersona.services.app import App
    from cpersona.services.portability.export import export_memories
    from cpersona.storage.migrate import open_database_and_upgrade
    from cpersona.storage.models import Memory
    from minilm_server import stub_embed

    corpus = Corpus(7)
    settings = load_settings({"CPERSONA_DB_PATH": str(workdir / "source.db"), "CPERSONA_EMBEDDING_MODE": "none"})
    db = open_database_and_upgrade(settings)
    batch = [corpus.row(i) for i in range(rows)]
    if vectors == "stub":
        matrix = np.asarray(stub_embed([r["content"] for r in batch]), dtype="<f4")
    else:
        matrix = np.random.default_rng(7).standard_normal((rows, 384)).astype("<f4")
        matrix /= np.linalg.norm(matrix, axis=1, keepdims=True)
    with db.write_connection() as conn:
        conn.execute(
            insert(Memory),
            [
                {
                    "agent_id": r["agent_id"],
                    "content": r["content"],
                    "msg_id": r["id"],
                    "timestamp": r["timestamp"],
                    "embedding": v.tobytes(),
                }
                for r, v in zip(batch, matrix)
            ],
        )
    out = workdir / "export.jsonl"
    app = App(db=db, settings=settings, embedder=None)
    answer = export_memories(app, agent_id=batch[0]["agent_id"], output_path=str(out), include_embeddings=True)
    assert answer.get("ok") is True, answer
    db.close()
    return out


CPU: dict[str, list[float]] = {"plain": [], "pgvector": []}  # this process's CPU per import


def import_once(cluster_url: str, kind: str, path: Path) -> float:
    from sqlalchemy import create_engine
    from sqlalchemy.engine import make_url

    from cpersona.config import load_settings
    from cpersona.services.app import App
    from cpersona.services.portability.importer import import_memories
    from cpersona.storage.migrate import open_database_and_upgrade

    name = f"cpersona_write_{kind}_{uuid.uuid4().hex[:8]}"
    admin = create_engine(cluster_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    url = make_url(cluster_url).set(database=name).render_as_string(hide_password=False)
    settings = load_settings(
        {
            **os.environ,
            "CPERSONA_DATABASE_URL": url,
            "CPERSONA_EMBEDDING_MODE": "none",
            "CPERSONA_UPDATE_CHECK": "false",
        }
    )
    db = open_database_and_upgrade(settings)
    try:
        if kind == "plain":
            with db.write_connection() as conn:
                for table in ("memories", "episodes"):
                    conn.exec_driver_sql(f"DROP TRIGGER IF EXISTS {table}_embedding_vec_sync ON {table}")
                conn.exec_driver_sql("DROP EXTENSION IF EXISTS vector CASCADE")
                for table in ("memories", "episodes"):  # the blob's storage as a start without pgvector leaves it
                    conn.exec_driver_sql(f"ALTER TABLE {table} ALTER COLUMN embedding SET STORAGE EXTENDED")
        app = App(db=db, settings=settings, embedder=None)
        started, cpu = time.perf_counter(), time.process_time()
        answer = import_memories(app, input_path=str(path))
        elapsed = time.perf_counter() - started
        CPU[kind].append(time.process_time() - cpu)
        assert answer.get("ok") is True, answer
    finally:
        db.close()
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pg-url", required=True)
    parser.add_argument("--rows", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--vectors", choices=("stub", "random"), default="stub")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="cpersona-write-") as tmp:
        path = export_file(args.rows, args.vectors, Path(tmp))
        times: dict[str, list[float]] = {"plain": [], "pgvector": []}
        for number in range(args.rounds):
            order = ("plain", "pgvector") if number % 2 == 0 else ("pgvector", "plain")
            for kind in order:
                times[kind].append(import_once(args.pg_url, kind, path))
                print(
                    f"round {number + 1} {kind}: {times[kind][-1] * 1000 / args.rows:.3f} ms/row,"
                    f" client CPU {CPU[kind][-1] * 1000 / args.rows:.3f} ms/row",
                    flush=True,
                )
    plain, vec = (statistics.median(times[k]) * 1000 / args.rows for k in ("plain", "pgvector"))
    print(
        f"{args.rows} rows, {args.vectors} vectors, load {os.getloadavg()[0]:.1f}: "
        f"plain {plain:.3f} ms/row, pgvector {vec:.3f} ms/row, ratio {vec / plain:.2f}x; client CPU "
        + ", ".join(f"{k} {statistics.median(v) * 1000 / args.rows:.3f}" for k, v in CPU.items())
        + " ms/row"
    )


if __name__ == "__main__":
    main()
