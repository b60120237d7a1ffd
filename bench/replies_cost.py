"""Recall CPU with and without the replies rule (issue 14, fifth pass), in-process, keyword-only.

Stores ``N`` rows of bench/latency.py's corpus (LoCoMo turns with words
swapped, one minute apart: many rows ask something and their next row is a
reply by the rule's reading), then runs latency.py's recall mix (200 queries)
alternately with the rule on and replaced by the identity, several passes,
and prints thread CPU per recall for each and the rule's own CPU.

    python bench/replies_cost.py 10000
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

from harness_python import ensure_harness_python

ensure_harness_python()

from latency import Corpus  # noqa: E402
from mcp_driver import REPO_DIR  # noqa: E402

sys.path.insert(0, str(REPO_DIR))

import cpersona.services.recall.words as words  # noqa: E402
from cpersona.config import load_settings  # noqa: E402
from cpersona.services.app import App  # noqa: E402
from cpersona.services.recall.replies import with_replies  # noqa: E402
from cpersona.services.recall.service import recall  # noqa: E402
from cpersona.services.records.memories import store  # noqa: E402
from cpersona.storage.engine import open_sqlite  # noqa: E402
from cpersona.storage.migrate import upgrade  # noqa: E402


def main() -> None:
    rows = int(sys.argv[1]) if len(sys.argv) > 1 else 10_000
    path = Path(tempfile.mkdtemp(prefix="cpersona-replies-cost-")) / "cpersona.db"
    db = open_sqlite(path)
    upgrade(db)
    env = {"CPERSONA_DB_PATH": str(path), "CPERSONA_UPDATE_CHECK": "false", "CPERSONA_DEGRADED_ADVISORY": "false"}
    app = App(db=db, settings=load_settings(env))
    corpus = Corpus(7)
    for i in range(rows):
        store(app, **corpus.row(i))
    queries = corpus.recall_queries(200, rows, rows)
    spent = [0.0]

    def timed(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202 - a pass-through timer
        started = time.thread_time()
        try:
            return with_replies(*args, **kwargs)
        finally:
            spent[0] += time.thread_time() - started

    def identity(backend, scope, hits, depth, *, source_id=""):  # noqa: ANN001, ANN202, ARG001
        return list(hits)

    def one_pass() -> float:
        started = time.thread_time()
        for q in queries:
            recall(app, **q)
        return (time.thread_time() - started) / len(queries) * 1000

    words.with_replies = timed
    one_pass()  # warm
    runs: dict[str, list[float]] = {"without": [], "with": []}
    own: list[float] = []
    for n in range(6):
        for label in ("without", "with") if n % 2 == 0 else ("with", "without"):
            spent[0] = 0.0
            words.with_replies = identity if label == "without" else timed
            runs[label].append(one_pass())
            if label == "with":
                own.append(spent[0] / len(queries) * 1000)
    for label, values in runs.items():
        print(
            f"{label:<8} rule: "
            + " ".join(f"{v:.2f}" for v in values)
            + f"  median {statistics.median(values):.2f} ms CPU/recall"
        )
    print(f"the rule itself: median {statistics.median(own):.3f} ms CPU/recall")


if __name__ == "__main__":
    main()
