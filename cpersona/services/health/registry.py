"""The health-check registry: one small unit per check, and the one runner all surfaces share.

A :class:`Check` is a name, a base severity, a detector and (for fix-capable
checks) a repair. ``check_health``, ``get_session_findings`` and the checkup CLI
all go through :func:`run_checks`, so a check cannot behave differently between
surfaces (spec health.md §1.1). The registry order is the order of
:data:`FAMILIES` below, each family module listing its checks in spec order.
"""

from __future__ import annotations

import functools
import importlib
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import Connection

from cpersona.services.app import App
from cpersona.storage import dialect
from cpersona.storage import errors as storage_errors

log = logging.getLogger(__name__)

SEVERITIES = ("critical", "warn", "info")
FAMILIES = (
    "cpersona.services.health.content",  # 1-4
    "cpersona.services.health.embeddings",  # 5-10
    "cpersona.services.health.integrity",  # 11-15
    "cpersona.services.health.hygiene",  # 16-29
    "cpersona.services.health.config_files",  # 30-38
)
REVIEW_HINT = (
    "Nothing the fix can write: every offending row is out of its reach (locked, or a shape the "
    "repair refuses to rewrite). Repairing it is an operator decision"
)

Issue = dict[str, Any]


@dataclass
class Prep:
    """What a run learns before any lock is taken (spec H-4): the probe and precomputed vectors."""

    probe_ran: bool = False
    probe_ok: bool = False  # the probe reached the backend and returned a vector
    probe_from_cache: bool = False
    probe_attempted: bool = False
    probe_error: str | None = None
    dimension: int | None = None
    # table -> [(id, text the vector was computed from, blob)]
    vectors: dict[str, list[tuple[int, str, bytes]]] = field(default_factory=dict)
    nodes: Any = None  # derived.NodeScan: token reports for missing_nodes; None = no report expected


@dataclass
class Ctx:
    """One check's view of the run."""

    app: App
    conn: Connection
    agent_id: str  # '' = whole database
    fix: bool
    prep: Prep
    now: datetime
    # Whether the run may read its probe as liveness evidence: only when fix was asked
    # (spec H-17), including the read-only residual run that follows a fix.
    judge_liveness: bool = False
    # Rows NULLed by this run that a second re-embed pass may fill (spec H-7).
    nulled: set[str] = field(default_factory=set)
    # Records whose text this run rewrote: their node builds are queued after commit (spec H-6).
    rewritten: set[tuple[str, int]] = field(default_factory=set)
    # (kind, id, owner) of rows this run deleted: removed from the remote vector index after commit (H-6).
    removed: set[tuple[str, int, str]] = field(default_factory=set)

    def __post_init__(self) -> None:
        dialect.JsonSql(self.conn).prepare(self.conn)  # JSON checks need it on PostgreSQL

    @property
    def settings(self) -> Any:
        return self.app.settings

    @property
    def scoped(self) -> bool:
        return self.agent_id != ""

    def has_table(self, name: str) -> bool:
        return has_object(self.conn, "table", name)


def has_object(conn: Connection, kind: str, name: str) -> bool:
    return dialect.has_object(conn, kind, name)


Detector = Callable[[Ctx], list[Issue]]
Repair = Callable[[Ctx, list[Issue]], None]


@dataclass(frozen=True)
class Check:
    name: str
    severity: str  # base severity: critical | warn | info
    detect: Detector
    repair: Repair | None = None  # None = report-only
    cross_agent: bool = False  # its repair reaches every agent or shared state
    whole_database: bool = False  # ignores agent_id

    @property
    def fixable(self) -> bool:
        return self.repair is not None


@functools.cache
def registry() -> tuple[Check, ...]:
    checks: list[Check] = []
    for module in FAMILIES:
        checks.extend(importlib.import_module(module).CHECKS)
    names = [c.name for c in checks]
    assert len(names) == len(set(names)), "a check name is registered twice"
    return tuple(checks)


def names() -> list[str]:
    return [c.name for c in registry()]


def by_name() -> dict[str, Check]:
    return {c.name: c for c in registry()}


def cross_agent_names() -> list[str]:
    return sorted(c.name for c in registry() if c.cross_agent)


def unknown_names(requested: Iterable[str], valid: Iterable[str]) -> list[str]:
    known = set(valid)
    out: list[str] = []
    for name in requested:
        if name not in known and name not in out:
            out.append(name)
    return out


def dedupe(requested: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(requested))


def unknown_refusal(unknown: list[str], valid: list[str]) -> dict[str, Any]:
    """H-1 / DC-2: the refusal that names the bad names and every valid one."""
    return {
        "ok": False,
        "error": f"unknown check name(s): {', '.join(unknown)}. Valid names: {', '.join(valid)}",
        "unknown_checks": unknown,
        "valid_checks": valid,
        "checks_run": [],
    }


def _stamp(check: Check, issue: Issue) -> Issue:
    """R-1: the runner's own severity when it set one, else the base; then the check name."""
    issue.setdefault("severity", check.severity)
    issue["check"] = check.name
    if not check.fixable:
        return issue
    if "repairable" not in issue:
        # a fix-capable check owes `repairable`; say so instead of guessing.
        log.warning("health check %s produced an issue without repairable", check.name)
        issue["repairable_undeclared"] = True
    elif issue["repairable"] == 0:
        issue["needs_human_review"] = True
        issue.setdefault("hint", REVIEW_HINT)
        if issue["severity"] == "warn":
            issue["severity"] = "info"
    return issue


def crashed(check: Check, exc: BaseException) -> Issue:
    """R-3: a check that raised becomes one warn issue; the rest of the run goes on."""
    # One line, never SQLAlchemy's text (the statement and its parameters).
    return {
        "type": "check_crashed",
        "check_name": check.name,
        "detail": storage_errors.reason(exc),
        "severity": "warn",
        "check": check.name,
    }


def run_one(check: Check, ctx: Ctx) -> list[Issue]:
    """Run one check inside its own savepoint; a raise undoes its writes (R-3)."""
    try:
        with ctx.conn.begin_nested():
            issues = check.detect(ctx)
            if ctx.fix and check.repair is not None and issues:
                check.repair(ctx, issues)
    except Exception as exc:  # noqa: BLE001 — any failure of one check is reported, not fatal
        log.warning("health check %s crashed: %s", check.name, exc)
        return [crashed(check, exc)]
    return [_stamp(check, issue) for issue in issues]


def run_checks(checks: Iterable[Check], ctx: Ctx) -> list[Issue]:
    issues: list[Issue] = []
    for check in checks:
        issues.extend(run_one(check, ctx))
    return issues


def severity_summary(issues: Iterable[Issue]) -> dict[str, int]:
    counts = dict.fromkeys(SEVERITIES, 0)
    for issue in issues:
        sev = issue.get("severity")
        if sev in counts:
            counts[sev] += 1
    return counts


def verdict(summary: dict[str, int]) -> str:
    """R-7: any critical -> unhealthy; any warn -> degraded; info never degrades."""
    if summary["critical"]:
        return "unhealthy"
    if summary["warn"]:
        return "degraded"
    return "healthy"
