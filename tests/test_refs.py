"""What each reader of a record ref accepts (spec associations §0.3, GC-3, A-12/A-17, VF-7, IM-9).

Three places read ``mem:<id>`` / ``ep:<id>`` and the spec lets them differ:

- get_contents (memory-and-recall GC-3): the string exactly as sent; leading
  zeros read through; id 0 or beyond signed 64-bit is malformed (missing).
- declare_associations / traverse (associations §0.3, A-3, A-12, A-17): the
  declared text is trimmed first; leading zeros read through; an overflowing
  id still makes the string a ref (never an entity name) that names nothing.
- the graph records of an export file, import and merge (storage VF-7, admin
  IM-9, MG-6): refs are stored canonical, so only the canonical spelling is
  read; the id is the *file's* record id, compared with the file's own ids,
  so no range applies.

The table pins each reader's answer for the same inputs, so the one parser
behind them (services/refs.py) cannot quietly widen or narrow any of them.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from cpersona.services.graph import associations
from cpersona.services.records import contents
from cpersona.services.portability.graph import RefMap

MAX = 2**63 - 1
PAD_64 = "mem:" + "0" * 59 + "7"  # exactly 64 characters
PAD_65 = "mem:" + "0" * 60 + "7"
LONG_DIGITS = "9" * 30

# input: (get_contents, associations (kind, id, in_range), graph (kind, id))
CASES: list[tuple[Any, Any, Any, Any]] = [
    ("mem:12", ("mem", 12), ("mem", 12, True), ("mem", 12)),
    ("ep:3", ("ep", 3), ("ep", 3, True), ("ep", 3)),
    ("mem:1", ("mem", 1), ("mem", 1, True), ("mem", 1)),
    # leading zeros: read through, except in the canonical graph records (VF-7)
    ("mem:01", ("mem", 1), ("mem", 1, True), None),
    ("ep:007", ("ep", 7), ("ep", 7, True), None),
    (PAD_64, ("mem", 7), ("mem", 7, True), None),
    (PAD_65, None, ("mem", 7, True), None),  # get_contents does not scan past 64 characters
    # zero and the signed 64-bit bound (GC-3; §0.3: an overflowing id names nothing)
    ("mem:0", None, ("mem", 0, False), ("mem", 0)),
    ("mem:00", None, ("mem", 0, False), None),
    (f"mem:{MAX}", ("mem", MAX), ("mem", MAX, True), ("mem", MAX)),
    (f"ep:{MAX + 1}", None, ("ep", MAX + 1, False), ("ep", MAX + 1)),
    (f"mem:{LONG_DIGITS}", None, ("mem", int(LONG_DIGITS), False), ("mem", int(LONG_DIGITS))),
    # surrounding whitespace: only declared text is trimmed
    (" mem:5", None, ("mem", 5, True), None),
    ("mem:5 ", None, ("mem", 5, True), None),
    ("\tmem:5\n", None, ("mem", 5, True), None),
    ("\u00a0mem:5\u3000", None, ("mem", 5, True), None),
    (" " * 315 + "mem:5", None, ("mem", 5, True), None),  # 320 characters: still read
    (" " * 316 + "mem:5", None, None, None),  # 321: longer than any trimmed declared text
]

# Malformed for every reader: signs, inner spaces, non-ASCII digits, other kinds, not strings.
NEVER = [
    "mem: 5",
    "mem:5 6",
    "mem:-1",
    "mem:+1",
    "mem:1.0",
    "mem:1e3",
    "mem:1_000",
    "mem:0x1",
    "mem:\u0661",
    "mem:\uff11",
    "mem:\u00b2",
    "MEM:1",
    "Mem:1",
    "mem:",
    ":1",
    "mem1",
    "memory:1",
    "m:1",
    "episode:1",
    "ep-1",
    "mem:1:2",
    "mem::1",
    "",
    "   ",
    "mem:5\x00",
    None,
    1,
    0,
    True,
    False,
    1.0,
    b"mem:1",
    ["mem:1"],
    {"ref": "mem:1"},
    ("mem", 1),
]


def _associations(value: Any) -> tuple[str, int, bool] | None:
    ref = associations.parse_ref(value)
    return None if ref is None else (ref.kind, ref.id, ref.in_range)


def _graph(value: Any) -> tuple[str, int] | None:
    """What the graph reader made of ``value``, observed through a RefMap only.

    Every (kind, id) a lenient reading could give is registered as a restored
    record; the ref is then re-pointed. A ref the reader refused re-points to
    nothing; an accepted one to the row registered for exactly its (kind, id).
    """
    refs = RefMap()
    refs.want_from({"ref": value})
    candidates: list[tuple[str, int]] = []
    if isinstance(value, str):
        loose = re.fullmatch(r"\s*(mem|ep):([0-9]+)\s*", value)
        if loose:
            candidates.append((loose.group(1), int(loose.group(2))))
    for n, (kind, ident) in enumerate(candidates, start=1000):
        refs.record(kind, ident, n)
    pointed = refs.repoint(value)
    if pointed is None:
        return None
    kind, _, new_id = pointed.partition(":")
    return next(c for n, c in enumerate(candidates, start=1000) if c[0] == kind and n == int(new_id))


@pytest.mark.parametrize(("value", "for_contents", "for_associations", "for_graph"), CASES)
def test_each_reader_of_a_ref(value: Any, for_contents: Any, for_associations: Any, for_graph: Any) -> None:
    # spec GC-3 (get_contents), §0.3 + A-3 (associations), VF-7 + IM-9 (graph records)
    assert contents.parse_ref(value) == for_contents
    assert _associations(value) == for_associations
    assert _graph(value) == for_graph


@pytest.mark.parametrize("value", NEVER, ids=repr)
def test_malformed_for_every_reader(value: Any) -> None:  # spec GC-3, §0.3
    assert contents.parse_ref(value) is None
    assert associations.parse_ref(value) is None
    assert _graph(value) is None


def test_the_graph_reader_also_reads_the_anchor() -> None:  # spec IM-9: every ref is re-pointed
    refs = RefMap()
    refs.want_from({"anchor_ref": "ep:4", "ref": "mem:007"})
    assert refs.wants("ep", 4) and not refs.wants("mem", 7)
    refs.record("ep", 4, 40)
    assert refs.repoint("ep:4") == "ep:40"


def test_associations_keep_the_canonical_spelling() -> None:  # spec §0.3: mem:007 is stored as mem:7
    assert associations.parse_ref(" ep:0042 ").canonical == "ep:42"


def test_a_graph_ref_too_long_to_convert_names_nothing(app, db, tmp_path) -> None:
    # spec IM-9: an item naming a record that was not restored is dropped and
    # summarised. A ref of more digits than Python converts to an int (no JSON
    # id can be that long) used to stop the whole import with a ValueError.
    from test_export_import import mem, write_jsonl
    from test_import_db import add_graph_tables_to

    from cpersona.services.portability import import_memories

    add_graph_tables_to(db)
    source = write_jsonl(
        tmp_path / "in.jsonl",
        mem("kept", id=10),
        {
            "_type": "entity",
            "id": 5,
            "agent_id": "alice",
            "project_id": "",
            "channel": "",
            "name": "Robert",
            "declared_by": "agent",
            "created_at": "t",
            "aliases": [],
        },
        {"_type": "mention", "entity": 5, "ref": "mem:" + "1" * 5000, "declared_by": "agent", "created_at": "t"},
        {"_type": "mention", "entity": 5, "ref": "mem:10", "declared_by": "agent", "created_at": "t"},
    )
    answer = import_memories(app, input_path=str(source))
    assert answer["ok"] is True and answer["imported_memories"] == 1
    assert answer["associations"] == {"entities": 1, "mentions": 1, "relations": 0}
    assert answer["errors"][-1].startswith("1 association items were not carried (0 entities, 1 mentions")


def test_ref_key_reads_only_what_the_server_writes() -> None:
    """reconstruct's walk and fetch split stored refs with refs.ref_key, not a second parser."""
    from cpersona.services.refs import ref_key

    assert ref_key("mem:12") == ("mem", 12) and ref_key("ep:3") == ("ep", 3)
    for bad in ("mem:012", " mem:1", "mem:-1", "note:4", "mem:"):
        with pytest.raises(ValueError):
            ref_key(bad)
