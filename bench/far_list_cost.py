"""One far list at a time over an existing file: the SQL walk of the coarse index against the
process-held copy (thread CPU), and whether they answer the same rows.

    python bench/far_list_cost.py DB [N]

Opens ``DB`` with our engine (a copy: it upgrades it and may write), loads the in-process copy
(storage/vector_index_sqlite.py; its load's thread CPU is printed), then for N stub queries
(bench/minilm_server.py's stub embedder over the newest rows' text) runs the far list of window
(10000, all) for the first agent twice through ``SqliteSearch``: through the copy
(``_process_index_scan``) and through the SQL walk (``_coarse_scan`` with the copy switched off).
A walk cut by the statement deadline answers nothing and counts as no agreement.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(BENCH.parent))

from minilm_server import stub_embed  # noqa: E402
from sqlalchemy import text  # noqa: E402

from cpersona.storage import vector_index_sqlite  # noqa: E402
from cpersona.storage.engine import open_sqlite  # noqa: E402
from cpersona.storage.scope import Scope  # noqa: E402
from cpersona.storage.search_sqlite import SqliteSearch  # noqa: E402
from cpersona.storage.vectors_sqlite import scan_parameters  # noqa: E402


def timed(call, *args):
    started = time.thread_time()
    result = call(*args)
    return result, time.thread_time() - started


def main() -> None:
    db = open_sqlite(sys.argv[1])
    count = int(sys.argv[2]) if len(sys.argv) > 2 else 10
    with db.read() as session:
        (agent,) = session.execute(text("SELECT agent_id FROM memories_coarse LIMIT 1")).one()
        rows = session.execute(text("SELECT content FROM memories ORDER BY id DESC LIMIT :n"), {"n": count}).all()
    backend = SqliteSearch(db)
    scope, where = Scope(agent_id=agent), "m.agent_id = :scope_agent"
    _, load = timed(vector_index_sqlite.warm_database, db)
    print(f"load of the copy: {load * 1000:.0f} ms thread CPU, load avg {os.getloadavg()[0]:.1f}")
    cpu: dict[str, list[float]] = {"sql": [], "copy": []}
    agreement = 0.0
    for (content,) in rows:
        q = np.asarray(stub_embed([content + " question"])[0], dtype="<f4").tobytes()
        params = {"scope_agent": agent, **scan_parameters(q, window=(10000, 10**9), threshold=-1.0, depth=10)}
        copy, spent = timed(backend._process_index_scan, "mem", scope, "", where, dict(params), q)
        cpu["copy"].append(spent)
        saved = backend._process_index_scan
        backend._process_index_scan = lambda *args: None  # the SQL walk of coarse_sqlite.far_statement
        walked, spent = timed(backend._coarse_scan, "mem", scope, "", where, dict(params), q)
        backend._process_index_scan = saved
        cpu["sql"].append(spent)
        agreement += len({i for _, i in copy or []} & {i for _, i in walked or []}) / max(1, len(walked or []))
    for name, values in cpu.items():
        print(f"{name}: thread CPU p50 {statistics.median(values) * 1000:.1f} ms, max {max(values) * 1000:.1f} ms")
    print(f"top-10 agreement copy vs SQL walk: {agreement / len(rows):.3f}; load avg {os.getloadavg()[0]:.1f}")
    db.close()


if __name__ == "__main__":
    main()
