"""Cost at 10k / 100k / 1M memories: recall and store over MCP, fill rate, memory, bytes per row.

    python bench/scale.py [--sizes 10000,100000,1000000] [--recalls 200] [--stores 100]
                          [--reaches 0,1000000000] [--pg-url postgresql+psycopg://...]
    python bench/scale.py --existing FILE [--recalls ...]   # time a database filled beforehand

For each size a fresh database is filled **in-process** (not over MCP; issue
17 allows an in-process bulk fill): on SQLite through
``cpersona/storage/bulk_load.py`` (executemany in 50k-row transactions, the
FTS5 trigram and word indexes rebuilt in one pass at the end instead of by
their insert triggers, the memories indexes built after the rows, the coarse
index written per batch with its trigger's own expression; the file it leaves
has the same rows, schema and full-text matches as per-row inserts, checked by
tests/test_bulk_load.py); on PostgreSQL in batched Core inserts with every
trigger live. The tool layer, dedup probe and embedding round trip are
skipped -> fill rows/s is the cost of a bulk load, not of the store tool. Rows are LoCoMo turns with a third of their words
swapped (bench/latency.py's ``Corpus``), each with a stub 384-d vector (the
feature-hashing stub of bench/minilm_server.py, unit length).

Then a real server (`python -m cpersona`, stdio, driven by the MCP SDK client)
opens the database with the stub embedding server (so recall embeds its
query, and the vector channel runs over the exact window and, with
``--reaches`` above CPERSONA_MAX_MEMORIES, the far list through the coarse
index; one server per reach, one after the other on the same database) and
is timed on:

  recall   ``--recalls`` sequential mixed recalls (bench/latency.py's query mix) -> p50 / p95 ms,
           and the server process's CPU time per recall (steadier than wall time on a loaded machine)
  store    ``--stores`` sequential stores of new rows -> p50 ms, and CPU per store
  RSS      the server process's VmRSS after the timed calls (and VmHWM, its peak)
  size     database bytes per row (SQLite: file + WAL after a checkpoint;
           PostgreSQL: pg_database_size), and the same minus the 1,536 bytes
           of the float vector itself

``--pg-url`` runs the same on PostgreSQL (a fresh database created on that
cluster and dropped afterwards; the user needs CREATE DATABASE).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from harness_python import ensure_harness_python

ensure_harness_python()

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent))

from latency import AGENT_ID, Corpus, cpu_ms, per_call, server_pid  # noqa: E402
from mcp_driver import start_embedder, write_results  # noqa: E402
from metrics import percentile  # noqa: E402
from minilm_server import stub_embed  # noqa: E402

VECTOR_BYTES = 384 * 4
BATCH = 2000


def open_database(kind: str, target: str):
    if kind == "sqlite":
        from cpersona.storage.engine import open_sqlite

        return open_sqlite(Path(target))
    from cpersona.storage.engine import open_postgres

    return open_postgres(target)


def fill_batches(corpus: Corpus, first: int, size: int, started: float):
    """Rows first..size-1 as bulk_load rows, BATCH at a time (the values the old per-row fill inserted)."""
    import numpy as np

    for start in range(first, size, BATCH):
        rows = [corpus.row(i) for i in range(start, min(size, start + BATCH))]
        vectors = np.asarray(stub_embed([r["content"] for r in rows]), dtype="<f4")
        yield [
            {
                "agent_id": r["agent_id"],
                "content": r["content"],
                "msg_id": r["id"],
                "timestamp": r["timestamp"],
                "created_at": r["timestamp"][:19].replace("T", " "),
                "embedding": v.tobytes(),
                "source": SOURCE,
            }
            for r, v in zip(rows, vectors)
        ]
        if start and start % 100_000 == 0:
            rate = (start - first) / (time.perf_counter() - started)
            print(f"    filled {start} rows ({rate:.0f} rows/s)", file=sys.stderr, flush=True)


SOURCE = json.dumps({"type": "User", "id": "bench", "name": "bench"})


def bulk_fill(db, corpus: Corpus, size: int) -> float:
    """Rows 0..size-1 in process; rows per second.

    SQLite: storage/bulk_load.py (executemany, large transactions, the
    full-text indexes and the memories indexes built in one pass at the end;
    the same rows, schema and matches as per-row inserts, tests/test_bulk_load.py).
    PostgreSQL: batched Core inserts with every trigger live.
    """
    from sqlalchemy import insert

    from cpersona.storage.models import Memory

    started = time.perf_counter()
    if db.is_sqlite:
        from cpersona.storage.bulk_load import load_memories

        load_memories(db, fill_batches(corpus, 0, size, started))
    else:
        for values in fill_batches(corpus, 0, size, started):
            with db.write_connection() as conn:
                conn.execute(insert(Memory), values)
    return size / (time.perf_counter() - started)


def existing_rows(path: Path) -> int:
    import sqlean

    conn = sqlean.connect(str(path))
    try:
        return int(conn.execute("SELECT count(*) FROM memories").fetchone()[0])
    finally:
        conn.close()


def sqlite_bytes(path: Path) -> int:
    import sqlean

    conn = sqlean.connect(str(path))
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    return sum(p.stat().st_size for p in path.parent.glob(path.name + "*"))


def postgres_bytes(url: str) -> int:
    from sqlalchemy import create_engine, text

    engine = create_engine(url)
    with engine.connect() as conn:
        return int(conn.execute(text("SELECT pg_database_size(current_database())")).scalar())


def memory_kb(pid: int | None) -> tuple[int | None, int | None]:
    if pid is None:
        return None, None
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    kb = lambda name: int(fields[name].split()[0]) if name in fields else None  # noqa: E731
    return kb("VmRSS"), kb("VmHWM")


def open_connections(pid: int | None, db_file: Path) -> int | None:
    """SQLite connections the server holds on the file: its open descriptors of the main file."""
    if pid is None:
        return None
    target = str(db_file.resolve())
    count = 0
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            count += os.readlink(fd) == target
        except OSError:
            continue
    return count


async def settle(pid: int | None, limit: float) -> None:
    """Wait (at most ``limit`` s) until the idle server stops using CPU: the start-up background
    work (coarse reconcile, the in-process vector index's load: seconds of CPU at 1M rows) would
    otherwise be counted in the CPU per recall."""
    deadline = time.monotonic() + limit
    last, quiet = cpu_ms(pid), 0
    while last is not None and time.monotonic() < deadline:
        await asyncio.sleep(1.0)
        now = cpu_ms(pid)
        if now is None:
            return
        # Under 2% of one core for 3 seconds running: one quiet second was often a background
        # thread waiting on a cold file (1M rows), and the timed calls then shared the process with it.
        quiet = quiet + 1 if now - last < 20.0 else 0
        if quiet >= 3:
            return
        last = now


async def time_server(
    env: dict[str, str], workdir: Path, corpus: Corpus, size: int, first: int, args
) -> dict[str, Any]:
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import get_default_environment, stdio_client

    from latency import RunningServer

    full = {**get_default_environment(), **env, "CPERSONA_UPDATE_CHECK": "false", "PYTHONUNBUFFERED": "1"}
    if args.server_src:
        # Another source tree of cpersona (e.g. `git archive` of a base commit): before/after with one venv.
        full["PYTHONPATH"] = args.server_src
    params = StdioServerParameters(
        command=str(BENCH.parent / ".venv" / "bin" / "python"), args=["-m", "cpersona"], env=full, cwd=str(workdir)
    )
    # One log per server (reach): the second server would overwrite the first's start-up story.
    with open(workdir / f"server-reach{env.get('CPERSONA_VECTOR_REACH', '0')}.log", "w") as errlog:
        async with stdio_client(params, errlog=errlog) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            server = RunningServer(name="ours", session=session, workdir=workdir)
            pid = server_pid(server)
            await server.call("recall", {"agent_id": AGENT_ID, "query": "warm up", "limit": 5})
            if args.settle > 0:
                await settle(pid, args.settle)
            recall_ms, failures = [], 0
            cpu_before = cpu_ms(pid)
            for arguments in corpus.recall_queries(args.recalls, size, size):
                answer, elapsed = await server.try_call("recall", arguments)
                failures += "messages" not in answer
                recall_ms.append(elapsed)
            recall_cpu = per_call(cpu_before, cpu_ms(pid), args.recalls)
            store_ms = []
            cpu_before = cpu_ms(pid)
            for index in range(first, first + args.stores):
                answer, elapsed = await server.try_call("store", corpus.row(index))
                failures += answer.get("ok") is not True
                store_ms.append(elapsed)
            store_cpu = per_call(cpu_before, cpu_ms(pid), args.stores)
            rss, peak = memory_kb(pid)
            connections = open_connections(pid, Path(env["CPERSONA_DB_PATH"]))
    return {
        "recall_p50_ms": round(statistics.median(recall_ms), 1),
        "recall_p95_ms": round(percentile(recall_ms, 0.95), 1),
        "store_p50_ms": round(statistics.median(store_ms), 2),
        "recall_cpu_ms": None if recall_cpu is None else round(recall_cpu, 1),
        "store_cpu_ms": None if store_cpu is None else round(store_cpu, 2),
        "rss_mb": None if rss is None else round(rss / 1024, 1),
        "peak_rss_mb": None if peak is None else round(peak / 1024, 1),
        "db_connections": connections,
        "failures": failures,
    }


async def one_size(kind: str, size: int, corpus: Corpus, embed_url: str, args) -> dict[str, Any]:
    from cpersona.storage.migrate import upgrade

    workdir = Path(tempfile.mkdtemp(prefix=f"cpersona-scale-{kind}-", dir=args.workdir))
    env = {
        "CPERSONA_DB_PATH": str(workdir / "cpersona.db"),
        "CPERSONA_EMBEDDING_MODE": "http",
        "CPERSONA_EMBEDDING_URL": embed_url,
    }
    pg_url = None
    if kind == "postgresql":
        from sqlalchemy import create_engine, text
        from sqlalchemy.engine import make_url

        name = "cpersona_scale_" + uuid.uuid4().hex[:10]
        admin = create_engine(args.pg_url, isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
        pg_url = make_url(args.pg_url).set(database=name).render_as_string(hide_password=False)
        env["CPERSONA_DATABASE_URL"] = pg_url
    if args.existing:
        # A database filled beforehand (e.g. by an interrupted fill): timed as it stands.
        env["CPERSONA_DB_PATH"] = args.existing
        workdir.rmdir()
        workdir = Path(args.existing).parent
        size, rate = existing_rows(Path(args.existing)), None
    else:
        db = open_database(kind, pg_url or env["CPERSONA_DB_PATH"])
        try:
            upgrade(db)
            rate = bulk_fill(db, corpus, size)
        finally:
            db.close()
        print(f"  [{kind}/{size}] in-process fill {rate:.0f} rows/s", file=sys.stderr, flush=True)
    timed = {}
    for number, reach in enumerate(args.reaches):
        # Each server stores its own --stores rows past the fill (new ids, so none is a duplicate).
        first = size + number * args.stores
        timed[f"reach={reach}"] = await time_server(
            {**env, "CPERSONA_VECTOR_REACH": str(reach)}, workdir, corpus, size, first, args
        )
    rows = size + args.stores * len(args.reaches)
    total = sqlite_bytes(workdir / "cpersona.db") if kind == "sqlite" else postgres_bytes(pg_url)
    if kind == "postgresql":
        admin.dispose()
        with create_engine(args.pg_url, isolation_level="AUTOCOMMIT").connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    if not args.keep and not args.existing:
        for path in workdir.glob("*"):
            path.unlink()
        workdir.rmdir()
    result = {
        "backend": kind,
        "size": size,
        "fill_rows_per_s": None if rate is None else round(rate),
        "servers": timed,
        "bytes_per_row": round(total / rows),
        "bytes_per_row_without_vector": round(total / rows - VECTOR_BYTES),
    }
    print(f"  [{kind}/{size}] {result}", file=sys.stderr, flush=True)
    return result


async def main_async(args) -> None:
    corpus = Corpus(args.seed)
    results = []
    with start_embedder("stub") as embed_url:
        for kind in ["sqlite", *(["postgresql"] if args.pg_url else [])]:
            for size in args.sizes:
                results.append(await one_size(kind, size, corpus, embed_url, args))
    load = os.getloadavg()
    payload = {
        "date_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "load": [round(x, 2) for x in load],
        "command": " ".join(sys.argv),
        "results": results,
    }
    print(json.dumps(payload, indent=1))
    write_results("scale", payload)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="10000,100000")
    parser.add_argument("--recalls", type=int, default=200)
    parser.add_argument("--stores", type=int, default=100)
    parser.add_argument(
        "--reaches",
        default="0,1000000000",
        help="CPERSONA_VECTOR_REACH of each timed server, one after the other on the same database "
        "(0: the exact window only; 1000000000: the far list over the whole corpus)",
    )
    parser.add_argument("--pg-url", default="", help="also run on PostgreSQL (a cluster URL with CREATE DATABASE)")
    parser.add_argument(
        "--settle",
        type=float,
        default=0.0,
        help="wait up to this many seconds for the idle server's start-up background work before timing",
    )
    parser.add_argument("--workdir", default=None, help="where the SQLite files go (default: the temp dir)")
    parser.add_argument("--keep", action="store_true", help="keep the database files")
    parser.add_argument(
        "--existing",
        default="",
        help="time this SQLite file as it stands instead of filling one (--sizes is ignored; "
        "its rows are counted; the timed stores are added to it)",
    )
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--server-src",
        default="",
        help="run the timed servers on this cpersona source tree (PYTHONPATH), e.g. a base commit's",
    )
    parser.add_argument(
        "--fill-only",
        default="",
        help="only fill this SQLite file with --sizes rows (one size) and exit, no server is timed",
    )
    args = parser.parse_args()
    args.sizes = [0] if args.existing else [int(s) for s in args.sizes.split(",")]
    args.reaches = [int(r) for r in args.reaches.split(",")]
    if args.fill_only:
        fill_only(Path(args.fill_only), args.sizes[0], args.seed)
        return
    asyncio.run(main_async(args))


def fill_only(path: Path, size: int, seed: int) -> None:
    from cpersona.storage.migrate import upgrade

    db = open_database("sqlite", str(path))
    try:
        upgrade(db)
        cpu = time.process_time()
        rate = bulk_fill(db, Corpus(seed), size)
    finally:
        db.close()
    total = sqlite_bytes(path)
    print(
        json.dumps(
            {
                "date_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                "load": [round(x, 2) for x in os.getloadavg()],
                "command": " ".join(sys.argv),
                "size": size,
                "fill_rows_per_s": round(rate),
                "fill_cpu_s": round(time.process_time() - cpu, 1),
                "bytes_per_row": round(total / size),
            }
        )
    )


if __name__ == "__main__":
    main()
