"""``export_memories``: one agent's (or every agent's) records to a JSONL file.

Spec admin-and-safety.md §6, storage.md §8. Everything — header counts and
rows — comes from one read snapshot, in pages (EX-6), so the header's counts are
exactly the records that follow (JL-4). The file is written beside its
destination under a temporary name (0600) and renamed over it only once
complete; on any failure the temporary file is removed and whatever was at the
destination is untouched (EX-5).
"""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from sqlalchemy.exc import SQLAlchemyError

from cpersona.services.app import App
from cpersona.services.portability import jsonl
from cpersona.services.portability.graph import GraphCounts, GraphReader
from cpersona.services.portability.layout import Layout
from cpersona.services.portability.paths import confine
from cpersona.services.portability.reader import SnapshotReader
from cpersona.services.responses import ToolFailure, failure
from cpersona.storage import errors as storage_errors

log = logging.getLogger(__name__)


def make_private_dirs(directory: Path) -> None:
    """Create ``directory`` and each missing ancestor with mode 0700 (EX-5).

    ``mkdir(parents=True)`` would give the ancestors the default mode.
    """
    missing = []
    while not directory.exists():
        missing.append(directory)
        directory = directory.parent
    for folder in reversed(missing):
        folder.mkdir(mode=0o700, exist_ok=True)


@contextmanager
def atomic_file(path: Path) -> Iterator[IO[str]]:
    """A text file that appears at ``path`` only if the block completes."""
    make_private_dirs(path.parent)
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, path)
    except BaseException:
        try:
            os.unlink(temp)
        except FileNotFoundError:
            pass
        raise


def export_memories(
    app: App, *, agent_id: Any, output_path: Any, include_embeddings: bool = False
) -> dict[str, Any]:
    if not isinstance(agent_id, str):
        return failure("agent_id must be a string")
    try:
        path = confine(output_path, app.settings.export_dir, "output_path")
    except ToolFailure as refused:
        return refused.as_response()
    with_vectors = include_embeddings is True
    try:
        with app.db.read() as session:
            conn = session.connection()
            layout = Layout.of(conn)
            records = SnapshotReader(conn, layout, agent_id or None)
            graph = GraphReader(conn, agent_id or None) if layout.has_graph else None
            counts = records.counts()
            graph_counts = graph.counts() if graph else GraphCounts()
            counts.update({k: graph_counts.get(k) for k in ("entity", "mention", "relation")})
            with atomic_file(path) as out:
                out.write(jsonl.dump_line(jsonl.header_record(agent_id, app.now_iso(), counts)))
                for row in records.memories():
                    out.write(jsonl.dump_line(jsonl.memory_record(row, with_vectors)))
                for row in records.episodes():
                    out.write(jsonl.dump_line(jsonl.episode_record(row, with_vectors)))
                for row in records.profiles():
                    out.write(jsonl.dump_line(jsonl.profile_record(row)))
                if graph is not None:
                    for record in graph.records():
                        out.write(jsonl.dump_line(record))
    except OSError as exc:
        return failure(f"could not write {path}: {exc.strerror or exc}")
    except (SQLAlchemyError, ValueError) as exc:
        storage_errors.log_details(log, f"export to {path}", exc)
        return failure(f"export failed: {storage_errors.reason(exc, app.db.label)}")

    answer: dict[str, Any] = {
        "ok": True,
        "path": str(path),
        "memories": counts["memory"],
        "episodes": counts["episode"],
        "profiles": counts["profile"],
    }
    if graph_counts.total():
        answer["associations"] = graph_counts.as_dict()
    return answer
