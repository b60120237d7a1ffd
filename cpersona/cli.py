"""The ``cpersona`` command: serve MCP (the default), plus maintenance subcommands.

stdout belongs to the MCP protocol while serving, so everything this module
says goes to stderr. Exit status: 0 after a clean shutdown, 2 for unusable
configuration (and, from argparse, for a command line it cannot read), 3 for a
database this build must not open, 1 for any other start-up failure. The
maintenance subcommands share that table (``checkup`` keeps its own, spec
CLI-6/7): any failure is one line on stderr, never a traceback, and a reader
that closes the output early (``| head``) ends the command quietly with 141,
as a program the shell's SIGPIPE ended (docs/operations.md).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable, Sequence

from cpersona import __version__, admin_cli, checkup, model_cli

log = logging.getLogger("cpersona")

EXIT_OK = 0
EXIT_START_FAILED = 1
EXIT_BAD_CONFIG = 2
EXIT_DATABASE_TOO_NEW = 3
EXIT_OUTPUT_CLOSED = 141  # 128 + SIGPIPE


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="cpersona",
        description="Persistent memory for LLM agents over MCP. Configuration comes from CPERSONA_* "
                    "environment variables (see docs/configuration.md).",
    )
    parser.add_argument("--version", action="version", version=f"cpersona {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.add_parser("serve", help="serve MCP on the transport CPERSONA_TRANSPORT names (the default command)")
    admin_cli.add_subcommands(commands)  # export, import, stats, import-db
    checkup.add_arguments(commands.add_parser(
        "checkup", help="run the health registry against the database (exit 2 on critical, 1 with --strict on warn)"))
    model_cli.add_subcommands(commands)  # fetch-model, embed-server
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    command = args.command or "serve"
    handler: Callable[[argparse.Namespace], int] = COMMANDS[command]
    if command == "serve":
        return handler(args)  # its failures are start-up lines; a crash while serving keeps its traceback
    if command == "checkup":
        return guarded(handler, args, prefix="error: checkup failed: ", status=checkup.EXIT_CRITICAL)
    return guarded(handler, args)


def guarded(handler: Callable[[argparse.Namespace], int], args: argparse.Namespace, *,
            prefix: str = "cpersona: ", status: int = EXIT_START_FAILED) -> int:
    """Run a maintenance command: any failure is one line, a closed output pipe a quiet 141."""
    try:
        code = handler(args)
        sys.stdout.flush()  # a reader that left shows here, not as "Exception ignored" at exit
        return code
    except BrokenPipeError:
        # Nothing more can be said on stdout; point it at /dev/null so the
        # interpreter's own flush at exit does not complain either.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OUTPUT_CLOSED
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # noqa: BLE001 — a maintenance command answers in one line
        log.debug("%s failed", getattr(args, "command", "command"), exc_info=True)
        print(f"{prefix}{failure_line(exc)}", file=sys.stderr)
        return status


def failure_line(exc: BaseException) -> str:
    """One line for a failure nobody caught: a storage sentence, an OS error, else its type and text."""
    from cpersona.storage import errors as storage_errors
    from cpersona.storage.migrate import MigrationError

    if isinstance(exc, MigrationError):
        return str(exc)  # already a sentence about the database
    if storage_errors.is_storage_failure(exc):
        return storage_errors.reason(exc)
    if isinstance(exc, OSError) and exc.strerror:
        return f"{exc.filename}: {exc.strerror}" if exc.filename else exc.strerror
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def _log_to_stderr() -> None:
    logging.basicConfig(stream=sys.stderr, level=logging.INFO,
                        format="%(asctime)s [%(name)s] %(levelname)s: %(message)s")
    # Alembic announces every plugin it loads at INFO; only its problems matter here.
    logging.getLogger("alembic").setLevel(logging.WARNING)


def _fail(message: str, status: int) -> int:
    print(f"cpersona: {message}", file=sys.stderr)
    return status


def serve(args: argparse.Namespace) -> int:
    # Imported here so --help and --version answer without loading the stack.
    import anyio

    from cpersona.config import ConfigError, check_startup, load_settings, warn_unknown_variables

    try:
        settings = load_settings()
        check_startup(settings)
    except ConfigError as exc:
        return _fail(str(exc), EXIT_BAD_CONFIG)
    _log_to_stderr()
    from cpersona.mcp.acl import AclConfigError, acl_gates, load_policy
    from cpersona.mcp.gates import GateChain
    from cpersona.mcp.pause_gate import PauseGate
    from cpersona.mcp.http import StartupRefusal, build_http_app, http_auth_mode, serve_http
    from cpersona.mcp.http_guard import connection_limits
    from cpersona.mcp.oauth import oauth_config

    # Spec T-7 steps 3-4, before anything expensive: the ACL file, then HTTP credentials.
    http = settings.transport == "streamable-http"
    try:
        policy = load_policy(settings)
        oauth = oauth_config(settings) if http else None
        auth = http_auth_mode(settings, policy, oauth) if http else None
    except (AclConfigError, StartupRefusal) as exc:
        return _fail(str(exc), EXIT_BAD_CONFIG)
    warn_unknown_variables(policy.env_refs if policy is not None else ())
    from cpersona.embedding.client import build_embedder
    from cpersona.mcp.server import build_server
    from cpersona.mcp.stdio import serve_stdio
    from cpersona.services.app import App
    from cpersona.services.records.backfill import start_backfill, stop_backfill
    from cpersona.services.calibration.service import start_calibration
    from cpersona.services.operations.tasks import start_task_queue
    from cpersona.services.operations.update_check import start_update_check
    from cpersona.storage.migrate import MigrationError, TooNewDatabase, open_database_and_upgrade

    # Spec T-7 order: embedding mode and client, then the database.
    try:
        embedder = build_embedder(settings)
    except ValueError as exc:
        return _fail(str(exc), EXIT_BAD_CONFIG)
    if embedder is not None:
        embedder.refresh_identity(force=True)  # bounded (≤ 3 s); a silent backend is tolerated
    try:
        db = open_database_and_upgrade(settings)
    except TooNewDatabase as exc:
        return _fail(str(exc), EXIT_DATABASE_TOO_NEW)
    except (MigrationError, OSError) as exc:
        return _fail(f"cannot open the database {settings.db_file}: {exc}", EXIT_START_FAILED)

    log.info("cpersona %s serving %s, database %s, embeddings %s", __version__, settings.transport,
             settings.db_file, settings.embedding_mode)
    if db.read_only is not None:
        # Said once, here; each refused write then answers the same sentence.
        log.warning("the database is read-only: %s cannot be written (%s); reads are served, every write "
                    "is refused", db.label, db.read_only)
    # The ACL gate comes first: a call it denies never reaches a later gate. The
    # pause gate follows: a paused write is answered only once it is allowed at all.
    gates = GateChain([*acl_gates(policy, settings, settings.transport), PauseGate()])
    app = App(db=db, settings=settings, embedder=embedder, remote_callers=http)
    # Restores the calibration sidecar, or recalibrates, off the serving path (spec §5.18.5).
    calibration = start_calibration(app)
    # Rows an earlier run stored without a vector get one, in the background (never under the lock),
    # and the DB task queue drains what earlier runs left (spec Q-2): both only write, so not on a
    # read-only database. The update check runs once, unwaited (UP-2).
    queue = None
    if db.read_only is None:
        start_backfill(app)
        queue = start_task_queue(app)
    start_update_check(app)
    server = build_server(app, gates=gates)
    try:
        if http:
            serve_http(build_http_app(server, host=settings.http_host, auth=auth, oauth=oauth,
                                      max_body_bytes=settings.http_max_body_bytes,
                                      body_limit_mode=settings.http_body_limit_mode,
                                      stream_max_seconds=settings.http_stream_max_secs),
                       settings.http_host, settings.http_port, connection_limits(settings))
        else:
            anyio.run(serve_stdio, server)
    except KeyboardInterrupt:
        pass
    finally:
        if calibration is not None:
            calibration.stop()
        if queue is not None:
            queue.stop()  # waits up to 5 s (spec Q-7)
        stop_backfill(app)
        db.close()
        if embedder is not None:
            embedder.close()
    return EXIT_OK


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {"serve": serve, **admin_cli.COMMANDS,
                                                            "checkup": checkup.run, **model_cli.COMMANDS}
