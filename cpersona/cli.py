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
from typing import Any

from cpersona import DISTRIBUTION, __version__

log = logging.getLogger("cpersona")

EXIT_OK = 0
EXIT_START_FAILED = 1
EXIT_BAD_CONFIG = 2
EXIT_DATABASE_TOO_NEW = 3
EXIT_OUTPUT_CLOSED = 141  # 128 + SIGPIPE


def build_parser(*, proxy_only: bool = False) -> argparse.ArgumentParser:
    """The command line; ``proxy_only``: with the ``serve`` and ``proxy`` commands alone.

    A host starts one proxy (or one server) per session, so those starts skip
    importing the maintenance commands' modules (~25 ms of a proxy's ~0.2 s of CPU).
    """
    parser = argparse.ArgumentParser(
        prog="cpersona",
        description="Persistent memory for LLM agents over MCP. Configuration comes from CPERSONA_* "
        "environment variables (see docs/configuration.md).",
    )
    parser.add_argument("--version", action="version", version=f"cpersona {__version__} ({DISTRIBUTION})")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.add_parser("serve", help="serve MCP on the transport CPERSONA_TRANSPORT names (the default command)")
    proxy = commands.add_parser(
        "proxy", help="stdio MCP for one client, forwarded to the shared HTTP server at CPERSONA_REMOTE_URL"
    )
    proxy.add_argument(
        "--spawn", action="store_true", help="when nothing answers, start the shared server (CPERSONA_PROXY_SPAWN)"
    )
    if proxy_only:
        return parser
    from cpersona import admin_cli, checkup, hooks, model_cli, people_cli
    from cpersona.ui import cli as ui_cli

    admin_cli.add_subcommands(commands)  # export, import, stats, import-db
    checkup.add_arguments(
        commands.add_parser(
            "checkup", help="run the health registry against the database (exit 2 on critical, 1 with --strict on warn)"
        )
    )
    model_cli.add_subcommands(commands)  # fetch-model, embed-server
    ui_cli.add_subcommands(commands)  # ui
    people_cli.add_subcommands(commands)  # search, list, show, delete
    hooks.add_subcommands(commands)  # hook session-start, hook session-end
    add_database_option(commands)
    return parser


# Commands that never open a database: the proxy forwards to a server, the model commands use the network.
NO_DATABASE = frozenset({"proxy", "fetch-model", "embed-server"})


def add_database_option(commands: Any) -> None:
    """``--db PATH`` on every subcommand that opens a database (those defining their own keep theirs)."""
    for name, sub in commands.choices.items():
        if name in NO_DATABASE:
            continue
        for parser in [sub, *_nested_parsers(sub)]:
            if "--db" not in parser._option_string_actions:
                parser.add_argument(
                    "--db",
                    metavar="PATH",
                    default=None,
                    help="SQLite database file for this command (overrides CPERSONA_DB_PATH and CPERSONA_DATABASE_URL)",
                )


def _nested_parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    return [
        nested
        for action in parser._actions
        if isinstance(action, argparse._SubParsersAction)
        for nested in action.choices.values()
    ]


def apply_database_option(args: argparse.Namespace) -> None:
    """Point this process at ``--db``: the settings every command loads read it from the environment."""
    path = getattr(args, "db", None)
    if path:
        os.environ["CPERSONA_DB_PATH"] = os.path.abspath(os.path.expanduser(path))
        os.environ.pop("CPERSONA_DATABASE_URL", None)  # the file named on the command line wins


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["proxy"]:
        return guarded(proxy, build_parser(proxy_only=True).parse_args(argv))
    if argv in ([], ["serve"]):
        # The host's own start command: like the proxy's, it skips building the
        # maintenance commands' parsers and importing their modules (~30 ms CPU).
        return serve(build_parser(proxy_only=True).parse_args(argv))
    args = build_parser().parse_args(argv)
    apply_database_option(args)
    command = args.command or "serve"
    # A module registering its own subcommands names their handler in the parser (set_defaults).
    handler: Callable[[argparse.Namespace], int] = getattr(args, "handler", None) or commands()[command]
    if command == "serve":
        return handler(args)  # its failures are start-up lines; a crash while serving keeps its traceback
    if command == "checkup":
        from cpersona import checkup

        return guarded(handler, args, prefix="error: checkup failed: ", status=checkup.EXIT_CRITICAL)
    return guarded(handler, args)


def guarded(
    handler: Callable[[argparse.Namespace], int],
    args: argparse.Namespace,
    *,
    prefix: str = "cpersona: ",
    status: int = EXIT_START_FAILED,
) -> int:
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
    logging.basicConfig(
        stream=sys.stderr, level=logging.INFO, format="%(asctime)s [%(name)s] %(levelname)s: %(message)s"
    )
    # Alembic announces every plugin it loads at INFO; only its problems matter here.
    logging.getLogger("alembic").setLevel(logging.WARNING)


def _fail(message: str, status: int) -> int:
    print(f"cpersona: {message}", file=sys.stderr)
    return status


# Which session serves stdio: ours on the SDK's wire types ("narrow"), or the
# SDK's own ("sdk"), which only tests select, to compare the two's answers.
STDIO_SESSION = "narrow"


def serve(args: argparse.Namespace) -> int:
    """Serve until stdin closes (stdio) or the server is interrupted, then leave at once.

    Everything is imported where it is first needed, so a stdio start loads only
    what a stdio start runs: no HTTP stack, OAuth or ACL code unless configured,
    no Alembic when the database is already at head, and the start-up work no
    first answer needs (:mod:`cpersona.background`) only after that answer.
    """
    import gc

    # The start allocates ~120,000 long-lived objects (the SDK's models, SQLAlchemy,
    # our declarations); with the collector on, its threshold-driven passes rescan
    # them again and again: 0.15-0.2 s of a ~1 s start (docs/benchmarks.md, issue 16
    # sixth round). Off until they are built, then frozen (see _collector_on).
    gc.disable()
    try:
        status = _serve(args)
    finally:
        gc.enable()  # a start that failed before serving must not leave it off
    return _leave(status)


def _collector_on() -> None:
    """Turn the garbage collector back on once everything a start imports is built.

    Everything alive now is module state that lives as long as the process, so it
    is frozen (moved where no collection scans it) rather than collected: a full
    collection here would cost the ~0.1 s the start just saved. The few hundred KiB
    of cycles the start dropped while the collector was off are frozen with it.
    Later collections scan only what serving allocates.
    """
    import gc

    gc.freeze()
    gc.enable()


def _serve(args: argparse.Namespace) -> int:
    from cpersona.config import ConfigError, check_startup, load_settings, warn_unknown_variables

    try:
        settings = load_settings()
        check_startup(settings)
    except ConfigError as exc:
        return _fail(str(exc), EXIT_BAD_CONFIG)
    if settings.embedding_mode == "local":
        from cpersona.embedding.local_model import local_mode_problem

        if (problem := local_mode_problem(settings)) is not None:
            return _fail(problem, EXIT_BAD_CONFIG)
    _log_to_stderr()
    http = settings.transport == "streamable-http"
    try:
        policy, oauth, auth = _preflight(settings, http)
    except ConfigError as exc:
        return _fail(str(exc), EXIT_BAD_CONFIG)
    warn_unknown_variables(policy.env_refs if policy is not None else ())
    from cpersona.storage.migrate import MigrationError, TooNewDatabase, open_database_and_upgrade

    # Spec T-7 order: embedding mode and client, then the database. Mode "none" has
    # no client (build_embedder answers None), so its module is not even loaded.
    embedder = None
    if settings.embedding_mode != "none":
        from cpersona.embedding.client import build_embedder

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

    from cpersona.mcp.surface import ToolSurface
    from cpersona.services.app import App
    from cpersona.background import BackgroundWork

    gates = tool_gates(policy, settings, settings.transport)
    if db.read_only is not None:
        # Said once, here; each refused write then answers the same sentence.
        log.warning(
            "the database is read-only: %s cannot be written (%s); reads are served, every write is refused",
            db.label,
            db.read_only,
        )
    app = App(db=db, settings=settings, embedder=embedder, remote_callers=http)
    background = BackgroundWork(app)
    background.prepare()
    surface = ToolSurface(app, gates=gates)
    if http:
        from cpersona.mcp.server import sdk_server

        server = sdk_server(surface)
    _collector_on()
    try:
        log.info(
            "cpersona %s serving %s, database %s, embeddings %s",
            __version__,
            settings.transport,
            settings.db_file,
            settings.embedding_mode,
        )
        if http:
            from cpersona.mcp.http import build_http_app, serve_http
            from cpersona.mcp.http_guard import connection_limits

            background.start()
            asgi = build_http_app(
                server,
                host=settings.http_host,
                auth=auth,
                oauth=oauth,
                max_body_bytes=settings.http_max_body_bytes,
                body_limit_mode=settings.http_body_limit_mode,
                stream_max_seconds=settings.http_stream_max_secs,
            )
            if settings.http_idle_exit_seconds > 0:
                from cpersona.mcp.idle_exit import IdleExit

                asgi = IdleExit(asgi, settings.http_idle_exit_seconds)
            serve_http(asgi, settings.http_host, settings.http_port, connection_limits(settings))
        else:
            import anyio

            if STDIO_SESSION == "sdk":  # tests/stdio_sdk_server.py: the SDK's session, to compare answers with
                from cpersona.mcp.server import sdk_server
                from cpersona.mcp.stdio import serve_stdio as serve_sdk

                anyio.run(serve_sdk, sdk_server(surface), background.start_in_thread)
            else:
                from cpersona.mcp.stdio_session import serve_stdio

                anyio.run(serve_stdio, surface, background.start_in_thread)
    except KeyboardInterrupt:
        pass
    finally:
        background.stop()
        db.close()  # every write committed before this returns
        if embedder is not None:
            embedder.close()
    return EXIT_OK


def tool_gates(policy: Any, settings: Any, transport: str) -> Any:
    """The gate chain every tool call passes, for the server and for the in-process CLI alike.

    The ACL gate comes first: a call it denies never reaches a later gate. The
    pause gate follows: a paused write is answered only once it is allowed at all.
    """
    from cpersona.mcp.gates import GateChain
    from cpersona.mcp.pause_gate import PauseGate

    acl: list = []
    if policy is not None:
        from cpersona.mcp.acl import acl_gates

        acl = acl_gates(policy, settings, transport)
    return GateChain([*acl, PauseGate()])


def _preflight(settings: Any, http: bool) -> tuple[Any, Any, Any]:
    """Spec T-7 steps 3-4, before anything expensive: the ACL file, then HTTP credentials.

    Each part is imported only when it is configured; its refusal becomes a ConfigError.
    """
    from cpersona.config import ConfigError

    policy = oauth = auth = None
    if settings.acl_file is not None:
        from cpersona.mcp.acl import AclConfigError, load_policy

        try:
            policy = load_policy(settings)
        except AclConfigError as exc:
            raise ConfigError(str(exc)) from None
    if http:
        from cpersona.mcp.acl import AclConfigError
        from cpersona.mcp.http import StartupRefusal, http_auth_mode
        from cpersona.mcp.oauth import oauth_config

        try:
            oauth = oauth_config(settings)
            auth = http_auth_mode(settings, policy, oauth)
        except (AclConfigError, StartupRefusal) as exc:
            raise ConfigError(str(exc)) from None
    return policy, oauth, auth


def _leave(status: int) -> int:
    """End the process now that the database is closed, skipping interpreter teardown.

    Tearing down the SDK's thousands of pydantic models and SQLAlchemy's caches
    took 0.7 s on a quiet machine and over 2 s on a busy one, after everything
    worth doing was done. Exit handlers still run and the standard streams are
    flushed first, and a non-daemon thread still finishing a write is waited for,
    as interpreter exit would.
    """
    import atexit
    import os
    import threading
    import time

    deadline = time.monotonic() + 5.0
    for thread in threading.enumerate():
        if thread is not threading.current_thread() and not thread.daemon:
            thread.join(max(0.0, deadline - time.monotonic()))
    logging.shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(status)


def proxy(args: argparse.Namespace) -> int:
    from cpersona import proxy_stdio  # httpx and the standard library only: no SDK, no database code

    return proxy_stdio.run(args)


def commands() -> dict[str, Callable[[argparse.Namespace], int]]:
    """Each command's handler (imported here, so a proxy's start loads none of the others)."""
    from cpersona import admin_cli, checkup, model_cli
    from cpersona.ui import cli as ui_cli

    return {
        "serve": serve,
        "proxy": proxy,
        **admin_cli.COMMANDS,
        "checkup": checkup.run,
        **model_cli.COMMANDS,
        **ui_cli.COMMANDS,
    }
