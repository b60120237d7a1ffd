"""How much of the exact vector top-10 the coarse index (sign bits + exact re-rank) keeps.

    python bench/coarse_overlap.py [--rows 20000] [--queries 300] [--random 100000]

Rows are LoCoMo turns (tests/fixtures/locomo-dev) and, past their count,
variants of them with about a third of the words swapped for words drawn by
corpus frequency (as bench/latency.py builds its rows), embedded with the real
MiniLM (all-MiniLM-L6-v2, the ONNX export in bench/.venvs/models, through
cpersona's own local model loader). Queries are the LoCoMo questions, embedded
the same way. Vectors are cached in bench/.cache/ so a re-run does not embed
again.

Both rankings run through the real SQLite search backend over one agent:
``_vector_scan`` (exact float cosine over the window) and ``_coarse_scan``
(the coarse index of revision 0007), for the window (1, all) — the far list
over the whole corpus. Overlap = |coarse top-10 ∩ exact top-10| / |exact
top-10|, averaged over queries, per candidate count. ``--random`` repeats it
on Gaussian 384-d vectors (the worst case for sign bits: no structure).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent))
sys.path.insert(0, str(BENCH))

from locomo_data import DEFAULT_DATA_DIR, load_conversations  # noqa: E402

from cpersona.storage import coarse_sqlite  # noqa: E402
from cpersona.storage.engine import open_sqlite  # noqa: E402
from cpersona.storage.migrate import upgrade  # noqa: E402
from cpersona.storage.scope import Scope  # noqa: E402
from cpersona.storage.search import open_search  # noqa: E402
from cpersona.storage.vectors_sqlite import scan_parameters  # noqa: E402

MODEL = BENCH / ".venvs" / "models" / "all-MiniLM-L6-v2"
CACHE = BENCH / ".cache"
DEPTH = 10


def texts(rows: int, seed: int = 7) -> tuple[list[str], list[str]]:
    conversations = load_conversations(DEFAULT_DATA_DIR)
    turns = [t.content for c in conversations for t in c.turns]
    questions = [q.question for c in conversations for q in c.questions]
    words = [w for t in turns for w in t.split()]
    out = list(turns[:rows])
    rng = random.Random(seed)
    while len(out) < rows:
        template = turns[len(out) % len(turns)].split()
        out.append(" ".join(rng.choice(words) if rng.random() < 0.35 else w for w in template))
    return out, questions


def embedded(name: str, items: list[str], *, query: bool) -> np.ndarray:
    CACHE.mkdir(exist_ok=True)
    path = CACHE / f"minilm-{name}-{len(items)}.npy"
    if path.exists():
        return np.load(path)
    from cpersona.embedding.local_model import LocalModel

    model = LocalModel(MODEL, threads=2)
    started = time.perf_counter()
    parts = [model.embed(items[i : i + 64], query=query) for i in range(0, len(items), 64)]
    vectors = np.concatenate(parts).astype("<f4")
    print(f"embedded {len(items)} {name} in {time.perf_counter() - started:.0f} s", flush=True)
    np.save(path, vectors)
    return vectors


def fill(db, vectors: np.ndarray) -> None:
    from sqlalchemy import text

    stamp = "2024-01-01 00:00:00"
    with db.write_connection() as conn:
        conn.execute(
            text(
                "INSERT INTO memories (agent_id, content, timestamp, embedding, created_at) "
                "VALUES ('a', :c, :t, :e, :at)"
            ),
            [
                {
                    "c": f"row {i}",
                    "t": stamp,
                    "e": v.tobytes(),
                    "at": f"2024-01-01 {i // 3600 % 24:02d}:{i // 60 % 60:02d}:{i % 60:02d}",
                }
                for i, v in enumerate(vectors)
            ],
        )


def measure(label: str, rows: np.ndarray, queries: np.ndarray, candidate_counts: list[int]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        db = open_sqlite(Path(tmp) / "overlap.db")
        upgrade(db)
        fill(db, rows)
        backend = open_search(db)
        scope = Scope(agent_id="a")
        where = "m.agent_id = :scope_agent"
        exact_ms, exact_lists = [], []
        for q in queries:
            blob = q.astype("<f4").tobytes()
            params = {"scope_agent": "a", **scan_parameters(blob, window=(1, 10**9), threshold=-1.0, depth=DEPTH)}
            started = time.perf_counter()
            exact_lists.append([i for _, i in backend._vector_scan("mem", where, dict(params), blob)])
            exact_ms.append((time.perf_counter() - started) * 1000)
        print(f"{label}: {len(rows)} rows, {len(queries)} queries; exact scan p50 {statistics.median(exact_ms):.1f} ms")
        for count in candidate_counts:
            coarse_sqlite.MIN_CANDIDATES, saved = count, coarse_sqlite.MIN_CANDIDATES
            overlaps, coarse_ms = [], []
            for q, exact in zip(queries, exact_lists):
                blob = q.astype("<f4").tobytes()
                params = {"scope_agent": "a", **scan_parameters(blob, window=(1, 10**9), threshold=-1.0, depth=DEPTH)}
                started = time.perf_counter()
                found = [i for _, i in backend._coarse_scan("mem", scope, "", where, dict(params), blob)]
                coarse_ms.append((time.perf_counter() - started) * 1000)
                overlaps.append(len(set(found) & set(exact)) / max(1, len(exact)))
            coarse_sqlite.MIN_CANDIDATES = saved
            print(
                f"  candidates {count:5d}: overlap mean {statistics.mean(overlaps):.4f}, "
                f"min {min(overlaps):.2f}, coarse p50 {statistics.median(coarse_ms):.1f} ms",
                flush=True,
            )
        db.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=20000)
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--random", type=int, default=0, help="also measure on this many Gaussian vectors")
    parser.add_argument("--candidates", default="100,200,400,800")
    args = parser.parse_args()
    counts = [int(c) for c in args.candidates.split(",")]
    rows, questions = texts(args.rows)
    rng = random.Random(11)
    questions = rng.sample(questions, min(args.queries, len(questions)))
    measure(
        "MiniLM, LoCoMo turns",
        embedded("rows", rows, query=False),
        embedded("questions", questions, query=True),
        counts,
    )
    if args.random:
        gen = np.random.default_rng(5)
        measure(
            "Gaussian 384-d",
            gen.standard_normal((args.random, 384)).astype("<f4"),
            gen.standard_normal((min(args.queries, 100), 384)).astype("<f4"),
            counts,
        )


if __name__ == "__main__":
    main()
