"""Where a recall's time goes, in-process, on an existing database (e.g. one bench/scale.py --keep left).

    python bench/recall_profile.py DB|postgresql+psycopg://... [--queries 200] [--reach 1000000000] [--passes 1]
        [--cprofile OUT] [--embedding none]

Opens ``DB`` with our engine (read and written as the server would: recall
bumps counters), the stub 384-d embedder of bench/minilm_server.py served over
loopback HTTP as in bench/scale.py, and runs bench/latency.py's recall mix
through ``services.recall.service.recall``. Each search primitive of the
backend is wrapped with a timer, so the report splits a recall's wall time
into the vector near list, the far list (coarse index), trigram keyword arms
(memories / episodes, and the term counts of the keyword budget), the word
arms, pool counts, row fetches and "the rest" (embedding round trip, fusion,
gate, response building). Thread CPU per recall is reported beside wall time
(steadier on a shared machine).
"""

from __future__ import annotations

import argparse
import cProfile
import os
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

from harness_python import ensure_harness_python

ensure_harness_python()

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent))

from latency import Corpus  # noqa: E402
from mcp_driver import start_embedder  # noqa: E402
from metrics import percentile  # noqa: E402

STAGES = {
    "keyword_memories": "trigram memories",
    "keyword_episodes": "trigram episodes",
    "_term_counts": "keyword budget counts",
    "word_memories": "word memories",
    "word_episodes": "word episodes",
    "table_counts": "pool counts",
    "fetch": "row fetch",
    "_vector_scan": "vector exact scan",
    "_near_scan": "vector near (held vectors)",
    "_coarse_scan": "vector coarse scan",
}


def wrap(cls, spent: dict[str, float], cpu: dict[str, float]) -> None:
    """Time each primitive of ``cls`` once per call, wall and thread CPU (nested calls count in their own stage only)."""
    active: list[str] = []

    for name, label in STAGES.items():
        original = getattr(cls, name, None)
        if original is None:  # a stage this backend does not have (PostgreSQL: no trigram term counts)
            continue

        def timed(*args, __original=original, __label=label, **kwargs):
            started, began = time.perf_counter(), time.thread_time()
            active.append(__label)
            try:
                return __original(*args, **kwargs)
            finally:
                active.pop()
                elapsed, used = time.perf_counter() - started, time.thread_time() - began
                spent[__label] += elapsed
                cpu[__label] += used
                if active:  # the caller's stage does not count this part twice
                    spent[active[-1]] -= elapsed
                    cpu[active[-1]] -= used

        setattr(cls, name, timed)


def watch_statements(engine, totals) -> None:
    """Wall time per statement shape (its first words, parameters and literals collapsed), via cursor events."""
    import re

    from sqlalchemy import event

    @event.listens_for(engine, "before_cursor_execute")
    def _before(conn, cursor, statement, parameters, context, executemany):
        conn.info.setdefault("cpersona_profile_started", []).append(time.perf_counter())

    @event.listens_for(engine, "after_cursor_execute")
    def _after(conn, cursor, statement, parameters, context, executemany):
        elapsed = time.perf_counter() - conn.info["cpersona_profile_started"].pop()
        shape = re.sub(r"\s+", " ", re.sub(r"%\(\w+\)s|'[^']*'|\b\d+\b", "?", statement)).strip()
        shape = shape[:90]
        totals[shape][0] += 1
        totals[shape][1] += elapsed


VECTOR_STAGES = {"vector exact scan", "vector near (held vectors)", "vector coarse scan"}
KEYWORD_STAGES = {"trigram memories", "trigram episodes", "keyword budget counts", "word memories", "word episodes"}


def print_slowest(walls: list[float], per_recall: list[dict[str, float]]) -> None:
    """Wall split of the slowest tenth of recalls against all of them: is the tail the vector side or the keyword side?"""
    order = sorted(range(len(walls)), key=lambda i: -walls[i])
    tail = order[: max(1, len(walls) // 10)]

    def split(indices: list[int]) -> tuple[float, float, float, float]:
        n = len(indices)
        wall = sum(walls[i] for i in indices) / n
        vector = sum(v for i in indices for k, v in per_recall[i].items() if k in VECTOR_STAGES) / n
        keyword = sum(v for i in indices for k, v in per_recall[i].items() if k in KEYWORD_STAGES) / n
        timed = sum(v for i in indices for v in per_recall[i].values()) / n
        return wall, vector, keyword, timed - vector - keyword

    for name, indices in (("all recalls", list(range(len(walls)))), ("slowest 10%", tail)):
        wall, vector, keyword, other = split(indices)
        print(
            f"  {name:12s} wall {wall:6.1f} ms: vector {vector:5.1f}, keyword {keyword:5.1f}, "
            f"fetch/counts {other:5.1f}, rest {wall - vector - keyword - other:5.1f}"
        )
    for i in tail:
        stages = ", ".join(f"{k} {v:.1f}" for k, v in sorted(per_recall[i].items(), key=lambda kv: -kv[1])[:3])
        print(f"    {walls[i]:6.1f} ms: {stages}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("db")
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--reach", type=int, default=1_000_000_000)
    parser.add_argument("--passes", type=int, default=1)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--statements", action="store_true", help="also report wall time per SQL statement shape (cursor events)"
    )
    parser.add_argument("--cprofile", default="", help="write a cProfile of the timed passes here")
    parser.add_argument(
        "--embedding", choices=("stub", "none"), default="stub", help="none: embeddings off (keyword arms only)"
    )
    args = parser.parse_args()

    from cpersona.config import load_settings
    from cpersona.embedding.client import build_embedder
    from cpersona.services.app import App
    from cpersona.services.recall.service import recall
    from cpersona.storage.migrate import open_database_and_upgrade
    from cpersona.storage.search_words import SqliteWordSearch

    on_postgres = args.db.startswith("postgresql")

    corpus = Corpus(args.seed)
    with start_embedder("stub") as url:
        env = {
            **os.environ,
            **({"CPERSONA_DATABASE_URL": args.db} if on_postgres else {"CPERSONA_DB_PATH": args.db}),
            "CPERSONA_EMBEDDING_MODE": "http" if args.embedding == "stub" else "none",
            "CPERSONA_EMBEDDING_URL": url,
            "CPERSONA_VECTOR_REACH": str(args.reach),
            "CPERSONA_UPDATE_CHECK": "false",
        }
        settings = load_settings(env)
        embedder = build_embedder(settings)
        db = open_database_and_upgrade(settings)
        app = App(db=db, settings=settings, embedder=embedder)
        spent: dict[str, float] = defaultdict(float)
        cpu_spent: dict[str, float] = defaultdict(float)
        if on_postgres:
            from cpersona.storage.search_words_postgres import PostgresWordSearch

            wrap(PostgresWordSearch, spent, cpu_spent)
        else:
            wrap(SqliteWordSearch, spent, cpu_spent)
        statements: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
        if args.statements:
            watch_statements(db.engine, statements)
        with db.read() as session:
            from sqlalchemy import text

            size = int(session.execute(text("SELECT count(*) FROM memories")).scalar())
        queries = corpus.recall_queries(args.queries, size, size)
        recall(app, agent_id=queries[0]["agent_id"], query="warm up", limit=5)
        profile = cProfile.Profile() if args.cprofile else None
        for number in range(args.passes):
            spent.clear()
            cpu_spent.clear()
            statements.clear()
            walls, cpus = [], []
            if profile:
                profile.enable()
            per_recall: list[dict[str, float]] = []
            for arguments in queries:
                before = dict(spent)
                cpu, started = time.thread_time(), time.perf_counter()
                answer = recall(app, **arguments)
                walls.append((time.perf_counter() - started) * 1000)
                cpus.append((time.thread_time() - cpu) * 1000)
                per_recall.append({k: (v - before.get(k, 0.0)) * 1000 for k, v in spent.items()})
                assert "messages" in answer, answer
            if profile:
                profile.disable()
            total, total_cpu = sum(walls), sum(cpus)
            print(
                f"pass {number + 1}: {len(queries)} recalls over {size} rows, reach {args.reach}, load {os.getloadavg()[0]:.1f}"
            )
            print(
                f"  wall p50 {statistics.median(walls):.1f} ms, p95 {percentile(walls, 0.95):.1f} ms; "
                f"thread CPU p50 {statistics.median(cpus):.1f} ms, p95 {percentile(cpus, 0.95):.1f} ms"
            )
            n = len(queries)
            print(f"  {'stage':38s} {'wall mean':>10s} {'share':>7s} {'CPU mean':>9s} {'share':>7s}")
            for label, seconds in sorted(cpu_spent.items(), key=lambda kv: -kv[1]):
                wall = spent[label] * 1000
                print(
                    f"  {label:38s} {wall / n:7.2f} ms {wall / total:7.1%} {seconds * 1000 / n:6.2f} ms {seconds * 1000 / total_cpu:7.1%}"
                )
            rest, rest_cpu = total - sum(spent.values()) * 1000, total_cpu - sum(cpu_spent.values()) * 1000
            label = "rest (embed, fusion, gate, response)"
            print(
                f"  {label:38s} {rest / n:7.2f} ms {rest / total:7.1%} {rest_cpu / n:6.2f} ms {rest_cpu / total_cpu:7.1%}"
            )
            print_slowest(walls, per_recall)
            if args.statements:
                print(f"  {'statement (first words)':90s} {'per recall':>10s} {'mean ms':>8s} {'ms/recall':>9s}")
                for shape, (count, seconds) in sorted(statements.items(), key=lambda kv: -kv[1][1]):
                    print(f"  {shape:90s} {count / n:10.2f} {seconds * 1000 / count:8.2f} {seconds * 1000 / n:9.2f}")
        if profile:
            profile.dump_stats(args.cprofile)
        db.close()


if __name__ == "__main__":
    main()
