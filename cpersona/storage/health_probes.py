"""Every statement the health checks run (services/health/*), in one storage module of their own.

The checks decide what is wrong and what a repair does; these functions read
and write the rows. A function taking ``agent_id`` applies the agent axis
through the isolation module ('' = the whole database).

Sections follow the check families: stats (H-11), content (checks 1-4),
derived nodes, embeddings (5-10), integrity (11-15), hygiene (16-29), deep check.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, text

from cpersona.storage import dialect
from cpersona.storage.repositories.base import chunks
from cpersona.storage.scope import Scope, sql_fragment

AXIS_VALUES = 20  # values shown per axis, most rows first
GLOBAL = "(global)"


# -- stats: counts and axis distributions, never issues (H-11) ----------------------------------


def _count(conn: Connection, table: str, where: str, params: dict[str, Any]) -> int:
    return int(conn.execute(text(f"SELECT COUNT(*) FROM {table} WHERE {where}"), params).scalar() or 0)


def _axis(conn: Connection, column: str, where: str, params: dict[str, Any]) -> dict[str, int]:
    rows = conn.execute(text(f"SELECT {column} AS v, COUNT(*) AS n FROM memories WHERE {where} GROUP BY {column} "
                             f"ORDER BY n DESC, {column} LIMIT {AXIS_VALUES}"), params)
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
        "axes": {"project_id": _axis(conn, "project_id", where, params),
                 "channel": _axis(conn, "channel", where, params)},
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

# The relations' unique key (storage.md §6.2).
_RELATION_KEY = ("agent_id", "project_id", "channel", "subject_kind", "subject_id", "predicate", "object_kind",
                 "object_id", "anchor_ref")


def repoint_declarations(conn: Connection, old_id: int, new_id: int) -> None:
    """Move declarations naming mem:old onto mem:new (before old is deleted)."""
    if old_id == new_id or not dialect.has_object(conn, "table", "relations"):
        return
    old, new = f"mem:{old_id}", f"mem:{new_id}"
    # A row whose moved copy would collide with one the survivor already carries
    # stays put (what SQLite's UPDATE OR IGNORE did, spelled for every engine);
    # the deletion trigger removes it with the old row afterwards.
    _run(conn, "UPDATE entity_mentions SET ref = :new WHERE ref = :old AND NOT EXISTS (SELECT 1 FROM entity_mentions t "
         "WHERE t.entity_id = entity_mentions.entity_id AND t.ref = :new)", old=old, new=new)
    _repoint_relations(conn, "subject_id", "subject_kind = 'mem' AND subject_id = :old", old=old_id, new=new_id)
    _repoint_relations(conn, "object_id", "object_kind = 'mem' AND object_id = :old", old=old_id, new=new_id)
    _repoint_relations(conn, "anchor_ref", "anchor_ref = :old", old=old, new=new)


def _repoint_relations(conn: Connection, column: str, where: str, **params: Any) -> None:
    same = " AND ".join(f"t.{c} = relations.{c}" for c in _RELATION_KEY if c != column)
    _run(conn, f"UPDATE relations SET {column} = :new WHERE {where} "
         f"AND NOT EXISTS (SELECT 1 FROM relations t WHERE t.{column} = :new AND {same})", **params)


def delete_unlocked_memories(conn: Connection, ids: list[int], *,
                             owners: set[tuple[str, int, str]] | None = None) -> int:
    """Delete the unlocked rows among ``ids`` (chunked); rows removed.

    With ``owners``, each deleted row's (``"mem"``, id, agent) is added to it first
    (read before the rows go).
    """
    deleted = 0
    for chunk in chunks(ids):
        marks = ", ".join(str(int(i)) for i in chunk)
        if owners is not None:
            owners.update(("mem", r.id, r.agent_id) for r in _rows(
                conn, f"SELECT id, agent_id FROM memories WHERE locked = 0 AND id IN ({marks})"))
        deleted += _run(conn, f"DELETE FROM memories WHERE locked = 0 AND id IN ({marks})")
    return deleted


def memory_bucket(conn: Connection, row_id: int) -> Any:
    """(agent_id, project_id, channel, locked) of the row, or None."""
    found = _rows(conn, "SELECT agent_id, project_id, channel, locked FROM memories WHERE id = :i", i=row_id)
    return found[0] if found else None


def twin_of(conn: Connection, agent_id: str, project_id: str, channel: str, content: str, row_id: int) -> int | None:
    """Another row of the exact bucket already holding ``content`` (a locked one first, then lowest id)."""
    return _scalar(
        conn, "SELECT id FROM memories WHERE agent_id = :a AND project_id = :p AND channel = :c AND content = :t "
        "AND id != :i ORDER BY locked DESC, id LIMIT 1", a=agent_id, p=project_id, c=channel, t=content, i=row_id)


def delete_unlocked_memory(conn: Connection, row_id: int) -> int:
    return _run(conn, "DELETE FROM memories WHERE id = :i AND locked = 0", i=row_id)


def rewrite_unlocked_memory(conn: Connection, row_id: int, content: str) -> int:
    """New text for an unlocked row, its vector cleared for the re-embed pass."""
    return _run(conn, "UPDATE memories SET content = :t, embedding = NULL WHERE id = :i AND locked = 0",
                t=content, i=row_id)


def memory_content(conn: Connection, row_id: int) -> str | None:
    return _scalar(conn, "SELECT content FROM memories WHERE id = :i", i=row_id)


def memories_containing(conn: Connection, agent_id: str, needle: str) -> list[Any]:
    """(id, content, locked) of the rows whose text contains ``needle`` (a plain substring)."""
    where, params = _agent_where(agent_id)
    return _rows(conn, f"SELECT id, content, locked FROM memories WHERE {where} "
                 f"AND {dialect.position(conn, 'content', ':needle')} > 0", needle=needle, **params)


def oversized_counts(conn: Connection, agent_id: str, cap: int) -> Any:
    """(n, unlocked) of the rows longer than ``cap``."""
    where, params = _agent_where(agent_id)
    return _rows(conn, f"SELECT COUNT(*) AS n, COALESCE({dialect.count_if('locked = 0')}, 0) AS unlocked "
                 f"FROM memories WHERE {where} AND length(content) > :cap", cap=cap, **params)[0]


def oversized_unlocked_ids(conn: Connection, agent_id: str, cap: int) -> list[int]:
    where, params = _agent_where(agent_id)
    return [r.id for r in _rows(conn, f"SELECT id FROM memories WHERE {where} AND locked = 0 "
                                f"AND length(content) > :cap", cap=cap, **params)]


def duplicated_rows(conn: Connection, agent_id: str) -> list[Any]:
    """(id, agent_id, project_id, channel, content, locked) of rows whose (agent, project, content) repeats."""
    where, params = _agent_where(agent_id, "m")
    return _rows(
        conn,
        f"SELECT m.id, m.agent_id, m.project_id, m.channel, m.content, m.locked FROM memories m "
        f"JOIN (SELECT agent_id, project_id, content FROM memories GROUP BY agent_id, project_id, content "
        f"HAVING COUNT(*) > 1) g ON g.agent_id = m.agent_id AND g.project_id = m.project_id "
        f"AND g.content = m.content WHERE {where} ORDER BY m.id", **params)


# -- derived nodes (check 37) ------------------------------------------------------------------

_TEXT_TABLES = {"mem": ("memories", "content"), "ep": ("episodes", "summary")}


def texts_to_measure(conn: Connection, kind: str, agent_id: str, limit: int) -> list[Any]:
    """(id, agent_id, project_id, body) of up to ``limit`` rows of ``kind`` with nonempty text, by id."""
    table, column = _TEXT_TABLES[kind]
    where, params = _agent_where(agent_id)
    return _rows(conn, f"SELECT id, agent_id, project_id, {column} AS body FROM {table} "
                 f"WHERE {where} AND length({column}) > 0 ORDER BY id LIMIT :cap", cap=limit, **params)


def noded_parents(conn: Connection, kind: str) -> set[int]:
    """Ids of the ``kind`` records that have any node row."""
    return {r[0] for r in _rows(conn, "SELECT DISTINCT parent_id FROM record_nodes WHERE parent_kind = :k", k=kind)}
