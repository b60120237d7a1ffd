"""Check 37, missing_nodes: records past the embedding window without current overflow nodes (spec R-49).

"Past the window" is the backend's token report (services/records/nodes.py, OV-1), a
network request, so :func:`measure` asks it in :func:`prepare` before any lock
is taken (spec H-4); the check itself only re-reads the database. Currency is
the node builder's own test (``nodes.current_nodes`` with the accepted model
keys), so the check and the builder cannot disagree about what "current" means.

The repair queues ``build_nodes`` tasks (services/operations/tasks.py) inside the run's
write transaction instead of building in place: building embeds every node,
which must not happen under the write lock, and the queue lives in the
database, so a build interrupted by a restart still runs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from cpersona.services.records import nodes
from cpersona.services.app import App
from cpersona.services.health.registry import Check, Ctx, Issue, Prep
from cpersona.services.operations.tasks import enqueue
from cpersona.storage import health_probes as probes
from cpersona.storage.repositories.episodes import EpisodeRepository
from cpersona.storage.repositories.memories import MemoryRepository
from cpersona.storage.repositories.tasks import TaskRepository

BUILD_CAP = 50  # records one fix run queues
REPORT_BATCH = 256  # texts per token-report request
MEASURE_CAP = 20000  # records measured per run and table; past it the count is a lower bound

HINT_UNKNOWN = (
    "the embedding backend did not return token counts, so records past the window cannot be "
    "told apart; check that its count_tokens route answers, then re-run"
)
HINT_QUEUE_OFF = (
    "node builds run on the task queue, which is off (CPERSONA_TASK_QUEUE_ENABLED=false); "
    "turn it on to let fix queue them"
)


@dataclass
class NodeScan:
    """What the token report said, gathered before the lock."""

    failed: bool = False  # a report was expected and not returned
    complete: bool = True  # False when a table had more rows than MEASURE_CAP
    # (kind, id, agent_id, project_id, text) of every record past the window
    past: list[tuple[str, int, str, str, str]] = field(default_factory=list)
    model_keys: frozenset[str] = frozenset()


def measure(app: App, prep: Prep, agent_id: str) -> None:
    """Token reports for every record without current nodes; leaves ``prep.nodes`` None when there is no report."""
    reporter = app.token_reporter
    if reporter is None or app.embedder is None:
        return  # no backend reports tokens: the feature is off and nothing is expected
    scan = NodeScan(model_keys=nodes.accepted_model_keys(app))
    candidates: list[tuple[str, int, str, str, str]] = []
    with app.db.read() as session:
        conn = session.connection()
        for kind in nodes.KINDS:
            rows = probes.texts_to_measure(conn, kind, agent_id, MEASURE_CAP + 1)
            if len(rows) > MEASURE_CAP:
                scan.complete, rows = False, rows[:MEASURE_CAP]
            noded = probes.noded_parents(conn, kind)
            for row in rows:
                if (
                    row.id in noded
                    and nodes.current_nodes(session, kind, row.id, row.body, model_keys=scan.model_keys) is not None
                ):
                    continue
                candidates.append((kind, row.id, row.agent_id, row.project_id, row.body))
    for start in range(0, len(candidates), REPORT_BATCH):
        batch = candidates[start : start + REPORT_BATCH]
        infos = reporter.report([c[4] for c in batch])
        if infos is None:
            prep.nodes = NodeScan(failed=True)
            return
        scan.past.extend(c for c, info in zip(batch, infos) if info.truncated)
    prep.nodes = scan


def _queued_ids(ctx: Ctx) -> set[tuple[str, int]]:
    """Records that already have a build waiting, so a second fix does not queue them twice."""
    found: set[tuple[str, int]] = set()
    for payload in TaskRepository(ctx.conn).payloads_of(nodes.TASK_TYPE):
        try:
            body = json.loads(payload)
        except (TypeError, ValueError):
            continue
        if isinstance(body, dict) and body.get("kind") in nodes.KINDS and isinstance(body.get("id"), int):
            found.add((body["kind"], body["id"]))
    return found


def _still_missing(ctx: Ctx, scan: NodeScan) -> list[tuple[str, int, str, str, str]]:
    """The measured records whose text is unchanged and whose nodes are still not current."""
    out = []
    for record in scan.past:
        kind, record_id, *_, body = record
        if nodes.record_text(ctx.conn, kind, record_id) != body:
            continue  # deleted or rewritten since it was measured: its own write queued a build
        if nodes.current_nodes(ctx.conn, kind, record_id, body, model_keys=scan.model_keys) is None:
            out.append(record)
    return out


def detect_missing_nodes(ctx: Ctx) -> list[Issue]:
    scan = getattr(ctx.prep, "nodes", None)
    if scan is None:
        return []
    if scan.failed:
        return [{"type": "missing_nodes", "count": None, "repairable": 0, "hint": HINT_UNKNOWN}]
    missing = _still_missing(ctx, scan)
    if not missing:
        return []
    queued = _queued_ids(ctx)
    waiting = sum((r[0], r[1]) in queued for r in missing)
    buildable = 0 if not ctx.settings.task_queue_enabled else min(len(missing) - waiting, BUILD_CAP)
    issue: Issue = {
        "type": "missing_nodes",
        "count": len(missing),
        "memories": sum(r[0] == "mem" for r in missing),
        "episodes": sum(r[0] == "ep" for r in missing),
        "repairable": buildable,
    }
    if waiting:
        issue["already_queued"] = waiting
    if not scan.complete:
        issue["complete"] = False
    if not ctx.settings.task_queue_enabled:
        issue["hint"] = HINT_QUEUE_OFF
    return [issue]


def repair_missing_nodes(ctx: Ctx, issues: list[Issue]) -> None:
    issue = issues[0]
    to_build: list[tuple[str, int, str, str, str]] = []
    if issue.get("repairable"):
        queued = _queued_ids(ctx)
        to_build = [r for r in _still_missing(ctx, ctx.prep.nodes) if (r[0], r[1]) not in queued][:BUILD_CAP]
    for kind, record_id, agent_id, project_id, _ in to_build:
        enqueue(
            ctx.app,
            ctx.conn,
            nodes.TASK_TYPE,
            agent_id=agent_id,
            project_id=project_id,
            payload={"kind": kind, "id": record_id},
        )
    # Builds run on the queue after this commit; `built` counts none here, `queued` says what was handed over.
    if issue["count"] is None:
        issue["built"] = 0
        return
    issue.update(
        built=0, queued=len(to_build), remaining=issue["count"] - len(to_build) - issue.get("already_queued", 0)
    )
    if issue["remaining"] > 0:
        issue["hint"] = "bounded repair: re-run fix until remaining reaches 0"


CHECK = Check("missing_nodes", "info", detect_missing_nodes, repair_missing_nodes)


# -- post-commit follow-up (H-6) ----------------------------------------------------------------


def queue_after_rewrites(app: App, rewritten: set[tuple[str, int]]) -> int:
    """Queue node builds for records this run rewrote whose new text still runs past the window.

    The rewrite's own trigger already removed the stale nodes; a store would have
    queued a build for the new text, so a repair does the same. Runs after the
    fix commits: the token report is a network call and never runs under the lock.
    Returns the number of builds queued.
    """
    reporter = app.token_reporter
    if not rewritten or reporter is None or not app.settings.task_queue_enabled:
        return 0
    wanted = sorted(rewritten)[:MEASURE_CAP]
    with app.db.read() as session:
        records = [(kind, rid, nodes.record_text(session, kind, rid)) for kind, rid in wanted]
    records = [r for r in records if r[2]]
    past: list[tuple[str, int, str]] = []
    for start in range(0, len(records), REPORT_BATCH):
        batch = records[start : start + REPORT_BATCH]
        infos = reporter.report([r[2] for r in batch])
        if infos is None:
            return 0  # unknown is never "fits" nor "past": missing_nodes will find them later
        past.extend(r for r, info in zip(batch, infos) if info.truncated)
    queued = 0
    with app.db.write() as session:
        for kind, record_id, body in past:
            if nodes.record_text(session, kind, record_id) != body:
                continue  # changed again since: that write queued its own build
            owner = (MemoryRepository if kind == "mem" else EpisodeRepository)(session).bucket_of(record_id)
            queued += nodes.queue_build(
                app, session, kind, record_id, agent_id=owner.agent_id, project_id=owner.project_id
            )
    return queued
