"""Every statement the health checks run (services/health/*), in one storage module of their own.

The checks decide what is wrong and what a repair does; these functions read
and write the rows. A function taking ``agent_id`` applies the agent axis
through the isolation module ('' = the whole database).

Sections follow the check families: stats (H-11), content (checks 1-4),
derived nodes, embeddings (5-10), integrity (11-15), hygiene (16-29), deep check.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from sqlalchemy import Connection, Engine, inspect, text

from cpersona.storage import dialect
from cpersona.storage.engine import sqlite_module
from cpersona.storage.repositories.base import chunks
from cpersona.storage.scope import Scope, sql_fragment
from cpersona.storage.tables import RELATION_KEY

AXIS_VALUES = 20  # values shown per axis, most rows first
GLOBAL = "(global)"


# -- stats: counts and axis distributions, never issues (H-11) ----------------------------------


def _count(conn: Connection, table: str, where: str, params: dict[str, Any]) -> int:
    return int(conn.execute(text(f"SELECT COUNT(*) FROM {table} WHERE {where}"), params).scalar() or 0)


def _axis(conn: Connection, column: str, where: str, params: dict[str, Any]) -> dict[str, int]:
    rows = conn.execute(
        text(
            f"SELECT {column} AS v, COUNT(*) AS n FROM memories WHERE {where} GROUP BY {column} "
            f"ORDER BY n DESC, {column} LIMIT {AXIS_VALUES}"
        ),
        params,
    )
    return {(r.v if r.v else GLOBAL): r.n for r in rows}


def db_size_bytes(conn: Connection) -> int:
    if conn.dialect.name == "postgresql":
        return int(conn.exec_driver_sql("SELECT pg_database_size(current_database())").scalar() or 0)
    try:
        pages = conn.exec_driver_sql("PRAGMA page_count").scalar() or 0
        size = conn.exec_driver_sql("PRAGMA page_size").scalar() or 0
    except Exception:  # noqa: BLE001 — unavailable (another dialect): 0 as specified
        return 0
    return int(pages) * int(size)


def storage_stats(conn: Connection, agent_id: str) -> dict[str, Any]:
    where, params = sql_fragment(Scope(agent_id=agent_id or None))
    memories = _count(conn, "memories", where, params)
    episodes = _count(conn, "episodes", where, params)
    out: dict[str, Any] = {
        "db_size_bytes": db_size_bytes(conn),
        "memories": memories,
        "episodes": episodes,
        "profiles": _count(conn, "profiles", where, params),
        "pending_tasks": _count(conn, "pending_memory_tasks", where, params),
        "axes": {
            "project_id": _axis(conn, "project_id", where, params),
            "channel": _axis(conn, "channel", where, params),
        },
    }
    if agent_id:
        out["agent_memories"] = memories
        out["agent_episodes"] = episodes
    return out


def _agent_where(agent_id: str, alias: str = "") -> tuple[str, dict[str, Any]]:
    """The agent predicate for agent-scoped data ('' = every agent)."""
    return sql_fragment(Scope(agent_id=agent_id or None), alias)


def _rows(conn: Connection, sql: str, **params: Any) -> list[Any]:
    return list(conn.execute(text(sql), params))


def _scalar(conn: Connection, sql: str, **params: Any) -> Any:
    return conn.execute(text(sql), params).scalar()


def _run(conn: Connection, sql: str, **params: Any) -> int:
    return conn.execute(text(sql), params).rowcount


# -- content (checks 1-4): rewrites, folds, deletions --------------------------------------------


def repoint_declarations(conn: Connection, old_id: int, new_id: int) -> None:
    """Move declarations naming mem:old onto mem:new (before old is deleted)."""
    if old_id == new_id or not dialect.has_object(conn, "table", "relations"):
        return
    old, new = f"mem:{old_id}", f"mem:{new_id}"
    # A row whose moved copy would collide with one the survivor already carries
    # stays put (what SQLite's UPDATE OR IGNORE did, spelled for every engine);
    # the deletion trigger removes it with the old row afterwards.
    _run(
        conn,
        "UPDATE entity_mentions SET ref = :new WHERE ref = :old AND NOT EXISTS (SELECT 1 FROM entity_mentions t "
        "WHERE t.entity_id = entity_mentions.entity_id AND t.ref = :new)",
        old=old,
        new=new,
    )
    _repoint_relations(conn, "subject_id", "subject_kind = 'mem' AND subject_id = :old", old=old_id, new=new_id)
    _repoint_relations(conn, "object_id", "object_kind = 'mem' AND object_id = :old", old=old_id, new=new_id)
    _repoint_relations(conn, "anchor_ref", "anchor_ref = :old", old=old, new=new)


def _repoint_relations(conn: Connection, column: str, where: str, **params: Any) -> None:
    same = " AND ".join(f"t.{c} = relations.{c}" for c in RELATION_KEY if c != column)
    _run(
        conn,
        f"UPDATE relations SET {column} = :new WHERE {where} "
        f"AND NOT EXISTS (SELECT 1 FROM relations t WHERE t.{column} = :new AND {same})",
        **params,
    )


def delete_unlocked_memories(
    conn: Connection, ids: list[int], *, owners: set[tuple[str, int, str]] | None = None
) -> int:
    """Delete the unlocked rows among ``ids`` (chunked); rows removed.

    With ``owners``, each deleted row's (``"mem"``, id, agent) is added to it first
    (read before the rows go).
    """
    deleted = 0
    for chunk in chunks(ids):
        marks = ", ".join(str(int(i)) for i in chunk)
        if owners is not None:
            owners.update(
                ("mem", r.id, r.agent_id)
                for r in _rows(conn, f"SELECT id, agent_id FROM memories WHERE locked = 0 AND id IN ({marks})")
            )
        deleted += _run(conn, f"DELETE FROM memories WHERE locked = 0 AND id IN ({marks})")
    return deleted


def memory_bucket(conn: Connection, row_id: int) -> Any:
    """(agent_id, project_id, channel, locked) of the row, or None."""
    found = _rows(conn, "SELECT agent_id, project_id, channel, locked FROM memories WHERE id = :i", i=row_id)
    return found[0] if found else None


def twin_of(conn: Connection, agent_id: str, project_id: str, channel: str, content: str, row_id: int) -> int | None:
    """Another row of the exact bucket already holding ``content`` (a locked one first, then lowest id)."""
    return _scalar(
        conn,
        "SELECT id FROM memories WHERE agent_id = :a AND project_id = :p AND channel = :c AND content = :t "
        "AND id != :i ORDER BY locked DESC, id LIMIT 1",
        a=agent_id,
        p=project_id,
        c=channel,
        t=content,
        i=row_id,
    )


def delete_unlocked_memory(conn: Connection, row_id: int) -> int:
    return _run(conn, "DELETE FROM memories WHERE id = :i AND locked = 0", i=row_id)


def rewrite_unlocked_memory(conn: Connection, row_id: int, content: str) -> int:
    """New text for an unlocked row, its vector cleared for the re-embed pass."""
    return _run(
        conn, "UPDATE memories SET content = :t, embedding = NULL WHERE id = :i AND locked = 0", t=content, i=row_id
    )


def memory_content(conn: Connection, row_id: int) -> str | None:
    return _scalar(conn, "SELECT content FROM memories WHERE id = :i", i=row_id)


def memories_containing(conn: Connection, agent_id: str, needle: str) -> list[Any]:
    """(id, content, locked) of the rows whose text contains ``needle`` (a plain substring)."""
    where, params = _agent_where(agent_id)
    return _rows(
        conn,
        f"SELECT id, content, locked FROM memories WHERE {where} "
        f"AND {dialect.position(conn, 'content', ':needle')} > 0",
        needle=needle,
        **params,
    )


def oversized_counts(conn: Connection, agent_id: str, cap: int) -> Any:
    """(n, unlocked) of the rows longer than ``cap``."""
    where, params = _agent_where(agent_id)
    return _rows(
        conn,
        f"SELECT COUNT(*) AS n, COALESCE({dialect.count_if('locked = 0')}, 0) AS unlocked "
        f"FROM memories WHERE {where} AND length(content) > :cap",
        cap=cap,
        **params,
    )[0]


def oversized_unlocked_ids(conn: Connection, agent_id: str, cap: int) -> list[int]:
    where, params = _agent_where(agent_id)
    return [
        r.id
        for r in _rows(
            conn, f"SELECT id FROM memories WHERE {where} AND locked = 0 AND length(content) > :cap", cap=cap, **params
        )
    ]


def duplicated_rows(conn: Connection, agent_id: str) -> list[Any]:
    """(id, agent_id, project_id, channel, content, locked) of rows whose (agent, project, content) repeats."""
    where, params = _agent_where(agent_id, "m")
    return _rows(
        conn,
        f"SELECT m.id, m.agent_id, m.project_id, m.channel, m.content, m.locked FROM memories m "
        f"JOIN (SELECT agent_id, project_id, content FROM memories GROUP BY agent_id, project_id, content "
        f"HAVING COUNT(*) > 1) g ON g.agent_id = m.agent_id AND g.project_id = m.project_id "
        f"AND g.content = m.content WHERE {where} ORDER BY m.id",
        **params,
    )


# -- derived nodes (check 37) ------------------------------------------------------------------

_TEXT_TABLES = {"mem": ("memories", "content"), "ep": ("episodes", "summary")}


def texts_to_measure(conn: Connection, kind: str, agent_id: str, limit: int) -> list[Any]:
    """(id, agent_id, project_id, body) of up to ``limit`` rows of ``kind`` with nonempty text, by id."""
    table, column = _TEXT_TABLES[kind]
    where, params = _agent_where(agent_id)
    return _rows(
        conn,
        f"SELECT id, agent_id, project_id, {column} AS body FROM {table} "
        f"WHERE {where} AND length({column}) > 0 ORDER BY id LIMIT :cap",
        cap=limit,
        **params,
    )


def noded_parents(conn: Connection, kind: str) -> set[int]:
    """Ids of the ``kind`` records that have any node row."""
    return {r[0] for r in _rows(conn, "SELECT DISTINCT parent_id FROM record_nodes WHERE parent_kind = :k", k=kind)}


# -- embeddings (checks 5-10) --------------------------------------------------------------------

VECTOR_TABLES = {"memories": "content", "episodes": "summary"}  # table -> the text its vector is made from


def local_vector_counts(conn: Connection, agent_id: str) -> Any:
    """(n, e): memories, and memories carrying a local vector."""
    where, params = _agent_where(agent_id)
    return _rows(
        conn,
        f"SELECT COUNT(*) AS n, COALESCE({dialect.count_if('embedding IS NOT NULL')}, 0) AS e "
        f"FROM memories WHERE {where}",
        **params,
    )[0]


def null_vector_rows(conn: Connection, table: str, agent_id: str, limit: int) -> list[Any]:
    """(id, body) of up to ``limit`` rows without a vector, by id."""
    where, params = _agent_where(agent_id)
    return _rows(
        conn,
        f"SELECT id, {VECTOR_TABLES[table]} AS body FROM {table} WHERE embedding IS NULL "
        f"AND {where} ORDER BY id LIMIT :n",
        n=limit,
        **params,
    )


def wrong_width_count(conn: Connection, table: str, agent_id: str, width_bytes: int) -> int:
    where, params = _agent_where(agent_id)
    return int(
        _scalar(
            conn,
            f"SELECT COUNT(*) FROM {table} WHERE {where} AND embedding IS NOT NULL AND length(embedding) != :w",
            w=width_bytes,
            **params,
        )
    )


def clear_wrong_width(conn: Connection, table: str, agent_id: str, width_bytes: int) -> int:
    where, params = _agent_where(agent_id)
    return _run(
        conn,
        f"UPDATE {table} SET embedding = NULL WHERE {where} AND embedding IS NOT NULL AND length(embedding) != :w",
        w=width_bytes,
        **params,
    )


def vector_page(conn: Connection, table: str, agent_id: str, after: int, page: int) -> list[Any]:
    """(id, embedding) of the next ``page`` rows with a vector past id ``after``."""
    where, params = _agent_where(agent_id)
    return _rows(
        conn,
        f"SELECT id, embedding FROM {table} WHERE {where} AND embedding IS NOT NULL "
        f"AND id > :after ORDER BY id LIMIT {int(page)}",
        after=after,
        **params,
    )


def clear_vectors(conn: Connection, table: str, ids: list[int]) -> None:
    for chunk in chunks(ids):
        marks = ", ".join(str(int(i)) for i in chunk)
        _run(conn, f"UPDATE {table} SET embedding = NULL WHERE id IN ({marks})")


def labelled_tables(conn: Connection) -> list[str]:
    """The vector tables that carry an ``embedding_model`` column."""
    inspector = inspect(conn)
    return [t for t in VECTOR_TABLES if any(c["name"] == "embedding_model" for c in inspector.get_columns(t))]


def foreign_labels(conn: Connection, table: str, agent_id: str, accepted: set[str]) -> list[Any]:
    """(label, n) of vectors stamped with a model label outside ``accepted`` (nonempty)."""
    where, params = _agent_where(agent_id)
    marks = ", ".join(f":a{i}" for i in range(len(accepted)))
    bind = {f"a{i}": v for i, v in enumerate(sorted(accepted))}
    return _rows(
        conn,
        f"SELECT embedding_model AS label, COUNT(*) AS n FROM {table} WHERE {where} "
        f"AND embedding IS NOT NULL AND embedding_model != '' AND embedding_model NOT IN ({marks}) "
        f"GROUP BY embedding_model",
        **params,
        **bind,
    )


def null_vector_counts(conn: Connection, table: str, agent_id: str) -> Any:
    """(total, nulls) of the table's rows."""
    where, params = _agent_where(agent_id)
    return _rows(
        conn,
        f"SELECT COUNT(*) AS total, COALESCE({dialect.count_if('embedding IS NULL')}, 0) AS nulls "
        f"FROM {table} WHERE {where}",
        **params,
    )[0]


# -- integrity (checks 11-15): FTS, schema objects, the file -------------------------------------


def _fts_integrity_statements(fts: str) -> tuple[str, str]:
    return (
        f"INSERT INTO {fts} ({fts}, rank) VALUES ('integrity-check', 1)",
        f"INSERT INTO {fts} ({fts}) VALUES ('integrity-check')",
    )


def _fts_verifies_with(execute: Callable[[str], Any], fts: str) -> bool:
    """True when the index verifies; a structural check stands in where the content form fails to run."""
    full, structural = _fts_integrity_statements(fts)
    try:
        execute(full)
        return True
    except Exception as exc:  # noqa: BLE001 — the message tells corruption from "unsupported"
        message = str(exc).lower()
        if "corrupt" in message or "malformed" in message:
            return False
        if "readonly" in message:
            # A read-only open (the report-only checkup, CLI-3) cannot run the command at all:
            # unavailable, so skipped rather than read as a damaged index.
            return True
    try:
        execute(structural)
    except Exception:  # noqa: BLE001
        return False
    return True


def fts_verifies_alone(engine: Engine, fts: str) -> bool:
    """The FTS integrity command on a connection of its own (report runs).

    The statement opens an implicit write transaction; on its own autocommit
    connection it ends with the statement instead of holding the lock for the run.
    """
    raw = engine.raw_connection()
    try:
        return _fts_verifies_with(lambda sql: raw.driver_connection.execute(sql), fts)
    finally:
        raw.close()


def fts_verifies(conn: Connection, fts: str) -> bool:
    """The FTS integrity command inside the run's transaction, each attempt in a savepoint (fix runs)."""

    def execute(sql: str) -> None:
        with conn.begin_nested():
            conn.exec_driver_sql(sql)

    return _fts_verifies_with(execute, fts)


def rebuild_fts(conn: Connection, fts: str, create_sql: str) -> None:
    """Create the FTS table if missing and rebuild its index from the content table, in a savepoint."""
    with conn.begin_nested():
        conn.exec_driver_sql(create_sql)
        conn.exec_driver_sql(f"INSERT INTO {fts} ({fts}) VALUES ('rebuild')")


def blank_colliding_msg_ids(conn: Connection) -> None:
    """Every agent: keep the msg_id of the highest-id locked row (else the highest id) per
    (agent, project, msg_id) and blank it on the other unlocked rows. No row is deleted."""
    _run(
        conn,
        "UPDATE memories SET msg_id = '' WHERE locked = 0 AND msg_id != '' AND id != ("
        " SELECT k.id FROM memories k WHERE k.agent_id = memories.agent_id AND k.project_id = memories.project_id"
        " AND k.msg_id = memories.msg_id ORDER BY k.locked DESC, k.id DESC LIMIT 1)",
    )


def create_object(conn: Connection, create_sql: str, *, replacing: tuple[str, str] | None = None) -> None:
    """Run one canonical CREATE (index or trigger) in a savepoint, first dropping ``replacing`` (kind, name).

    A failure undoes the drop too, so a previous definition stays in place.
    """
    with conn.begin_nested():
        if replacing is not None:
            kind, name = replacing
            conn.exec_driver_sql(f"DROP {kind.upper()} IF EXISTS {name}")
        conn.exec_driver_sql(create_sql)


def stored_definition(conn: Connection, kind: str, name: str) -> str | None:
    """The SQL SQLite keeps for an index or trigger, or None when it does not exist."""
    return _scalar(conn, "SELECT sql FROM sqlite_master WHERE type = :k AND name = :n", k=kind, n=name)


_DUPLICATE_GROUPS = {
    "idx_memories_dedup_content": (
        "SELECT COUNT(*) FROM (SELECT 1 FROM memories GROUP BY agent_id, project_id, channel, content "
        "HAVING COUNT(*) > 1)"
    ),
    "idx_memories_dedup_msg_id": (
        "SELECT COUNT(*) FROM (SELECT 1 FROM memories WHERE msg_id != '' "
        "GROUP BY agent_id, project_id, msg_id HAVING COUNT(*) > 1)"
    ),
}


def duplicate_groups(conn: Connection, index_name: str) -> int:
    """Row groups that would violate the unique dedup index ``index_name`` (0 for any other index)."""
    sql = _DUPLICATE_GROUPS.get(index_name)
    return int(_scalar(conn, sql)) if sql is not None else 0


def quick_check(conn: Connection) -> list[str]:
    return [str(r[0]) for r in _rows(conn, "PRAGMA quick_check")]


def quick_check_file(path: Any) -> list[str]:
    """PRAGMA quick_check on a fresh read-only connection to the file (no stale structure cache)."""
    module = sqlite_module()
    conn = module.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return [str(r[0]) for r in conn.execute("PRAGMA quick_check").fetchall()]
    finally:
        conn.close()


# -- hygiene (checks 16-29): naming, JSON, timestamps, queue, profiles, sources ------------------

HYGIENE_PAGE = 1000


def sentinel_sql(conn: Any) -> str:
    """The anonymous User sentinel (R-41, DC-5): type User, empty id and name, nothing else."""
    j = dialect.JsonSql(conn)
    return (
        f"({j.valid('source')} AND {j.type_is('source', 'object')} "
        f"AND {j.text_at('source', 'type')} = 'User' AND {j.text_at('source', 'id')} = '' "
        f"AND {j.text_at('source', 'name')} = '' AND {j.key_count('source')} = 3)"
    )


def unattributed_sql(conn: Any) -> str:
    j = dialect.JsonSql(conn)
    return (
        f"({j.valid('source')} AND ({j.type_is('source', 'null')} OR ({j.type_is('source', 'object')} "
        f"AND {j.key_count('source')} = 0)))"
    )


def _bad_type_sql(conn: Any) -> str:
    j = dialect.JsonSql(conn)
    return (
        f"{j.valid('source')} AND NOT {unattributed_sql(conn)} "
        f"AND (NOT {j.type_is('source', 'object')} OR {j.type_is_not('source', 'text', 'type')} "
        f"OR {j.text_at('source', 'type')} NOT IN ('User', 'Agent', 'System'))"
    )


def _paged(conn: Connection, sql: str, **params: Any) -> Iterator[Any]:
    """Rows of ``sql`` (which must select id and filter ``id > :after``) a page at a time."""
    after = 0
    while True:
        rows = _rows(conn, f"{sql} ORDER BY id LIMIT {HYGIENE_PAGE}", after=after, **params)
        if not rows:
            return
        yield from rows
        after = rows[-1].id


def project_counts(conn: Connection, agent_id: str) -> list[Any]:
    """(project_id, n) of every nonempty project, most rows first."""
    where, params = _agent_where(agent_id)
    return _rows(
        conn,
        f"SELECT project_id, COUNT(*) AS n FROM memories WHERE {where} AND project_id != '' "
        f"GROUP BY project_id ORDER BY n DESC, project_id",
        **params,
    )


def invalid_json_counts(conn: Connection, agent_id: str) -> Any:
    """(s, m, u): rows with invalid source JSON, with invalid metadata JSON, unlocked rows with either."""
    where, params = _agent_where(agent_id)
    j = dialect.JsonSql(conn)
    bad_source, bad_metadata = f"NOT {j.valid('source')}", f"NOT {j.valid('metadata')}"
    return _rows(
        conn,
        f"SELECT COALESCE({dialect.count_if(bad_source)}, 0) AS s, "
        f"COALESCE({dialect.count_if(bad_metadata)}, 0) AS m, "
        f"COALESCE({dialect.count_if(f'locked = 0 AND ({bad_source} OR {bad_metadata})')}, 0) AS u "
        f"FROM memories WHERE {where}",
        **params,
    )[0]


def invalid_json_rows(conn: Connection, agent_id: str) -> list[Any]:
    """(id, source, metadata, vs, vm) of unlocked rows with invalid JSON (vs, vm: each field valid)."""
    where, params = _agent_where(agent_id)
    j = dialect.JsonSql(conn)
    return _rows(
        conn,
        f"SELECT id, source, metadata, {j.valid('source')} AS vs, {j.valid('metadata')} AS vm "
        f"FROM memories WHERE {where} AND locked = 0 "
        f"AND (NOT {j.valid('source')} OR NOT {j.valid('metadata')})",
        **params,
    )


def set_source_and_metadata(conn: Connection, row_id: int, source: str, metadata: str) -> int:
    return _run(
        conn,
        "UPDATE memories SET source = :s, metadata = :m WHERE id = :i AND locked = 0",
        s=source,
        m=metadata,
        i=row_id,
    )


def engine_reads_instant(conn: Connection, stamp: str) -> bool:
    """Whether the engine's own instant parser reads ``stamp``."""
    return bool(_scalar(conn, f"SELECT {dialect.instant(conn, ':s')} IS NOT NULL", s=stamp))


def checked_memory_stamps(conn: Connection, agent_id: str) -> Iterator[Any]:
    """(id, timestamp, created_at, locked, sq) of rows with a timestamp; sq: the engine reads it."""
    where, params = _agent_where(agent_id)
    return _paged(
        conn,
        f"SELECT id, timestamp, created_at, locked, {dialect.instant(conn, 'timestamp')} IS NOT NULL "
        f"AS sq FROM memories WHERE {where} AND id > :after AND timestamp != ''",
        **params,
    )


def memory_stamps(conn: Connection, agent_id: str) -> Iterator[Any]:
    """(id, timestamp, created_at, locked) of rows with a timestamp, by id."""
    where, params = _agent_where(agent_id)
    return _paged(
        conn,
        f"SELECT id, timestamp, created_at, locked FROM memories WHERE {where} AND id > :after AND timestamp != ''",
        **params,
    )


def set_memory_timestamp(conn: Connection, row_id: int, stamp: str) -> int:
    return _run(conn, "UPDATE memories SET timestamp = :t WHERE id = :i AND locked = 0", t=stamp, i=row_id)


def episodes_without_start(conn: Connection, agent_id: str) -> list[Any]:
    """(id, created_at) of episodes with no start_time."""
    where, params = _agent_where(agent_id)
    return _rows(
        conn, f"SELECT id, created_at FROM episodes WHERE {where} AND (start_time IS NULL OR start_time = '')", **params
    )


def episode_stamps(conn: Connection, agent_id: str) -> Iterator[Any]:
    """(id, start_time, end_time, created_at) of every episode, by id."""
    where, params = _agent_where(agent_id)
    return _paged(
        conn, f"SELECT id, start_time, end_time, created_at FROM episodes WHERE {where} AND id > :after", **params
    )


def set_episode_stamp(conn: Connection, row_id: int, column: str, stamp: str) -> int:
    if column not in ("start_time", "end_time"):
        raise ValueError(f"not an episode time column: {column}")
    return _run(conn, f"UPDATE episodes SET {column} = :t WHERE id = :i", t=stamp, i=row_id)


def _older_tasks(conn: Connection, agent_id: str, cutoff: str) -> tuple[str, dict[str, Any]]:
    where, params = _agent_where(agent_id)
    older = f"{dialect.instant(conn, 'created_at')} < {dialect.instant(conn, ':cutoff')}"
    return f"{where} AND {older}", {**params, "cutoff": cutoff}


def tasks_older_than(conn: Connection, agent_id: str, cutoff: str) -> int:
    """Queue rows created before ``cutoff`` (server-clock form)."""
    where, params = _older_tasks(conn, agent_id, cutoff)
    return int(_scalar(conn, f"SELECT COUNT(*) FROM pending_memory_tasks WHERE {where}", **params))


def delete_tasks_older_than(conn: Connection, agent_id: str, cutoff: str) -> int:
    where, params = _older_tasks(conn, agent_id, cutoff)
    return _run(conn, f"DELETE FROM pending_memory_tasks WHERE {where}", **params)


def agents_without_profile(conn: Connection, agent_id: str) -> list[str]:
    where, params = _agent_where(agent_id, "m")
    return [
        r.agent_id
        for r in _rows(
            conn,
            f"SELECT DISTINCT m.agent_id FROM memories m WHERE {where} AND NOT EXISTS "
            f"(SELECT 1 FROM profiles p WHERE p.agent_id = m.agent_id) ORDER BY m.agent_id",
            **params,
        )
    ]


_BLANK = "trim(content, :blank_chars) = ''"


def blank_counts(conn: Connection, agent_id: str) -> Any:
    """(n, u): rows whose text is only blank characters, and the unlocked ones among them."""
    where, params = _agent_where(agent_id)
    return _rows(
        conn,
        f"SELECT COUNT(*) AS n, COALESCE({dialect.count_if('locked = 0')}, 0) AS u FROM memories "
        f"WHERE {where} AND {_BLANK}",
        blank_chars=dialect.BLANK_CHARS,
        **params,
    )[0]


def blank_unlocked_ids(conn: Connection, agent_id: str) -> list[int]:
    where, params = _agent_where(agent_id)
    return [
        r.id
        for r in _rows(
            conn,
            f"SELECT id FROM memories WHERE {where} AND locked = 0 AND {_BLANK}",
            blank_chars=dialect.BLANK_CHARS,
            **params,
        )
    ]


def bad_source_rows(conn: Connection, agent_id: str, *, unlocked: bool, limit: int | None = None) -> list[Any]:
    """(id, source) of rows whose source JSON is valid but not a canonical User/Agent/System object."""
    where, params = _agent_where(agent_id)
    lock = " AND locked = 0" if unlocked else ""
    tail = f" ORDER BY id LIMIT {int(limit)}" if limit is not None else ""
    return _rows(conn, f"SELECT id, source FROM memories WHERE {where}{lock} AND {_bad_type_sql(conn)}{tail}", **params)


def bad_source_count(conn: Connection, agent_id: str, *, unlocked: bool) -> int:
    where, params = _agent_where(agent_id)
    lock = " AND locked = 0" if unlocked else ""
    return int(_scalar(conn, f"SELECT COUNT(*) FROM memories WHERE {where}{lock} AND {_bad_type_sql(conn)}", **params))


def set_source(conn: Connection, row_id: int, source: str) -> int:
    return _run(conn, "UPDATE memories SET source = :s WHERE id = :i AND locked = 0", s=source, i=row_id)


def oversized_profile_count(conn: Connection, agent_id: str, cap: int) -> int:
    where, params = _agent_where(agent_id)
    return int(
        _scalar(conn, f"SELECT COUNT(*) FROM profiles WHERE {where} AND length(content) > :cap", cap=cap, **params)
    )


def truncate_profiles(conn: Connection, agent_id: str, cap: int) -> int:
    where, params = _agent_where(agent_id)
    return _run(
        conn,
        f"UPDATE profiles SET content = substr(content, 1, :cap) WHERE {where} AND length(content) > :cap",
        cap=cap,
        **params,
    )


def anonymous_counts(conn: Connection, agent_id: str) -> Any:
    """(s, u): rows whose source is the anonymous sentinel, and rows with no attribution at all."""
    where, params = _agent_where(agent_id)
    return _rows(
        conn,
        f"SELECT COALESCE({dialect.count_if(sentinel_sql(conn))}, 0) AS s, "
        f"COALESCE({dialect.count_if(unattributed_sql(conn))}, 0) AS u "
        f"FROM memories WHERE {where}",
        **params,
    )[0]


# -- deep check (DC-5 … DC-12): one agent exactly ------------------------------------------------


def sentinel_rows(conn: Connection, agent_id: str) -> list[Any]:
    """(id, content, locked) of the agent's rows whose source is the anonymous sentinel, by id."""
    return _rows(
        conn,
        f"SELECT id, content, locked FROM memories WHERE agent_id = :agent AND {sentinel_sql(conn)} ORDER BY id",
        agent=agent_id,
    )


def short_rows(conn: Connection, agent_id: str, max_chars: int) -> list[Any]:
    """(id, content, locked) of the agent's rows at most ``max_chars`` long once trimmed, by id."""
    return _rows(
        conn,
        "SELECT id, content, locked FROM memories WHERE agent_id = :agent AND length(trim(content)) <= :n ORDER BY id",
        agent=agent_id,
        n=max_chars,
    )


def profile_updated_at(conn: Connection, agent_id: str) -> tuple[bool, str | None]:
    """(whether the agent has a ``user_id = ''`` profile, its updated_at)."""
    row = _rows(conn, "SELECT updated_at FROM profiles WHERE agent_id = :agent AND user_id = ''", agent=agent_id)
    return (True, row[0].updated_at) if row else (False, None)


def orphaned_episode_rows(conn: Connection, agent_id: str) -> list[Any]:
    """(id, summary, start_time, end_time) of dated episodes no memory of the agent falls inside, by id."""
    start, end = dialect.instant(conn, "e.start_time"), dialect.instant(conn, "e.end_time")
    return _rows(
        conn,
        "SELECT e.id, e.summary, e.start_time, e.end_time FROM episodes e WHERE e.agent_id = :agent "
        "AND e.start_time IS NOT NULL AND e.start_time != '' AND e.end_time IS NOT NULL AND e.end_time != '' "
        f"AND ({start} IS NULL OR {end} IS NULL OR NOT EXISTS ("
        " SELECT 1 FROM memories m WHERE m.agent_id = :agent"
        f" AND {dialect.instant(conn, 'm.timestamp')} BETWEEN {start} AND {end})) ORDER BY e.id",
        agent=agent_id,
    )


def embedded_count(conn: Connection, agent_id: str) -> int:
    return int(
        _scalar(conn, "SELECT COUNT(*) FROM memories WHERE agent_id = :agent AND embedding IS NOT NULL", agent=agent_id)
    )


def newest_embedded_memories(conn: Connection, agent_id: str, limit: int) -> list[Any]:
    """(id, content, embedding) of the agent's newest ``limit`` rows with a vector."""
    return _rows(
        conn,
        "SELECT id, content, embedding FROM memories WHERE agent_id = :agent "
        "AND embedding IS NOT NULL ORDER BY id DESC LIMIT :n",
        agent=agent_id,
        n=limit,
    )


def newest_texts(conn: Connection, table: str, agent_id: str, limit: int) -> list[Any]:
    """(id, body) of the agent's newest ``limit`` rows of ``table`` (memories or episodes)."""
    return _rows(
        conn,
        f"SELECT id, {VECTOR_TABLES[table]} AS body FROM {table} WHERE agent_id = :agent ORDER BY id DESC LIMIT :n",
        agent=agent_id,
        n=limit,
    )


def newest_vectors(conn: Connection, table: str, agent_id: str, limit: int) -> list[Any]:
    """(id, embedding) of the agent's newest ``limit`` rows of ``table`` with a vector."""
    if table not in VECTOR_TABLES:
        raise ValueError(f"not a vector table: {table}")
    return _rows(
        conn,
        f"SELECT id, embedding FROM {table} WHERE agent_id = :agent AND embedding IS NOT NULL "
        f"ORDER BY id DESC LIMIT :n",
        agent=agent_id,
        n=limit,
    )
