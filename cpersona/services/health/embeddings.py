"""Checks 5-10: stored vectors and the embedding backend (spec R-17..R-22).

No check here calls the embedder: the probe and the re-embeddings are computed
by :func:`prepare` before any lock is taken (spec H-4), and the second pass
(:func:`second_pass`, H-7) embeds outside the lock and writes in a short
transaction of its own.
"""

from __future__ import annotations

from typing import Any

from cpersona.embedding.passages import embed_passages
from cpersona.services.app import App
from cpersona.services.health.registry import Check, Ctx, Issue, Prep
from cpersona.storage import health_probes as probes
from cpersona.storage.repositories.base import Repository
from cpersona.storage.repositories.episodes import EpisodeRepository
from cpersona.storage.repositories.memories import MemoryRepository

TABLES = probes.VECTOR_TABLES
_REPOSITORIES: dict[str, type[Repository]] = {"memories": MemoryRepository, "episodes": EpisodeRepository}
EMBED_BATCH = 32  # texts per request while re-embedding (H-4)
PAGE = 100  # vectors read per page by the non-finite scan

HINT_MODE_NONE = (
    "Nothing to repair: CPERSONA_EMBEDDING_MODE is 'none', so no embeddings are produced and a NULL blob is "
    "the resting state. Set a mode and restart to start embedding, then re-run with fix to backfill"
)
HINT_NO_CLIENT = (
    "Nothing to repair in this process: CPERSONA_EMBEDDING_MODE is set but no embedding client is installed "
    "here. Restart the server with a reachable backend, then re-run with fix to backfill"
)
HINT_NO_LOCAL = (
    "Nothing to repair: CPERSONA_VECTOR_SEARCH_MODE=remote with CPERSONA_STORE_BLOB=false keeps no local "
    "vectors, so a NULL blob is expected here"
)


def keeps_local_vectors(app: App) -> bool:
    s = app.settings
    return s.vector_search_mode != "remote" or s.store_blob


# -- preparation outside the lock (H-4, H-7) --------------------------------------------------


def probe(app: App, prep: Prep) -> None:
    embedder = app.embedder
    if embedder is None:
        return
    prep.probe_ran = True
    try:
        result = embedder.embed_query("test")
    except Exception as exc:  # noqa: BLE001 — a raising client is an unreachable one
        prep.probe_attempted, prep.probe_error = True, f"{type(exc).__name__}: {exc}"
        return
    outcome = result.outcome
    prep.probe_from_cache = bool(outcome.from_cache)
    prep.probe_attempted = bool(outcome.attempted)
    prep.probe_error = outcome.error
    if result.vector is not None:
        prep.dimension = int(result.vector.shape[0])
        prep.probe_ok = bool(outcome.ok and not outcome.from_cache)


def null_rows(app: App, table: str, agent_id: str, limit: int) -> list[tuple[int, str]]:
    with app.db.read() as session:
        rows = probes.null_vector_rows(session.connection(), table, agent_id, limit)
    return [(r.id, r.body) for r in rows if isinstance(r.body, str) and r.body.strip()]


def compute_vectors(app: App, rows: list[tuple[int, str]]) -> list[tuple[int, str, bytes]]:
    out: list[tuple[int, str, bytes]] = []
    for start in range(0, len(rows), EMBED_BATCH):
        batch = rows[start : start + EMBED_BATCH]
        blobs = embed_passages(app.embedder, [body for _, body in batch], batch_size=EMBED_BATCH)  # as a store does
        if all(b is None for b in blobs):
            break  # the backend stopped answering; what is left waits for the next run
        out.extend((row_id, body, blob) for (row_id, body), blob in zip(batch, blobs) if blob is not None)
    return out


def fault_latched(app: App) -> bool:
    return app.embedding_health.snapshot()[0] == "fault"


def precompute(app: App, prep: Prep, agent_id: str, tables: list[str]) -> None:
    """Re-embeddings for the NULL-vector tables whose checks run (H-4), at most the cap per table."""
    if app.embedder is None or not tables:
        return
    if fault_latched(app) and not prep.probe_ok:
        return  # a latched fault skips the pre-computation unless this run's probe got through
    for table in tables:
        if table == "memories" and not keeps_local_vectors(app):
            continue
        rows = null_rows(app, table, agent_id, int(app.settings.reembed_row_cap))
        prep.vectors[table] = compute_vectors(app, rows)


def write_vectors(conn: Any, table: str, vectors: list[tuple[int, str, bytes]]) -> int:
    """Write precomputed vectors where the row is still NULL and its text unchanged (R-21)."""
    rows = _REPOSITORIES[table](conn)
    return sum(rows.set_embedding_if_unchanged(i, b, v) for i, b, v in vectors)


def second_pass(app: App, agent_id: str, table: str, budget: int) -> int:
    """H-7: rows NULLed during the run, embedded outside the lock, written in a short transaction."""
    if app.embedder is None or budget <= 0:
        return 0
    vectors = compute_vectors(app, null_rows(app, table, agent_id, budget))
    if not vectors:
        return 0
    with app.db.write_connection() as conn:
        return write_vectors(conn, table, vectors)


# -- 5: embedding_dimension -----------------------------------------------------------------------


def _mismatch_counts(ctx: Ctx, dim: int) -> dict[str, int]:
    return {t: probes.wrong_width_count(ctx.conn, t, ctx.agent_id, dim * 4) for t in TABLES}


def detect_dimension(ctx: Ctx) -> list[Issue]:
    dim = ctx.prep.dimension
    if ctx.app.embedder is None or not dim:
        return []
    counts = _mismatch_counts(ctx, dim)
    total = sum(counts.values())
    if not total:
        return []
    return [
        {
            "type": "embedding_dimension_mismatch",
            "count": total,
            "memories": counts["memories"],
            "episodes": counts["episodes"],
            "expected_dim": dim,
            "repairable": total,
        }
    ]


def repair_dimension(ctx: Ctx, issues: list[Issue]) -> None:
    for table in TABLES:
        if probes.clear_wrong_width(ctx.conn, table, ctx.agent_id, ctx.prep.dimension * 4):
            ctx.nulled.add(table)


# -- 6: nonfinite_embedding -----------------------------------------------------------------------


def nonfinite_ids(ctx: Ctx, table: str) -> list[int]:
    # Imported here: the registry (rendered into check_health's description on the first
    # tools/list) imports this module, and numpy is 12 MiB a listing never uses.
    import numpy as np

    found: list[int] = []
    after = 0
    while True:
        rows = probes.vector_page(ctx.conn, table, ctx.agent_id, after, PAGE)
        if not rows:
            return found
        after = rows[-1].id
        for r in rows:
            blob = bytes(r.embedding)
            if len(blob) % 4 == 0 and not np.isfinite(np.frombuffer(blob, dtype="<f4")).all():
                found.append(r.id)


def detect_nonfinite(ctx: Ctx) -> list[Issue]:
    issues = []
    for table in TABLES:
        ids = nonfinite_ids(ctx, table)
        if ids:
            issues.append({"type": "nonfinite_embedding", "table": table, "count": len(ids), "repairable": len(ids)})
    return issues


def repair_nonfinite(ctx: Ctx, issues: list[Issue]) -> None:
    for issue in issues:
        probes.clear_vectors(ctx.conn, issue["table"], nonfinite_ids(ctx, issue["table"]))
        ctx.nulled.add(issue["table"])


# -- 7: embedding_backend (report-only) -------------------------------------------------------------

SEMANTIC_DEGRADED = "degraded — recall is falling back to keyword/FTS"
HINT_UNREACHABLE = (
    "the configured embedding backend did not answer; restart or reconfigure it, then re-run "
    "this check to confirm recovery"
)
HINT_MISCONFIGURED = (
    "no request could be sent, so this is configuration, not an outage: fix the embedding "
    "URL / key settings and restart, then re-run this check"
)
HINT_NOT_PROBED = (
    "liveness is not judged on a report-only run — only a fix=true run reads its probe as "
    "liveness evidence. A finding-free result here is not evidence the backend is up"
)


def _evidence(ctx: Ctx, error: str | None) -> str:
    embedder = ctx.app.embedder
    return f"mode={embedder.mode} / {error or 'the embedding call produced no vector'}"


def detect_backend(ctx: Ctx) -> list[Issue]:
    if ctx.app.embedder is None:
        return []  # "no backend configured" is never reported here
    prep = ctx.prep
    if ctx.judge_liveness:
        if prep.probe_ok:
            return []
        if prep.probe_from_cache:
            return [
                {
                    "type": "embedding_backend_not_probed",
                    "status": "not_probed",
                    "reason": "served_from_cache",
                    "hint": "the probe was answered from the client's cache, so it says nothing about the backend",
                }
            ]
        if not prep.probe_attempted and prep.probe_error:
            return [
                {
                    "type": "embedding_backend_misconfigured",
                    "status": "misconfigured",
                    "severity": "warn",
                    "evidence": _evidence(ctx, prep.probe_error),
                    "semantic_recall": SEMANTIC_DEGRADED,
                    "hint": HINT_MISCONFIGURED,
                }
            ]
        return [
            {
                "type": "embedding_backend_unreachable",
                "status": "unreachable",
                "severity": "warn",
                "evidence": _evidence(ctx, prep.probe_error),
                "semantic_recall": SEMANTIC_DEGRADED,
                "hint": HINT_UNREACHABLE,
            }
        ]
    state, kind, evidence, _ = ctx.app.embedding_health.snapshot()
    if state == "fault":
        kind = "misconfigured" if kind == "misconfigured" else "unreachable"
        return [
            {
                "type": f"embedding_backend_{kind}",
                "status": kind,
                "severity": "warn",
                "evidence": _evidence(ctx, evidence),
                "semantic_recall": SEMANTIC_DEGRADED,
                "hint": HINT_MISCONFIGURED if kind == "misconfigured" else HINT_UNREACHABLE,
            }
        ]
    return [
        {
            "type": "embedding_backend_not_probed",
            "status": "not_probed",
            "last_observed": state,
            "reason": "no_probe_on_this_run",
            "hint": HINT_NOT_PROBED,
        }
    ]


# -- 8: embedding_model (report-only) -------------------------------------------------------------


def detect_model(ctx: Ctx) -> list[Issue]:
    embedder = ctx.app.embedder
    mode = ctx.settings.embedding_model_mode
    current = getattr(embedder, "model_label", "") if embedder is not None else ""
    tables = probes.labelled_tables(ctx.conn)
    # nothing to compare without labels on the rows or a known current identity.
    if mode == "off" or not current or not tables:
        return []
    accepted = {current, getattr(embedder, "model", "")} - {""}
    counts: dict[str, int] = {"memories": 0, "episodes": 0}
    labels: dict[str, int] = {}
    for table in tables:
        for r in probes.foreign_labels(ctx.conn, table, ctx.agent_id, accepted):
            counts[table] += r.n
            labels[r.label] = labels.get(r.label, 0) + r.n
    total = sum(counts.values())
    if not total:
        return []
    top = sorted(labels.items(), key=lambda kv: (-kv[1], kv[0]))[:5]
    recall = (
        "treated as unembedded (keyword search only)"
        if mode == "reject"
        else "still compared by vector; scores across models are not comparable"
    )
    return [
        {
            "type": "embedding_model_mismatch",
            "count": total,
            "memories": counts["memories"],
            "episodes": counts["episodes"],
            "current": current,
            "labels": [{"label": k, "count": v} for k, v in top],
            "mode": mode,
            "recall": recall,
            "hint": "re-embed these rows with the current model (export, clear vectors, backfill) "
            "or restore the model that produced them",
        }
    ]


# -- 9, 10: NULL vectors --------------------------------------------------------------------------


def _null_check(name: str, table: str) -> Check:
    def detect(ctx: Ctx) -> list[Issue]:
        row = probes.null_vector_counts(ctx.conn, table, ctx.agent_id)
        count = int(row.nulls)
        if not count:
            return []
        issue: Issue = {"type": name, "count": count}
        app = ctx.app
        no_local = table == "memories" and not keeps_local_vectors(app)
        if app.embedder is None or no_local:
            issue["severity"] = "info"
            issue["repairable"] = 0
            if no_local and app.embedder is not None:
                issue["hint"] = HINT_NO_LOCAL
                issue["repair"] = "skipped: this configuration stores no local memory embeddings"
            else:
                issue["hint"] = HINT_MODE_NONE if ctx.settings.embedding_mode == "none" else HINT_NO_CLIENT
            return [issue]
        issue["severity"] = "critical" if count * 2 > int(row.total) else "warn"
        issue["repairable"] = min(count, int(ctx.settings.reembed_row_cap))
        if ctx.fix:
            issue["re_embedded"] = 0  # an outcome even when nothing could be written
        return [issue]

    def repair(ctx: Ctx, issues: list[Issue]) -> None:
        written = write_vectors(ctx.conn, table, ctx.prep.vectors.get(table, []))
        for issue in issues:
            if "re_embedded" in issue:
                issue["re_embedded"] = written

    return Check(name, "warn", detect, repair)


CHECKS = [
    Check("embedding_dimension", "critical", detect_dimension, repair_dimension),
    Check("nonfinite_embedding", "warn", detect_nonfinite, repair_nonfinite),
    Check("embedding_backend", "info", detect_backend),
    Check("embedding_model", "info", detect_model),
    _null_check("null_embedding", "memories"),
    _null_check("null_episode_embedding", "episodes"),
]
