"""Checks 30-38: configuration, index files, operating context, file modes, derived rows (spec R-42..R-50).

Several of these watch features this build does not have (contiguous, coarse and
block index files, record blocks — spec README decision 6). They stay registered
so the registry, ``checks_run`` and the count are stable (spec §9 open point 3),
and in the "feature off" state they report nothing.
"""

from __future__ import annotations

import glob
import os
import stat
from pathlib import Path

from cpersona.services.health import derived
from cpersona.services.health.registry import Check, Ctx, Issue
from cpersona.services.operating_context import SUMMARY_SIZE_HINT, read_state
from cpersona.services.calibration.sidecar import glob_escape
from cpersona.storage import coarse_sqlite
from cpersona.storage import health_probes as probes


def _nothing(ctx: Ctx) -> list[Issue]:
    """The detector of vector_index, block_index and missing_blocks: always no issue.

    Their features (contiguous vector index files, record blocks and their
    index) do not exist in this build (spec README decision 6),
    so the "feature off" state is the only state and it reports nothing (§9 point 3).
    """
    return []


def _no_repair(ctx: Ctx, issues: list[Issue]) -> None:
    """The repair slot of the feature-off fix-capable checks: there is never an issue to repair."""
    return None


# -- 32: coarse_index ---------------------------------------------------------------------------


def detect_coarse(ctx: Ctx) -> list[Issue]:
    """Rows the coarse index (storage/coarse_sqlite.py) lost track of, while a far list reads it.

    Only writers without our TEMP triggers (no sqlite-vec: the sqlite3 shell,
    CPersona 2.6) leave it behind. Silent while no far list reads it (R-44:
    CPERSONA_VECTOR_REACH not past CPERSONA_MAX_MEMORIES), as with the feature off.
    """
    if not ctx.app.db.is_sqlite or ctx.settings.vector_reach <= ctx.settings.max_memories:
        return []
    if not coarse_sqlite.present(ctx.conn):
        return []
    return [
        {
            "type": "coarse_index_drift",
            "table": table,
            "stale_rows": n["stale"],
            "missing_rows": n["missing"],
            "repairable": 1,
            "hint": "rows written by a program without sqlite-vec; fix rewrites their index rows "
            "(cpersona also does at every start)",
        }
        for table, n in coarse_sqlite.drift(ctx.conn).items()
    ]


def repair_coarse(ctx: Ctx, issues: list[Issue]) -> None:
    coarse_sqlite.reconcile(ctx.conn)
    left = coarse_sqlite.drift(ctx.conn)
    for issue in issues:
        issue["fixed"] = issue["table"] not in left


# -- 30: vector_fallback_config -----------------------------------------------------------------


def detect_vector_fallback(ctx: Ctx) -> list[Issue]:
    s = ctx.settings
    if s.vector_search_mode != "remote" or s.store_blob:
        return []
    r = probes.local_vector_counts(ctx.conn, ctx.agent_id)
    return [
        {
            "type": "no_local_vector_fallback",
            "vector_search_mode": s.vector_search_mode,
            "store_blob": s.store_blob,
            "memories": r.n,
            "memories_with_local_embedding": int(r.e),
            "hint": "no local vectors are kept: a remote /search outage would leave keyword-only recall; set "
            "CPERSONA_STORE_BLOB=true to keep a local fallback",
        }
    ]


# -- 34, 35: operating context --------------------------------------------------------------------


def detect_context_parse(ctx: Ctx) -> list[Issue]:
    state = read_state(ctx.settings)
    if state.status != "unusable":
        return []
    issue: Issue = {"type": "operating_context_parse_error"}
    if not ctx.scoped:
        issue["path"] = str(state.path)  # paths only on whole-database calls
    issue["detail"] = state.error
    issue["hint"] = "operating context is dormant until the sidecar parses; edit the file"
    return [issue]


def detect_context_size(ctx: Ctx) -> list[Issue]:
    context = read_state(ctx.settings).active
    if context is None or len(context.summary) <= SUMMARY_SIZE_HINT:
        return []
    issue: Issue = {"type": "operating_context_summary_oversized"}
    if not ctx.scoped:
        issue["path"] = str(read_state(ctx.settings).path)
    issue.update(
        summary_len=len(context.summary),
        budget=SUMMARY_SIZE_HINT,
        hint="clients get this summary at every connection; move detail into [[doctrine]] sections",
    )
    return [issue]


# -- 36: file_permissions -----------------------------------------------------------------------


def server_files(ctx: Ctx) -> list[tuple[Path, str]]:
    """(path, what it holds) for every file the server keeps beside the database (R-48)."""
    s = ctx.settings
    db = Path(ctx.app.db.path or s.db_file)
    files = [
        (db, "the memory database"),
        (Path(f"{db}-wal"), "the database's write-ahead log"),
        (Path(f"{db}-shm"), "the database's shared-memory index"),
        (s.calibration_sidecar, "calibrated thresholds"),
    ]
    files += [
        (Path(p), "a calibration backup")
        for p in sorted(glob.glob(glob_escape(str(s.calibration_sidecar)) + ".before-*"))
    ]
    files += [(s.update_check_cache, "the update-check cache"), (s.alias_ledger_path, "the alias ledger")]
    for table in ("memories", "episodes"):
        files.append((Path(f"{db}.{table}.vecindex"), "a vector index"))
        files.append((Path(f"{db}.{table}.coarseindex"), "a coarse vector index"))
    files.append((Path(f"{db}.blocks.blockindex"), "the block index"))
    return [(p, holds) for p, holds in files if p.is_file()]


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def detect_permissions(ctx: Ctx) -> list[Issue]:
    if os.name == "nt":
        return []  # permission bits are not the access control there
    issues: list[Issue] = []
    for path, holds in server_files(ctx):
        mode = _mode(path)
        if mode & 0o077:
            issue: Issue = {"type": "file_reachable_by_other_accounts"}
            if not ctx.scoped:
                issue["path"] = str(path)
            issue.update(
                mode=f"{mode:04o}",
                holds=holds,
                writable_by_others=bool(mode & 0o022),
                repairable=1,
                hint="fix narrows it to 0600 (owner only)",
            )
            issues.append(issue)
    directory = Path(ctx.app.db.path or ctx.settings.db_file).parent
    if directory.is_dir() and (mode := _mode(directory)) & 0o077:
        issue = {"type": "directory_reachable_by_other_accounts"}
        if not ctx.scoped:
            issue["path"] = str(directory)
        issue.update(
            mode=f"{mode:04o}",
            holds="the files above",
            writable_by_others=bool(mode & 0o022),
            repairable=0,
            hint="reported, not narrowed: this directory can hold files this package did not place, so "
            "chmod 700 it yourself once no other account needs to traverse it",
        )
        issues.append(issue)
    return issues


def repair_permissions(ctx: Ctx, issues: list[Issue]) -> None:
    # Same order as detection, so the n-th file issue is the n-th reachable file
    # (agent-scoped issues carry no path to match on).
    reachable = [p for p, _ in server_files(ctx) if _mode(p) & 0o077]
    file_issues = [i for i in issues if i["type"] == "file_reachable_by_other_accounts"]
    for path, issue in zip(reachable, file_issues):
        try:
            os.chmod(path, _mode(path) & 0o600)  # only ever removes bits
            issue["fixed"] = not (_mode(path) & 0o077)
        except OSError as exc:
            issue["fixed"], issue["fix_error"] = False, str(exc)


CHECKS = [
    Check("vector_fallback_config", "info", detect_vector_fallback),
    Check("vector_index", "info", _nothing),
    Check("coarse_index", "info", detect_coarse, repair_coarse, cross_agent=True),
    Check("block_index", "info", _nothing, _no_repair, cross_agent=True),
    Check("operating_context_parse", "warn", detect_context_parse),
    Check("operating_context_size", "info", detect_context_size),
    Check("file_permissions", "warn", detect_permissions, repair_permissions, cross_agent=True, whole_database=True),
    derived.CHECK,  # missing_nodes
    Check("missing_blocks", "info", _nothing, _no_repair),
]
