"""``cpersona fetch-model`` and ``cpersona embed-server``: the local embedding model from the command line.

``fetch-model`` needs only the network (no ONNX Runtime), so it can run on a
machine that will not serve: the folder it fills is copied as it is to an
offline one (into the same cache folder, or anywhere with
CPERSONA_EMBEDDING_MODEL_PATH pointing at it).
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

EXIT_OK, EXIT_FAILED, EXIT_BAD_CONFIG = 0, 1, 2


def add_subcommands(commands: Any) -> None:
    fetch = commands.add_parser("fetch-model", help="download a local embedding model into the cache (once)")
    fetch.add_argument(
        "name",
        nargs="?",
        default=None,
        help="model profile (default: CPERSONA_EMBEDDING_LOCAL_MODEL, else all-MiniLM-L6-v2)",
    )
    fetch.add_argument("--list", action="store_true", help="list the profiles and whether each is cached")
    fetch.add_argument("--verify", action="store_true", help="check a cached folder against its SHA256SUMS")
    fetch.add_argument(
        "--cache-dir", type=Path, default=None, help="cache folder (default: CPERSONA_EMBEDDING_CACHE_DIR)"
    )
    fetch.add_argument(
        "--source",
        default=None,
        help="URL of a folder laid out like a cached model folder (default: the Hugging Face hub)",
    )

    server = commands.add_parser("embed-server", help="serve the local model over the http embedding contract")
    server.add_argument("--host", default=None, help="address to bind (default 127.0.0.1)")
    server.add_argument("--port", type=int, default=None, help="port (default 8401; 0 picks a free one)")


def _fail(message: str, status: int) -> int:
    print(f"cpersona: {message}", file=sys.stderr)
    return status


def _settings() -> Any:
    from cpersona.config import load_settings

    return load_settings()


def fetch(args: argparse.Namespace) -> int:
    from cpersona.config import ConfigError
    from cpersona.embedding.fetch import FetchError, cache_folder, fetch_model, is_complete, verify_folder
    from cpersona.embedding.local import default_cache_dir
    from cpersona.embedding.profiles import PROFILES, profile

    try:
        settings = _settings()
    except ConfigError as exc:
        return _fail(str(exc), EXIT_BAD_CONFIG)
    cache_dir = args.cache_dir or settings.embedding_cache_dir or default_cache_dir()
    if args.list:
        for item in PROFILES.values():
            state = "cached" if is_complete(cache_folder(cache_dir, item), item) else "not cached"
            measured = "measured here" if item.measured else "not measured here"
            print(
                f"{item.name:24} {item.dimension}-wide, {item.languages}, ~{item.approx_download_mb} MB, "
                f"{measured}, {state}"
            )
        return EXIT_OK
    try:
        chosen = profile(args.name or settings.embedding_local_model)
    except KeyError as exc:
        return _fail(str(exc.args[0]), EXIT_BAD_CONFIG)
    folder = cache_folder(cache_dir, chosen)
    if args.verify:
        if not is_complete(folder, chosen):
            return _fail(f"{folder} holds no complete copy of {chosen.name}", EXIT_FAILED)
        bad = verify_folder(folder)
        if bad:
            return _fail(
                f"{folder}: {', '.join(bad)} do(es) not match SHA256SUMS; delete the folder and fetch again",
                EXIT_FAILED,
            )
        print(f"{folder}: every file matches SHA256SUMS")
        return EXIT_OK
    try:
        path = fetch_model(chosen, cache_dir, source=args.source or settings.embedding_model_source)
    except FetchError as exc:
        return _fail(str(exc), EXIT_FAILED)
    print(path)
    return EXIT_OK


def embed_server(args: argparse.Namespace) -> int:
    from cpersona.config import ConfigError
    from cpersona.embedding import server
    from cpersona.embedding.fetch import stderr_progress
    from cpersona.embedding.local import ModelUnavailable, build_provider

    try:
        settings = _settings()
        provider = build_provider(settings)
    except (ConfigError, ValueError) as exc:
        return _fail(str(exc), EXIT_BAD_CONFIG)
    logging.basicConfig(
        stream=sys.stderr, level=logging.INFO, format="%(asctime)s [%(name)s] %(levelname)s: %(message)s"
    )
    try:
        model = provider.load_now(stderr_progress)
    except ModelUnavailable as exc:
        return _fail(str(exc), EXIT_FAILED)
    try:
        server.serve(model, args.host or server.DEFAULT_HOST, server.DEFAULT_PORT if args.port is None else args.port)
    except OSError as exc:
        return _fail(f"embed-server cannot listen: {exc}", EXIT_FAILED)
    return EXIT_OK


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {"fetch-model": fetch, "embed-server": embed_server}
