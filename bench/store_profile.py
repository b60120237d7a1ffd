"""Where a store's time goes, in-process, on an existing database (e.g. one bench/scale.py --fill-only wrote).

    python bench/store_profile.py DB [--stores 100] [--first 2000000] [--cprofile OUT] [--top 25]

Opens ``DB`` with our engine, the stub 384-d embedder of bench/minilm_server.py
over loopback HTTP (as bench/scale.py's server has it), and stores
``--stores`` new rows of bench/latency.py's corpus (indexes from ``--first``,
so none is a duplicate) through ``services.records.memories.store``, one at a
time. Reports wall and thread CPU per store (p50 / p95) and, with
``--cprofile``, the functions that took the most cumulative time. The rows are
written: run it on a copy.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import statistics
import sys
import time
from pathlib import Path

from harness_python import ensure_harness_python

ensure_harness_python()

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent))

from latency import Corpus  # noqa: E402
from mcp_driver import start_embedder  # noqa: E402
from metrics import percentile  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("db")
    parser.add_argument("--stores", type=int, default=100)
    parser.add_argument("--first", type=int, default=2_000_000)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--reach", type=int, default=0)
    parser.add_argument("--cprofile", default="", help="write a cProfile of the timed stores here")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument(
        "--embedding", default="http", choices=["http", "none"], help="none: the storage cost alone, no round trip"
    )
    args = parser.parse_args()

    from cpersona.config import load_settings
    from cpersona.embedding.client import build_embedder
    from cpersona.services.app import App
    from cpersona.services.records.memories import store
    from cpersona.storage.migrate import open_database_and_upgrade

    corpus = Corpus(args.seed)
    with start_embedder("stub") as url:
        env = {
            **os.environ,
            "CPERSONA_DB_PATH": args.db,
            "CPERSONA_EMBEDDING_MODE": args.embedding,
            "CPERSONA_EMBEDDING_URL": url,
            "CPERSONA_VECTOR_REACH": str(args.reach),
            "CPERSONA_UPDATE_CHECK": "false",
        }
        settings = load_settings(env)
        db = open_database_and_upgrade(settings)
        app = App(db=db, settings=settings, embedder=build_embedder(settings))
        store(app, **corpus.row(args.first - 1))  # warm up (imports, first connection)
        commit_ms: list[float] = []

        original_commit = db.engine.dialect.do_commit

        def timed_commit(dbapi_connection):
            started = time.perf_counter()
            try:
                return original_commit(dbapi_connection)
            finally:
                commit_ms.append((time.perf_counter() - started) * 1000)

        db.engine.dialect.do_commit = timed_commit
        profile = cProfile.Profile() if args.cprofile else None
        walls, cpus = [], []
        for index in range(args.first, args.first + args.stores):
            row = corpus.row(index)
            if profile:
                profile.enable()
            cpu, started = time.thread_time(), time.perf_counter()
            answer = store(app, **row)
            walls.append((time.perf_counter() - started) * 1000)
            cpus.append((time.thread_time() - cpu) * 1000)
            if profile:
                profile.disable()
            assert answer.get("ok") is True, answer
        print(f"{args.stores} stores into {args.db}, load {os.getloadavg()[0]:.1f}")
        print(
            f"  wall p50 {statistics.median(walls):.2f} ms, p95 {percentile(walls, 0.95):.2f} ms; "
            f"thread CPU p50 {statistics.median(cpus):.2f} ms, p95 {percentile(cpus, 0.95):.2f} ms"
        )
        if db.is_sqlite:
            commits = sorted(commit_ms)
            print(f"  commit wall p50 {statistics.median(commits):.2f} ms, p95 {percentile(commits, 0.95):.2f} ms")
        if profile:
            profile.dump_stats(args.cprofile)
            pstats.Stats(args.cprofile).sort_stats("cumulative").print_stats(args.top)
        db.close()


if __name__ == "__main__":
    main()
