"""Operator subcommands of ``cpersona``: export, import, stats, import-db.

Each runs the same service the MCP tools run (one rule, one place), on the
database ``CPERSONA_DB_PATH`` names, and exits 0 on success, 1 when the service
refused or failed (its message on stderr), 2 for unusable configuration and 3
for a database this build must not open (the exit codes of ``cpersona serve``).
Results go to stdout as short lines (``--json`` prints the service's answer).

``stats`` only reads: it opens the file read-only (on PostgreSQL, one read
snapshot) and never upgrades it, so it also describes a database this build
refuses to serve.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

PROGRESS_MIN_BYTES = 1 << 20  # smaller imports finish before a bar is worth drawing
PROGRESS_INTERVAL = 0.1
STATS_BUCKET_LIMIT = 200  # per table, in the text output and in --json


def add_subcommands(commands: Any) -> None:
    export = commands.add_parser("export", help="write memories, episodes, profiles and associations to a JSONL file")
    export.add_argument("path", help="the file to write (the rules of export_memories apply, e.g. CPERSONA_EXPORT_DIR)")
    export.add_argument("--agent", default="", help="export only this agent (default: every agent)")
    export.add_argument("--include-embeddings", action="store_true", help="also write the stored vectors")
    export.add_argument("--json", action="store_true", help="print the service's JSON answer")

    restore = commands.add_parser("import", help="read a JSONL export into the database (idempotent)")
    restore.add_argument("path", help="the export file to read")
    restore.add_argument("--target-agent", default="", help="file every record under this agent instead of its own")
    restore.add_argument("--dry-run", action="store_true", help="count what would be imported; write nothing")
    restore.add_argument("--json", action="store_true", help="print the service's JSON answer")
    restore.add_argument("--no-progress", action="store_true", help="no progress display on stderr")

    stats = commands.add_parser("stats", help="row counts per agent/project/channel, file size, schema revision")
    stats.add_argument("--json", action="store_true", help="print the figures as JSON")

    backup = commands.add_parser("backup", help="write a consistent copy of the database (safe while serving)")
    backup.add_argument("path", help="the new file to write (must not exist)")

    copy = commands.add_parser("import-db", help="copy every record of a CPersona 2.6 database into this one")
    copy.add_argument("path", help="the 2.6 database file (opened read-only, never changed)")
    copy.add_argument("--json", action="store_true", help="print the service's JSON answer")


# -- shared plumbing ---------------------------------------------------------------------------


class _Exit(Exception):
    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


def _codes() -> Any:
    from cpersona import cli

    return cli


def _settings() -> Any:
    from cpersona.config import ConfigError, load_settings, warn_unknown_variables

    try:
        settings = load_settings()
    except ConfigError as exc:
        raise _Exit(str(exc), _codes().EXIT_BAD_CONFIG) from None
    warn_unknown_variables()
    return settings


@contextmanager
def _app(*, must_exist: bool, settings: Any = None, embedder: Any = None) -> Iterator[Any]:
    """An App on the configured database (``settings``, else read now), upgraded to head as ``serve`` would."""
    import logging

    from cpersona.services.app import App
    from cpersona.storage.migrate import MigrationError, TooNewDatabase, open_database_and_upgrade

    logging.basicConfig(stream=sys.stderr, level=logging.WARNING, format="cpersona: %(levelname)s: %(message)s")
    settings = settings or _settings()
    if must_exist and not settings.database_url and not settings.db_file.exists():
        raise _Exit(f"no database at {settings.db_file} (CPERSONA_DB_PATH)", _codes().EXIT_START_FAILED)
    try:
        db = open_database_and_upgrade(settings)
    except TooNewDatabase as exc:
        raise _Exit(str(exc), _codes().EXIT_DATABASE_TOO_NEW) from None
    except (MigrationError, OSError) as exc:
        raise _Exit(f"cannot open the database {settings.db_file}: {exc}", _codes().EXIT_START_FAILED) from None
    try:
        yield App(db=db, settings=settings, embedder=embedder)
    finally:
        db.close()


def _run(body: Callable[[argparse.Namespace], dict[str, Any] | None], args: argparse.Namespace) -> int:
    try:
        answer = body(args)
    except _Exit as stop:
        print(f"cpersona: {stop}", file=sys.stderr)
        return stop.status
    if answer is None:
        return 0
    if getattr(args, "json", False):
        print(json.dumps(answer, ensure_ascii=False, indent=2))
    if answer.get("ok") is False:
        print(f"cpersona: {answer.get('error') or answer.get('reason')}", file=sys.stderr)
        return _codes().EXIT_START_FAILED
    return 0


# -- backup ----------------------------------------------------------------------------------------


def _backup(args: argparse.Namespace) -> dict[str, Any]:
    from cpersona.services.portability.paths import new_file_target
    from cpersona.services.responses import ToolFailure
    from cpersona.storage.backup import BackupError, backup_to

    with _app(must_exist=True) as app:
        try:
            path = backup_to(app.db, new_file_target(app, Path(args.path), "backup path"))
        except ToolFailure as refused:
            return refused.as_response()
        except (BackupError, OSError) as exc:
            return {"ok": False, "error": str(exc)}
    print(f"backed up {app.settings.db_file} to {path}")
    return {"ok": True, "path": str(path)}


# -- export ----------------------------------------------------------------------------------------


def _export(args: argparse.Namespace) -> dict[str, Any]:
    from cpersona.services.portability import export_memories

    with _app(must_exist=True) as app:
        answer = export_memories(
            app, agent_id=args.agent, output_path=args.path, include_embeddings=args.include_embeddings
        )
    if answer.get("ok") and not args.json:
        graph = answer.get("associations")
        extra = f", associations {graph}" if graph else ""
        print(
            f"exported to {answer['path']}: memories {answer['memories']}, episodes {answer['episodes']}, "
            f"profiles {answer['profiles']}{extra}"
        )
    return answer


# -- import, with progress --------------------------------------------------------------------------


class ImportProgress:
    """Shows how far the importer has read its file, on stderr.

    The importer reads the file twice: a checking pass, then the import. Which
    pass is running is counted from the interpreter's "open" audit events for
    that file; how far it has read is the file's offset in /proc/self/fdinfo
    (where there is no /proc, elapsed time is shown instead). On a terminal one
    line is redrawn; otherwise a line is written at every tenth of each pass.
    """

    PASSES = ("checking", "importing")

    def __init__(self, path: Path, stream: IO[str] | None = None) -> None:
        self.path = path.resolve()
        self.size = max(self.path.stat().st_size, 1)
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self._opens = 0
        self._active = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="cpersona-import-progress", daemon=True)
        self._drawn: tuple[int, int] = (0, -1)  # (pass, tenth) last written
        self._started = time.monotonic()

    def __enter__(self) -> ImportProgress:
        self._active = True
        sys.addaudithook(self._audit)  # cannot be removed; it goes quiet on exit
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._active = False
        self._stop.set()
        self._thread.join()
        if self.tty:
            self.stream.write("\n")
        self.stream.flush()

    def _audit(self, event: str, args: tuple[Any, ...]) -> None:
        if not self._active or event != "open" or not args or not isinstance(args[0], (str, os.PathLike)):
            return
        opened = os.fspath(args[0])
        if os.path.basename(opened) == self.path.name and os.path.realpath(opened) == str(self.path):
            self._opens += 1

    def _offset(self) -> int | None:
        """The read offset of our file as this process holds it open, or None."""
        try:
            for name in os.listdir("/proc/self/fd"):
                try:
                    if os.readlink(f"/proc/self/fd/{name}") != str(self.path):
                        continue
                    with open(f"/proc/self/fdinfo/{name}") as info:
                        for line in info:
                            if line.startswith("pos:"):
                                return int(line.split()[1])
                except OSError:
                    continue
        except OSError:
            pass
        return None

    def _loop(self) -> None:
        proc = os.path.isdir("/proc/self/fdinfo")
        while not self._stop.wait(PROGRESS_INTERVAL):
            if self._opens == 0:
                continue
            step = min(self._opens, len(self.PASSES)) - 1
            offset = self._offset() if proc else None
            if offset is not None:
                self._draw(step, min(offset / self.size, 1.0))
            elif not proc:
                self._elapsed(step)

    def _label(self, step: int) -> str:
        return f"import: pass {step + 1}/{len(self.PASSES)} {self.PASSES[step]}"

    def _draw(self, step: int, fraction: float) -> None:
        done_mb, total_mb = fraction * self.size / 1e6, self.size / 1e6
        if self.tty:
            if step != self._drawn[0]:
                self.stream.write("\n")  # keep the finished pass's line
            self._drawn = (step, 0)
            bar = "#" * int(fraction * 30)
            self.stream.write(f"\r{self._label(step)} [{bar:<30}] {fraction:4.0%} {done_mb:.1f}/{total_mb:.1f} MB")
            self.stream.flush()
            return
        tenth = int(fraction * 10)
        if (step, tenth) > self._drawn:
            self._drawn = (step, tenth)
            self.stream.write(f"{self._label(step)} {tenth * 10}% ({done_mb:.1f}/{total_mb:.1f} MB)\n")
            self.stream.flush()

    def _elapsed(self, step: int) -> None:
        tens = int(time.monotonic() - self._started) // 10
        if (step, tens) > self._drawn:
            self._drawn = (step, tens)
            self.stream.write(f"{self._label(step)} ({tens * 10} s)\n")
            self.stream.flush()


def _import(args: argparse.Namespace) -> dict[str, Any]:
    from cpersona.services.portability import import_memories

    path = Path(args.path)
    with _app(must_exist=False) as app:
        show = not args.no_progress and path.is_file() and path.stat().st_size >= PROGRESS_MIN_BYTES
        with ImportProgress(path) if show else _nothing():
            answer = import_memories(app, input_path=args.path, target_agent_id=args.target_agent, dry_run=args.dry_run)
    if answer.get("ok") and _read_nothing(answer):
        # Every line refused and nothing counted: not an export at all, so not a success.
        errors = answer["errors"]
        more = f" (and {len(errors) - 1} more errors)" if len(errors) > 1 else ""
        raise _Exit(
            f"nothing was imported: {path} holds no cpersona record; {errors[0]}{more}", _codes().EXIT_START_FAILED
        )
    if answer.get("ok") and not args.json:
        verb = "would import" if answer.get("dry_run") else "imported"
        print(
            f"{verb} {answer.get('imported_memories', 0)} memories (skipped {answer.get('skipped_memories', 0)}), "
            f"{answer.get('imported_episodes', 0)} episodes (skipped {answer.get('skipped_episodes', 0)}), "
            f"profile updated: {'yes' if answer.get('profile_updated') else 'no'}"
        )
        for line in answer.get("errors", [])[:20]:
            print(f"  {line}", file=sys.stderr)
    return answer


def _read_nothing(answer: dict[str, Any]) -> bool:
    counts = ("imported_memories", "skipped_memories", "imported_episodes", "skipped_episodes")
    return bool(answer.get("errors")) and not answer.get("profile_updated") and not any(answer.get(k) for k in counts)


@contextmanager
def _nothing() -> Iterator[None]:
    yield None


# -- import-db -----------------------------------------------------------------------------------------


def _import_db(args: argparse.Namespace) -> dict[str, Any]:
    from cpersona.services.portability import import_db
    from cpersona.services.portability.import_db import vet_source
    from cpersona.services.responses import ToolFailure
    from cpersona.storage.migrate import import_db_command

    settings = _settings()
    target = settings.database_url and "the PostgreSQL database CPERSONA_DATABASE_URL names"
    try:
        # The source is vetted before the target is created: a mistyped path must
        # not leave an empty database behind.
        source = vet_source(args.path, None)
    except ToolFailure as refused:
        raise _Exit(str(refused), _codes().EXIT_START_FAILED) from None
    if not target:
        ours = settings.db_file
        if ours.resolve() == source or (ours.exists() and os.path.samefile(ours, source)):
            raise _Exit(
                f"CPERSONA_DB_PATH names {source}, the database being copied: import-db copies it into a "
                f"new file; run `{import_db_command(source)}`",
                _codes().EXIT_START_FAILED,
            )
        named = (
            "CPERSONA_DB_PATH"
            if "db_path" in settings.model_fields_set
            else "CPERSONA_DB_PATH is unset: the default, under the working directory"
        )
        target = f"{ours} ({named})"
    announced: list[bool] = []

    def progress(line: str) -> None:
        # The target is named once the copy has really begun: a target or source that
        # cannot be opened is answered by its one failure line alone.
        if not announced:
            announced.append(True)
            print(f"import-db: copying {source} into {target}", file=sys.stderr, flush=True)
        print(f"import-db: {line}", file=sys.stderr, flush=True)

    with _app(must_exist=False, settings=settings) as app:
        if app.db.read_only is not None:  # refused before the source is read at all
            from cpersona.storage.errors import read_only_sentence

            raise _Exit(read_only_sentence(app.db.label, app.db.read_only), _codes().EXIT_START_FAILED)
        answer = import_db(app, source, progress=progress)
    if answer.get("ok"):
        serve_with = (
            "the same CPERSONA_DATABASE_URL"
            if settings.database_url
            else f"CPERSONA_DB_PATH={shlex.quote(str(settings.db_file))}"
        )
        print(f"import-db: done; serve the copy with {serve_with}", file=sys.stderr)
    if answer.get("ok") and not args.json:
        mem, ep = answer["memories"], answer["episodes"]
        print(f"copied from {answer['source']} (schema_version {answer.get('source_schema_version')}) into {target}:")
        print(f"  memories  {mem['copied']} copied, {mem['skipped']} already present")
        print(f"  episodes  {ep['copied']} copied, {ep['skipped']} already present")
        print(f"  profiles  {answer['profiles']['copied']} copied")
        if graph := answer.get("associations"):
            print(f"  associations  {graph}")
        if not_copied := answer.get("not_copied"):
            print(f"  not copied (derived or out of scope): {not_copied}")
        for line in answer.get("errors", [])[:20]:
            print(f"  {line}", file=sys.stderr)
    return answer


# -- stats ---------------------------------------------------------------------------------------------


def collect_stats(path: Path) -> dict[str, Any]:
    """Figures about the database file at ``path``, read without changing it."""
    from sqlalchemy import text

    from cpersona.storage.foreign import read_only_snapshot
    from cpersona.storage.migrate import head_revision, probe

    found = probe(path)
    if found is None:
        raise _Exit(f"no database at {path} (CPERSONA_DB_PATH)", _codes().EXIT_START_FAILED)
    sizes = {
        suffix or "db": (Path(f"{path}{suffix}").stat().st_size if Path(f"{path}{suffix}").exists() else 0)
        for suffix in ("", "-wal", "-shm")
    }
    stats: dict[str, Any] = {
        "path": str(path.resolve()),
        "size_bytes": sizes["db"],
        "wal_bytes": sizes["-wal"],
        "schema_version": found.version,
        "alembic_revision": found.alembic_revision,
        "head_revision": head_revision(),
    }
    with read_only_snapshot(path.resolve()) as conn:
        _count_rows(stats, found.tables, lambda sql: list(conn.execute(text(sql)).all()))
    return stats


def collect_stats_postgres(url: str) -> dict[str, Any]:
    """The same figures for the PostgreSQL database at ``url``, from one read snapshot."""
    from sqlalchemy import text

    from cpersona.storage.engine import open_postgres
    from cpersona.storage.migrate import _probe_rows, head_revision

    db = open_postgres(url)
    try:
        with db.read() as session:

            def rows(sql: str) -> list[Any]:
                return list(session.execute(text(sql)).all())

            found = _probe_rows(lambda sql: [tuple(r) for r in rows(sql)], "postgresql")
            if "memories" not in found.tables:
                raise _Exit(f"no cpersona tables in {db.label} (CPERSONA_DATABASE_URL)", _codes().EXIT_START_FAILED)
            stats: dict[str, Any] = {
                "path": db.label,
                "size_bytes": rows("SELECT pg_database_size(current_database())")[0][0],
                "wal_bytes": None,  # PostgreSQL's WAL is the cluster's, not this database's
                "schema_version": found.version,
                "alembic_revision": found.alembic_revision,
                "head_revision": head_revision(),
            }
            _count_rows(stats, found.tables, rows)
    finally:
        db.close()
    return stats


def _count_rows(stats: dict[str, Any], tables: frozenset[str], rows: Callable[[str], list[Any]]) -> None:
    """Row counts (and the largest agent/project/channel buckets) of the tables present."""
    for table in ("memories", "episodes"):
        if table not in tables:
            continue
        stats[table] = rows(f"SELECT count(*) FROM {table}")[0][0]
        buckets = rows(
            f"SELECT agent_id, project_id, channel, count(*) AS n FROM {table} "
            f"GROUP BY agent_id, project_id, channel ORDER BY n DESC, agent_id, project_id, channel "
            f"LIMIT {STATS_BUCKET_LIMIT + 1}"
        )
        stats[f"{table}_by_bucket"] = [
            {"agent_id": a, "project_id": p, "channel": c, "count": n} for a, p, c, n in buckets[:STATS_BUCKET_LIMIT]
        ]
        if len(buckets) > STATS_BUCKET_LIMIT:
            stats[f"{table}_by_bucket_truncated"] = True
    if "profiles" in tables:
        stats["profiles"] = rows("SELECT count(*) FROM profiles")[0][0]
    if "pending_memory_tasks" in tables:
        stats["pending_tasks"] = rows("SELECT count(*) FROM pending_memory_tasks")[0][0]
    for table in ("entities", "relations", "entity_mentions", "record_nodes"):
        if table in tables:
            stats[table] = rows(f"SELECT count(*) FROM {table}")[0][0]


def _stats(args: argparse.Namespace) -> None:
    settings = _settings()
    if settings.database_url:
        stats = collect_stats_postgres(settings.database_url)
    else:
        stats = collect_stats(settings.db_file)
    if args.json:
        print(json.dumps(stats, ensure_ascii=False, indent=2))
        return None
    revision = stats["alembic_revision"]
    state = "head" if revision == stats["head_revision"] else f"head is {stats['head_revision']}"
    print(f"database        {stats['path']}")
    wal = "" if stats["wal_bytes"] is None else f" (WAL {stats['wal_bytes'] / 1e6:.1f} MB)"
    print(f"size            {stats['size_bytes'] / 1e6:.1f} MB{wal}")
    print(f"schema_version  {stats['schema_version']}")
    print(f"alembic         {revision or 'not managed by cpersona yet'}" + (f" ({state})" if revision else ""))
    for key in (
        "memories",
        "episodes",
        "profiles",
        "pending_tasks",
        "entities",
        "relations",
        "entity_mentions",
        "record_nodes",
    ):
        if key in stats:
            print(f"{key:<16}{stats[key]}")
    for table in ("memories", "episodes"):
        buckets = stats.get(f"{table}_by_bucket")
        if not buckets:
            continue
        print(f"\n{table} by agent / project / channel:")
        print(f"  {'agent_id':<24} {'project_id':<16} {'channel':<20} count")
        for b in buckets:
            print(f"  {_cell(b['agent_id'], 24)} {_cell(b['project_id'], 16)} {_cell(b['channel'], 20)} {b['count']}")
        if stats.get(f"{table}_by_bucket_truncated"):
            print(f"  … more buckets (only the {STATS_BUCKET_LIMIT} largest are shown)")
    return None


def _cell(value: str, width: int) -> str:
    shown = repr(value) if value == "" else value
    return (shown if len(shown) <= width else shown[: width - 1] + "…").ljust(width)


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "export": lambda args: _run(_export, args),
    "import": lambda args: _run(_import, args),
    "stats": lambda args: _run(_stats, args),
    "import-db": lambda args: _run(_import_db, args),
    "backup": lambda args: _run(_backup, args),
}
