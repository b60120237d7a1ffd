"""What every retrieval benchmark shares: the server/mode command line and the run loop over them.

locomo.py and jsquad.py (and any later retrieval bench) run one fresh server
per (embedding mode, server) pair, with the mode's embedder started once for
all servers of that mode; a run that breaks records why and the next one
still runs, so one broken server never costs the other's figures.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, Awaitable, Callable, Protocol, TypeVar

from mcp_driver import check_server_available, start_embedder

MODES_HELP = (
    "comma list of: none, minilm (http to bench/minilm_server.py), stub, local (in-process ONNX MiniLM; ours only)"
)


class Run(Protocol):
    server: str
    mode: str
    aborted: str


RunT = TypeVar("RunT", bound=Run)


def add_run_arguments(parser: argparse.ArgumentParser, *, servers: str, default_modes: str) -> None:
    """--servers, --modes and --no-per-question, the same on every retrieval bench."""
    parser.add_argument("--servers", default="ours,ref", help=f"comma list of: {servers}")
    parser.add_argument("--modes", default=default_modes, help=MODES_HELP)
    parser.add_argument(
        "--no-per-question",
        dest="per_question",
        action="store_false",
        help="leave per-question rankings out of the JSON",
    )


def comma_list(value: str) -> list[str]:
    return [item for item in value.split(",") if item]


async def run_all(
    args: argparse.Namespace,
    new_run: Callable[[str, str], RunT],
    run_one: Callable[[RunT, str | None], Awaitable[None]],
    after_mode: Callable[[str, str | None], Any] | None = None,
) -> list[RunT]:
    """One run per (mode, server) of ``args``; ``after_mode(mode, url)`` runs while the mode's embedder is still up."""
    servers = comma_list(args.servers)
    for name in servers:
        check_server_available(name)
    runs: list[RunT] = []
    for mode in comma_list(args.modes):
        with start_embedder(mode) as embed_url:
            for name in servers:
                print(f"running {name} with embeddings {mode} ...", file=sys.stderr, flush=True)
                run = new_run(name, mode)
                runs.append(run)
                try:
                    await run_one(run, embed_url)
                except Exception as exc:  # noqa: BLE001 - one broken server must not cost the other server's figures
                    run.aborted = f"{type(exc).__name__}: {exc}"[:500]
                    print(f"  ! {mode}/{name} aborted: {run.aborted}", file=sys.stderr, flush=True)
            if after_mode is not None:
                after_mode(mode, embed_url)
    return runs
