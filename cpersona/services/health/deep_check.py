"""deep_check: heuristic, per-agent data-quality analysis; two of its eight checks repair (spec §5)."""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection

from cpersona.services.app import App
from cpersona.services.calibration.sidecar import read_sidecar, scoring_version
from cpersona.storage import dialect
from cpersona.storage import health_probes as probes
from cpersona.services.health.registry import dedupe, unknown_names, unknown_refusal
from cpersona.services.requests import Request
from cpersona.services.timestamps import instant_seconds

STALE_PROFILE_DAYS = 30
STALE_CALIBRATION_DAYS = 90
NEVER_CALIBRATED_MIN_ROWS = 50
NEAR_DUPLICATE_COSINE = 0.97
NORM_TOLERANCE = 0.001
NORM_SCAN_ROWS = 2000
BLOCK = 256  # rows per block of the near-duplicate product: bounds memory at BLOCK x cap floats
_NAME_PREFIX = re.compile(r"^\[([^\[\]\n]{1,64})\] ")
_NOT_NAMES = frozenset(
    {
        "x",
        "episode",
        "profile",
        "trace",
        "debug",
        "info",
        "notice",
        "warn",
        "warning",
        "error",
        "err",
        "critical",
        "crit",
        "fatal",
        "alert",
        "emerg",
    }
)
_STAMP = re.compile(r"^\d{1,4}([-/:.]\d{1,4})+([ T]\d{1,2}(:\d{2}){1,2}(\.\d+)?)?(Z|[+-]\d{2}:?\d{2})?$")


class DeepCtx:
    def __init__(self, app: App, conn: Connection, agent_id: str, fix: bool) -> None:
        self.app, self.conn, self.agent_id, self.fix = app, conn, agent_id, fix
        self.removed: list[str] = []  # refs of the agent's rows deleted, for the remote index after commit
        dialect.JsonSql(conn).prepare(conn)  # the sentinel test reads JSON on PostgreSQL


# -- anonymous_source (DC-5) ---------------------------------------------------------------------


def recovered_name(content: str) -> str | None:
    if content.startswith("[Memory from"):
        return None
    match = _NAME_PREFIX.match(content)
    if not match:
        return None
    name = match.group(1)
    if (
        not any(ch.isalpha() for ch in name)
        or name.lower() in _NOT_NAMES
        or name[0] in "!^"
        or _STAMP.match(name.strip())
    ):
        return None
    return name


def anonymous_source(ctx: DeepCtx) -> dict[str, Any]:
    rows = probes.sentinel_rows(ctx.conn, ctx.agent_id)
    found = [(r, recovered_name(r.content)) for r in rows]
    good = [(r, n) for r, n in found if n]
    bad = [r for r, n in found if not n]
    out: dict[str, Any] = {"recoverable": len(good), "unrecoverable": len(bad)}
    if ctx.fix:
        fixed = 0
        for r, name in good:
            if not r.locked:
                source = '{"type": "User", "id": "", "name": ' + _json_str(name) + "}"
                fixed += probes.set_source(ctx.conn, r.id, source)
        out["fixed"] = fixed
        locked = sum(1 for r, _ in good if r.locked)
        if locked:
            out["unfixable_locked"] = locked
    if good:
        out["samples"] = [{"id": r.id, "recovered_name": n} for r, n in good[:5]]
    if bad:
        out["unrecoverable_samples"] = [{"id": r.id, "content_preview": r.content[:60]} for r in bad[:5]]
    return out


def _json_str(value: str) -> str:
    import json

    return json.dumps(value, ensure_ascii=False)


# -- short_content (DC-6) ------------------------------------------------------------------------


def weighted_length(value: str) -> int:
    return sum(3 if unicodedata.east_asian_width(ch) in ("W", "F") else 1 for ch in value)


def _short_rows(ctx: DeepCtx) -> list[Any]:
    # A weighted length <= 5 implies at most 5 characters, so SQL narrows the scan first.
    rows = probes.short_rows(ctx.conn, ctx.agent_id, 5)
    return [r for r in rows if weighted_length(r.content.strip(" ")) <= 5]


def short_content(ctx: DeepCtx) -> dict[str, Any]:
    rows = _short_rows(ctx)
    out: dict[str, Any] = {"count": len(rows)}
    if ctx.fix:
        ids = [r.id for r in rows if not r.locked]
        fixed = probes.delete_unlocked_memories(ctx.conn, ids)
        ctx.removed.extend(f"mem:{i}" for i in ids)
        out["fixed"] = fixed
    if rows:
        out["samples"] = [{"id": r.id, "content": r.content} for r in rows[:10]]
    return out


# -- stale_profile (DC-7) ------------------------------------------------------------------------


def stale_profile(ctx: DeepCtx) -> dict[str, Any]:
    found, updated_at = probes.profile_updated_at(ctx.conn, ctx.agent_id)
    out: dict[str, Any] = {"count": 0, "threshold_days": STALE_PROFILE_DAYS}
    if found:
        seconds = instant_seconds(updated_at or "")
        now = ctx.app.clock().timestamp()
        if seconds is not None and now - seconds > STALE_PROFILE_DAYS * 86400:
            out["count"] = 1
            out["last_updated"] = updated_at
    return out


# -- orphaned_episodes (DC-8) --------------------------------------------------------------------


def orphaned_episodes(ctx: DeepCtx) -> dict[str, Any]:
    rows = probes.orphaned_episode_rows(ctx.conn, ctx.agent_id)
    out: dict[str, Any] = {"count": len(rows)}
    if rows:
        out["samples"] = [
            {"id": r.id, "summary": r.summary[:80], "start": r.start_time, "end": r.end_time} for r in rows[:5]
        ]
    return out


# -- calibration_staleness (DC-9) ----------------------------------------------------------------


def calibration_staleness(ctx: DeepCtx) -> dict[str, Any]:
    app = ctx.app
    if app.embedder is None:
        return {"status": "not_applicable", "reason": "no embedding client configured"}
    stored = read_sidecar(app.settings.calibration_sidecar)
    if stored.status == "unreadable":
        return {
            "status": "unreadable",
            "hint": f"the calibration sidecar cannot be parsed ({stored.error}); "
            "run calibrate_threshold to write a fresh one",
        }
    if stored.status == "missing":
        embedded = probes.embedded_count(ctx.conn, ctx.agent_id)
        if embedded >= NEVER_CALIBRATED_MIN_ROWS:
            return {"status": "never_calibrated", "embedded_rows": embedded, "hint": "run calibrate_threshold"}
        return {"status": "ok", "reason": f"corpus too small to matter ({embedded} embedded rows)"}
    values = stored.values
    runtime = scoring_version(app.settings)
    if values.scoring_version != runtime:
        hint = "restart the server so start-up recalibrates, or run calibrate_threshold"
        if not app.settings.auto_calibrate and not app.settings.calibrate_on_model_change:
            hint += " (or set CPERSONA_CALIBRATE_ON_MODEL_CHANGE=true)"
        return {
            "status": "stale_scoring_version",
            "sidecar_scoring_version": values.scoring_version,
            "runtime_scoring_version": runtime,
            "hint": hint,
        }
    seconds = instant_seconds(values.calibrated_at or "")
    if seconds is None:
        return {"status": "unknown", "reason": "the sidecar's calibrated_at cannot be read"}
    age_days = round((app.clock().timestamp() - seconds) / 86400, 1)
    if age_days > STALE_CALIBRATION_DAYS:
        return {
            "status": "stale",
            "age_days": age_days,
            "threshold_days": STALE_CALIBRATION_DAYS,
            "hint": "run calibrate_threshold: the corpus has likely changed since",
        }
    return {"status": "ok", "age_days": age_days}


# -- near_duplicate (DC-10) ----------------------------------------------------------------------


def near_duplicate(ctx: DeepCtx) -> dict[str, Any]:
    import numpy as np  # here: the tool's description (tools/list) imports this module, and numpy is 12 MiB

    cap = int(ctx.app.settings.near_duplicate_row_cap)
    rows = probes.newest_embedded_memories(ctx.conn, ctx.agent_id, cap)
    kept, vectors, excluded = [], [], 0
    for r in rows:
        blob = bytes(r.embedding)
        vec = np.frombuffer(blob, dtype="<f4") if len(blob) % 4 == 0 and blob else None
        if vec is None or not np.isfinite(vec).all():
            excluded += 1
            continue
        kept.append(r)
        vectors.append(vec)
    out: dict[str, Any] = {"pairs": 0, "rows_scanned": len(kept)}
    if excluded:
        out["skipped"] = f"{excluded} row(s) excluded: non-finite embedding"
    if len(kept) < 2:
        return out
    if len({v.shape[0] for v in vectors}) > 1:
        out["skipped"] = "mixed embedding dimensions"
        return out
    matrix = np.vstack(vectors).astype(np.float32)
    norms = np.linalg.norm(matrix, axis=1)
    norms[norms == 0] = 1.0
    matrix /= norms[:, None]
    pairs: list[tuple[float, int, int]] = []
    count = 0
    for start in range(0, len(kept), BLOCK):
        block = matrix[start : start + BLOCK] @ matrix.T  # BLOCK x n: memory stays bounded
        for i, j in zip(*np.nonzero(block > NEAR_DUPLICATE_COSINE)):
            a, b = start + int(i), int(j)
            if b <= a or kept[a].content == kept[b].content:
                continue
            count += 1
            pairs.append((float(block[i, j]), a, b))
            if len(pairs) > 200:  # only the best 20 are shown; keep the candidate list short
                pairs.sort(key=lambda p: (-p[0], p[1], p[2]))
                del pairs[20:]
    out["pairs"] = count
    out["threshold"] = NEAR_DUPLICATE_COSINE
    if pairs:
        pairs.sort(key=lambda p: (-p[0], p[1], p[2]))
        out["samples"] = [
            {
                "id_a": kept[a].id,
                "id_b": kept[b].id,
                "cosine": round(c, 4),
                "preview_a": kept[a].content[:60],
                "preview_b": kept[b].content[:60],
            }
            for c, a, b in pairs[:20]
        ]
        out["hint"] = "merge candidates: review them and use merge_memories where they say the same thing"
    return out


# -- unnormalized_content (DC-11) ----------------------------------------------------------------


def decomposed(value: str) -> list[str]:
    nfc = set(unicodedata.normalize("NFC", value))
    seen: list[str] = []
    for ch in value:
        code = f"U+{ord(ch):04X}"
        if ch not in nfc and code not in seen:
            seen.append(code)
    return seen[:12]


def unnormalized_content(ctx: DeepCtx) -> dict[str, Any]:
    cap = int(ctx.app.settings.normalization_scan_cap)
    by_table, scanned, samples, complete = {}, {}, [], True
    for table in ("memories", "episodes"):
        rows = probes.newest_texts(ctx.conn, table, ctx.agent_id, cap + 1)
        if len(rows) > cap:
            complete, rows = False, rows[:cap]
        bad = [r for r in rows if isinstance(r.body, str) and unicodedata.normalize("NFC", r.body) != r.body]
        by_table[table], scanned[table] = len(bad), len(rows)
        samples.extend(
            {"table": table, "id": r.id, "excerpt": r.body[:80], "decomposed_codepoints": decomposed(r.body)}
            for r in bad
        )
    out: dict[str, Any] = {
        "count": sum(by_table.values()),
        "by_table": by_table,
        "rows_scanned": scanned,
        "complete": complete,
    }
    if samples:
        out["samples"] = samples[:10]
    return out


# -- embedding_norm (DC-12) ----------------------------------------------------------------------


def embedding_norm(ctx: DeepCtx) -> dict[str, Any]:
    import numpy as np  # see near_duplicate

    by_table, scanned, samples, complete = {}, {}, [], True
    for table in ("memories", "episodes"):
        rows = probes.newest_vectors(ctx.conn, table, ctx.agent_id, NORM_SCAN_ROWS + 1)
        if len(rows) > NORM_SCAN_ROWS:
            complete, rows = False, rows[:NORM_SCAN_ROWS]
        bad = 0
        for r in rows:
            blob = bytes(r.embedding)
            if not blob or len(blob) % 4:
                continue
            norm = float(np.linalg.norm(np.frombuffer(blob, dtype="<f4").astype(np.float64)))
            if not np.isfinite(norm):
                continue
            if abs(norm - 1.0) > NORM_TOLERANCE:
                bad += 1
                samples.append({"table": table, "id": r.id, "norm": round(norm, 6)})
        by_table[table], scanned[table] = bad, len(rows)
    out: dict[str, Any] = {
        "count": sum(by_table.values()),
        "by_table": by_table,
        "rows_scanned": scanned,
        "tolerance": NORM_TOLERANCE,
        "complete": complete,
    }
    if samples:
        out["samples"] = samples[:10]
    return out


DeepFn = Callable[[DeepCtx], dict[str, Any]]
DEEP_CHECKS: dict[str, DeepFn] = {
    "anonymous_source": anonymous_source,
    "short_content": short_content,
    "stale_profile": stale_profile,
    "orphaned_episodes": orphaned_episodes,
    "calibration_staleness": calibration_staleness,
    "near_duplicate": near_duplicate,
    "unnormalized_content": unnormalized_content,
    "embedding_norm": embedding_norm,
}
FIXABLE = ("anonymous_source", "short_content")


def _run(ctx: DeepCtx, name: str) -> dict[str, Any]:
    try:
        with ctx.conn.begin_nested():
            return DEEP_CHECKS[name](ctx)
    except Exception as exc:  # noqa: BLE001 — DC-3: one check's failure is its result, not the call's
        return {"error": str(exc) or type(exc).__name__}


@dataclass(frozen=True)
class DeepCheckArguments(Request):
    """``deep_check``'s arguments in the types its schema declares; defaults are the schema's."""

    agent_id: str  # '' is the empty-agent bucket, not every agent
    fix: bool = False
    checks: Sequence[str] = ()  # none named: every check
    session_key: str = ""  # selects the pause bucket; the facade's pause gate reads it


def deep_check(
    app: App, *, agent_id: Any, fix: Any = False, checks: Any = None, session_key: Any = ""
) -> dict[str, Any]:
    """:func:`answer_deep_check` for a library caller, whose arguments no schema has checked."""
    # Anything but true reports only (a repair must be asked for); a non-string agent is the '' bucket.
    agent = agent_id if isinstance(agent_id, str) else ""
    named = tuple(str(name) for name in checks or ())
    return answer_deep_check(app, DeepCheckArguments(agent_id=agent, fix=fix is True, checks=named))


def answer_deep_check(app: App, args: DeepCheckArguments) -> dict[str, Any]:
    """The selected checks over one agent's rows; the fixable ones repair when ``fix`` (spec §5)."""
    valid = list(DEEP_CHECKS)
    unknown = unknown_names(args.checks, valid)
    if unknown:
        return unknown_refusal(unknown, valid)
    checks_run = dedupe(args.checks) or valid
    fix, agent = args.fix, args.agent_id
    results: dict[str, Any] = {}
    writers = [n for n in checks_run if fix and n in FIXABLE]
    readers = [n for n in checks_run if n not in writers]
    with app.db.engine.connect() as conn:
        with conn.begin() as txn:
            ctx = DeepCtx(app, conn, agent, False)
            for name in readers:
                results[name] = _run(ctx, name)
            txn.rollback()
    if writers:
        with app.db.write_connection() as conn:
            ctx = DeepCtx(app, conn, agent, True)
            for name in writers:
                results[name] = _run(ctx, name)
        from cpersona.services.records import remote_vectors  # here: it brings the embedding client

        remote_vectors.forget(app, agent, ctx.removed)  # after commit (remote vector mode)
    return {"agent_id": agent, "checks_run": checks_run, "results": {n: results[n] for n in checks_run}, "fixed": fix}
