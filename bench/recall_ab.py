"""A/B of server trees over MCP stdio on one seeded database: wall and server CPU per call, alternating.

    python bench/recall_ab.py --arm new=/path/to/tree --arm old=/work/main [--arm ref] \
        [--seed-db /tmp/ab10k.db] [--size 10000] [--recalls 200] [--stores 50] [--rounds 2]

Each ``--arm NAME=TREE`` is our server run from the source tree TREE (on
PYTHONPATH, with the project's venv); ``--arm ref`` is the reference 2.6.14.
Our arms each open their own copy of ``--seed-db`` (filled once through the
first of our arms with bench/latency.py's rows when it does not exist), the
reference fills its own database to the same rows, so every arm starts from
the same ``--size`` rows. Then ``--rounds`` rounds of bench/latency.py's
recall mix and of sequential new stores run with the calls alternating
between the arms call by call (A, B, A, B, ...), so the machine's load falls
on every arm alike.

A third phase, "hop", sends recalls with limit 0: the whole MCP path and the
hop to a worker thread with next to no database work.

Per arm and phase: wall p50 / p95 / mean (client round trip), server CPU per
call (all threads, /proc) and that CPU split by thread name: the event loop
("python" / "cpersona" main thread) against worker threads. On a loaded
machine the CPU figures are the comparison to trust.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import signal
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from harness_python import ensure_harness_python

ensure_harness_python()

from latency import AGENT_ID, Corpus, fill, server_pid  # noqa: E402,F401
from mcp_driver import start_server  # noqa: E402
from metrics import percentile  # noqa: E402

TICK_MS = 1000.0 / os.sysconf("SC_CLK_TCK")


def thread_cpu(pid: int | None) -> dict[str, float]:
    """CPU ms per thread name (threads of one name summed) of process ``pid``."""
    out: dict[str, float] = defaultdict(float)
    if pid is None:
        return out
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError):
                stat = (task / "stat").read_text()
                name = stat[stat.index("(") + 1 : stat.rindex(")")]
                fields = stat.rsplit(")", 1)[1].split()
                label = "main" if task.name == str(pid) else name
                out[label] += (int(fields[11]) + int(fields[12])) * TICK_MS
    return out


def diff(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {k: after.get(k, 0.0) - before.get(k, 0.0) for k in set(after) | set(before)}


PROFILE_HOOK = """
import atexit, cProfile, marshal, os, signal, threading, time
_out = os.environ.get("CPERSONA_BENCH_AB_PROFILE")
if _out:
    # Thread CPU, not wall: the machine is shared. Everything starts at SIGUSR1 (the driver sends it
    # after the warm-up), so start-up and first-call imports stay out: the event loop's thread is
    # profiled from then on, and each job handed to a worker thread (anyio.to_thread.run_sync) is
    # profiled while it runs, on a profiler of its own thread (anyio.to_thread.run_sync or
    # cpersona.storage.workers, whichever the tree uses).
    _profiles = {}
    _on = []
    def _profile(name):
        key = threading.get_ident()
        if key not in _profiles:
            _profiles[key] = (name, cProfile.Profile(time.thread_time))
        return _profiles[key][1]
    def _start(*_):
        _on.append(True)
        _profile("MainThread").enable()
    signal.signal(signal.SIGUSR1, _start)
    import anyio.to_thread
    _run_sync = anyio.to_thread.run_sync
    def _profiled_job(func):
        def job(*args):
            if not _on:
                return func(*args)
            profile = _profile("worker-" + threading.current_thread().name.replace(" ", "_"))
            profile.enable()
            try:
                return func(*args)
            finally:
                profile.disable()
        return job
    async def run_sync(func, *args, **kwargs):
        return await _run_sync(_profiled_job(func), *args, **kwargs)
    anyio.to_thread.run_sync = run_sync
    try:  # trees where Database.run has its own threads (cpersona.storage.workers)
        from cpersona.storage import workers as _workers
    except ImportError:
        _workers = None
    if _workers is not None:
        _pool_run = _workers.WorkerPool.run
        async def pool_run(self, fn, *args):
            return await _pool_run(self, _profiled_job(fn), *args)
        _workers.WorkerPool.run = pool_run
    def _dump():
        os.makedirs(_out, exist_ok=True)
        for number, (name, profile) in enumerate(_profiles.values()):
            profile.snapshot_stats()
            with open(os.path.join(_out, f"{number:03d}-{name}.prof"), "wb") as f:
                marshal.dump(profile.stats, f)
    atexit.register(_dump)
"""


def profile_hook(work: Path) -> Path:
    """A directory holding a sitecustomize that cProfiles every thread of the server (dumped at exit)."""
    hook = work / "profile_hook"
    hook.mkdir(exist_ok=True)
    (hook / "sitecustomize.py").write_text(PROFILE_HOOK)
    return hook


def parse_arm(text: str) -> tuple[str, str | None]:
    if text == "ref":
        return "ref", None
    name, _, tree = text.partition("=")
    if not tree:
        raise argparse.ArgumentTypeError("--arm is NAME=TREE or ref")
    return name, str(Path(tree).resolve())


async def run(args: argparse.Namespace) -> None:
    corpus = Corpus(args.seed)
    arms = [parse_arm(a) for a in args.arm]
    ours = [(n, t) for n, t in arms if t is not None]
    seed_db = Path(args.seed_db)
    base_env = {"CPERSONA_EMBEDDING_MODE": "none"}
    fill_to = args.size
    if ours and not seed_db.exists():
        name, tree = ours[0]
        print(f"filling {seed_db} to {fill_to} rows through {name} ...", file=sys.stderr, flush=True)
        env = {**base_env, "PYTHONPATH": tree, "CPERSONA_DB_PATH": str(seed_db)}
        async with start_server("ours", env) as server:
            await fill(server, corpus, 0, fill_to, 8, f"seed/{name}")
    work = Path(tempfile.mkdtemp(prefix="recall-ab-"))
    try:
        async with contextlib.AsyncExitStack() as stack:
            servers = []
            for name, tree in arms:
                if tree is None:
                    server = await stack.enter_async_context(start_server("ref", dict(base_env)))
                    print("filling ref ...", file=sys.stderr, flush=True)
                    await fill(server, corpus, 0, fill_to, 8, "ref")
                else:
                    db = work / f"{name}.db"
                    shutil.copyfile(seed_db, db)
                    env = {**base_env, "PYTHONPATH": tree, "CPERSONA_DB_PATH": str(db)}
                    if args.profile_dir:
                        env["PYTHONPATH"] = f"{profile_hook(work)}:{tree}"
                        env["CPERSONA_BENCH_AB_PROFILE"] = str(Path(args.profile_dir).resolve() / name)
                    server = await stack.enter_async_context(start_server("ours", env))
                servers.append((name, server, server_pid(server)))
            # Warm every server: first calls import and fill caches.
            for query in corpus.recall_queries(10, fill_to, 99):
                for _, server, _ in servers:
                    await server.try_call("recall", query)
            for index in range(900_000, 900_010):
                for _, server, _ in servers:
                    await server.try_call("store", corpus.row(index))
            if args.profile_dir:
                for _, _, pid in servers:
                    if pid is not None:
                        os.kill(pid, signal.SIGUSR1)
            wall: dict[tuple[str, str], list[float]] = defaultdict(list)
            cpu: dict[tuple[str, str], dict[str, float]] = defaultdict(lambda: defaultdict(float))
            calls: dict[tuple[str, str], int] = defaultdict(int)
            client: dict[tuple[str, str], float] = defaultdict(float)  # the driver's own CPU in the call
            next_row = 1_000_000  # timestamps in the past (row i is 2024-01-01 + i minutes): no clock warnings
            for round_number in range(args.rounds):
                phases = [
                    ("recall", [("recall", q) for q in corpus.recall_queries(args.recalls, fill_to, round_number)]),
                    ("store", [("store", None) for _ in range(args.stores)]),
                    # limit 0: the whole MCP path and the hop to the worker, next to no database work.
                    ("hop", [("recall", {"agent_id": AGENT_ID, "query": "hop", "limit": 0}) for _ in range(args.hops)]),
                ]
                for phase, items in phases:
                    for tool, arguments in items:
                        if tool == "store":
                            row = corpus.row(next_row)
                            next_row += 1
                        for name, server, pid in servers:
                            before = thread_cpu(pid)
                            client_before = time.process_time()
                            answer, elapsed = await server.try_call(tool, arguments if tool == "recall" else dict(row))
                            client[(name, phase)] += (time.process_time() - client_before) * 1000
                            spent = diff(thread_cpu(pid), before)
                            if "tool_error" in answer or answer.get("ok") is False:
                                print(f"[{name}] {tool} failed: {str(answer)[:300]}", file=sys.stderr)
                                continue
                            wall[(name, phase)].append(elapsed)
                            calls[(name, phase)] += 1
                            for label, value in spent.items():
                                cpu[(name, phase)][label] += value
            if args.threads:
                for name, _, pid in servers:
                    for task in sorted(Path(f"/proc/{pid}/task").iterdir()):
                        stat = (task / "stat").read_text()
                        fields = stat.rsplit(")", 1)[1].split()
                        print(
                            f"  [{name}] thread {task.name} {stat[stat.index('(') + 1 : stat.rindex(')')]}: "
                            f"CPU {(int(fields[11]) + int(fields[12])) * TICK_MS:.0f} ms"
                        )
            print(f"\nload {os.getloadavg()[0]:.2f}, {time.strftime('%H:%M:%S', time.gmtime())} UTC")
            for phase in ("recall", "store", "hop"):
                print(f"\n{phase}: arm  wall p50 / p95 / mean ms   client CPU   server CPU ms per call (by thread)")
                for name, _, _ in servers:
                    key = (name, phase)
                    values = wall[key]
                    if not values:
                        continue
                    n = calls[key]
                    threads = sorted(cpu[key].items(), key=lambda kv: -kv[1])
                    total = sum(v for _, v in threads) / n
                    split = ", ".join(f"{label} {v / n:.2f}" for label, v in threads if v > 0)
                    print(
                        f"  {name:<8} {percentile(values, 0.5):7.2f} / {percentile(values, 0.95):7.2f} / "
                        f"{sum(values) / len(values):7.2f}   {client[key] / n:6.2f}   CPU {total:6.2f}  ({split})"
                    )
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arm", action="append", required=True, help="NAME=TREE (ours from a source tree) or ref")
    parser.add_argument("--seed-db", default="/tmp/recall-ab-10k.db")
    parser.add_argument("--size", type=int, default=10_000)
    parser.add_argument("--recalls", type=int, default=200)
    parser.add_argument("--stores", type=int, default=50)
    parser.add_argument("--hops", type=int, default=100, help="recalls with limit 0 (the call path alone)")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--threads", action="store_true", help="list each server thread's CPU at the end")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--profile-dir", default="", help="our arms write a cProfile here (CPERSONA_BENCH_AB_PROFILE)")
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
