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


class _Mallinfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def c_heap() -> str:
    """glibc's view (mallinfo2): bytes in use and free-but-kept in its arenas, and in mmapped blocks;
    and pymalloc's arenas (sys._debugmallocstats): what Python's small objects hold."""
    parts = []
    try:
        fn = ctypes.CDLL("libc.so.6").mallinfo2
        fn.restype = _Mallinfo2
        m = fn()
        parts.append(
            f"malloc in use {m.uordblks / MB:.1f}, free kept {m.fordblks / MB:.1f}, mmapped {m.hblkhd / MB:.1f}"
        )
    except (OSError, AttributeError):
        pass
    import tempfile

    with tempfile.TemporaryFile(mode="w+") as out:
        sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(out.fileno(), 2)
        try:
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        out.seek(0)
        stats = {}
        for line in out:
            if line.startswith("#") and "=" in line:
                name, _, value = line[1:].partition("=")
                stats[name.strip()] = int(value.strip().replace(",", ""))
    arenas = stats.get("arenas allocated current")
    used = stats.get("bytes in allocated blocks")
    if arenas is not None and used is not None:
        parts.append(f"pymalloc arenas (1 MiB each) {arenas}, holding {used / MB:.1f} MB of objects")
    return "; ".join(parts)


def index_bytes(db) -> dict[str, int]:
    from cpersona.storage import vector_index_sqlite as vi

    found = vi._INDEXES.peek(db)
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


_SNAPSHOT: list = []


def report(stage: str, db) -> None:
    if _SNAPSHOT:
        import tracemalloc

        now = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(False, tracemalloc.__file__)])
        print(f"  Python allocations since the last stage (tracemalloc, top 6 by size, {stage}):")
        for stat in now.compare_to(_SNAPSHOT[0], "lineno")[:6]:
            print(f"    {stat.size_diff / MB:+7.1f} MB {stat.count_diff:+8d} blocks  {stat.traceback[0]}")
        _SNAPSHOT[0] = now
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
    print(f"{'':28s} {c_heap()}", flush=True)
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
    parser.add_argument(
        "--trace", action="store_true", help="also show where Python allocations grew (tracemalloc: slower)"
    )
    args = parser.parse_args()
    if args.trace:
        import tracemalloc

        tracemalloc.start()
        _SNAPSHOT.append(tracemalloc.take_snapshot())

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
