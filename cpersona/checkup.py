"""``python -m cpersona.checkup`` (and ``cpersona checkup``): the health registry for timers and CI.

It runs the same check_health (and optionally deep_check) the server runs,
against a database file, and turns the verdict into an exit status (spec §7):
2 on any critical finding (or a failure), 1 with --strict on any warn, else 0.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

DEFAULT_DB = "data/cpersona.db"
EXIT_OK, EXIT_WARN, EXIT_CRITICAL = 0, 1, 2
DEEP_LINE_CHARS = 400


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--db", metavar="PATH", help="database file (default: CPERSONA_DB_PATH, else data/cpersona.db)")
    parser.add_argument("--agent", metavar="AGENT_ID", default="", help="scope agent-scoped checks to one agent")
    parser.add_argument("--fix", action="store_true", help="apply repairs (default: read-only report)")
    parser.add_argument("--strict", action="store_true", help="exit 1 on warn findings too")
    parser.add_argument("--deep", action="store_true", help="also run deep_check for each agent")
    parser.add_argument("--json", action="store_true", help="print the full report as JSON")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m cpersona.checkup", description="Run the cpersona health registry against a database file."
    )
    add_arguments(parser)
    return parser


def _err(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return EXIT_CRITICAL


def resolve_db(arg: str | None) -> Path:
    """CLI-1: --db, else CPERSONA_DB_PATH, else the relative default (announced on stderr)."""
    if arg:
        return Path(arg).expanduser().absolute()
    if os.environ.get("CPERSONA_DB_PATH"):
        return Path(os.environ["CPERSONA_DB_PATH"]).expanduser().absolute()
    path = Path(DEFAULT_DB).absolute()
    print(f"cpersona checkup: using {path}", file=sys.stderr)
    return path


def exit_code(summary: dict[str, int], strict: bool) -> int:
    """CLI-7 / R-8."""
    if summary.get("critical", 0) > 0:
        return EXIT_CRITICAL
    if strict and summary.get("warn", 0) > 0:
        return EXIT_WARN
    return EXIT_OK


def agents_of(app: Any) -> list[str]:
    from sqlalchemy import text

    with app.db.read() as session:
        rows = session.execute(
            text(
                "SELECT agent_id FROM memories UNION SELECT agent_id FROM profiles "
                "UNION SELECT agent_id FROM episodes ORDER BY 1"
            )
        )
        return [r[0] for r in rows]


def _deep_worth_printing(result: dict[str, Any]) -> bool:
    for value in result.values():
        if not isinstance(value, dict):
            continue
        if any(value.get(k) for k in ("count", "pairs", "recoverable", "unrecoverable", "error")):
            return True
        if value.get("status") not in (None, "ok", "not_applicable"):
            return True
    return False


def render(report: dict[str, Any], *, fix: bool, code: int, strict: bool) -> str:
    """CLI-8: first line, one line per issue, deep lines, last line."""
    s = report["severity_summary"]
    lines = [
        f"cpersona checkup: {report['total_memories']} memories, {s['critical']} critical / {s['warn']} warn / "
        f"{s['info']} info" + (" (fix applied)" if fix else "")
    ]
    for issue in report["issues"]:
        rest = {k: v for k, v in issue.items() if k not in ("type", "severity", "check")}
        lines.append(f"  [{issue.get('severity', ''):<8}] {issue.get('type')}: {rest}")
    for agent, result in report.get("deep", {}).items():
        if _deep_worth_printing(result):
            lines.append(f"  deep[{agent}]: {json.dumps(result, ensure_ascii=False)[:DEEP_LINE_CHARS]}")
    lines.append(f"exit={code} ({'strict gate' if strict else 'non-strict gate'})")
    return "\n".join(lines)


def report_database(path: Path) -> Any:
    """A database that cannot change the file (CLI-3, H-13).

    The server's engine switches the file to WAL on connect, which rewrites the
    header of a rollback-journal database; a report must leave the file as it
    found it, so this one is the storage layer's read-only engine (``mode=ro``,
    the journal mode left alone) and refuses every write before SQLite is asked.
    """
    from cpersona.storage.engine import Database, sqlite_engine

    return Database(
        sqlite_engine(path, read_only=True), path=Path(path).resolve(), read_only="a checkup report never writes"
    )


def vet_database(path: Path, *, fix: bool) -> str | None:
    """Why ``path`` cannot be checked at all (a folder, a file that is not a database), or None.

    Asked before any check runs: on a file that is not a database every check
    would crash on its own, and one sentence says it better than thirty. A
    ``--fix`` run migrates first, so an empty or table-less SQLite file is its to
    set up; a report has nothing to read in one.
    """
    from cpersona.storage.migrate import MigrationError, probe

    if path.is_dir():
        return f"{path} is a folder, not a database file"
    if not path.is_file():
        return None  # run() answers "database not found" (CLI-1's message)
    try:
        found = probe(path)
    except MigrationError as exc:
        return str(exc)
    if fix:
        return None
    if found is None:
        return f"{path} is an empty file, not a database"
    if "memories" not in found.tables:
        return f"{path} is a SQLite database without cpersona's tables"
    return None


def run(args: argparse.Namespace) -> int:
    from cpersona.config import ConfigError, load_settings
    from cpersona.embedding.client import build_embedder

    path = resolve_db(args.db)
    if problem := vet_database(path, fix=args.fix):
        return _err(f"checkup failed: {problem}")
    if not path.is_file():
        return _err(f"database not found: {path}")
    try:
        settings = load_settings({**os.environ, "CPERSONA_DB_PATH": str(path)})
        embedder = build_embedder(settings)  # CLI-2: validated as at server start
    except (ConfigError, ValueError) as exc:
        return _err(str(exc))
    db = None
    try:
        from cpersona.services.app import App
        from cpersona.services.health.check_health import run_health, select
        from cpersona.services.health.deep_check import deep_check
        from cpersona.storage.migrate import open_and_upgrade

        if args.fix:
            db = open_and_upgrade(path, fts_enabled=settings.fts_enabled)
        else:
            db = report_database(path)  # CLI-3: a report never migrates nor writes
        app = App(db=db, settings=settings, embedder=embedder)
        checks, checks_run = select([])
        report = run_health(app, agent_id=args.agent, fix=args.fix, checks=checks, checks_run=checks_run)
        if args.deep:
            agents = [args.agent] if args.agent else agents_of(app)
            report["deep"] = {a: deep_check(app, agent_id=a, fix=args.fix) for a in agents}
    except Exception as exc:  # noqa: BLE001 — CLI-6: any failure is a clean exit 2
        from cpersona.cli import failure_line

        return _err(f"checkup failed: {failure_line(exc)}")
    finally:
        if db is not None:
            db.close()
        if embedder is not None:
            embedder.close()
    code = exit_code(report["severity_summary"], args.strict)
    if args.json:
        print(json.dumps(report, indent=2, ensure_ascii=False, default=str))
    else:
        print(render(report, fix=args.fix, code=code, strict=args.strict))
    return code


def main(argv: Sequence[str] | None = None) -> int:
    from cpersona.cli import guarded

    return guarded(run, build_parser().parse_args(argv), prefix="error: checkup failed: ", status=EXIT_CRITICAL)


if __name__ == "__main__":
    sys.exit(main())
