"""get_session_findings: the health detector's issues in the SuperAuditor v1.1 shape (spec §6)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cpersona import __version__
from cpersona.services.app import App
from cpersona.services.health.check_health import prepare, report_run
from cpersona.services.health.registry import Issue, by_name, registry
from cpersona.services.requests import Request
from cpersona.services.responses import failure

SUPERAUDITOR = "1.1"
# F-5: static severities of the escalation tiers (registry names use their base severity).
TIER_SEVERITY = {
    "null_embedding_expected": "info",
    "null_episode_embedding_expected": "info",
    "null_embedding_pipeline_down": "critical",
    "null_episode_embedding_pipeline_down": "critical",
    "schema_objects_perf_index": "warn",
    "vector_index_degraded": "warn",
    "coarse_index_degraded": "warn",
    "embedding_backend_unreachable": "warn",
    "embedding_backend_misconfigured": "warn",
    "folder_integrity": "warn",
    "folder_integrity_cycle": "critical",
    "folder_integrity_empty": "info",
    "folder_unfiled": "info",
    "check_crashed": "warn",
    "fts_integrity": "critical",
}


def finding_kind(issue: Issue) -> str:
    """F-4: the registry name, or the tier a self-grading check's stamp selects."""
    check, sev = issue["check"], issue.get("severity")
    if issue.get("type") == "check_crashed":
        return "check_crashed"
    if check in ("null_embedding", "null_episode_embedding"):
        return {"critical": f"{check}_pipeline_down", "info": f"{check}_expected"}.get(sev, check)
    if check == "embedding_backend" and issue.get("type") in (
        "embedding_backend_unreachable",
        "embedding_backend_misconfigured",
    ):
        return issue["type"]
    if check == "schema_objects":
        return "schema_objects" if sev == "critical" else "schema_objects_perf_index"
    if check in ("vector_index", "coarse_index") and sev == "warn":
        return f"{check}_degraded"
    return check


def static_severity(kind: str) -> str:
    if kind in TIER_SEVERITY:
        return TIER_SEVERITY[kind]
    check = by_name().get(kind)
    return check.severity if check is not None else "info"


def to_finding(issue: Issue) -> dict[str, Any]:
    """F-3: payload minus kind/severity; the issue's kind -> object_kind, severity -> health_severity."""
    if "object_kind" in issue or "health_severity" in issue:
        raise ValueError(f"issue of {issue.get('check')} already carries a findings field")
    finding = {k: v for k, v in issue.items() if k not in ("kind", "severity")}
    if "kind" in issue:
        finding["object_kind"] = issue["kind"]
    finding["health_severity"] = issue.get("severity")
    kind = finding_kind(issue)
    finding["kind"] = kind
    finding["severity"] = static_severity(kind)
    return finding


def _counts(values: list[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for v in values:
        out[v] = out.get(v, 0) + 1
    return out


def summary_text(findings: list[dict[str, Any]], capped: list[str], limit: int) -> str:
    """F-7."""
    if not findings:
        return "Storage findings: none."
    by_sev = _counts([f["severity"] for f in findings])
    sevs = ", ".join(f"{s} {by_sev[s]}" for s in ("critical", "warn", "info") if s in by_sev)
    kinds = ", ".join(f"{k} {n}" for k, n in _counts([f["kind"] for f in findings]).items())
    out = f"Storage findings: {len(findings)} returned ({sevs}); kinds: {kinds}."
    if capped:
        out += f" Capped at {limit} per kind: {', '.join(capped)} — more exist than were returned."
    return out


@dataclass(frozen=True)
class FindingsArguments(Request):
    """``get_session_findings``' arguments in the types its schema declares; defaults are the schema's."""

    session_key: str = ""
    per_kind_limit: int = 5
    include_summary: bool = True


def get_session_findings(
    app: App, *, session_key: Any = "", per_kind_limit: Any = 5, include_summary: Any = True
) -> dict[str, Any]:
    """:func:`answer_get_session_findings` for a library caller, whose arguments no schema has checked."""
    if isinstance(per_kind_limit, bool) or not isinstance(per_kind_limit, int):
        return _bad_limit(per_kind_limit)
    return answer_get_session_findings(
        app,
        FindingsArguments(
            session_key=session_key if isinstance(session_key, str) else "",
            per_kind_limit=per_kind_limit,
            include_summary=include_summary is not False,
        ),
    )


def _bad_limit(per_kind_limit: Any) -> dict[str, Any]:
    return failure(f"per_kind_limit must be at least 1 (got {per_kind_limit})", per_kind_limit=per_kind_limit)


def answer_get_session_findings(app: App, args: FindingsArguments) -> dict[str, Any]:
    per_kind_limit = args.per_kind_limit
    if per_kind_limit < 1:
        return _bad_limit(per_kind_limit)
    checks = registry()
    # F-2: the full registry, report-only, whole database; the update-status issue is not a finding.
    issues = report_run(app, "", checks, prepare(app, "", checks, fix=False), judge_liveness=False)
    kept: list[dict[str, Any]] = []
    seen: dict[str, int] = {}
    capped: list[str] = []
    for issue in issues:
        finding = to_finding(issue)
        kind = finding["kind"]
        seen[kind] = seen.get(kind, 0) + 1
        if seen[kind] > per_kind_limit:
            if kind not in capped:
                capped.append(kind)
            continue
        kept.append(finding)
    out: dict[str, Any] = {
        "findings": kept,
        "total": len(kept),
        "counts_by_kind": _counts([f["kind"] for f in kept]),
        "counts_by_severity": _counts([f["severity"] for f in kept]),
        "capped_kinds": capped,
        "per_kind_limit": per_kind_limit,
    }
    if args.include_summary:
        out["summary"] = summary_text(kept, capped, per_kind_limit)
    key = args.session_key.strip()
    if app.settings.transport != "stdio" and key in ("", "transport"):
        out["identity_shared"] = True
    out["_meta"] = {"server_version": __version__, "superauditor": SUPERAUDITOR}
    return out
