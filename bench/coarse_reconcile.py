"""Cost of the start-up coarse-index reconcile read (storage/coarse_sqlite.drift) over N random 384-d memories.

Usage: python bench/coarse_reconcile.py [N]   (default 100000; fills a temporary file through our engine)
"""

import pathlib
import shutil
import sys
import tempfile
import time

import numpy as np
from sqlalchemy import text
from cpersona.storage.engine import open_sqlite
from cpersona.storage.migrate import upgrade
from cpersona.storage import coarse_sqlite

N = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
d = pathlib.Path(tempfile.mkdtemp(dir="/tmp")) / "x.db"
db = open_sqlite(d)
upgrade(db)
rng = np.random.default_rng(1)
t = time.perf_counter()
with db.write_connection() as c:
    raw = c.connection.driver_connection
    for s in range(0, N, 10000):
        n = min(10000, N - s)
        vecs = rng.normal(size=(n, 384)).astype("<f4")
        raw.executemany(
            "INSERT INTO memories (agent_id, content, timestamp, created_at, embedding) "
            "VALUES ('a', ?, '2026-01-01', ?, ?)",
            [(f"row {s + i}", f"2026-01-01 00:00:{i % 60:02d}", vecs[i].tobytes()) for i in range(n)],
        )
print("fill s", round(time.perf_counter() - t, 1))
for _ in range(2):
    t = time.perf_counter()
    with db.read() as s:
        print(coarse_sqlite.drift(s.connection()), "drift read s", round(time.perf_counter() - t, 2))
t = time.perf_counter()
with db.read() as s:
    s.execute(text("select 1")).all()
print("checkout+select ms", round((time.perf_counter() - t) * 1000, 3))
db.close()
shutil.rmtree(d.parent)
