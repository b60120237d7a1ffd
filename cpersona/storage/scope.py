"""The isolation axes: the one place that turns agent / project / channel into SQL.

Read semantics (spec AX-1, memory-and-recall §5.1):

=========  ==================  =====================  ==============================
axis       omitted (None)      ``''``                 ``'X'``
=========  ==================  =====================  ==============================
agent      no filter           ``agent_id = ''``      ``agent_id = 'X'``
project    no filter           ``project_id = ''``    ``project_id IN ('X', '')``
channel    no filter           no filter              ``channel = 'X' OR channel = ''``
=========  ==================  =====================  ==============================

Writes never union: dedup and uniqueness use the exact bucket (spec AX-3).
Every query that reads memories or episodes builds its WHERE clause here, for
ORM selects (:func:`predicates`) and for raw SQL (:func:`sql_fragment`) alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import ColumnElement, and_, or_, true
from sqlalchemy.sql import FromClause


@dataclass(frozen=True, slots=True)
class Scope:
    """Which rows a read may see. ``None`` on an axis means "no filter"."""

    agent_id: str | None = None
    project_id: str | None = None
    channel: str | None = None

    @property
    def project_values(self) -> tuple[str, ...] | None:
        if self.project_id is None:
            return None
        return ("",) if self.project_id == "" else (self.project_id, "")

    @property
    def channel_values(self) -> tuple[str, ...] | None:
        if not self.channel:
            return None
        return (self.channel, "")


def predicates(table: FromClause | Any, scope: Scope) -> ColumnElement[bool]:
    """The scope as an SQLAlchemy boolean over ``table`` (a Table or ORM class)."""
    cols = table.c if hasattr(table, "c") else table
    clauses: list[ColumnElement[bool]] = []
    if scope.agent_id is not None:
        clauses.append(cols.agent_id == scope.agent_id)
    if (projects := scope.project_values) is not None:
        clauses.append(cols.project_id.in_(projects))
    if (channels := scope.channel_values) is not None:
        clauses.append(or_(cols.channel == channels[0], cols.channel == ""))
    return and_(true(), *clauses)


def sql_fragment(scope: Scope, alias: str = "") -> tuple[str, dict[str, Any]]:
    """The scope as raw SQL text plus bound parameters, for hand-written queries.

    The text always starts with ``1=1`` so it can be ANDed without fuss; the
    parameter names are prefixed ``scope_`` to stay clear of the caller's.
    """
    p = f"{alias}." if alias else ""
    parts = ["1=1"]
    params: dict[str, Any] = {}
    if scope.agent_id is not None:
        parts.append(f"{p}agent_id = :scope_agent")
        params["scope_agent"] = scope.agent_id
    if scope.project_id is not None:
        if scope.project_id == "":
            parts.append(f"{p}project_id = ''")
        else:
            parts.append(f"{p}project_id IN (:scope_project, '')")
            params["scope_project"] = scope.project_id
    if scope.channel:
        parts.append(f"({p}channel = :scope_channel OR {p}channel = '')")
        params["scope_channel"] = scope.channel
    return " AND ".join(parts), params
