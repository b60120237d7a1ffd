"""``cpersona import-db PATH``: copy a CPersona 2.6 database into ours.

A 2.6 database (schema_version 14..21) is never opened for writing (spec README
decision 9): it is opened read-only (``mode=ro`` URI plus ``query_only``) and
read in one snapshot. Its rows are turned into the same records an export
would write and fed through the import path, so the copy obeys exactly the
import rules — dedup, profiles kept when ours are newer, id re-pointing for
the declared graph — and re-running the command copies nothing twice. The
whole copy is one write transaction on our side: all of it or none of it.

Not copied, by design: derived tables (record nodes, blocks, vector and block
change logs — rebuilt from the records, LR-6), the task queue (its payloads
name the source's row ids), and declared folders (out of scope, decision 6);
their row counts are reported.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy.exc import SQLAlchemyError

from cpersona.services.app import App
from cpersona.services.portability import jsonl
from cpersona.services.portability.graph import GraphReader, RefMap
from cpersona.services.portability.importer import ErrorLog, RecordImporter
from cpersona.storage.layout import Layout
from cpersona.storage.repositories.snapshot import SnapshotReader
from cpersona.services.responses import ToolFailure, answers_refusals, failure
from cpersona.storage.foreign import read_only_snapshot, row_count, schema_version
from cpersona.storage import errors as storage_errors

log = logging.getLogger(__name__)

# Tables of the source that hold something we do not copy, reported by count.
NOT_COPIED = {
    "pending_tasks": "pending_memory_tasks",
    "folders": "folders",
    "folder_members": "folder_members",
}


def vet_source(source_path: Any, ours: Path | None) -> Path:
    """The resolved source file, or ToolFailure when it is missing, not a file, or ``ours``."""
    if not isinstance(source_path, (str, os.PathLike)) or not str(source_path):
        raise ToolFailure("a database path is required")
    path = Path(source_path).expanduser()
    if not path.exists():
        raise ToolFailure(f"File not found: {path}")
    if not path.is_file():
        raise ToolFailure(f"not a regular file: {path}")
    path = path.resolve()
    if ours is not None and ours.exists() and os.path.samefile(path, ours):
        raise ToolFailure(f"{path} is this server's own database; name the database to copy from")
    return path


Progress = Callable[[str], None]


@answers_refusals
def import_db(app: App, source_path: Any, progress: Progress | None = None) -> dict[str, Any]:
    """Copy every record of the database at ``source_path`` into ours; counts per table.

    ``progress`` is told one line per stage (what the source holds, each table
    as it is copied, the commit), for an operator watching a long copy.
    """
    try:
        path = vet_source(source_path, app.db.path)
        return _copy(app, path, progress or (lambda line: None))
    except SQLAlchemyError as exc:
        storage_errors.log_details(log, f"import-db from {source_path}", exc)
        return failure(f"import-db aborted and rolled back: {storage_errors.reason(exc, app.db.label)}")


def _copy(app: App, path: Path, progress: Progress) -> dict[str, Any]:
    with read_only_snapshot(path) as source:
        try:
            layout = Layout.of(source)
        except SQLAlchemyError as exc:
            # Nothing of ours was touched yet: a file SQLite cannot read.
            raise ToolFailure(f"could not read {path}: {storage_errors.reason(exc, str(path))}") from None
        if not {"memories", "episodes", "profiles"} <= layout.tables:
            raise ToolFailure(f"{path} is not a CPersona database (no memories/episodes/profiles tables)")
        version = schema_version(source) if "schema_version" in layout.tables else None
        reader = SnapshotReader(source, layout, None)
        graph = GraphReader(source, None) if layout.has_graph else None
        refs = RefMap()
        for record in graph.records() if graph else ():
            refs.want_from(record)
        sizes = {table: row_count(source, table) for table in ("memories", "episodes", "profiles")}
        progress(f"{path} (schema_version {version}): " + ", ".join(f"{n} {t}" for t, n in sizes.items()))

        errors = ErrorLog()
        with app.db.write() as session:
            importer = RecordImporter(
                app,
                session.connection(),
                target_agent_id="",
                dry_run=False,
                refs=refs,
                export_headed=False,
                errors=errors,
            )
            t = importer.tallies
            for row in reader.memories():
                importer.feed(f"memories id {row.id}", jsonl.memory_record(row, True))
            progress(
                f"memories  {sizes['memories']} read: {t.imported_memories} copied, "
                f"{t.skipped_memories} already present"
            )
            for row in reader.episodes():
                importer.feed(f"episodes id {row.id}", jsonl.episode_record(row, True))
            progress(
                f"episodes  {sizes['episodes']} read: {t.imported_episodes} copied, "
                f"{t.skipped_episodes} already present"
            )
            for row in reader.profiles():
                importer.feed(f"profiles id {row.id}", jsonl.profile_record(row))
            progress(f"profiles  {sizes['profiles']} read: {t.profiles_applied} copied")
            graph_records = 0
            for record in graph.records() if graph else ():
                importer.feed(f"{record['_type']} {record.get('id', '')}".rstrip(), record)
                graph_records += 1
            if graph:
                progress(f"associations  {graph_records} records read")
            extra = importer.finish()
            progress("committing")
        not_copied = {label: row_count(source, table) for label, table in NOT_COPIED.items() if table in layout.tables}

    answer: dict[str, Any] = {
        "ok": True,
        "source": str(path),
        "source_schema_version": version,
        "memories": {"copied": t.imported_memories, "skipped": t.skipped_memories},
        "episodes": {"copied": t.imported_episodes, "skipped": t.skipped_episodes},
        "profiles": {"copied": t.profiles_applied},
        **extra,
    }
    if any(not_copied.values()):
        answer["not_copied"] = {k: v for k, v in not_copied.items() if v}
    if listed := errors.as_list():
        answer["errors"] = listed
    return answer
