"""``export_memories``: one agent's (or every agent's) records to a JSONL file.

Spec admin-and-safety.md §6, storage.md §8. Everything — header counts and
rows — comes from one read snapshot, in pages (EX-6), so the header's counts are
exactly the records that follow (JL-4). The file is written beside its
destination under a temporary name (0600) and renamed over it only once
complete; on any failure the temporary file is removed and whatever was at the
destination is untouched (EX-5). Where it may write, and what it never writes
over (spec decision 12), is :mod:`cpersona.services.portability.paths`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from sqlalchemy.exc import SQLAlchemyError

from cpersona.services.app import App
from cpersona.services.portability import jsonl
from cpersona.services.portability.graph import GraphCounts, GraphReader
from cpersona.storage.layout import Layout
from cpersona.services.portability.paths import output_target, write_atomically
from cpersona.storage.repositories.snapshot import SnapshotReader
from cpersona.services.requests import Request
from cpersona.services.responses import answers_refusals, failure
from cpersona.storage import errors as storage_errors

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ExportArguments(Request):
    """``export_memories``' arguments in the types its schema declares; defaults are the schema's."""

    agent_id: str  # '' = every agent
    output_path: str
    include_embeddings: bool = False


@answers_refusals
def export_memories(app: App, *, agent_id: Any, output_path: Any, include_embeddings: Any = False) -> dict[str, Any]:
    """:func:`answer_export_memories` for a library caller (``cpersona export``), whose arguments no schema has checked.

    The path is not checked here: paths.py's rules judge any value (EX-1).
    """
    if not isinstance(agent_id, str):
        return failure("agent_id must be a string")
    args = ExportArguments(agent_id=agent_id, output_path=output_path, include_embeddings=include_embeddings is True)
    return answer_export_memories.raises(app, args)


@answers_refusals
def answer_export_memories(app: App, args: ExportArguments) -> dict[str, Any]:
    """The scope's records, header first, to a file that appears only once complete (spec §6)."""
    agent_id = args.agent_id
    path = output_target(app, args.output_path)
    try:
        with app.db.read() as session:
            conn = session.connection()
            layout = Layout.of(conn)
            records = SnapshotReader(conn, layout, agent_id or None)
            graph = GraphReader(conn, agent_id or None) if layout.has_graph else None
            counts = records.counts()
            graph_counts = graph.counts() if graph else GraphCounts()
            counts.update({k: graph_counts.get(k) for k in ("entity", "mention", "relation")})
            with write_atomically(app, path) as out:
                out.write(jsonl.dump_line(jsonl.header_record(agent_id, app.now_iso(), counts)))
                for row in records.memories():
                    out.write(jsonl.dump_line(jsonl.memory_record(row, args.include_embeddings)))
                for row in records.episodes():
                    out.write(jsonl.dump_line(jsonl.episode_record(row, args.include_embeddings)))
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
