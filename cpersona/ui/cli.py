"""``cpersona ui [--port N] [--write] [--db PATH]``: serve the page on 127.0.0.1 until interrupted.

The URL printed on stdout carries a token made at this start; the page
answers nothing without it. Exit status follows ``cpersona serve``: 2 for
unusable configuration, 3 for a database this build must not open, 1 when
the port cannot be bound or the database cannot be opened.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

DEFAULT_PORT = 8765
HOST = "127.0.0.1"  # never another interface: the token is the only lock on this door


def add_subcommands(commands: Any) -> None:
    ui = commands.add_parser("ui", help="browse the memory in a local web page (read-only unless --write)")
    ui.add_argument(
        "--port", type=int, default=DEFAULT_PORT, help=f"port on 127.0.0.1 (default {DEFAULT_PORT}; 0 picks a free one)"
    )
    ui.add_argument(
        "--write", action="store_true", help="allow edit, lock, unlock and delete (through the tools' own rules)"
    )
    ui.add_argument("--db", type=Path, default=None, help="SQLite database file (default: CPERSONA_DB_PATH)")


def _fail(message: str, status: int) -> int:
    print(f"cpersona: {message}", file=sys.stderr)
    return status


def run(args: argparse.Namespace) -> int:
    import secrets
    import socket

    from cpersona.config import ConfigError, load_settings

    environ = dict(os.environ)
    if args.db is not None:
        environ["CPERSONA_DB_PATH"] = str(args.db)
        environ.pop("CPERSONA_DATABASE_URL", None)  # --db names a SQLite file, whatever the environment says
    try:
        settings = load_settings(environ)
    except ConfigError as exc:
        return _fail(str(exc), 2)
    if not 0 <= args.port <= 65535:
        return _fail(f"--port {args.port} is not a port number (0-65535)", 2)
    try:
        gates, context = _gates(settings)
    except ConfigError as exc:
        return _fail(str(exc), 2)
    if settings.database_url is None and not Path(settings.db_file).is_file():
        # The page looks at a memory that exists; it never creates one (a mistyped path would look empty).
        return _fail(f"no database at {settings.db_file} (--db or CPERSONA_DB_PATH)", 1)

    from cpersona.embedding.client import build_embedder
    from cpersona.storage.migrate import MigrationError, TooNewDatabase, open_database_and_upgrade

    try:
        embedder = build_embedder(settings)
    except ValueError as exc:
        return _fail(str(exc), 2)
    try:
        db = open_database_and_upgrade(settings)
    except TooNewDatabase as exc:
        return _fail(str(exc), 3)
    except (MigrationError, OSError) as exc:
        return _fail(f"cannot open the database {settings.db_file}: {exc}", 1)
    try:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a restart right after a stop binds again
        try:
            listener.bind((HOST, args.port))
            listener.listen(128)  # a browser opening the printed link at once waits in the backlog, not refused
        except OSError as exc:
            listener.close()
            return _fail(f"cannot listen on {HOST}:{args.port}: {exc.strerror or exc}", 1)
        return _serve(
            listener, db, settings, embedder, gates, context, token=secrets.token_urlsafe(24), write=args.write
        )
    finally:
        db.close()
        if embedder is not None:
            embedder.close()


def _gates(settings: Any) -> tuple[Any, dict[str, Any]]:
    """The server's gate chain (:func:`cpersona.cli.tool_gates`), the caller being this machine's user
    (the ACL's ``local``, as over stdio)."""
    from cpersona import cli

    policy, _, _ = cli._preflight(settings, http=False)  # an unusable ACL file is a ConfigError
    context: dict[str, Any] = {}
    if policy is not None:
        from cpersona.mcp.acl import LOCAL, Principal

        context["principal"] = Principal(LOCAL)
    return cli.tool_gates(policy, settings, "stdio"), context


def _serve(
    listener: Any,
    db: Any,
    settings: Any,
    embedder: Any,
    gates: Any,
    context: dict[str, Any],
    *,
    token: str,
    write: bool,
) -> int:
    import uvicorn

    from cpersona.mcp.tools import default_registry
    from cpersona.services.app import App
    from cpersona.ui.server import UiState, build_ui_app

    app = App(db=db, settings=settings, embedder=embedder)
    state = UiState(app=app, registry=default_registry(), gates=gates, token=token, write=write, context=context)
    port = listener.getsockname()[1]
    print(f"cpersona ui: http://{HOST}:{port}/?token={token}", flush=True)
    print(
        f"cpersona ui: database {db.label}, {'WRITE enabled' if write else 'read-only (--write to edit)'}; "
        "the link works until this process stops (Ctrl-C)",
        file=sys.stderr,
        flush=True,
    )
    config = uvicorn.Config(
        build_ui_app(state), log_level="warning", access_log=False, lifespan="off", ws="none", loop="asyncio"
    )
    server = uvicorn.Server(config)
    try:
        server.run(sockets=[listener])
    except KeyboardInterrupt:
        pass
    return 0


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {"ui": run}
