"""Load on the streamable HTTP transport: N concurrent MCP clients against one server on 127.0.0.1.

Starts the server itself (`python -m cpersona`, or the reference with `--server
ref`) on a free loopback port with a fresh database and a bearer token, seeds
it, then runs `--clients` SDK clients (httpx2, one MCP client each) that issue
`--requests` tool calls apiece: one store for every two recalls, agents spread
over the clients. Every call is timed; the run is bounded by the request
count and by `--max-seconds`, and stops by itself.

    python bench/http_load.py --clients 8 --requests 150
    python bench/http_load.py --server ref        # the reference, same load

Prints requests/s, p50/p95/p99 latency per tool and overall, and errors.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

TOKEN = "bench-token"
REFERENCE = Path("/work/ref-venv/bin/cpersona")
WORDS = (
    "deploy key rotation monday database backup restore latency budget review release notes owner "
    "schedule meeting coffee migration index vector recall memory agent profile episode summary"
).split()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(server: str, workdir: Path, port: int) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CPERSONA_", "EMBEDDING_"))}
    env.update(
        {
            "CPERSONA_DB_PATH": str(workdir / "load.db"),
            "CPERSONA_UPDATE_CHECK": "false",
            "CPERSONA_TRANSPORT": "streamable-http",
            "CPERSONA_HTTP_PORT": str(port),
            "CPERSONA_AUTH_TOKEN": TOKEN,
        }
    )
    command = [sys.executable, "-m", "cpersona"] if server == "ours" else [str(REFERENCE)]
    proc = subprocess.Popen(
        command,
        env=env,
        cwd=workdir,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=(workdir / "server.log").open("wb"),
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server exited {proc.returncode}: {(workdir / 'server.log').read_text()[-2000:]}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return proc
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise SystemExit("server did not start within 30 s")


def sentence(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(6, 18)))


async def client_loop(
    url: str, n: int, requests: int, deadline: float, seed: int, timings: dict[str, list[float]], errors: list[str]
) -> None:
    rng = random.Random(seed * 1000 + n)
    agent = f"agent-{n % 4}"
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60) as http:
        async with Client(streamable_http_client(url, http_client=http)) as client:
            for i in range(requests):
                if time.monotonic() > deadline:
                    return
                if i % 3 == 0:
                    tool, args = "store", {"agent_id": agent, "content": f"{sentence(rng)} #{n}-{i}"}
                else:
                    tool, args = "recall", {"agent_id": agent, "query": " ".join(rng.sample(WORDS, 2)), "limit": 5}
                began = time.perf_counter()
                try:
                    result = await client.call_tool(tool, args)
                except Exception as exc:  # noqa: BLE001 — counted, the run goes on
                    errors.append(f"{tool}: {type(exc).__name__}: {exc}")
                    continue
                timings[tool].append(time.perf_counter() - began)
                payload = result.structured_content or {}
                if result.is_error or payload.get("ok") is False:
                    errors.append(f"{tool}: {payload}")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


async def run(args: argparse.Namespace) -> int:
    workdir = Path(tempfile.mkdtemp(prefix="cpersona-http-load-"))
    port = free_port()
    proc = start(args.server, workdir, port)
    url = f"http://127.0.0.1:{port}/mcp"
    try:
        seed_timings: dict[str, list[float]] = {"store": [], "recall": []}
        await client_loop(url, 0, args.seed_rows, time.monotonic() + args.max_seconds, 7, seed_timings, [])
        timings: dict[str, list[float]] = {"store": [], "recall": []}
        errors: list[str] = []
        deadline = time.monotonic() + args.max_seconds
        began = time.perf_counter()
        await asyncio.gather(
            *(client_loop(url, n, args.requests, deadline, args.seed, timings, errors) for n in range(args.clients))
        )
        elapsed = time.perf_counter() - began
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        shutil.rmtree(workdir, ignore_errors=True)

    every = timings["store"] + timings["recall"]
    print(
        f"server={args.server} clients={args.clients} requests={len(every)} errors={len(errors)} elapsed={elapsed:.2f}s"
    )
    print(f"throughput {len(every) / elapsed:.1f} requests/s")
    for name, values in (("all", every), ("store", timings["store"]), ("recall", timings["recall"])):
        if values:
            print(
                f"{name:7s} n={len(values):5d} p50={statistics.median(values) * 1000:7.1f} ms "
                f"p95={percentile(values, 0.95) * 1000:7.1f} ms p99={percentile(values, 0.99) * 1000:7.1f} ms"
            )
    for line in errors[:5]:
        print("error:", line[:300])
    return 1 if errors else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--server", choices=("ours", "ref"), default="ours")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--requests", type=int, default=150, help="tool calls per client")
    parser.add_argument("--seed-rows", type=int, default=300, help="calls made before the timed run (1/3 stores)")
    parser.add_argument("--max-seconds", type=float, default=300.0, help="hard bound on the timed run")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    if args.server == "ref" and not REFERENCE.exists():
        raise SystemExit(f"the reference is not installed at {REFERENCE}")
    return asyncio.run(run(args))


if __name__ == "__main__":
    raise SystemExit(main())
