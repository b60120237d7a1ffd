"""Checks 16-29: data hygiene — naming, JSON, timestamps, queue, profiles, sources (spec R-28..R-41)."""

from __future__ import annotations

import json
import math
import re
import unicodedata
from collections import defaultdict
from datetime import datetime, timedelta, timezone
from typing import Any

from cpersona.services.health.content import delete_unlocked
from cpersona.services.health.registry import Check, Ctx, Issue
from cpersona.services.sanitize import CANONICAL_TYPES, normalize_source
from cpersona.services.timestamps import instant_seconds
from cpersona.storage import health_probes as probes

STALE_TASK_AGE = timedelta(hours=1)
_OFFSET = re.compile(r"[+-]\d{2}:?\d{2}$")


def canonical_utc(stamp: str | None) -> str | None:
    """A readable stamp as ``YYYY-MM-DDTHH:MM:SS+00:00``, or None."""
    seconds = instant_seconds(stamp) if stamp else None
    if seconds is None:
        return None
    return datetime.fromtimestamp(seconds, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S+00:00")


def _boundary(ctx: Ctx) -> float:
    return ctx.now.timestamp() + float(ctx.settings.future_timestamp_skew_seconds)


def _ahead(ctx: Ctx, stamp: str | None) -> bool:
    seconds = instant_seconds(stamp) if stamp else None
    return seconds is not None and seconds > _boundary(ctx)


# -- 16: axis_hygiene ---------------------------------------------------------------------------


def bucket_key(project_id: str) -> str:
    folded = unicodedata.normalize("NFKC", project_id).casefold()
    return "".join(ch for ch in folded if unicodedata.category(ch)[0] in "LNM")


def detect_axis(ctx: Ctx) -> list[Issue]:
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in probes.project_counts(ctx.conn, ctx.agent_id):
        key = bucket_key(r.project_id)
        if key:
            groups[key].append({"project_id": r.project_id, "count": r.n})
    clusters = [members for members in groups.values() if len(members) > 1]
    return [{"type": "project_id_naming_drift", "clusters": clusters}] if clusters else []


# -- 17: invalid_json ---------------------------------------------------------------------------


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def reencode_json(raw: str | None) -> str:
    """R-29: an object a lenient parser still reads is re-encoded (non-finite -> null); else '{}'."""
    try:
        value = json.loads(raw or "")
    except (ValueError, RecursionError):
        return "{}"
    return json.dumps(_finite(value), ensure_ascii=False) if isinstance(value, dict) else "{}"


def detect_json(ctx: Ctx) -> list[Issue]:
    r = probes.invalid_json_counts(ctx.conn, ctx.agent_id)
    if not (r.s or r.m):
        return []
    return [{"type": "invalid_json", "bad_source": int(r.s), "bad_metadata": int(r.m), "repairable": int(r.u)}]


def repair_json(ctx: Ctx, issues: list[Issue]) -> None:
    for r in probes.invalid_json_rows(ctx.conn, ctx.agent_id):
        probes.set_source_and_metadata(
            ctx.conn,
            r.id,
            r.source if r.vs else reencode_json(r.source),
            r.metadata if r.vm else reencode_json(r.metadata),
        )


# -- 18, 19: memory timestamps ------------------------------------------------------------------


def _iso(stamp: str) -> datetime | None:
    try:
        return datetime.fromisoformat(stamp.strip())
    except (ValueError, AttributeError):
        return None


def _sqlite_reads(ctx: Ctx, stamp: str) -> bool:
    return probes.engine_reads_instant(ctx.conn, stamp)


def _invalid_rows(ctx: Ctx) -> list[Any]:
    out = []
    for r in probes.checked_memory_stamps(ctx.conn, ctx.agent_id):
        if not r.sq:
            out.append(r)
        elif _iso(r.timestamp) is None and not _ahead(ctx, r.timestamp):
            out.append(r)
    return out


def _respelled(ctx: Ctx, row: Any) -> str | None:
    moment = _iso(row.timestamp)
    if moment is not None:
        spelled = moment.astimezone(timezone.utc).isoformat() if moment.tzinfo else moment.isoformat()
        if _sqlite_reads(ctx, spelled):
            return spelled
    return canonical_utc(row.created_at)


def detect_invalid_ts(ctx: Ctx) -> list[Issue]:
    rows = _invalid_rows(ctx)
    if not rows:
        return []
    repairable = sum(1 for r in rows if not r.locked and _respelled(ctx, r) is not None)
    return [{"type": "invalid_timestamp", "count": len(rows), "repairable": repairable}]


def repair_invalid_ts(ctx: Ctx, issues: list[Issue]) -> None:
    for r in _invalid_rows(ctx):
        new = None if r.locked else _respelled(ctx, r)
        if new is not None:
            probes.set_memory_timestamp(ctx.conn, r.id, new)


def _future_rows(ctx: Ctx) -> list[Any]:
    return [r for r in probes.memory_stamps(ctx.conn, ctx.agent_id) if _ahead(ctx, r.timestamp)]


def _future_fix(ctx: Ctx, created_at: str) -> str | None:
    return None if _ahead(ctx, created_at) else canonical_utc(created_at)


def detect_future(ctx: Ctx) -> list[Issue]:
    rows = _future_rows(ctx)
    if not rows:
        return []
    repairable = sum(1 for r in rows if not r.locked and _future_fix(ctx, r.created_at))
    return [{"type": "future_timestamp", "count": len(rows), "repairable": repairable}]


def repair_future(ctx: Ctx, issues: list[Issue]) -> None:
    for r in _future_rows(ctx):
        new = None if r.locked else _future_fix(ctx, r.created_at)
        if new:
            probes.set_memory_timestamp(ctx.conn, r.id, new)


# -- 20: missing_episode_start_time ---------------------------------------------------------------


def _missing_start(ctx: Ctx) -> list[Any]:
    return probes.episodes_without_start(ctx.conn, ctx.agent_id)


def detect_missing_start(ctx: Ctx) -> list[Issue]:
    rows = _missing_start(ctx)
    if not rows:
        return []
    return [
        {
            "type": "missing_episode_start_time",
            "count": len(rows),
            "repairable": sum(1 for r in rows if canonical_utc(r.created_at)),
            "hint": "fix writes created_at as start_time: an approximation (when the episode was recorded)",
        }
    ]


def repair_missing_start(ctx: Ctx, issues: list[Issue]) -> None:
    for r in _missing_start(ctx):
        if stamp := canonical_utc(r.created_at):
            probes.set_episode_stamp(ctx.conn, r.id, "start_time", stamp)


# -- 21, 22: format drift -----------------------------------------------------------------------


def stamp_class(stamp: str) -> str:
    s = stamp.strip()
    if s.endswith("Z") or s.endswith("+00:00"):
        return "utc"
    if len(s) > 10 and _OFFSET.search(s[10:]):
        return "aware"
    return "naive"


def to_utc(stamp: str) -> str | None:
    moment = _iso(stamp)
    if moment is None or moment.tzinfo is None:
        return None
    return moment.astimezone(timezone.utc).isoformat()


def _memory_stamps(ctx: Ctx) -> list[Any]:
    return list(probes.memory_stamps(ctx.conn, ctx.agent_id))


def _classes(stamps: list[str]) -> dict[str, int]:
    counts = {"utc": 0, "aware": 0, "naive": 0}
    for s in stamps:
        counts[stamp_class(s)] += 1
    return counts


def _drifting(counts: dict[str, int]) -> bool:
    return sum(1 for v in counts.values() if v) > 1 or counts["aware"] > 0


def detect_memory_drift(ctx: Ctx) -> list[Issue]:
    rows = _memory_stamps(ctx)
    counts = _classes([r.timestamp for r in rows])
    if not _drifting(counts):
        return []
    aware = [r for r in rows if stamp_class(r.timestamp) == "aware"]
    issue: Issue = {
        "type": "timestamp_format_drift",
        **counts,
        "repairable": sum(1 for r in aware if not r.locked and to_utc(r.timestamp)),
    }
    locked = sum(1 for r in aware if r.locked)
    if locked:
        issue["unfixable_locked"] = locked
    if counts["naive"]:
        issue["unfixable_naive"] = counts["naive"]
    return [issue]


def repair_memory_drift(ctx: Ctx, issues: list[Issue]) -> None:
    written = 0
    for r in _memory_stamps(ctx):
        if stamp_class(r.timestamp) == "aware" and not r.locked and (utc := to_utc(r.timestamp)):
            written += probes.set_memory_timestamp(ctx.conn, r.id, utc)
    for issue in issues:
        issue["normalized"] = written


def _episode_values(ctx: Ctx) -> list[tuple[int, str, str, str | None]]:
    """(episode id, column, value, replacement or None) for every non-empty start/end value."""
    out = []
    for r in probes.episode_stamps(ctx.conn, ctx.agent_id):
        for column in ("start_time", "end_time"):
            value = getattr(r, column)
            if not value:
                continue
            cls = stamp_class(value)
            fix = None
            if cls == "aware":
                fix = to_utc(value)
            elif cls == "naive" and value == r.created_at:
                fix = canonical_utc(r.created_at)
            out.append((r.id, column, value, fix))
    return out


def detect_episode_drift(ctx: Ctx) -> list[Issue]:
    values = _episode_values(ctx)
    counts = _classes([v[2] for v in values])
    if not _drifting(counts):
        return []
    issue: Issue = {
        "type": "episode_timestamp_format_drift",
        **counts,
        "repairable": sum(1 for v in values if v[3] is not None),
    }
    unfixable = sum(1 for v in values if stamp_class(v[2]) == "naive" and v[3] is None)
    if unfixable:
        issue["unfixable_naive"] = unfixable
        issue["hint"] = (
            "naive start/end values that differ from created_at are left alone: their time zone cannot be known"
        )
    return [issue]


def repair_episode_drift(ctx: Ctx, issues: list[Issue]) -> None:
    written = 0
    for row_id, column, _, fix in _episode_values(ctx):
        if fix is not None:
            written += probes.set_episode_stamp(ctx.conn, row_id, column, fix)
    for issue in issues:
        issue["normalized"] = written


# -- 23: future_episode_timestamp -----------------------------------------------------------------


def _future_episodes(ctx: Ctx) -> list[Any]:
    return [
        r for r in probes.episode_stamps(ctx.conn, ctx.agent_id) if _ahead(ctx, r.start_time) or _ahead(ctx, r.end_time)
    ]


def detect_future_episode(ctx: Ctx) -> list[Issue]:
    rows = _future_episodes(ctx)
    if not rows:
        return []
    return [
        {
            "type": "future_episode_timestamp",
            "count": len(rows),
            "repairable": sum(1 for r in rows if _future_fix(ctx, r.created_at)),
        }
    ]


def repair_future_episode(ctx: Ctx, issues: list[Issue]) -> None:
    for r in _future_episodes(ctx):
        stamp = _future_fix(ctx, r.created_at)
        if not stamp:
            continue
        for column in ("start_time", "end_time"):
            if _ahead(ctx, getattr(r, column)):
                probes.set_episode_stamp(ctx.conn, r.id, column, stamp)


# -- 24: stale_pending_tasks ----------------------------------------------------------------------


def _stale_cutoff(ctx: Ctx) -> str:
    return (ctx.now - STALE_TASK_AGE).astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def detect_stale_tasks(ctx: Ctx) -> list[Issue]:
    count = probes.tasks_older_than(ctx.conn, ctx.agent_id, _stale_cutoff(ctx))
    return [{"type": "stale_pending_tasks", "count": count, "repairable": count}] if count else []


def repair_stale_tasks(ctx: Ctx, issues: list[Issue]) -> None:
    probes.delete_tasks_older_than(ctx.conn, ctx.agent_id, _stale_cutoff(ctx))


# -- 25: missing_profile --------------------------------------------------------------------------


def detect_missing_profile(ctx: Ctx) -> list[Issue]:
    agents = probes.agents_without_profile(ctx.conn, ctx.agent_id)
    return [{"type": "missing_profile", "count": len(agents), "agents": agents}] if agents else []


# -- 26: empty_content ----------------------------------------------------------------------------


def detect_empty(ctx: Ctx) -> list[Issue]:
    r = probes.blank_counts(ctx.conn, ctx.agent_id)
    return [{"type": "empty_content", "count": r.n, "repairable": int(r.u)}] if r.n else []


def repair_empty(ctx: Ctx, issues: list[Issue]) -> None:
    delete_unlocked(ctx, probes.blank_unlocked_ids(ctx.conn, ctx.agent_id))


# -- 27: invalid_source_type ----------------------------------------------------------------------


def mapped_source(raw: str) -> str | None:
    """The canonical re-encoding of a source the normaliser can map, else None."""
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    shaped = normalize_source(value)
    if isinstance(shaped, dict) and shaped.get("type") in CANONICAL_TYPES and shaped != value:
        return json.dumps(shaped, ensure_ascii=False)
    return None


def _offenders(ctx: Ctx, *, unlocked: bool, limit: int | None = None) -> list[Any]:
    return probes.bad_source_rows(ctx.conn, ctx.agent_id, unlocked=unlocked, limit=limit)


def _count_offenders(ctx: Ctx, *, unlocked: bool) -> int:
    return probes.bad_source_count(ctx.conn, ctx.agent_id, unlocked=unlocked)


def detect_source_type(ctx: Ctx) -> list[Issue]:
    count = _count_offenders(ctx, unlocked=False)
    if not count:
        return []
    cap = int(ctx.settings.invalid_source_classify_cap)
    unlocked = _offenders(ctx, unlocked=True, limit=cap + 1)
    classified = unlocked[:cap]
    mappable = sum(1 for r in classified if mapped_source(r.source))
    issue: Issue = {"type": "invalid_source_type", "count": count}
    if len(unlocked) > cap:
        issue["repairable"] = None  # H-14: more offenders than one run classifies
        issue["classified"] = len(classified)
    else:
        issue["repairable"] = mappable
    return [issue]


def repair_source_type(ctx: Ctx, issues: list[Issue]) -> None:
    cap = int(ctx.settings.invalid_source_classify_cap)
    mapped = unmapped = 0
    for r in _offenders(ctx, unlocked=True, limit=cap):
        shaped = mapped_source(r.source)
        if shaped is None:
            unmapped += 1
        else:
            mapped += probes.set_source(ctx.conn, r.id, shaped)
    total = _count_offenders(ctx, unlocked=False)
    remaining = _count_offenders(ctx, unlocked=True)
    locked = total - remaining
    for issue in issues:
        issue.update(mapped=mapped, unmapped=unmapped, locked=locked, remaining=remaining)
        if issue.get("repairable") is None:
            issue["hint"] = (
                f"at most {cap} rows are classified per run: run fix again until `remaining` stops decreasing"
            )
        elif mapped == 0:
            hint = (
                "nothing here maps to User/Agent/System: repairing these sources is a reviewed migration, "
                "not an automatic fix"
            )
            if remaining == 0 and locked:
                hint += "; every offender is locked — unlock them first"
            issue["hint"] = hint


# -- 28: oversized_profile ------------------------------------------------------------------------


def detect_oversized_profile(ctx: Ctx) -> list[Issue]:
    cap = int(ctx.settings.max_profile_length)
    n = probes.oversized_profile_count(ctx.conn, ctx.agent_id, cap)
    return [{"type": "oversized_profile", "count": n, "max_len": cap, "repairable": n}] if n else []


def repair_oversized_profile(ctx: Ctx, issues: list[Issue]) -> None:
    probes.truncate_profiles(ctx.conn, ctx.agent_id, int(ctx.settings.max_profile_length))


# -- 29: anonymous_source -------------------------------------------------------------------------


def detect_anonymous(ctx: Ctx) -> list[Issue]:
    r = probes.anonymous_counts(ctx.conn, ctx.agent_id)
    sentinel, unattributed = int(r.s), int(r.u)
    if not (sentinel or unattributed):
        return []
    issue: Issue = {"type": "anonymous_source", "count": sentinel + unattributed}
    if unattributed:
        issue["unattributed"] = unattributed
    if sentinel:
        issue["hint"] = (
            "names can often be recovered from a leading [name] in the text: run "
            "deep_check with checks=['anonymous_source']"
        )
    return [issue]


CHECKS = [
    Check("axis_hygiene", "warn", detect_axis),
    Check("invalid_json", "warn", detect_json, repair_json),
    Check("invalid_timestamp", "warn", detect_invalid_ts, repair_invalid_ts),
    Check("future_timestamp", "warn", detect_future, repair_future),
    Check("missing_episode_start_time", "info", detect_missing_start, repair_missing_start),
    Check("timestamp_format_drift", "warn", detect_memory_drift, repair_memory_drift),
    Check("episode_timestamp_format_drift", "warn", detect_episode_drift, repair_episode_drift),
    Check("future_episode_timestamp", "warn", detect_future_episode, repair_future_episode),
    Check("stale_pending_tasks", "warn", detect_stale_tasks, repair_stale_tasks),
    Check("missing_profile", "info", detect_missing_profile),
    Check("empty_content", "warn", detect_empty, repair_empty),
    Check("invalid_source_type", "warn", detect_source_type, repair_source_type),
    Check("oversized_profile", "warn", detect_oversized_profile, repair_oversized_profile),
    Check("anonymous_source", "info", detect_anonymous),
]
