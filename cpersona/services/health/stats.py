"""The ``stats`` block of check_health (spec H-11): counts and axis distributions, never issues."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, text

from cpersona.storage.scope import Scope, sql_fragment

AXIS_VALUES = 20  # values shown per axis, most rows first
GLOBAL = "(global)"


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
