"""What a server process holds, stage by stage, on an existing SQLite database (issue 17's RSS target).

    python bench/memory_profile.py DB [--reach 1000000000] [--recalls 100] [--stores 50] [--seed 7]

Runs in one process what ``python -m cpersona`` runs at start (the App, the
start-up background work: coarse reconcile, the in-process vector index's
load, calibration restore or start-up calibration, backfill, task queue), with
the stub 384-d embedder over loopback HTTP as bench/scale.py does, then
bench/latency.py's recall mix and new stores through the services. After each
stage it prints the process's VmRSS / VmHWM and their parts (anonymous memory,
file-backed pages), SQLite's own heap (``sqlite3_memory_used``: page caches,
statements, schema), the in-process vector index's arrays by field, and the
held float window. The rest of the anonymous memory is the interpreter, the
libraries and what the C heap keeps after frees. A last line shows the same
after ``malloc_trim`` (what glibc would give back), not done by the server then.

Timings here are not the point (see bench/scale.py and bench/recall_profile.py):
thread CPU per call is printed only as a check that the run did the work.
"""

from __future__ import annotations

import argparse
import ctypes
import os
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

MB = 1024 * 1024


def status() -> dict[str, int]:
    fields = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM", "RssAnon", "RssFile", "RssShmem"):
            fields[name] = int(value.split()[0]) * 1024
    return fields


def sqlite_heap() -> int | None:
    module = sys.modules.get("sqlean._sqlite3")
    if module is None:
        return None
    used = ctypes.CDLL(module.__file__).sqlite3_memory_used
    used.restype = ctypes.c_int64
    return int(used())


def index_bytes(db) -> dict[str, int]:
    from cpersona.storage import vector_index_sqlite as vi

    found = vi._INDEXES.get(db)
    out: dict[str, int] = {}
    if found is None:
        return out
    for kind, index in found._kinds.items():
        a = index.arrays
        for name, value in vars(a).items():
            if hasattr(value, "nbytes"):
                out[f"{kind}.{name}"] = out.get(f"{kind}.{name}", 0) + value.nbytes
            elif isinstance(value, dict):
                for sub in value.values():
                    if hasattr(sub, "nbytes"):
                        out[f"{kind}.{name}"] = out.get(f"{kind}.{name}", 0) + sub.nbytes
        if index.floats is not None:
            out[f"{kind}.floats"] = index.floats.matrix.nbytes + index.floats.norms.nbytes
        out[f"{kind}.rows"] = a.n
    return out


def report(stage: str, db) -> None:
    s = status()
    heap = sqlite_heap()
    held = index_bytes(db)
    arrays = sum(v for k, v in held.items() if not k.endswith(".rows"))
    print(
        f"{stage:28s} RSS {s['VmRSS'] / MB:6.1f} (peak {s['VmHWM'] / MB:6.1f}) MB: anon {s['RssAnon'] / MB:6.1f}, "
        f"file {s['RssFile'] / MB:5.1f}; sqlite heap {0 if heap is None else heap / MB:5.1f}; index {arrays / MB:5.1f}"
        f"  [load {os.getloadavg()[0]:.1f}]",
        flush=True,
    )
    if held:
        parts = ", ".join(f"{k} {v / MB:.1f}" for k, v in held.items() if not k.endswith(".rows"))
        rows = ", ".join(f"{k} {v}" for k, v in held.items() if k.endswith(".rows"))
        print(f"{'':28s} {parts}; {rows}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("db")
    parser.add_argument("--reach", type=int, default=1_000_000_000)
    parser.add_argument("--recalls", type=int, default=100)
    parser.add_argument("--stores", type=int, default=50)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()

    corpus = Corpus(args.seed)
    with start_embedder("stub") as url:
        from cpersona.background import BackgroundWork
        from cpersona.config import load_settings
        from cpersona.embedding.client import build_embedder
        from cpersona.services.app import App
        from cpersona.storage.migrate import open_database_and_upgrade

        env = {
            **os.environ,
            "CPERSONA_DB_PATH": args.db,
            "CPERSONA_EMBEDDING_MODE": "http",
            "CPERSONA_EMBEDDING_URL": url,
            "CPERSONA_VECTOR_REACH": str(args.reach),
            "CPERSONA_UPDATE_CHECK": "false",
        }
        settings = load_settings(env)
        embedder = build_embedder(settings)
        db = open_database_and_upgrade(settings)
        app = App(db=db, settings=settings, embedder=embedder)
        from cpersona.services.recall.service import recall
        from cpersona.services.records.memories import store

        report("opened", db)
        background = BackgroundWork(app)
        background.prepare()
        started = time.perf_counter()
        background.start()
        if background._coarse is not None:
            background._coarse.join()
            report(f"index loaded ({time.perf_counter() - started:.0f} s)", db)
        if background._calibration is not None:
            background._calibration.join()
            report(f"calibration done ({time.perf_counter() - started:.0f} s)", db)
        with db.read() as session:
            from sqlalchemy import text

            size = int(session.execute(text("SELECT count(*) FROM memories")).scalar())
        cpus = []
        for arguments in corpus.recall_queries(args.recalls, size, size):
            cpu = time.thread_time()
            answer = recall(app, **arguments)
            cpus.append((time.thread_time() - cpu) * 1000)
            assert "messages" in answer, answer
        report(f"{args.recalls} recalls (CPU p50 {statistics.median(cpus):.0f} ms)", db)
        cpus = []
        for index in range(size, size + args.stores):
            cpu = time.thread_time()
            answer = store(app, **corpus.row(index))
            cpus.append((time.thread_time() - cpu) * 1000)
            assert answer.get("ok") is True, answer
        report(f"{args.stores} stores (CPU p50 {statistics.median(cpus):.1f} ms)", db)
        ctypes.CDLL("libc.so.6").malloc_trim(0)
        report("after malloc_trim", db)
        background.stop()
        db.close()


if __name__ == "__main__":
    main()
