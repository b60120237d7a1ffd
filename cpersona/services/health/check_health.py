"""The check_health tool: validate the selection, prepare outside the lock, run, repair, judge (spec §2)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from cpersona.services.records import remote_vectors
from cpersona.services.app import App
from cpersona.services.health import derived, embeddings
from cpersona.services.health.registry import (
    Check,
    Ctx,
    Issue,
    Prep,
    dedupe,
    names,
    registry,
    run_checks,
    severity_summary,
    unknown_names,
    unknown_refusal,
    verdict,
)
from cpersona.storage.health_probes import storage_stats
from cpersona.services.operations.update_check import update_notice
from cpersona.services.requests import Request

NULL_CHECKS = {"null_embedding": "memories", "null_episode_embedding": "episodes"}
# Whole-database report-only scan run on a read connection before the locked run (H-5).
OUTSIDE_LOCK = ("sqlite_integrity",)


def select(requested: Sequence[str] | None) -> tuple[list[Check], list[str]] | dict[str, Any]:
    """(checks in registry order, checks_run) or the H-1 refusal."""
    requested = [str(n) for n in (requested or [])]
    valid = names()
    unknown = unknown_names(requested, valid)
    if unknown:
        return unknown_refusal(unknown, valid)
    checks_run = dedupe(requested) or valid
    chosen = set(checks_run)
    return [c for c in registry() if c.name in chosen], checks_run


def report_run(app: App, agent_id: str, checks: Sequence[Check], prep: Prep, *, judge_liveness: bool) -> list[Issue]:
    """All checks on one read snapshot; nothing is committed (H-13)."""
    with app.db.engine.connect() as conn:
        with conn.begin() as txn:
            ctx = Ctx(app, conn, agent_id, False, prep, app.clock(), judge_liveness=judge_liveness)
            issues = run_checks(checks, ctx)
            txn.rollback()
    return issues


def prepare(app: App, agent_id: str, checks: Sequence[Check], *, fix: bool) -> Prep:
    """H-4: the probe (and, under fix, the re-embeddings) before any lock is taken."""
    prep = Prep()
    embeddings.probe(app, prep)
    if any(c.name == "missing_nodes" for c in checks):
        derived.measure(app, prep, agent_id)  # token reports are network calls: never under the lock
    if fix:
        tables = [NULL_CHECKS[c.name] for c in checks if c.name in NULL_CHECKS]
        embeddings.precompute(app, prep, agent_id, tables)
    return prep


def _ordered(checks: Sequence[Check], by_check: dict[str, list[Issue]]) -> list[Issue]:
    return [issue for c in checks for issue in by_check.get(c.name, [])]


def fix_run(app: App, agent_id: str, checks: Sequence[Check], prep: Prep) -> list[Issue]:
    by_check: dict[str, list[Issue]] = {}
    early = [c for c in checks if c.name in OUTSIDE_LOCK]
    for issue in report_run(app, agent_id, early, prep, judge_liveness=True):
        by_check.setdefault(issue["check"], []).append(issue)
    locked = [c for c in checks if c.name not in OUTSIDE_LOCK]
    with app.db.write_connection() as conn:
        ctx = Ctx(app, conn, agent_id, True, prep, app.clock(), judge_liveness=True)
        for issue in run_checks(locked, ctx):
            by_check.setdefault(issue["check"], []).append(issue)
    _second_pass(app, agent_id, ctx.nulled, prep, by_check)
    derived.queue_after_rewrites(app, ctx.rewritten)  # H-6: after commit, token reports outside the lock
    remote_vectors.push_rows(app, ctx.rewritten)  # H-6: rewritten text reaches the remote index (remote mode)
    remote_vectors.forget_rows(app, ctx.removed)
    return _ordered(checks, by_check)


def _second_pass(app: App, agent_id: str, nulled: set[str], prep: Prep, by_check: dict[str, list[Issue]]) -> None:
    """H-7: rows NULLed during the run get vectors within what remains of the per-run cap."""
    cap = int(app.settings.reembed_row_cap)
    for name, table in NULL_CHECKS.items():
        found = [i for i in by_check.get(name, []) if "re_embedded" in i]
        if table not in nulled or not found:
            continue
        if table == "memories" and not embeddings.keeps_local_vectors(app):
            continue
        written = embeddings.second_pass(app, agent_id, table, cap - found[0]["re_embedded"])
        for issue in found:
            issue["re_embedded"] += written


def update_issue(app: App) -> Issue | None:
    """H-18: at most one issue about the running release; outside the registry and checks_run."""
    notice = update_notice(app)
    if notice is None or notice.get("kind") not in ("newer", "yanked"):
        return None
    yanked = notice["kind"] == "yanked"
    issue: Issue = {
        "check": "update_status",
        "running": notice["running"],
        "available": notice["available"],
        "install_method": notice["install"]["method"],
        "hint": f"{notice['install']['command']} — then restart the server",
        "release_notes": notice["release_notes"],
        "type": "version_yanked" if yanked else "update_available",
        "severity": "warn" if yanked else "info",
    }
    if yanked:
        issue["yank_reason"] = notice.get("reason")
    issue["detail"] = notice["message"]
    return issue


def run_health(
    app: App, *, agent_id: str, fix: bool, checks: Sequence[Check], checks_run: list[str], with_update: bool = True
) -> dict[str, Any]:
    prep = prepare(app, agent_id, checks, fix=fix)
    if fix:
        issues = fix_run(app, agent_id, checks, prep)
        residual = report_run(app, agent_id, checks, prep, judge_liveness=True)  # H-9
    else:
        issues = report_run(app, agent_id, checks, prep, judge_liveness=False)
        residual = issues
    counted = list(residual)
    if with_update and (notice := update_issue(app)) is not None:
        issues = [*issues, notice]
        counted.append(notice)
    summary = severity_summary(counted)
    with app.db.engine.connect() as conn:
        stats = storage_stats(conn, agent_id)
        conn.rollback()
    return {
        "total_memories": stats["memories"],
        "issues": issues,
        "severity_summary": summary,
        "status": verdict(summary),
        "fixed": fix,
        "checks_run": checks_run,
        "stats": stats,
    }


@dataclass(frozen=True)
class HealthArguments(Request):
    """``check_health``'s arguments in the types its schema declares; defaults are the schema's."""

    agent_id: str = ""  # '' = every agent
    fix: bool = False
    checks: Sequence[str] = ()  # none named: the whole registry
    session_key: str = ""  # selects the pause bucket; the facade's pause gate reads it


def check_health(
    app: App, *, agent_id: Any = "", fix: Any = False, checks: Any = None, session_key: Any = ""
) -> dict[str, Any]:
    """:func:`answer_check_health` for a library caller, whose arguments no schema has checked."""
    # Anything but true reports only: a repair must be asked for.
    return answer_check_health(app, HealthArguments(agent_id=agent_id or "", fix=fix is True, checks=checks or ()))


def answer_check_health(app: App, args: HealthArguments) -> dict[str, Any]:
    """The registry's checks over one agent (or all), repaired when ``fix`` (spec §2)."""
    chosen = select(args.checks)
    if isinstance(chosen, dict):
        return chosen
    selected, checks_run = chosen
    return run_health(app, agent_id=args.agent_id, fix=args.fix, checks=selected, checks_run=checks_run)
