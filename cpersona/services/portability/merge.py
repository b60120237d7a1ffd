"""``merge_memories``: copy or move one agent's records into another (spec §8).

Write batches of a few hundred records (a read snapshot for a dry run; see
batches.py): read the source agent in id order, in pages; write each record
under the target unless the target already holds an equal one (the dedup keys
of :mod:`writer`); carry the declared graph through the id map; for a move,
delete exactly the source rows that were copied. Content is copied verbatim —
it was sanitised when it was first stored (MG-3).

Every committed batch is a merge of a prefix of the source, so a failure (or a
kill) keeps a consistent prefix that a re-run completes (issue 13 item 3). For
a move that means each batch deletes the source rows it copied before it
commits, after carrying the declarations on them (the source's triggers drop
those with the rows); a row that a declaration still waiting for a later row
names stays at the source until that declaration is carried. A failure rolls
back the open batch only (MG-9 when nothing was committed yet).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection
from sqlalchemy.exc import SQLAlchemyError

from cpersona.services.records import remote_vectors
from cpersona.services.app import App
from cpersona.services.portability.batches import Run, restore_run, stopped_message
from cpersona.services.portability.graph import CarryResult, GraphCarrier, GraphReader, RefMap
from cpersona.storage.layout import Layout
from cpersona.storage.repositories.snapshot import SnapshotReader
from cpersona.services.portability.writer import EpisodeRow, MemoryRow, ProfileRow, RecordWriter
from cpersona.services.requests import Request
from cpersona.services.responses import ToolFailure, answers_refusals, failure
from cpersona.storage import dialect
from cpersona.storage import errors as storage_errors
from cpersona.storage.errors import DatabaseBusy
from cpersona.storage.repositories.associations import AssociationRepository
from cpersona.storage.repositories.episodes import EpisodeRepository
from cpersona.storage.repositories.memories import MemoryRepository
from cpersona.storage.repositories.profiles import ProfileRepository
from cpersona.storage.repositories.tasks import TaskRepository

log = logging.getLogger(__name__)

STRATEGIES = ("skip",)
# Rows a merge checks against the embedding window after it commits (MG-8). Each
# check is a token-report request, so a huge merge leaves the rest to
# check_health's missing_nodes repair instead of making one call take minutes.
NODE_FOLLOWUP_LIMIT = 1000
MODES = ("copy", "move")


def validate_merge(source_agent_id: Any, target_agent_id: Any, strategy: Any, mode: Any) -> None:
    """MG-1, in its order; exposed so the facade can run it before its pause gate (MG-2)."""
    if not isinstance(source_agent_id, str) or not source_agent_id:
        raise ToolFailure("source_agent_id is required")
    if not isinstance(target_agent_id, str) or not target_agent_id:
        raise ToolFailure("target_agent_id is required")
    if source_agent_id == target_agent_id:
        raise ToolFailure("source_agent_id and target_agent_id must differ")
    if strategy not in STRATEGIES:
        raise ToolFailure(f"Unsupported strategy '{strategy}'. Currently supported: 'skip'")
    if mode not in MODES:
        raise ToolFailure(f"Invalid mode '{mode}'. Supported: 'copy', 'move'")


@dataclass
class MergeTallies:
    merged_memories: int = 0
    skipped_memories: int = 0
    merged_episodes: int = 0
    skipped_episodes: int = 0
    profile_copied: bool = False
    skipped_profile: bool = False

    def counts(self) -> dict[str, Any]:
        return dict(self.__dict__)


class _Merge:
    def __init__(self, app: App, run: Run[MergeTallies], source: str, target: str, *, move: bool) -> None:
        conn: Connection = run.connection
        dry_run = run.dry_run
        self.app = app
        self.run_ = run
        self.move = move
        self.conn = conn
        self.source = source
        self.target = target
        self.dry_run = dry_run
        self.layout = Layout.of(conn)
        self.reader = SnapshotReader(conn, self.layout, source)
        self.writer = RecordWriter(conn, self.layout, dry_run=dry_run)
        self.refs = RefMap()
        self.tallies = MergeTallies()
        # (kind, new id, text, project) of rows this merge wrote, for MG-8.
        self.inserted: list[tuple[str, int, str, str]] = []
        # (ref, text) of every row written, pushed to the remote index after commit (MG-8).
        remote = not dry_run and app.remote_index is not None
        self.remote_items: list[tuple[str, str]] | None = [] if remote else None
        # What committed batches wrote: the follow-ups after the last commit act on these.
        self.durable_inserted: list[tuple[str, int, str, str]] = []
        # A move deletes copied source rows batch by batch (MG-7): copied and not yet
        # deleted, deleted in the open batch, deleted by committed batches.
        self._to_delete: dict[str, list[int]] = {"memories": [], "episodes": [], "profiles": []}
        self._deleting: dict[str, list[int]] = {"memories": [], "episodes": [], "profiles": []}
        self.durable_deleted: dict[str, list[int]] = {"memories": [], "episodes": [], "profiles": []}
        self.deleted = {"memories": 0, "episodes": 0, "profiles": 0}
        self.carrier: GraphCarrier | None = None
        run.track(lambda: self.tallies)
        run.before_commit.append(self._settle)
        run.on_commit.append(self._committed)

    def run(self) -> dict[str, Any]:
        self.carrier = carrier = self._collect_graph()
        self._memories()
        self._episodes()
        self._profiles()
        carried = carrier.apply(self.refs, self.run_.tick) if carrier else CarryResult()
        extra: dict[str, Any] = {}
        if carried.carried.total() or carried.not_carried:
            extra["associations"] = carried.carried.as_dict()
            if carried.not_carried:
                extra["associations"]["not_carried"] = carried.not_carried
        if self.move and not self.dry_run:
            extra.update(self._delete_source(graph_complete=carrier is not None and not carried.not_carried))
        return extra

    def _settle(self) -> None:
        """Before each commit: for a move, carry what the batch's rows resolved, then delete them."""
        if not self.move or self.dry_run:
            return
        waiting: set[tuple[str, int]] = set()
        if self.carrier is not None:
            self.carrier.carry_ready(self.refs)
            waiting = self.carrier.waiting_on()
        for name, kind in (("memories", "mem"), ("episodes", "ep"), ("profiles", "")):
            ready = [i for i in self._to_delete[name] if (kind, i) not in waiting]
            self._to_delete[name] = [i for i in self._to_delete[name] if (kind, i) in waiting]
            self._delete_copied(name, ready)

    def _delete_copied(self, name: str, ids: list[int]) -> None:
        repository = {"memories": MemoryRepository, "episodes": EpisodeRepository, "profiles": ProfileRepository}[name]
        self.deleted[name] += repository(self.conn).delete_by_ids(ids, self.source)
        self._deleting[name] += ids

    def _committed(self) -> None:
        """After each commit, outside the lock: push this batch's rows to the remote index (MG-8)."""
        if self.remote_items:
            remote_vectors.push(self.app, self.target, self.remote_items)
            self.remote_items = []
        self.durable_inserted += self.inserted
        self.inserted = []
        for name, ids in self._deleting.items():
            self.durable_deleted[name] += ids
            ids.clear()

    def _collect_graph(self) -> GraphCarrier | None:
        """Read the source's declarations first: they say which record ids to remember."""
        if not self.layout.has_graph:
            return None  # no tables, so nothing was ever declared
        carrier = GraphCarrier(self.conn, supported=True, dry_run=self.dry_run, now=self.app.now_iso())
        for record in GraphReader(self.conn, self.source).records():
            self.refs.want_from(record)
            carrier.collect(record, record["_type"], self.target)
        return carrier

    def _memories(self) -> None:
        for row in self.reader.memories():
            # An empty row counts as skipped, never copied (MG-3, MG-4 for episodes).
            written = bool(row.content) and self._copy(
                row.id,
                MemoryRow(
                    agent_id=self.target,
                    project_id=row.project_id,
                    channel=row.channel,
                    msg_id=row.msg_id,
                    content=row.content,
                    source=row.source,
                    timestamp=row.timestamp,
                    metadata=row.metadata,
                    created_at=row.created_at,
                    locked=row.locked,
                    recall_count=row.recall_count,
                    last_recalled_at=row.last_recalled_at,
                    embedding=row.embedding,
                    embedding_model=row.embedding_model or "",
                ),
            )
            if written:
                self.tallies.merged_memories += 1
            else:
                self.tallies.skipped_memories += 1
            self.run_.tick()

    def _episodes(self) -> None:
        for row in self.reader.episodes():
            written = bool(row.summary) and self._copy(
                row.id,
                EpisodeRow(
                    agent_id=self.target,
                    project_id=row.project_id,
                    channel=row.channel,
                    summary=row.summary,
                    keywords=row.keywords,
                    created_at=row.created_at,
                    start_time=row.start_time,
                    end_time=row.end_time,
                    resolved=row.resolved,
                    embedding=row.embedding,
                    embedding_model=row.embedding_model or "",
                ),
            )
            if written:
                self.tallies.merged_episodes += 1
            else:
                self.tallies.skipped_episodes += 1
            self.run_.tick()

    def _copy(self, source_id: int, row: MemoryRow | EpisodeRow) -> bool:
        """Write one source record under the target unless it holds an equal one; True when written.

        Either way the source id now maps to the row holding the record (MG-6);
        a row written is remembered for a move's delete (MG-7) and the follow-ups (MG-8).
        """
        if isinstance(row, MemoryRow):
            kind, copied, text, (inserted, new_id) = "mem", "memories", row.content, self.writer.put_memory(row)
        else:
            kind, copied, text, (inserted, new_id) = "ep", "episodes", row.summary, self.writer.put_episode(row)
        self.refs.record(kind, source_id, new_id)
        if inserted:
            self._to_delete[copied].append(source_id)
            self._note_inserted(kind, new_id, text, row.project_id)
        return inserted

    def _note_inserted(self, kind: str, new_id: int | None, text: str, project_id: str) -> None:
        if new_id is not None and self.remote_items is not None:
            self.remote_items.append((f"{kind}:{new_id}", text))
        if (
            new_id is not None
            and not self.dry_run
            and len(self.inserted) + len(self.durable_inserted) < NODE_FOLLOWUP_LIMIT
        ):
            self.inserted.append((kind, new_id, text, project_id))

    def _profiles(self) -> None:
        """MG-5: copied only where the target has no profile for that user_id."""
        for row in self.reader.profiles():
            if self.writer.stored_profile(self.target, row.user_id) is not None:
                self.tallies.skipped_profile = True
                continue
            self.writer.put_profile(ProfileRow(self.target, row.user_id, row.project_id, row.content, row.updated_at))
            self.tallies.profile_copied = True
            self._to_delete["profiles"].append(row.id)
            self.run_.tick()

    def _delete_source(self, *, graph_complete: bool) -> dict[str, Any]:
        """MG-7: remove exactly the copied source rows; clean up only an emptied source.

        Runs in the last batch: earlier batches deleted what they copied (:meth:`_settle`).
        """
        if self.carrier is not None:
            self.carrier.carry_ready(self.refs)  # every declaration still waiting is settled by apply()
        for name, ids in self._to_delete.items():
            self._delete_copied(name, ids)
            self._to_delete[name] = []
        deleted = self.deleted
        left = self.reader.counts()
        left_at_source = {"memories": left["memory"], "episodes": left["episode"], "profiles": left["profile"]}
        deleted_tasks = 0
        if not any(left_at_source.values()):
            deleted_tasks = TaskRepository(self.conn).delete_agent(self.source)
            if graph_complete:
                # The entities trigger removes their aliases and mentions (LR-2).
                AssociationRepository(self.conn).delete_agent(self.source)
        if self.layout.has_graph:
            for name, remaining in AssociationRepository(self.conn).owned_counts(self.source).items():
                if remaining:
                    left_at_source[name] = remaining
        return {
            "source_deleted": {
                "ok": True,
                "agent_id": self.source,
                "deleted_memories": deleted["memories"],
                "deleted_profiles": deleted["profiles"],
                "deleted_episodes": deleted["episodes"],
                "deleted_pending_tasks": deleted_tasks,
            },
            "left_at_source": left_at_source,
        }


@dataclass(frozen=True)
class MergeArguments(Request):
    """``merge_memories``' arguments in the types its schema declares; defaults are the schema's."""

    source_agent_id: str
    target_agent_id: str
    strategy: str = "skip"
    mode: str = "copy"
    dry_run: bool = False
    session_key: str = ""  # selects the pause bucket; the facade's gate reads it


@answers_refusals
def merge_memories(
    app: App,
    *,
    source_agent_id: Any,
    target_agent_id: Any,
    strategy: Any = "skip",
    mode: Any = "copy",
    dry_run: Any = False,
    session_key: Any = "",
) -> dict[str, Any]:
    """:func:`answer_merge_memories` for a library caller, whose arguments no schema has checked.

    Only ``true`` is a dry run; the rest is left to :func:`validate_merge`, which judges any value (MG-1).
    """
    args = MergeArguments(
        source_agent_id=source_agent_id,
        target_agent_id=target_agent_id,
        strategy=strategy,
        mode=mode,
        dry_run=dry_run is True,
    )
    return answer_merge_memories.raises(app, args)


@answers_refusals
def answer_merge_memories(app: App, args: MergeArguments) -> dict[str, Any]:
    """Copy (or move) the source agent's records to the target, in write batches (spec §8)."""
    validate_merge(args.source_agent_id, args.target_agent_id, args.strategy, args.mode)
    merge: _Merge | None = None
    run: Run[MergeTallies] | None = None
    try:
        with restore_run(app, dry_run=args.dry_run) as run:
            merge = _Merge(app, run, args.source_agent_id, args.target_agent_id, move=args.mode == "move")
            extra = merge.run()
    except (SQLAlchemyError, DatabaseBusy) as exc:
        if isinstance(exc, SQLAlchemyError):
            storage_errors.log_details(log, f"merge {args.source_agent_id!r} -> {args.target_agent_id!r}", exc)
        reason = exc.reason if isinstance(exc, DatabaseBusy) else dialect.error_message(exc)
        if merge is not None and run is not None and run.wrote and run.committed is not None:
            _follow_up(app, merge, emptied=False, moved=args.mode == "move")
            return failure(
                stopped_message(reason, "merge"),
                dry_run=args.dry_run,
                source_agent_id=args.source_agent_id,
                target_agent_id=args.target_agent_id,
                **run.committed.counts(),
            )
        seen = merge.tallies if merge else MergeTallies()
        return failure(
            f"merge aborted and rolled back: {reason}",
            dry_run=args.dry_run,
            source_agent_id=args.source_agent_id,
            target_agent_id=args.target_agent_id,
            merged_memories=0,
            skipped_memories=seen.skipped_memories,
            merged_episodes=0,
            skipped_episodes=seen.skipped_episodes,
            profile_copied=False,
            skipped_profile=seen.skipped_profile,
        )
    if not args.dry_run:
        emptied = args.mode == "move" and not any(extra.get("left_at_source", {}).values())
        _follow_up(app, merge, emptied=emptied, moved=args.mode == "move")
    return {
        "ok": True,
        "dry_run": args.dry_run,
        "source_agent_id": args.source_agent_id,
        "target_agent_id": args.target_agent_id,
        "strategy": args.strategy,
        "mode": args.mode,
        **merge.tallies.counts(),
        **extra,
    }


def _follow_up(app: App, merge: _Merge, *, emptied: bool, moved: bool) -> None:
    """MG-7, MG-8 after the last commit, for what the committed batches wrote."""
    _queue_node_builds(app, merge.target, merge.durable_inserted)
    _sync_remote_index(app, merge, emptied=emptied, moved=moved)
    if emptied:
        # MG-7: an emptied source keeps no calibration behind (after commit,
        # so a rolled-back move never loses it).
        app.calibration.forget_agent(merge.source, app.settings)


def _sync_remote_index(app: App, merge: _Merge, *, emptied: bool, moved: bool) -> None:
    """After commit, in remote vector mode (the merged rows were pushed after each
    commit, MG-8): after a move, purge an emptied source's namespace or remove
    the moved rows from it (MG-7)."""
    if merge.remote_items is None:
        return
    if emptied:
        remote_vectors.purge(app, merge.source)
    elif moved:
        gone = merge.durable_deleted
        refs = [f"mem:{i}" for i in gone["memories"]] + [f"ep:{i}" for i in gone["episodes"]]
        remote_vectors.forget(app, merge.source, refs)


def _queue_node_builds(app: App, agent_id: str, inserted: list[tuple[str, int, str, str]]) -> int:
    """MG-8: queue node builds for merged rows past the embedding window, as store does.

    The token reports are network requests, so they run after the merge has
    committed and outside any write lock; the builds are queued in one short
    transaction afterwards. A failure here never undoes the merge.
    """
    from cpersona.services.records.nodes import queue_build, runs_past_window

    long_rows = [(kind, row_id, project) for kind, row_id, text, project in inserted if runs_past_window(app, text)]
    if not long_rows:
        return 0
    try:
        with app.db.write() as session:
            return sum(
                queue_build(app, session, kind, row_id, agent_id=agent_id, project_id=project)
                for kind, row_id, project in long_rows
            )
    except SQLAlchemyError:
        log.warning("merged rows past the embedding window were not queued for nodes", exc_info=True)
        return 0


def paused_merge_body(source_agent_id: str, target_agent_id: str, strategy: str, mode: str) -> dict[str, Any]:
    """The success shape a paused, non-dry merge answers before the facade adds
    ``persisted``/``reason`` (spec §9.5)."""
    return {
        "ok": True,
        "dry_run": True,
        "source_agent_id": source_agent_id,
        "target_agent_id": target_agent_id,
        "strategy": strategy,
        "mode": mode,
        **MergeTallies().counts(),
    }
