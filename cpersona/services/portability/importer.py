"""``import_memories``: restore a JSONL export (spec admin-and-safety.md §7).

The data path, top to bottom:

1. vet the path and the file (IM-1) — :func:`vet_import`;
2. first pass over the file (:func:`jsonl.scan`): header, per-type counts, parse
   errors, the record ids graph records point at. A header whose counts do not
   match the file means a truncated file, and nothing is written (IM-10);
3. second pass in write batches of a few hundred lines (a read snapshot for a
   dry run): every line goes through :class:`RecordImporter`, which refuses a
   bad line with its line number and carries on (IM-3..IM-8);
4. graph records are written last, through the id map (IM-9);
5. the answer (§7.3).

A failure rolls back the open batch only; batches already committed stay, the
answer says so with their counts, and the same import run again skips them
and completes the rest (issue 13 item 3; see batches.py).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection
from sqlalchemy.exc import SQLAlchemyError

from cpersona.services.records import remote_vectors
from cpersona.services.app import App
from cpersona.services.portability import coerce, jsonl
from cpersona.services.portability.batches import Run, restore_run, stopped_message
from cpersona.services.portability.coerce import LineRefused, VectorRejected
from cpersona.services.portability.graph import GraphCarrier, RefMap
from cpersona.storage.layout import Layout
from cpersona.services.portability.paths import vet_input_file
from cpersona.services.portability.writer import EpisodeRow, MemoryRow, ProfileRow, RecordWriter
from cpersona.services.refs import canonical_ref
from cpersona.services.requests import Request
from cpersona.services.responses import ToolFailure, answers_refusals, failure
from cpersona.services.sanitize import has_lone_surrogate, nul_refusal, sanitize
from cpersona.services.timestamps import ahead_of_clock, sql_stamp
from cpersona.storage import dialect
from cpersona.storage import errors as storage_errors
from cpersona.storage.errors import DatabaseBusy

log = logging.getLogger(__name__)

MAX_LISTED_ERRORS = 100  # IM-16
# A memory or an episode line: the field holding its text, and its ref kind.
_TEXT_RECORDS = {"memory": ("content", "mem"), "episode": ("summary", "ep")}


class ErrorLog:
    """Per-line messages, at most 100 listed plus a count of the rest (IM-16)."""

    def __init__(self) -> None:
        self.listed: list[str] = []
        self.unlisted = 0

    def add(self, message: str) -> None:
        if len(self.listed) < MAX_LISTED_ERRORS:
            self.listed.append(message)
        else:
            self.unlisted += 1

    def as_list(self) -> list[str]:
        if self.unlisted:
            return self.listed + [f"{self.unlisted} more errors were not listed"]
        return list(self.listed)


@dataclass
class Tallies:
    imported_memories: int = 0
    skipped_memories: int = 0
    imported_episodes: int = 0
    skipped_episodes: int = 0
    profile_updated: bool = False
    profiles_applied: int = 0
    future_timestamps: int = 0
    future_episode_timestamps: int = 0
    memories_without_project: int = 0
    episodes_without_project: int = 0

    def counts(self) -> dict[str, Any]:
        return {
            "imported_memories": self.imported_memories,
            "skipped_memories": self.skipped_memories,
            "imported_episodes": self.imported_episodes,
            "skipped_episodes": self.skipped_episodes,
            "profile_updated": self.profile_updated,
        }


class FutureClock:
    """Counts stamps ahead of the server clock by more than the allowance (IM-12).

    Import stores them whatever CPERSONA_FUTURE_TIMESTAMP_MODE says: an export
    must come back as it was written.
    """

    def __init__(self, app: App) -> None:
        self.now = app.clock()
        self.allowance = app.settings.future_timestamp_skew_seconds

    def ahead(self, stamp: str | None) -> bool:
        return bool(stamp) and ahead_of_clock(stamp, self.now, self.allowance) is not None


class RecordImporter:
    """Restores records one at a time into a writer; shared by the file import and import-db.

    ``where`` names the record in messages ("Line 12", "memories id 7").
    """

    def __init__(
        self,
        app: App,
        conn: Connection,
        *,
        target_agent_id: str,
        dry_run: bool,
        refs: RefMap,
        export_headed: bool,
        errors: ErrorLog,
    ) -> None:
        layout = Layout.of(conn)
        self.settings = app.settings
        self.target = target_agent_id
        self.refs = refs
        self.export_headed = export_headed
        self.errors = errors
        self.tallies = Tallies()
        self.writer = RecordWriter(conn, layout, dry_run=dry_run)
        self.graph = GraphCarrier(conn, supported=layout.has_graph, dry_run=dry_run, now=app.now_iso())
        self.clock = FutureClock(app)
        self.now_sql = sql_stamp(app.clock())
        self.folders_skipped = 0
        self._profile_lines: dict[tuple[str, str], str] = {}
        # agent -> (ref, text) of inserted rows, for the remote index after commit (IM-13);
        # None unless the caller will push them.
        self.remote_items: dict[str, list[tuple[str, str]]] | None = None

    # -- dispatch

    def feed(self, where: str, record: dict[str, Any]) -> None:
        kind = jsonl.record_type(record)
        if kind in ("", "header"):
            return
        if kind in jsonl.GRAPH_TYPES:
            self.graph.collect(record, kind, self.target or None)
            return
        if kind in jsonl.FOLDER_TYPES:
            self.folders_skipped += 1  # declared folders are out of scope (decision 6)
            return
        handler = {"memory": self._memory, "episode": self._episode, "profile": self._profile}.get(kind)
        if handler is None:
            self.errors.add(f"{where}: unknown type '{kind}'")
            return
        agent = self._agent(where, kind, record)
        if agent is None:
            return
        try:
            # Decision 11: a NUL anywhere in the record refuses the record, named
            # by field and position, before any of its text is cleaned or stored.
            if problem := nul_refusal(**{k: v for k, v in record.items() if isinstance(k, str)}):
                raise LineRefused(problem)
            handler(where, record, agent)
        except LineRefused as refused:
            self.errors.add(f"{where}: {kind} {refused.reason}; it was not imported")
            if kind == "memory":
                self.tallies.skipped_memories += 1
            elif kind == "episode":
                self.tallies.skipped_episodes += 1

    def _agent(self, where: str, kind: str, record: dict[str, Any]) -> str | None:
        """IM-4: the target, else the record's own agent — ``""`` included (decision 7)."""
        if self.target:
            return self.target
        agent = record.get("agent_id")
        if agent is None:
            self.errors.add(f"{where}: {kind} missing agent_id")
            return None
        if not isinstance(agent, str):
            self.errors.add(f"{where}: {kind} agent_id is not a string; it was not imported")
            return None
        try:
            return coerce.text(record, "agent_id")
        except LineRefused as refused:
            self.errors.add(f"{where}: {kind} {refused.reason}; it was not imported")
            return None

    def _project(self, record: dict[str, Any]) -> tuple[str, bool]:
        """(project_id, whether the record lacked the key) — IM-11."""
        return coerce.key(record, "project_id"), "project_id" not in record

    # -- records

    def _vector(self, where: str, kind: str, record: dict[str, Any]) -> tuple[bytes | None, str, str | None]:
        """(blob, label, error line) for the record's optional vector (JL-6)."""
        if record.get("embedding_b64") is None:
            return None, "", None
        try:
            blob = coerce.decode_vector(record["embedding_b64"])
        except VectorRejected as why:
            return None, "", f"{where}: {kind} {why}; it was imported without a vector"
        label = record.get("embedding_model")
        return blob, label if isinstance(label, str) else "", None

    def _memory(self, where: str, record: dict[str, Any], agent: str) -> None:
        raw = coerce.text(record, "content")
        if not raw:
            self.tallies.skipped_memories += 1  # IM-6.1: silently
            return
        project, no_project = self._project(record)
        row = MemoryRow(
            agent_id=agent,
            project_id=project,
            channel=coerce.key(record, "channel"),
            msg_id=coerce.key(record, "msg_id"),
            content=raw,
            source=coerce.json_column(record, "source"),
            timestamp=coerce.text(record, "timestamp"),
            metadata=coerce.json_column(record, "metadata"),
            created_at=coerce.text(record, "created_at") or self.now_sql,
            locked=coerce.flag(record, "locked"),
            recall_count=coerce.count(record, "recall_count"),
            last_recalled_at=coerce.optional_text(record, "last_recalled_at"),
        )
        if not self._restore(where, "memory", record, row):
            self.tallies.skipped_memories += 1
            return
        self.tallies.imported_memories += 1
        if self.clock.ahead(row.timestamp):
            self.tallies.future_timestamps += 1
        if no_project and self.export_headed:
            self.tallies.memories_without_project += 1

    def _episode(self, where: str, record: dict[str, Any], agent: str) -> None:
        raw = coerce.text(record, "summary")
        if not raw:
            return  # IM-7: ignored, not counted
        project, no_project = self._project(record)
        row = EpisodeRow(
            agent_id=agent,
            project_id=project,
            channel=coerce.key(record, "channel"),
            summary=raw,
            keywords=coerce.keywords(record),
            created_at=coerce.text(record, "created_at") or self.now_sql,
            start_time=coerce.optional_text(record, "start_time"),
            end_time=coerce.optional_text(record, "end_time"),
            resolved=coerce.flag(record, "resolved"),
        )
        if not self._restore(where, "episode", record, row):
            self.tallies.skipped_episodes += 1
            return
        self.tallies.imported_episodes += 1
        if self.clock.ahead(row.start_time) or self.clock.ahead(row.end_time):
            self.tallies.future_episode_timestamps += 1
        if no_project and self.export_headed:
            self.tallies.episodes_without_project += 1

    def _restore(self, where: str, kind: str, record: dict[str, Any], row: MemoryRow | EpisodeRow) -> bool:
        """What a memory line and an episode line share once their row is read; True when written.

        Attaches the line's vector (JL-6), cleans the text as store does (IM-5),
        writes the row unless an equal one is already there (IM-6.3, IM-7), and
        maps the file's id to whichever row now holds the record (IM-9).
        """
        text_field, ref_kind = _TEXT_RECORDS[kind]
        row.embedding, row.embedding_model, vector_error = self._vector(where, kind, record)
        cleaned = sanitize(getattr(row, text_field), self.settings.max_content_length)
        if not cleaned.text:
            raise LineRefused(f"{text_field} is empty after sanitization")
        setattr(row, text_field, cleaned.text)
        put = self.writer.put_memory if kind == "memory" else self.writer.put_episode
        inserted, row_id = put(row)
        self.refs.record(ref_kind, record.get("id"), row_id)
        if not inserted:
            return False
        self._note_remote(row.agent_id, canonical_ref(ref_kind, row_id), cleaned.text)
        if cleaned.truncated:
            self.errors.add(
                f"{where}: {kind} {text_field} exceeded the "
                f"{self.settings.max_content_length}-character cap and was truncated"
            )
        if vector_error:
            self.errors.add(vector_error)
        return True

    def _note_remote(self, agent: str, ref: str, text: str) -> None:
        if self.remote_items is not None:
            self.remote_items.setdefault(agent, []).append((ref, text))

    def _profile(self, where: str, record: dict[str, Any], agent: str) -> None:
        user_id = coerce.key(record, "user_id")
        raw = coerce.text(record, "content")
        if not raw:
            self.errors.add(f"{where}: profile has no content; the existing profile was kept")
            return
        content = sanitize(raw, self.settings.max_profile_length).text
        if not content:
            raise LineRefused("content is empty after sanitization")
        key = (agent, user_id)
        if key in self._profile_lines:
            self.errors.add(
                f"{where}: profile for agent '{agent}' and user_id '{user_id}' already "
                f"came from {self._profile_lines[key]}; only the first one is applied"
            )
            return
        self._profile_lines[key] = where
        updated_at = coerce.text(record, "updated_at") or self.now_sql
        stored = self.writer.stored_profile(agent, user_id)
        if stored is not None and coerce.is_newer(stored.updated_at, updated_at):
            self.errors.add(
                f"{where}: the stored profile for agent '{agent}' is newer than this one "
                f"({stored.updated_at} > {updated_at}); the stored profile was kept"
            )
            return
        self.writer.put_profile(ProfileRow(agent, user_id, coerce.key(record, "project_id"), content, updated_at))
        self.tallies.profile_updated = True
        self.tallies.profiles_applied += 1

    # -- after the last record

    def finish(self, tick: Callable[[], bool] | None = None) -> dict[str, Any]:
        """Write the graph (IM-9; ``tick`` after each item), add the summary lines, return the optional answer keys."""
        carried = self.graph.apply(self.refs, tick)
        if (line := carried.summary_line()) is not None:
            self.errors.add(line)
        t = self.tallies
        if t.memories_without_project or t.episodes_without_project:
            self.errors.add(
                f"{t.memories_without_project} memory and {t.episodes_without_project} episode "
                "records had no project_id (an export from before that axis was exported); "
                "they were restored into the global pool"
            )
        if self.folders_skipped:
            self.errors.add(
                f"{self.folders_skipped} folder records were not restored: declared folders "
                "are not supported by this server"
            )
        extra: dict[str, Any] = {}
        if carried.carried.total() or (carried.not_supported and carried.not_supported.total()):
            extra["associations"] = carried.response()
        if t.future_timestamps:
            extra["future_timestamps"] = t.future_timestamps
        if t.future_episode_timestamps:
            extra["future_episode_timestamps"] = t.future_episode_timestamps
        return extra


# --- the tool ---------------------------------------------------------------


def vet_import(app: App, input_path: Any) -> None:
    """IM-1 alone, for the MCP facade to run before its pause gate (IM-2)."""
    vet_input_file(app, input_path)


class _Abort(Exception):
    """Stops a run and rolls it back; the message completes "import aborted …"."""


def _zero_counts() -> dict[str, Any]:
    return Tallies().counts()


@dataclass(frozen=True)
class ImportArguments(Request):
    """``import_memories``' arguments in the types its schema declares; defaults are the schema's."""

    input_path: str
    target_agent_id: str = ""  # '' keeps each record's own agent
    dry_run: bool = False
    session_key: str = ""  # selects the pause bucket; the facade's gate reads it


@answers_refusals
def import_memories(
    app: App, *, input_path: Any, target_agent_id: Any = "", dry_run: Any = False, session_key: Any = ""
) -> dict[str, Any]:
    """:func:`answer_import_memories` for a library caller (``cpersona import``), whose arguments no schema has checked.

    A non-string target keeps each record's agent and only ``true`` is a dry run; the path is not
    checked here: paths.py's rules judge any value (IM-1).
    """
    target = target_agent_id if isinstance(target_agent_id, str) else ""
    args = ImportArguments(input_path=input_path, target_agent_id=target, dry_run=dry_run is True)
    return answer_import_memories.raises(app, args)


@answers_refusals
def answer_import_memories(app: App, args: ImportArguments) -> dict[str, Any]:
    """Restore an export's records, in write batches, skipping what is already stored (spec §7)."""
    settings = app.settings
    target, dry_run = args.target_agent_id, args.dry_run
    path = vet_input_file(app, args.input_path)
    if target and has_lone_surrogate(target):
        return failure("target_agent_id holds an unpaired surrogate")
    found = jsonl.scan(path, settings.max_import_bytes)

    aborted = "import aborted (dry run — nothing was written)" if dry_run else "import aborted and rolled back"
    if (problem := found.truncation()) is not None:
        extra: dict[str, Any] = {"dry_run": dry_run, **_zero_counts()}
        if found.parse_errors:
            extra["errors"] = found.parse_errors[:MAX_LISTED_ERRORS]
        return failure(f"{aborted}: {problem}", **extra)

    errors = ErrorLog()
    run: Run[Tallies] | None = None
    try:
        with restore_run(app, dry_run=dry_run) as run:
            importer = RecordImporter(
                app,
                run.connection,
                target_agent_id=target,
                dry_run=dry_run,
                refs=found.refs,
                export_headed=found.export_headed,
                errors=errors,
            )
            run.track(lambda: importer.tallies)
            if not dry_run and app.remote_index is not None:
                importer.remote_items = {}  # IM-14: a dry run writes nowhere, the remote index included
                run.on_commit.append(lambda: _push_remote(app, importer))
            seen = _restore_lines(importer, path, settings.max_import_bytes, errors, run.tick)
            if seen != found.counts:
                raise _Abort("the file changed while it was being imported")
            extra = importer.finish(run.tick)
    except (_Abort, ToolFailure, DatabaseBusy) as stop:
        reason = stop.message if isinstance(stop, ToolFailure) else getattr(stop, "reason", str(stop))
        return _stopped(run, aborted, reason, dry_run, errors)
    except SQLAlchemyError as exc:
        storage_errors.log_details(log, f"import of {path}", exc)
        return _stopped(run, aborted, f"database error: {dialect.error_message(exc)}", dry_run, errors)
    return {"ok": True, "dry_run": dry_run, **importer.tallies.counts(), **extra, **_errors(errors)}


def _push_remote(app: App, importer: RecordImporter) -> None:
    """IM-13: after each commit, outside the lock; a failure is logged only."""
    items, importer.remote_items = importer.remote_items or {}, {}
    for agent, pairs in items.items():
        remote_vectors.push(app, agent, pairs)


def _stopped(run: Run[Tallies] | None, aborted: str, reason: str, dry_run: bool, errors: ErrorLog) -> dict[str, Any]:
    """The failure answer: all rolled back (zero counts), or a kept prefix and its counts."""
    if run is not None and run.wrote and run.committed is not None:
        return failure(stopped_message(reason, "import"), dry_run=dry_run, **run.committed.counts(), **_errors(errors))
    return failure(f"{aborted}: {reason}", dry_run=dry_run, **_zero_counts(), **_errors(errors))


def _restore_lines(
    importer: RecordImporter, path: Any, max_bytes: int, errors: ErrorLog, tick: Callable[[], bool]
) -> Counter[str]:
    """Second pass: every line into the importer, a batch boundary after each; the per-type counts seen."""
    seen: Counter[str] = Counter()
    for line in jsonl.read_lines(path, max_bytes):
        if line.record is None:
            errors.add(line.error or "")
            continue
        kind = jsonl.record_type(line.record)
        if kind in jsonl.KNOWN_TYPES and kind != "header":
            seen[kind] += 1
        importer.feed(f"Line {line.number}", line.record)
        tick()
    return seen


def _errors(errors: ErrorLog) -> dict[str, Any]:
    listed = errors.as_list()
    return {"errors": listed} if listed else {}


def paused_import_body() -> dict[str, Any]:
    """The success shape a paused, non-dry import answers before the facade adds
    ``persisted``/``reason`` (spec §9.5)."""
    return {"ok": True, "dry_run": True, **_zero_counts()}
