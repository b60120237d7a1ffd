"""Health: ``check_health``, ``deep_check``, ``get_session_findings``.

The descriptions render the registry's size and its cross-agent names from the
registry itself, so the text cannot drift from what runs (spec health.md §8).
They are rendered when first read (tools/list), not when the tool table is
built: the health services are then imported only by a server that lists tools.
"""

from __future__ import annotations

from cpersona.config import Settings
from cpersona.mcp.demands import DEEP_CHECK as DEEP_CHECK_ACCESS
from cpersona.mcp.demands import FINDINGS, HEALTH
from cpersona.mcp.pause_gate import DowngradeFix
from cpersona.mcp.registry import READ_ONLY, Annotations, Ref, ServiceRef, ToolSpec
from cpersona.mcp.tools.common import KEY_FIELD_MAX, object_schema


def _default(name: str) -> int:
    return Settings.model_fields[name].default


_SESSION_KEY = {
    "type": "string",
    "description": "A session name you choose. It only picks which no-persist pause applies to this call (a paused "
    "session gets fix downgraded to false); it is not a credential and never filters data.",
    "default": "",
    "maxLength": KEY_FIELD_MAX,
}


def _check_health_description() -> str:
    from cpersona.services.health.registry import cross_agent_names, registry

    cross = ", ".join(cross_agent_names())
    return (
        f"Inspect the memory database with a registry of {len(registry())} checks; every issue is tagged "
        "critical, warn or info and names the check that found it. Areas: text contamination and duplicates, "
        "oversized rows, stored vectors and the embedding backend, FTS and schema objects, SQLite file integrity, "
        "project naming, JSON and timestamp drift, stale queued tasks, profiles and sources, configuration and file "
        "permissions. The answer includes storage stats with the project_id and channel distributions. `status` "
        "(healthy / degraded / unhealthy) is the only verdict, derived from the severity counts (info never "
        "degrades), and it judges what is stored, not whether the pipeline that fills it works: a corpus whose "
        "every vector is NULL can be healthy. Only a fix=true run reads its embedding probe as evidence of backend "
        "liveness; a report run still contacts the backend but draws no liveness conclusion from it. `checks` "
        "selects registry names; an unknown name is refused (ok=false) and `checks_run` is echoed in every "
        "answer. fix=true repairs within the named agent and never touches locked memories, except the "
        f"cross-agent repairs ({cross}), which reach every agent and need read-write on '*' under an ACL. "
        "Critical file-integrity findings are only reported (restore from a backup). Irreversible repairs: "
        "memories over CPERSONA_MAX_CONTENT_LENGTH (default "
        f"{_default('max_content_length')}) and profiles over CPERSONA_MAX_PROFILE_LENGTH (default "
        f"{_default('max_profile_length')}) are cut, keeping the start (a lowered cap also shortens rows that "
        "fitted the old one); duplicate_content and empty_content delete rows; memory_annotation and "
        "discord_mention strip text; invalid_json replaces unreadable JSON by a re-encoding or '{}'; "
        "stale_pending_tasks deletes queued tasks older than one hour; dedup_msg_id_index blanks colliding msg_ids; "
        "the timestamp checks copy created_at over unusable stamps. Some repairs are bounded per run (re-embedding "
        f"at most CPERSONA_REEMBED_ROW_CAP rows per table, source classification at most "
        f"{_default('invalid_source_classify_cap')} rows): while a fix answer shows `remaining` above 0 it has not "
        "converged, so run fix again until the numbers stop going down."
    )


def _deep_check_description() -> str:
    from cpersona.services.health.deep_check import DEEP_CHECKS, FIXABLE as DEEP_FIXABLE

    fixable = ", ".join(DEEP_FIXABLE)
    report_only = ", ".join(name for name in DEEP_CHECKS if name not in DEEP_FIXABLE)
    return (
        f"Heuristic data-quality analysis of one agent's memories with {len(DEEP_CHECKS)} checks: anonymous sources "
        "whose author can be recovered, short or trivial rows, a stale profile, episodes no memory falls inside, "
        "stale threshold calibration, near-duplicate pairs by embedding (merge candidates), text not in Unicode NFC, "
        f"and vectors that are not unit length. fix=true repairs only {fixable}; the short_content repair deletes "
        "every unlocked row it reports, so run without fix first and read its samples. The others "
        f"({report_only}) accept fix and ignore it: act on them with merge_memories, delete_memory, "
        "calibrate_threshold or update_profile. `checks` selects a subset; an unknown name is refused."
    )


CHECK_HEALTH = ToolSpec(
    name="check_health",
    contracts="health.md §2",
    description=_check_health_description,
    input_schema=object_schema(
        {
            "agent_id": {"type": "string", "description": "The agent to check; empty checks every agent."},
            "fix": {"type": "boolean", "description": "Apply the repairs (default: report only).", "default": False},
            "checks": {
                "type": "array",
                "items": {"type": "string"},
                "description": "Registry check names to run; empty runs them all.",
            },
            "session_key": _SESSION_KEY,
        }
    ),
    annotations=Annotations(read_only=False),
    service=ServiceRef("cpersona.services.health.check_health", "answer_check_health"),
    request=Ref("cpersona.services.health.check_health", "HealthArguments"),
    access=HEALTH,
    paused=DowngradeFix(),  # P-11: it reports, it does not repair
)


def _deep_check_schema() -> dict:
    from cpersona.services.health.deep_check import DEEP_CHECKS

    return object_schema(
        {
            "agent_id": {
                "type": "string",
                "description": "The agent to analyse (required; '' is the empty-agent bucket).",
            },
            "fix": {"type": "boolean", "description": "Apply the repairs (default: report only).", "default": False},
            "checks": {
                "type": "array",
                "items": {"type": "string"},
                "description": "Checks to run; empty runs all of: " + ", ".join(DEEP_CHECKS),
            },
            "session_key": _SESSION_KEY,
        },
        required=["agent_id"],
    )


DEEP_CHECK = ToolSpec(
    name="deep_check",
    contracts="health.md §5",
    description=_deep_check_description,
    input_schema=_deep_check_schema,
    annotations=Annotations(read_only=False),
    service=ServiceRef("cpersona.services.health.deep_check", "answer_deep_check"),
    request=Ref("cpersona.services.health.deep_check", "DeepCheckArguments"),
    access=DEEP_CHECK_ACCESS,
    paused=DowngradeFix(),
)

GET_SESSION_FINDINGS = ToolSpec(
    name="get_session_findings",
    contracts="health.md §6",
    description=(
        "Pull the storage findings on demand: the same detector as check_health(fix=false), run over the whole "
        "database, read-only, never repairing. Each finding has `kind` (a registry check name, or an escalation "
        "tier for checks that grade their own severity, such as null_embedding_pipeline_down — a tier is not a "
        "registry name), `check` (the registry name that produced it; check_health(checks=[finding['check']]) "
        "re-runs exactly that probe) and a fixed per-kind `severity` (critical: reads are wrong now; warn: two "
        "stored facts contradict; info: an observation). check_health's own verdict for the issue stays visible as "
        "`health_severity`. A check that raised is reported as kind check_crashed and the pull still succeeds. "
        "Cost: every pull runs the full registry, including the FTS5 integrity check and PRAGMA quick_check, so "
        "it is O(database); there is no cheap subset, so budget calls by frequency. Findings are not filtered by "
        "agent or project (scope repairs with check_health(agent_id=...)). Caps are honest: at most per_kind_limit "
        "findings per kind, `capped_kinds` names every kind that had more, and `total` and the counts describe "
        "the returned set only. `summary` restates it in prose (include_summary=false leaves it out). On a shared "
        "transport without a session_key the answer carries identity_shared: true; _meta.server_version names the "
        "running version."
    ),
    input_schema=object_schema(
        {
            "session_key": {
                "type": "string",
                "description": "A session name you choose; on a shared (non-stdio) "
                "transport an empty one marks the answer identity_shared.",
                "default": "",
                "maxLength": KEY_FIELD_MAX,
            },
            "per_kind_limit": {
                "type": "integer",
                "description": "Most findings returned per kind (default 5, at "
                "least 1); kinds that had more are listed in capped_kinds.",
                "default": 5,
            },
            "include_summary": {
                "type": "boolean",
                "description": "Add the prose `summary` (default true); set false when reading the answer by machine.",
                "default": True,
            },
        }
    ),
    annotations=READ_ONLY,
    service=ServiceRef("cpersona.services.health.findings", "answer_get_session_findings"),
    request=Ref("cpersona.services.health.findings", "FindingsArguments"),
    access=FINDINGS,
)

TOOLS = [CHECK_HEALTH, GET_SESSION_FINDINGS, DEEP_CHECK]  # the reference's order
