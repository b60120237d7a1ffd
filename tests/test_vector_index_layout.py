"""The in-process coarse index's compact layout (storage/vector_index_sqlite.py) answers as the SQL walk.

The copy holds SQLite's own stamps as int64 digits, any other form as bytes,
ranks only for the rows placed since its load, and scope codes as narrow as
their number allows (docs/benchmarks.md, Scale: the arrays were 100 MB at 1M
rows). Each test drives one of those switches through real writes and checks
the answers against the exact scan or the SQL walk of the coarse table.
"""

from __future__ import annotations

import numpy as np
import pytest

from cpersona.embedding.vectors import to_blob
from cpersona.storage import vector_index_sqlite
from cpersona.storage.scope import Scope
from cpersona.storage.search_sqlite import SqliteSearch
from cpersona.storage.vectors_sqlite import scan_parameters
from test_vector_channel import DIM, add_memories, stamp
from test_vector_index_process import FAR, loads, two  # noqa: F401 - two is a fixture

pytestmark = pytest.mark.sqlite_only  # the coarse index is SQLite's

WINDOWS = ((1, 10**9), (10, 60), (0, 30), (37, 81), (150, 400), (5, 6))


def rng_vector(rng: np.random.Generator) -> list[float]:
    return list(rng.normal(size=DIM))


def same_as_exact(backend: SqliteSearch, agent: str = "a", seeds: range = range(3)) -> None:
    where = f"m.agent_id = '{agent}'"
    for seed in seeds:
        q = to_blob(rng_vector(np.random.default_rng(700 + seed)))
        for window in WINDOWS:
            # depth 400: every row of the window comes back, so a misplaced row or edge shows
            params = scan_parameters(q, window=window, threshold=-1.0, depth=400)
            exact = backend._vector_scan("mem", where, dict(params), q)
            copy = backend._process_index_scan("mem", Scope(agent_id=agent), "", where, dict(params), q)
            assert copy == exact, (agent, window)


def test_stamps_as_digits_keep_the_text_and_its_order():
    rng = np.random.default_rng(3)
    texts = sorted({stamp(int(i)) for i in rng.integers(-(10**9), 10**9, 400)})
    values = vector_index_sqlite._encode([t.encode() for t in texts], vector_index_sqlite._STAMP)
    assert values is not None
    assert [vector_index_sqlite._stamp_text(v) for v in values] == texts
    assert list(values) == sorted(values)
    for other in ("2026-06-01T10:00:00", "2026-06-01 10:00:00.5", "", "2026-06-01 10:0a:00", "２０２６-06-01 10:00"):
        assert vector_index_sqlite._encode([texts[0].encode(), other.encode()], vector_index_sqlite._STAMP) is None


def test_stamps_of_other_forms_after_the_load_keep_the_window_exact(two):  # spec VEC-2, VEC-7
    writer, reader = two
    rng = np.random.default_rng(11)
    add_memories(
        writer, *({"content": f"r{i}", "embedding": rng_vector(rng), "created_at": stamp(i)} for i in range(120))
    )
    backend = SqliteSearch(reader)
    same_as_exact(backend)  # loads the copy: SQLite's own stamps only
    # ISO stamps with a T and an offset, fractions, an empty one: they sort among the others as text
    others = [
        stamp(30).replace(" ", "T") + "+00:00",
        stamp(60) + ".250",
        "",
        stamp(200).replace(" ", "T"),
        stamp(45) + ".5",
    ]
    add_memories(
        writer, *({"content": f"o{i}", "embedding": rng_vector(rng), "created_at": s} for i, s in enumerate(others))
    )
    add_memories(
        writer, *({"content": f"s{i}", "embedding": rng_vector(rng), "created_at": stamp(3 * i)} for i in range(40))
    )
    same_as_exact(backend)
    assert loads(reader) == 1  # applied from the change log, not loaded again


def test_a_load_that_meets_another_form_of_stamp_half_way_keeps_the_window_exact(two, monkeypatch):
    writer, reader = two
    monkeypatch.setattr(vector_index_sqlite, "_LOAD_CHUNK", 16)  # the odd stamps arrive in a later chunk
    rng = np.random.default_rng(12)
    rows = [{"content": f"r{i}", "embedding": rng_vector(rng), "created_at": stamp(i)} for i in range(150)]
    rows[97]["created_at"] = stamp(97).replace(" ", "T") + "Z"  # loaded after 6 chunks of SQLite stamps
    add_memories(writer, *rows)
    same_as_exact(SqliteSearch(reader))


def test_more_agents_than_a_byte_of_codes_keeps_each_scope_its_own(two, monkeypatch):  # spec ISO-2
    writer, reader = two
    rng = np.random.default_rng(13)
    rows = []
    for i in range(300 * 3):
        rows.append(
            {"agent_id": f"agent{i % 300}", "content": f"t{i}", "embedding": rng_vector(rng), "created_at": stamp(i)}
        )
    ids = add_memories(writer, *rows)
    owner = {row_id: row["agent_id"] for row_id, row in zip(ids, rows)}
    backend = SqliteSearch(reader)
    for agent in ("agent0", "agent254", "agent255", "agent256", "agent299"):
        q = to_blob(rng_vector(rng))
        params = scan_parameters(q, window=(0, 10**9), threshold=-1.0, depth=10)
        where = f"m.agent_id = '{agent}'"
        copy = backend._process_index_scan("mem", Scope(agent_id=agent), "", where, dict(params), q)
        assert len(copy) == 3 and {owner[i] for _, i in copy} == {agent}
        assert copy == backend._vector_scan("mem", where, dict(params), q)
    # and the same once more agents arrive after the load (the codes widen in place)
    more = [
        {"agent_id": f"late{i}", "content": f"l{i}", "embedding": rng_vector(rng), "created_at": stamp(5000 + i)}
        for i in range(70000 // 1000)
    ]
    add_memories(writer, *more)
    same_as_exact(backend, agent="late3")
    same_as_exact(backend, agent="agent256", seeds=range(1))


def test_a_far_list_found_block_by_block_gets_the_walks_candidates(two, monkeypatch):  # spec VEC-7, ISO-2
    # Many blocks, few candidate places, and few sign patterns: rows tie on distance inside and
    # across blocks, and the bound on what later blocks keep tightens several times.
    writer, reader = two
    monkeypatch.setattr(vector_index_sqlite, "_BLOCK", 64)
    from cpersona.storage import coarse_sqlite

    monkeypatch.setattr(coarse_sqlite, "MIN_CANDIDATES", 30)
    rng = np.random.default_rng(17)
    patterns = np.sign(rng.normal(size=(8, DIM)))
    rows = [
        {
            "agent_id": "ab"[i % 3 == 2],
            "content": f"t{i}",
            "embedding": list(patterns[i % 8] * rng.uniform(0.1, 1.0, DIM) + (rng.normal(size=DIM) if i % 2 else 0)),
            "created_at": stamp(i % 500),
        }
        for i in range(1500)
    ]
    add_memories(writer, *rows)
    backend = SqliteSearch(reader)
    # some rows placed after the load, so blocks past the loaded rows compare added ranks
    for window in ((10, 10**9), (0, 10**9), (700, 10**9)):
        for seed in range(4):
            q = to_blob(rng_vector(np.random.default_rng(900 + seed)))
            params = scan_parameters(q, window=window, threshold=-1.0, depth=5)
            copy = backend._process_index_scan("mem", Scope(agent_id="a"), "", "m.agent_id = 'a'", dict(params), q)
            with monkeypatch.context() as patch:
                patch.setattr(backend, "_process_index_scan", lambda *args: None)
                walked = backend._coarse_scan("mem", Scope(agent_id="a"), "", "m.agent_id = 'a'", dict(params), q)
            assert copy == walked and len(copy) == 5, (window, seed)
        add_memories(
            writer,
            *(
                {"content": f"late{window[0]}-{i}", "embedding": rng_vector(rng), "created_at": stamp(3 * i)}
                for i in range(90)
            ),
        )
