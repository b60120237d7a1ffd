"""Seeding helpers for the health tests (imported, not a conftest: the name conftest is taken by tests/conftest.py).

Rows are written with raw SQL so a test can plant exactly the defect a check finds.
"""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import text

from cpersona.services.app import App
from cpersona.services.health.check_health import check_health


def make_app(db: Any, **env: str) -> App:
    from conftest import make_app as app_on  # names the database on either backend

    return app_on(db, **env)


def insert_memory(
    app: Any,
    content: str,
    *,
    agent: str = "a",
    project: str = "",
    channel: str = "",
    locked: int = 0,
    source: str = "{}",
    metadata: str = "{}",
    timestamp: str = "2024-01-01T00:00:00+00:00",
    msg_id: str = "",
    embedding: bytes | None = None,
) -> int:
    with app.db.write_connection() as conn:
        return conn.execute(
            text(
                "INSERT INTO memories (agent_id, project_id, channel, content, locked, source, metadata, timestamp, "
                "msg_id, embedding) VALUES (:a, :p, :c, :t, :l, :s, :m, :ts, :mid, :e) RETURNING id"
            ),
            {
                "a": agent,
                "p": project,
                "c": channel,
                "t": content,
                "l": locked,
                "s": source,
                "m": metadata,
                "ts": timestamp,
                "mid": msg_id,
                "e": embedding,
            },
        ).scalar()


def execute(app: Any, sql: str, **params: Any) -> None:
    with app.db.write_connection() as conn:
        conn.exec_driver_sql(sql) if not params else conn.execute(text(sql), params)


def query(app: Any, sql: str, **params: Any) -> list[Any]:
    with app.db.read() as session:
        return list(session.execute(text(sql), params))


def issues_of(result: dict[str, Any], check: str) -> list[dict[str, Any]]:
    return [i for i in result["issues"] if i["check"] == check]


def run(app: Any, check: str, **kwargs: Any) -> list[dict[str, Any]]:
    return issues_of(check_health(app, checks=[check], **kwargs), check)


@pytest.fixture
def h():
    """The helpers as one object, so test modules need no import path tricks."""

    class H:
        pass

    obj = H()
    for fn in (make_app, insert_memory, execute, query, issues_of, run):
        setattr(obj, fn.__name__, staticmethod(fn))
    return obj
