"""Start-up cost, side by side: our direct start, the reference's, and our proxy to a warm server.

Each run is a fresh process and a fresh client (raw JSON-RPC lines over pipes,
so only the server's own work is measured): spawn → ``initialize`` answered →
one ``recall`` answered → stdin closed → process gone. The three kinds
alternate run by run, so a change in machine load hits them alike. Measured
per run: time to the initialize answer, to the recall answer, from closing
stdin to exit, and the process's own CPU and peak RSS (``wait4`` rusage of
that one child), and the same two read from /proc the moment the recall is
answered (``cpu_at_recall_s``, ``peak_rss_at_recall_mib``: without the
process's way out). Medians over the runs, and ratios against the reference.

Every run starts from a copy of the same small database (each server kind
builds its own once: the reference's files are of the 2.6 line). The proxy's
server is started once before the runs, on the proxy's database, and warmed;
its cost is not the proxy's.

Ours runs as installed, not from this checkout: the package (with its
migrations, as the wheel ships them) is copied into a scratch virtual
environment that borrows .venv's dependencies, and byte-compiled as pip does
when it installs a wheel. Run from the checkout, an editable install's import
hook (~25 ms) and, where PYTHONDONTWRITEBYTECODE is set (it is on the shared
machine), compiling ~100 modules from source on every start (~0.1-0.2 s) would
be charged to ours; no installed copy pays either, and the reference's venv
does not. ``--editable`` measures the checkout as it is.

Before anything runs, the page cache of each environment's shared libraries is
dropped (``--keep-page-cache`` to skip): a library file written recently sits in
the cache as 2 MiB folios that are mapped whole, which read as up to ~6 MiB of
extra RSS for whichever kind's venv was installed last (``file_pmd_at_recall_mib``).

    .venv/bin/python bench/startup.py --runs 5
"""

from __future__ import annotations

import argparse
import compileall
import json
import math
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
REPO_DIR = BENCH_DIR.parent
RESULTS_DIR = BENCH_DIR / "results"
PYTHONS = {"ours": REPO_DIR / ".venv" / "bin" / "python", "ref": BENCH_DIR / ".venvs" / "ref" / "bin" / "python"}
TOKEN = "bench-startup-token"
SEED_ROWS = 20
TIMEOUT = 180.0

INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "bench-startup", "version": "0"},
    },
}
INITIALIZED = {"jsonrpc": "2.0", "method": "notifications/initialized"}
RECALL = {
    "jsonrpc": "2.0",
    "id": 2,
    "method": "tools/call",
    "params": {"name": "recall", "arguments": {"agent_id": "bench", "query": "seed memory about start-up"}},
}


def base_env(db_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CPERSONA_", "EMBEDDING_"))}
    env.update(CPERSONA_DB_PATH=str(db_path), CPERSONA_EMBEDDING_MODE="none", CPERSONA_UPDATE_CHECK="false")
    return env


class Wire:
    """Newline-delimited JSON-RPC to one child process."""

    def __init__(self, command: list[str], env: dict[str, str]) -> None:
        self.started = time.monotonic()
        # The working directory is the run's own: `-m cpersona` must never find this checkout by accident.
        cwd = Path(env["CPERSONA_DB_PATH"]).parent if "CPERSONA_DB_PATH" in env else Path(tempfile.gettempdir())
        self.proc = subprocess.Popen(
            command, env=env, cwd=cwd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
        )

    def send(self, message: dict[str, Any]) -> None:
        self.proc.stdin.write(json.dumps(message).encode() + b"\n")
        self.proc.stdin.flush()

    def answer(self, request_id: int) -> dict[str, Any]:
        while True:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"the process ended before answering request {request_id}")
            message = json.loads(line)
            if message.get("id") == request_id:
                return message

    def finish(self) -> tuple[float, float, float]:
        """Close stdin; (seconds to exit, CPU seconds, peak RSS MiB) of the child."""
        closed = time.monotonic()
        self.proc.stdin.close()
        _, status, usage = os.wait4(self.proc.pid, 0)
        gone = time.monotonic()
        self.proc.returncode = os.waitstatus_to_exitcode(status)
        return gone - closed, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024


def file_pmd_mib(pid: int) -> float:
    """MiB of the process's file mappings mapped as 2 MiB pages (``FilePmdMapped``); NaN where unknown.

    Part of RSS the code does not decide: on this kernel (ext4 with large page-cache
    folios) a shared library whose file was written recently (a fresh venv) sits
    in the page cache as 2 MiB folios and is mapped whole, so the same process
    reads up to ~6 MiB more RSS than once those pages were evicted and read back
    in small folios (docs/benchmarks.md, issue 16 eighth round). Reported beside
    the RSS so two kinds are compared in the same state.
    """
    try:
        rollup = Path(f"/proc/{pid}/smaps_rollup").read_text()
        return int(rollup.split("FilePmdMapped:")[1].split()[0]) / 1024
    except (OSError, IndexError, ValueError):
        return float("nan")


def settle_page_cache(python: Path) -> int:
    """Drop the page cache of the shared libraries in ``python``'s environment; the count of files.

    ``posix_fadvise(DONTNEED)`` only drops clean pages no process maps; the next
    start reads them back in the small folios a mapping fault reads, so every
    kind starts from the same state, whatever wrote its files when (see
    :func:`file_pmd_mib`). Nothing on disk changes.
    """
    prefix = subprocess.run(
        [str(python), "-c", "import sys; print(sys.prefix)"], check=True, capture_output=True, text=True
    ).stdout.strip()
    settled = 0
    for root, _dirs, files in os.walk(prefix):
        for name in files:
            path = os.path.join(root, name)
            if ".so" not in name or os.path.islink(path):
                continue
            fd = os.open(path, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                settled += 1
            finally:
                os.close(fd)
    return settled


def at_the_answer(pid: int) -> tuple[float, float]:
    """(CPU seconds, peak RSS MiB) of a live process, read from /proc; NaN where /proc is not Linux's.

    Read the moment the first recall is answered, before stdin closes: the
    CPU to the first answered recall itself, without what a process spends
    leaving (``cpu_s`` from ``wait4`` includes that: the reference's interpreter
    teardown, say). CPU is the sum of the process's threads' on-CPU time
    (``schedstat``, nanoseconds); peak RSS is ``VmHWM``.
    """
    try:
        cpu_ns = 0
        for task in Path(f"/proc/{pid}/task").iterdir():
            try:
                cpu_ns += int((task / "schedstat").read_text().split()[0])
            except (OSError, ValueError):
                pass  # a thread that ended meanwhile
        status = Path(f"/proc/{pid}/status").read_text()
        hwm_kib = int(status.split("VmHWM:")[1].split()[0])
        return cpu_ns / 1e9, hwm_kib / 1024
    except (OSError, IndexError, ValueError):
        return float("nan"), float("nan")


def one_run(command: list[str], env: dict[str, str]) -> dict[str, float]:
    wire = Wire(command, env)
    wire.send(INITIALIZE)
    wire.answer(1)
    initialized = time.monotonic() - wire.started
    wire.send(INITIALIZED)
    wire.send(RECALL)
    answer = wire.answer(2)
    recalled = time.monotonic() - wire.started
    recall_cpu, recall_hwm = at_the_answer(wire.proc.pid)
    recall_pmd = file_pmd_mib(wire.proc.pid)
    if "result" not in answer or answer["result"].get("isError"):
        raise RuntimeError(f"recall failed: {str(answer)[:300]}")
    exit_after_close, cpu, rss = wire.finish()
    return {
        "initialize_s": initialized,
        "recall_s": recalled,
        "exit_after_close_s": exit_after_close,
        "cpu_s": cpu,
        "peak_rss_mib": rss,
        "cpu_at_recall_s": recall_cpu,
        "peak_rss_at_recall_mib": recall_hwm,
        "file_pmd_at_recall_mib": recall_pmd,
    }


# What each floor kind imports, and nothing else (kind: statement).
FLOORS = {
    "floor": "import mcp",
    "ref-floor": "import mcp",
    # Everything our stack loads before cpersona's own first line runs: the SDK, SQLAlchemy Core
    # and its SQLite dialect, pydantic-settings, SQLite (sqlean) and anyio's asyncio backend.
    "stack-floor": "import mcp, sqlalchemy, sqlalchemy.dialects.sqlite, pydantic_settings, sqlean, "
    "anyio._backends._asyncio",
    # The same with the SDK narrowed to its wire types (see startup_narrow.py).
    "narrow-floor": "import mcp_types, sqlalchemy, sqlalchemy.dialects.sqlite, pydantic_settings, sqlean, "
    "anyio._backends._asyncio",
}


def floor_run(python: Path, statement: str = "import mcp") -> dict[str, float]:
    """A process that runs ``statement`` (imports) and exits (CPU and peak RSS only).

    Importing any part of the SDK runs its package ``__init__``, which imports
    its client and server halves whole, so ``import mcp`` is the least any
    server built on it can cost.
    """
    proc = subprocess.Popen(
        [str(python), "-c", statement],
        cwd=tempfile.gettempdir(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    _, status, usage = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"{python} -c {statement!r} failed")
    nan = float("nan")
    return {
        "initialize_s": nan,
        "recall_s": nan,
        "exit_after_close_s": nan,
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "peak_rss_mib": usage.ru_maxrss / 1024,
        "cpu_at_recall_s": nan,
        "peak_rss_at_recall_mib": nan,
        "file_pmd_at_recall_mib": nan,
    }


def seed(command: list[str], env: dict[str, str]) -> None:
    wire = Wire(command, env)
    wire.send(INITIALIZE)
    wire.answer(1)
    wire.send(INITIALIZED)
    for n in range(SEED_ROWS):
        wire.send(
            {
                "jsonrpc": "2.0",
                "id": 10 + n,
                "method": "tools/call",
                "params": {
                    "name": "store",
                    "arguments": {
                        "agent_id": "bench",
                        "content": f"seed memory {n} about start-up, databases and proxies",
                    },
                },
            }
        )
        wire.answer(10 + n)
    wire.finish()


def installed_python(source: Path, target: Path) -> Path:
    """A python that imports ``source``'s cpersona as pip installs it, with .venv's dependencies.

    A venv without pip whose site-packages holds the copied, byte-compiled package
    and a .pth naming .venv's site-packages. Paths a .pth adds are not site
    directories, so .venv's editable-install hook never runs here.
    """
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(target)], check=True)
    ours_site = subprocess.run(
        [str(PYTHONS["ours"]), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    python = target / "bin" / "python"
    site = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    )
    skip = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(source / "cpersona", site / "cpersona", ignore=skip)
    if (source / "migrations").is_dir():  # the wheel ships them as cpersona.migrations (pyproject.toml)
        shutil.copytree(source / "migrations", site / "cpersona" / "migrations", ignore=skip)
    (site / "cpersona-deps.pth").write_text(ours_site + "\n")
    if not compileall.compile_dir(str(site / "cpersona"), quiet=1):
        raise SystemExit(f"byte-compiling {site / 'cpersona'} failed")
    return python


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_warm_server(python: Path, db_path: Path) -> tuple[subprocess.Popen[bytes], str]:
    sys.path.insert(0, str(REPO_DIR))
    from cpersona.proxy_spawn import Endpoint, answers

    port = free_port()
    env = base_env(db_path)
    env.update(CPERSONA_TRANSPORT="streamable-http", CPERSONA_HTTP_PORT=str(port), CPERSONA_AUTH_TOKEN=TOKEN)
    proc = subprocess.Popen(
        [str(python), "-m", "cpersona"],
        env=env,
        cwd=db_path.parent,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # cwd: as Wire's
    endpoint = Endpoint(f"http://127.0.0.1:{port}/mcp", TOKEN)
    deadline = time.monotonic() + TIMEOUT
    while not answers(endpoint, timeout=2):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("the warm HTTP server did not start")
        time.sleep(0.2)
    return proc, endpoint.url


def median_table(results: dict[str, list[dict[str, float]]]) -> tuple[dict[str, dict[str, float]], str]:
    metrics = (
        "initialize_s",
        "recall_s",
        "exit_after_close_s",
        "cpu_s",
        "peak_rss_mib",
        "cpu_at_recall_s",
        "peak_rss_at_recall_mib",
        "file_pmd_at_recall_mib",
    )
    medians = {kind: {m: statistics.median(r[m] for r in runs) for m in metrics} for kind, runs in results.items()}
    ref = medians.get("ref")
    compared = [k for k in ("old", "ours", "old-proxy", "proxy", "narrow", *FLOORS) if k in medians]
    lines = [
        "| | " + " | ".join(medians) + " | " + " | ".join(f"{k}/ref" for k in compared) + " |",
        "|---|" + "---|" * (len(medians) + len(compared)),
    ]
    for metric in metrics:
        cells = [f"{medians[k][metric]:.2f}" for k in medians]
        ratios = []
        for kind in compared:
            if ref and kind in medians and ref[metric] > 0 and not math.isnan(medians[kind][metric]):
                ratios.append(f"{medians[kind][metric] / ref[metric]:.2f}×")
            else:
                ratios.append("—")
        lines.append(f"| {metric} | " + " | ".join(cells) + " | " + " | ".join(ratios) + " |")
    return medians, "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument(
        "--kinds",
        default="ours,ref,proxy",
        help="comma-separated: ours, ref, proxy, old, old-proxy (the earlier proxy, to the same "
        "warm server), floor and ref-floor (`import mcp` alone with each interpreter), stack-floor "
        "(ours' third-party imports alone: SDK, SQLAlchemy + SQLite dialect, pydantic-settings, "
        "sqlean, anyio's backend), narrow (a measurement prototype: our start and recall with the "
        "SDK narrowed to mcp_types, bench/startup_narrow.py) and narrow-floor (its imports alone)",
    )
    parser.add_argument(
        "--old-src",
        type=Path,
        help="a checkout of an earlier cpersona, run as kind 'old' "
        "(installed as ours is): the before of a before/after",
    )
    parser.add_argument(
        "--editable",
        action="store_true",
        help="run ours and the proxy from this checkout's .venv as it is (and 'old' with its "
        "source first on PYTHONPATH) instead of from installed, byte-compiled copies",
    )
    parser.add_argument(
        "--keep-page-cache",
        action="store_true",
        help="do not drop the page cache of each environment's shared libraries before the runs "
        "(a freshly written venv then reads up to ~6 MiB more RSS, file_pmd_at_recall_mib)",
    )
    args = parser.parse_args(argv)
    kinds = [k for k in args.kinds.split(",") if k]
    if {"old", "old-proxy"} & set(kinds) and args.old_src is None:
        raise SystemExit("kinds 'old' and 'old-proxy' need --old-src")
    proxies = [k for k in kinds if k in ("proxy", "old-proxy")]

    def env_for(kind: str, db_path: Path) -> dict[str, str]:
        env = base_env(db_path)
        if kind == "old" and args.editable:
            env["PYTHONPATH"] = str(args.old_src.resolve())
        if kind == "narrow" and narrow_shim is not None:
            env["PYTHONPATH"] = str(narrow_shim)
        return env

    work = Path(tempfile.mkdtemp(prefix="cpersona-bench-startup-"))
    warm = None
    narrow_shim: Path | None = None
    try:
        for kind, python in PYTHONS.items():
            if (
                kind in kinds
                or (kind == "ours" and set(kinds) & {"proxy", "old", "old-proxy", "narrow", *FLOORS})
                or (kind == "ref" and "ref-floor" in kinds)
            ):
                if not python.exists():
                    raise SystemExit(f"{kind}: {python} does not exist (bench/.venvs, see COMMON.md)")
        if not args.keep_page_cache:
            environments = [PYTHONS["ours"]] + ([PYTHONS["ref"]] if {"ref", "ref-floor"} & set(kinds) else [])
            # First: the seeding and the warm server then read them back as every run will.
            for python in environments:  # ours, old and the proxy all borrow .venv's libraries
                count = settle_page_cache(python)
                print(f"page cache dropped for {count} shared libraries of {python}", flush=True)
        pythons = {"ref": PYTHONS["ref"], "ours": PYTHONS["ours"], "old": PYTHONS["ours"]}
        if not args.editable:
            pythons["ours"] = installed_python(REPO_DIR, work / "venv-ours")
            if {"old", "old-proxy"} & set(kinds):
                pythons["old"] = installed_python(args.old_src.resolve(), work / "venv-old")
        pythons["proxy"] = pythons["narrow"] = pythons["ours"]
        pythons["old-proxy"] = pythons["old"]
        commands: dict[str, tuple[list[str], Path]] = {}
        for kind in kinds:
            if kind == "old-proxy" or kind in FLOORS:
                continue  # old-proxy shares the proxy's database and warm server; a floor has no database
            python = pythons[kind]
            seed_db = work / f"seed-{kind}" / "memory.db"
            seed_db.parent.mkdir(parents=True)
            seed([str(python), "-m", "cpersona"], env_for(kind, seed_db))
            commands[kind] = ([str(python), "-m", "cpersona"], seed_db)
            if kind == "narrow":  # seeded by ours (the same files), served by the prototype
                from startup_narrow import write_prototype

                narrow_shim, narrow_script = write_prototype(work)
                commands[kind] = ([str(python), str(narrow_script)], seed_db)
        if proxies:
            if "proxy" not in commands:
                raise SystemExit("kind 'old-proxy' is measured beside 'proxy'")
            warm, url = start_warm_server(pythons["ours"], commands["proxy"][1])
            proxy_env = {k: v for k, v in os.environ.items() if not k.startswith("CPERSONA_")}
            proxy_env.update(CPERSONA_REMOTE_URL=url, CPERSONA_AUTH_TOKEN=TOKEN)
            one_run([str(pythons["proxy"]), "-m", "cpersona", "proxy"], proxy_env)  # warms the server, not measured
        results: dict[str, list[dict[str, float]]] = {kind: [] for kind in kinds}
        for n in range(args.runs):
            for kind in kinds:
                if kind in FLOORS:
                    run = floor_run(pythons["ref" if kind == "ref-floor" else "ours"], FLOORS[kind])
                elif kind in proxies:
                    run = one_run([str(pythons[kind]), "-m", "cpersona", "proxy"], proxy_env)
                else:
                    command, seed_db = commands[kind]
                    run_db = work / f"run-{kind}-{n}" / "memory.db"
                    shutil.copytree(seed_db.parent, run_db.parent)
                    run = one_run(command, env_for(kind, run_db))
                results[kind].append(run)
                print(f"run {n + 1} {kind}: " + ", ".join(f"{k} {v:.2f}" for k, v in run.items()), flush=True)
        medians, table = median_table(results)
        load = os.getloadavg()
        mode = "editable checkout" if args.editable else "installed, byte-compiled copies"
        print(f"\nmedians of {args.runs} runs ({mode}), load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}\n")
        print(table)
        RESULTS_DIR.mkdir(exist_ok=True)
        out = RESULTS_DIR / f"startup-{time.strftime('%Y%m%d-%H%M%S')}.json"
        out.write_text(
            json.dumps({"runs": results, "medians": medians, "load": load, "editable": args.editable}, indent=2)
        )
        print(f"\nwritten: {out}")
    finally:
        if warm is not None:
            warm.terminate()
            warm.wait(30)
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
