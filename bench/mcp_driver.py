"""Start a CPersona-compatible server over MCP stdio and call its tools.

Both benchmarks drive every server through this one module, so "ours" and the
reference see byte-identical requests: the only thing that differs between
them is the interpreter that runs ``-m cpersona``.

Each server gets a fresh temporary directory (its working directory and its
database) and an environment built from scratch: the SDK's minimal default
environment plus the CPERSONA_* settings the benchmark asks for. Nothing from
the caller's shell leaks in, so a stray CPERSONA_EMBEDDING_MODE cannot skew a
run. The one exception is PYTHONPATH, handed to our servers only: it is how a
source tree other than the installed one is measured.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, AsyncIterator, Iterator

from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.client.stdio import get_default_environment
from pg_database import database_for

BENCH_DIR = Path(__file__).resolve().parent
REPO_DIR = BENCH_DIR.parent
RESULTS_DIR = BENCH_DIR / "results"

# Where each server's interpreter lives; both run as `<python> -m cpersona`.
# CPERSONA_BENCH_<NAME>_PYTHON overrides one (e.g. a reference venv made elsewhere).
DEFAULT_PYTHONS = {
    "ours": REPO_DIR / ".venv" / "bin" / "python",
    "ours-pg": REPO_DIR / ".venv" / "bin" / "python",  # ours on PostgreSQL (pg_database.py)
    "ref": BENCH_DIR / ".venvs" / "ref" / "bin" / "python",
}

EMBED_PYTHON = BENCH_DIR / ".venvs" / "embed" / "bin" / "python"
LOCAL_MODEL = BENCH_DIR / ".venvs" / "models" / "all-MiniLM-L6-v2"  # bench/export_minilm.py writes it
EMBED_START_TIMEOUT_SECONDS = 180.0

# A call that takes longer than this is a hung server, not a slow one.
CALL_TIMEOUT_SECONDS = 120.0


class ToolCallError(RuntimeError):
    """A tool answered with isError, or its answer was not a JSON object."""


def server_python(name: str) -> Path:
    override = os.environ.get(f"CPERSONA_BENCH_{name.upper().replace('-', '_')}_PYTHON")
    if override:
        return Path(override)
    if name not in DEFAULT_PYTHONS:
        raise SystemExit(f"unknown server {name!r}; expected one of {', '.join(DEFAULT_PYTHONS)}")
    return DEFAULT_PYTHONS[name]


def check_server_available(name: str) -> None:
    """Fail early with the fix, rather than with a subprocess traceback mid-run."""
    python = server_python(name)
    if not python.exists():
        raise SystemExit(f"server {name!r}: {python} does not exist; run bench/setup.sh")


def embedding_env(mode: str, embed_url: str | None) -> dict[str, str]:
    """CPERSONA_* settings for one embedding mode of the benchmarks.

    ``none`` is keyword-only; ``local`` is the in-process ONNX model exported
    from the MiniLM weights; every other mode name (minilm, stub) is the
    ``http`` provider pointed at a local minilm_server.py.
    """
    if mode == "none":
        return {"CPERSONA_EMBEDDING_MODE": "none"}
    if mode == "local":  # our server only: the model in-process (made by bench/export_minilm.py)
        if not (LOCAL_MODEL / "model.onnx").is_file():
            raise SystemExit(f"{LOCAL_MODEL} holds no exported model; run bench/setup.sh")
        return {"CPERSONA_EMBEDDING_MODE": "local", "CPERSONA_EMBEDDING_MODEL_PATH": str(LOCAL_MODEL)}
    if not embed_url:
        raise ValueError(f"mode {mode!r} needs an embedding server URL")
    return {"CPERSONA_EMBEDDING_MODE": "http", "CPERSONA_EMBEDDING_URL": embed_url}


def decode_result(tool: str, result: Any) -> dict[str, Any]:
    """The JSON object a tool answered with.

    The text content carries the response as JSON on both SDK lines; the
    structured content is only a fallback because mcp 1.x and 2.x wrap
    non-object returns differently there.
    """
    if getattr(result, "is_error", False) or getattr(result, "isError", False):
        texts = [getattr(c, "text", "") for c in result.content]
        raise ToolCallError(f"{tool}: tool error: {' '.join(texts)[:500]}")
    for content in result.content:
        text = getattr(content, "text", None)
        if text is None:
            continue
        try:
            decoded = json.loads(text)
        except json.JSONDecodeError:
            continue
        if isinstance(decoded, dict):
            return decoded
    structured = getattr(result, "structured_content", None) or getattr(result, "structuredContent", None)
    if isinstance(structured, dict):
        return structured
    raise ToolCallError(f"{tool}: answer is not a JSON object: {result!r}"[:500])


@dataclass
class RunningServer:
    """One live server process behind an initialized MCP session."""

    name: str
    session: ClientSession
    workdir: Path
    server_info: dict[str, Any] = field(default_factory=dict)

    async def call(self, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
        result = await self.session.call_tool(tool, arguments, read_timeout_seconds=CALL_TIMEOUT_SECONDS)
        return decode_result(tool, result)

    async def timed_call(self, tool: str, arguments: dict[str, Any]) -> tuple[dict[str, Any], float]:
        """The answer and the client-side round trip in milliseconds."""
        started = time.perf_counter()
        answer = await self.call(tool, arguments)
        return answer, (time.perf_counter() - started) * 1000.0

    async def try_call(self, tool: str, arguments: dict[str, Any]) -> tuple[dict[str, Any], float]:
        """Like timed_call, but a tool error comes back as {"tool_error": text} for the caller to count."""
        started = time.perf_counter()
        try:
            answer = await self.call(tool, arguments)
        except ToolCallError as exc:
            answer = {"tool_error": str(exc)}
        return answer, (time.perf_counter() - started) * 1000.0

    async def call_many(
        self,
        tool: str,
        argument_list: list[dict[str, Any]],
        concurrency: int,
    ) -> list[dict[str, Any]]:
        """Call one tool for every argument set with up to `concurrency` requests in flight.

        Answers come back in argument order; a tool error is an answer
        {"tool_error": text}. With concurrency 1 the calls are strictly
        sequential, which keeps row ids in input order.
        """
        if concurrency <= 1:
            return [(await self.try_call(tool, args))[0] for args in argument_list]
        gate = asyncio.Semaphore(concurrency)

        async def one(args: dict[str, Any]) -> dict[str, Any]:
            async with gate:
                return (await self.try_call(tool, args))[0]

        return list(await asyncio.gather(*(one(args) for args in argument_list)))


def server_environment(name: str, settings: dict[str, str], workdir: Path) -> dict[str, str]:
    """The environment server `name` starts with: the SDK's minimal one, its database in `workdir`, `settings`."""
    env = dict(get_default_environment())
    env.update(
        {
            "CPERSONA_DB_PATH": str(workdir / "cpersona.db"),
            "CPERSONA_UPDATE_CHECK": "false",
            "PYTHONUNBUFFERED": "1",
        }
    )
    if name != "ref" and os.environ.get("PYTHONPATH"):
        # The SDK's default environment leaves PYTHONPATH out, so `PYTHONPATH=<tree> python
        # bench/...` ran the installed package, not the tree. Our servers get it; the
        # reference never does (our tree on its path would shadow its own cpersona).
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    env.update(settings)
    return env


@contextlib.asynccontextmanager
async def start_server(
    name: str,
    settings: dict[str, str],
    keep_workdir: bool = False,
) -> AsyncIterator[RunningServer]:
    """Run `<python> -m cpersona` for server `name` on a fresh database.

    `settings` are extra CPERSONA_* variables. The server's stderr goes to
    `server.log` in its working directory, which is deleted afterwards unless
    `keep_workdir` (the path is printed so a failure can be inspected).
    """
    check_server_available(name)
    workdir = Path(tempfile.mkdtemp(prefix=f"cpersona-bench-{name}-"))
    env = server_environment(name, settings, workdir)
    database = database_for(name)
    if database is not None:
        env["CPERSONA_DATABASE_URL"] = database.url
    params = StdioServerParameters(
        command=str(server_python(name)),
        args=["-m", "cpersona"],
        env=env,
        cwd=str(workdir),
    )
    failed = False
    try:
        with open(workdir / "server.log", "w") as errlog:
            async with stdio_client(params, errlog=errlog) as (read, write):
                async with ClientSession(read, write) as session:
                    init = await session.initialize()
                    info = getattr(init, "server_info", None) or getattr(init, "serverInfo", None)
                    yield RunningServer(
                        name=name,
                        session=session,
                        workdir=workdir,
                        server_info=info.model_dump() if info is not None else {},
                    )
    except BaseException:
        failed = True
        print(f"[{name}] server failed; its log: {workdir / 'server.log'}", file=sys.stderr)
        raise
    finally:
        if not (keep_workdir or failed):
            shutil.rmtree(workdir, ignore_errors=True)
        if database is not None and not keep_workdir:
            database.drop()


def write_results(prefix: str, payload: dict[str, Any]) -> Path:
    """Write one run's figures to bench/results/<prefix>-<UTC time>.json."""
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    path = RESULTS_DIR / f"{prefix}-{stamp}.json"
    path.write_text(json.dumps(payload, indent=2, sort_keys=False) + "\n")
    return path


@contextlib.contextmanager
def start_embedder(mode: str) -> Iterator[str | None]:
    """Run bench/minilm_server.py for an embedding mode; yields its /embed URL.

    ``none`` needs no embedder (yields None); ``stub`` runs the stdlib-only stub
    on this interpreter; ``minilm`` runs the model in bench/.venvs/embed.
    """
    if mode in ("none", "local"):
        yield None
        return
    if mode == "stub":
        command = [sys.executable, str(BENCH_DIR / "minilm_server.py"), "--stub", "--port", "0"]
    elif mode == "minilm":
        if not EMBED_PYTHON.exists():
            raise SystemExit(f"{EMBED_PYTHON} does not exist; run bench/setup.sh")
        command = [str(EMBED_PYTHON), str(BENCH_DIR / "minilm_server.py"), "--port", "0"]
    else:
        raise SystemExit(f"unknown embedding mode {mode!r}; expected none, stub or minilm")
    # stderr goes to a file: the model loader's progress bars are not benchmark output.
    with tempfile.NamedTemporaryFile("w+", prefix="cpersona-bench-embed-", suffix=".log") as log:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log, text=True)
        try:
            yield _read_embed_url(process, log)
        finally:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _read_embed_url(process: subprocess.Popen, log: Any) -> str:
    """The URL from the server's first stdout line (the model load can take a while)."""
    assert process.stdout is not None
    result: list[str] = []
    reader = threading.Thread(target=lambda: result.append(process.stdout.readline()), daemon=True)
    reader.start()
    reader.join(EMBED_START_TIMEOUT_SECONDS)
    line = result[0].strip() if result else ""
    if not line.startswith("listening on "):
        process.kill()
        process.wait()
        log.seek(0)
        tail = log.read()[-2000:]
        raise SystemExit(f"embedding server did not start (exit code {process.poll()}, said {line!r}):\n{tail}")
    return line.removeprefix("listening on ")
