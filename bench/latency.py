"""Store and recall latency over MCP at growing database sizes, both servers side by side.

For each embedding mode (`none`, or `stub`: a near-zero-cost embedding server,
so the servers' own cost is what is measured) and each server, one fresh
database grows through the requested sizes. At each size:

  fill    stores up to the size (minus the probes below), several requests in
          flight over the one MCP session -> fill rows/s
  store   `--store-probes` sequential stores of new rows, timed one by one
          -> store p50 / p95 ms (the database then holds exactly `size` rows)
  recall  `--recalls` sequential mixed recalls (natural questions, keyword
          pairs, single words, phrases cut from stored rows, queries matching
          nothing, blank recency listings; limits 5 / 10 / 25) -> p50 / p95 ms

Besides the client-side round trips, each timed phase reads the server
process's own CPU time (Linux /proc, all its threads) -> store / recall CPU ms
per call. On a machine shared with other work, wall-clock latency stretches
with the load while CPU per call barely moves, so the CPU figures are the
steadier comparison; the issue's targets are still judged on the wall clock.

Rows are LoCoMo turns with about a third of their words swapped for words
drawn by corpus frequency, so every row is distinct while text length and word
statistics stay conversational. Everything is seeded: both servers get the
same rows and the same queries in the same order. The servers of one mode run
side by side and the timed calls alternate between them (ours, ref, ours, ...),
so background load on the machine cannot favour one of them.

    python bench/latency.py --sizes 1000,10000,100000 --servers ours,ref --modes none,stub
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Iterator

from harness_python import ensure_harness_python

ensure_harness_python()

from bm25 import ENGLISH_STOP_WORDS, tokenize  # noqa: E402
from locomo_data import DEFAULT_DATA_DIR, load_conversations  # noqa: E402
from mcp_driver import (  # noqa: E402
    RunningServer,
    check_server_available,
    embedding_env,
    start_embedder,
    start_server,
    write_results,
)
from metrics import percentile  # noqa: E402

AGENT_ID = "latency-bench"
SPEAKERS = ("Caroline", "Melanie", "Jon", "Gina", "Nate", "Joanna", "Tim", "John")
FIRST_TIMESTAMP = datetime(2024, 1, 1, tzinfo=timezone.utc)
PROGRESS_EVERY_SECONDS = 15.0


class Corpus:
    """Deterministic rows and queries built from the LoCoMo turns."""

    def __init__(self, seed: int) -> None:
        conversations = load_conversations(DEFAULT_DATA_DIR)
        self.templates = [turn.text for c in conversations for turn in c.turns]
        self.questions = [q.question for c in conversations for q in c.questions]
        words = [w for text in self.templates for w in tokenize(text)]
        self.words = words  # drawing from the token stream = drawing by corpus frequency
        self.content_words = [w for w in words if w not in ENGLISH_STOP_WORDS and len(w) > 2]
        self.seed = seed

    def row(self, index: int) -> dict[str, Any]:
        """Store arguments of row `index` (the same for every server and every run)."""
        rng = random.Random(self.seed * 1_000_003 + index)
        template = self.templates[index % len(self.templates)].split()
        text = " ".join(rng.choice(self.words) if rng.random() < 0.35 else word for word in template)
        return {
            "agent_id": AGENT_ID,
            "content": f"{SPEAKERS[index % len(SPEAKERS)]}: {text} ({index})",
            "id": f"row-{index}",
            "timestamp": (FIRST_TIMESTAMP + timedelta(minutes=index)).isoformat(),
        }

    def recall_queries(self, count: int, rows_stored: int, size_seed: int) -> list[dict[str, Any]]:
        rng = random.Random(self.seed * 7919 + size_seed)
        queries = []
        for number in range(count):
            kind = rng.random()
            if kind < 0.40:
                query = rng.choice(self.questions)
            elif kind < 0.60:
                query = f"{rng.choice(self.content_words)} {rng.choice(self.content_words)}"
            elif kind < 0.75:
                query = rng.choice(self.content_words)
            elif kind < 0.85:
                words = self.row(rng.randrange(rows_stored))["content"].split()
                start = rng.randrange(max(1, len(words) - 5))
                query = " ".join(words[start : start + 5])
            elif kind < 0.95:
                query = f"zqxv{number} wlkjh{number}"
            else:
                query = ""  # a blank query lists recent rows
            limit = rng.choice((10, 10, 10, 10, 5, 25))
            queries.append({"agent_id": AGENT_ID, "query": query, "limit": limit})
        return queries


@dataclass
class SizeResult:
    server: str
    mode: str
    size: int
    fill_rows: int
    fill_rows_per_s: float
    store_ms: list[float]
    recall_ms: list[float]
    recall_rows: list[int]
    failures: int
    store_cpu_ms: float | None = None  # server CPU per timed store, None where /proc is missing
    recall_cpu_ms: float | None = None

    def summary(self) -> dict[str, Any]:
        return {
            "server": self.server,
            "mode": self.mode,
            "size": self.size,
            "fill_rows": self.fill_rows,
            "fill_rows_per_s": round(self.fill_rows_per_s, 1),
            "store_p50_ms": round(percentile(self.store_ms, 0.50), 2),
            "store_p95_ms": round(percentile(self.store_ms, 0.95), 2),
            "recall_p50_ms": round(percentile(self.recall_ms, 0.50), 2),
            "recall_p95_ms": round(percentile(self.recall_ms, 0.95), 2),
            "recall_mean_rows": round(sum(self.recall_rows) / len(self.recall_rows), 2) if self.recall_rows else 0.0,
            "store_cpu_ms": None if self.store_cpu_ms is None else round(self.store_cpu_ms, 2),
            "recall_cpu_ms": None if self.recall_cpu_ms is None else round(self.recall_cpu_ms, 2),
            "failures": self.failures,
        }


def server_pid(server: RunningServer) -> int | None:
    """The server's process, found by its working directory (a fresh temporary one); None without /proc."""
    proc = Path("/proc")
    if not proc.is_dir():
        return None
    for entry in proc.iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue  # not this driver either (run from that directory, its cmdline may name cpersona too)
        try:
            if os.readlink(entry / "cwd") == str(server.workdir) and b"cpersona" in (entry / "cmdline").read_bytes():
                return int(entry.name)
        except OSError:
            continue
    return None


def cpu_ms(pid: int | None) -> float | None:
    """User plus system CPU time of process `pid` (all threads), in milliseconds."""
    if pid is None:
        return None
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) * 1000.0 / os.sysconf("SC_CLK_TCK")


def per_call(before: float | None, after: float | None, calls: int) -> float | None:
    return None if before is None or after is None or calls == 0 else (after - before) / calls


def is_stored(answer: dict[str, Any]) -> bool:
    return answer.get("ok") is True and answer.get("result") == "stored"


def batches(start: int, stop: int, size: int) -> Iterator[range]:
    for first in range(start, stop, size):
        yield range(first, min(first + size, stop))


async def fill(
    server: RunningServer, corpus: Corpus, start: int, stop: int, concurrency: int, label: str
) -> tuple[float, int]:
    """Store rows start..stop-1; returns (rows per second, failed stores)."""
    failures = 0
    started = last_report = time.perf_counter()
    for batch in batches(start, stop, max(concurrency * 25, 1)):
        answers = await server.call_many("store", [corpus.row(i) for i in batch], concurrency)
        failures += sum(not is_stored(a) for a in answers)
        now = time.perf_counter()
        if now - last_report >= PROGRESS_EVERY_SECONDS or batch.stop == stop:
            done = batch.stop - start
            rate = done / (now - started)
            remaining = (stop - batch.stop) / rate if rate else 0.0
            print(
                f"  [{label}] filled {batch.stop}/{stop} rows, {rate:.0f} rows/s, ~{remaining:.0f} s left",
                file=sys.stderr,
                flush=True,
            )
            last_report = now
    elapsed = time.perf_counter() - started
    return ((stop - start) / elapsed if elapsed > 0 else 0.0), failures


async def measure_mode(
    names: list[str], mode: str, embed_url: str | None, corpus: Corpus, args: argparse.Namespace
) -> list[SizeResult]:
    """All servers of one embedding mode, alive together, grown through every size.

    Fills run one server at a time (they saturate the machine); the timed
    stores and recalls alternate between the servers call by call, so load
    from anything else on the machine falls on both alike and the ratios hold.
    """
    results = []
    async with contextlib.AsyncExitStack() as stack:
        servers = [await stack.enter_async_context(start_server(n, embedding_env(mode, embed_url))) for n in names]
        pids = {server.name: server_pid(server) for server in servers}
        stored = 0
        for size in args.sizes:
            fill_to = max(stored, size - args.store_probes)
            fills = {}
            for server in servers:
                fills[server.name] = await fill(
                    server, corpus, stored, fill_to, args.concurrency, f"{mode}/{server.name}/{size}"
                )
            store_ms: dict[str, list[float]] = {server.name: [] for server in servers}
            failures = {server.name: fills[server.name][1] for server in servers}
            cpu_before = {name: cpu_ms(pid) for name, pid in pids.items()}
            for index in range(fill_to, size):
                for server in servers:
                    answer, elapsed = await server.try_call("store", corpus.row(index))
                    if "tool_error" not in answer:  # a refusal is fast and would flatter the figure
                        store_ms[server.name].append(elapsed)
                    failures[server.name] += not is_stored(answer)
            stored = size
            store_cpu = {name: per_call(cpu_before[name], cpu_ms(pid), size - fill_to) for name, pid in pids.items()}
            cpu_before = {name: cpu_ms(pid) for name, pid in pids.items()}
            recall_ms: dict[str, list[float]] = {server.name: [] for server in servers}
            recall_rows: dict[str, list[int]] = {server.name: [] for server in servers}
            for arguments in corpus.recall_queries(args.recalls, stored, size):
                for server in servers:
                    answer, elapsed = await server.try_call("recall", arguments)
                    if "tool_error" not in answer:
                        recall_ms[server.name].append(elapsed)
                    recall_rows[server.name].append(len(answer.get("messages") or []))
                    failures[server.name] += "messages" not in answer
            recall_cpu = {name: per_call(cpu_before[name], cpu_ms(pid), args.recalls) for name, pid in pids.items()}
            for server in servers:
                name = server.name
                result = SizeResult(
                    name,
                    mode,
                    size,
                    fill_to,
                    fills[name][0],
                    store_ms[name],
                    recall_ms[name],
                    recall_rows[name],
                    failures[name],
                    store_cpu[name],
                    recall_cpu[name],
                )
                results.append(result)
                summary = result.summary()
                print(
                    f"  [{mode}/{name}/{size}] fill {summary['fill_rows_per_s']} rows/s; store p50 {summary['store_p50_ms']} ms; "
                    f"recall p50 {summary['recall_p50_ms']} / p95 {summary['recall_p95_ms']} ms; "
                    f"server CPU per store {summary['store_cpu_ms']} / recall {summary['recall_cpu_ms']} ms; failures {failures[name]}",
                    file=sys.stderr,
                    flush=True,
                )
    return results


def ratio(ours: float | None, ref: float | None) -> str:
    return f"{ours / ref:.2f}" if ours is not None and ref else "-"


def format_tables(summaries: list[dict[str, Any]]) -> str:
    columns = (
        "fill_rows_per_s",
        "store_p50_ms",
        "store_p95_ms",
        "recall_p50_ms",
        "recall_p95_ms",
        "store_cpu_ms",
        "recall_cpu_ms",
        "recall_mean_rows",
    )
    header = f"{'mode':<6} {'size':>7} {'server':<7} " + " ".join(f"{c:>16}" for c in columns) + f" {'failures':>8}"
    lines = [header, "-" * len(header)]
    for s in summaries:
        lines.append(
            f"{s['mode']:<6} {s['size']:>7} {s['server']:<7} "
            + " ".join(f"{'-' if s[c] is None else s[c]:>16}" for c in columns)
            + f" {s['failures']:>8}"
        )
    keyed = {(s["mode"], s["size"], s["server"]): s for s in summaries}
    for top, bottom in (("ours", "ref"), ("ours-pg", "ours")):  # ours-pg: ours on PostgreSQL
        pairs = sorted({(m, z) for (m, z, v) in keyed if (m, z, top) in keyed and (m, z, bottom) in keyed})
        if pairs:
            lines += ["", f"{top} / {bottom} (rows/s: higher is better; ms: lower is better)"]
            lines.append(f"{'mode':<6} {'size':>7} " + " ".join(f"{c:>16}" for c in columns[:7]))
            for mode, size in pairs:
                ours, ref = keyed[(mode, size, top)], keyed[(mode, size, bottom)]
                lines.append(f"{mode:<6} {size:>7} " + " ".join(f"{ratio(ours[c], ref[c]):>16}" for c in columns[:7]))
    lines += target_lines(keyed)
    return "\n".join(lines)


def target_lines(keyed: dict[tuple[str, int, str], dict[str, Any]]) -> list[str]:
    """The issue's targets, checked where this run measured what they need."""
    lines = []
    ours, ref = keyed.get(("none", 10000, "ours")), keyed.get(("none", 10000, "ref"))
    if ours and ref:
        for column in ("store_p50_ms", "recall_p50_ms"):
            verdict = "met" if ours[column] <= ref[column] / 2 else "MISSED"
            lines.append(
                f"target 10k/none {column} <= half the reference's: {ours[column]} vs {ref[column]} -> {verdict}"
            )
    ours_100k = keyed.get(("stub", 100000, "ours"))
    if ours_100k:
        verdict = "met" if ours_100k["recall_p95_ms"] < 150 else "MISSED"
        lines.append(f"target 100k/stub recall p95 < 150 ms: {ours_100k['recall_p95_ms']} -> {verdict}")
    return ([""] + lines) if lines else []


async def main_async(args: argparse.Namespace) -> None:
    servers = [s for s in args.servers.split(",") if s]
    modes = [m for m in args.modes.split(",") if m]
    for name in servers:
        check_server_available(name)
    corpus = Corpus(args.seed)
    results: list[SizeResult] = []
    for mode in modes:
        with start_embedder(mode) as embed_url:
            print(f"running {', '.join(servers)} with embeddings {mode} ...", file=sys.stderr, flush=True)
            results.extend(await measure_mode(servers, mode, embed_url, corpus, args))
    summaries = [r.summary() for r in results]
    print()
    print(format_tables(summaries))
    path = write_results(
        "latency",
        {
            "benchmark": "latency",
            "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "sizes": args.sizes,
            "recalls": args.recalls,
            "store_probes": args.store_probes,
            "concurrency": args.concurrency,
            "seed": args.seed,
            "runs": summaries,
        },
    )
    print(f"\nresults written to {path}")


def parse_sizes(text: str) -> list[int]:
    try:
        sizes = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(f"--sizes must be a comma list of integers, got {text!r}") from None
    if not sizes or sizes[0] < 1:
        raise argparse.ArgumentTypeError("--sizes needs at least one positive size")
    return sizes


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=parse_sizes, default=parse_sizes("1000,10000,100000"))
    parser.add_argument("--servers", default="ours,ref", help="comma list of: ours, ours-pg (ours on PostgreSQL), ref")
    parser.add_argument("--modes", default="none,stub", help="comma list of: none, stub, minilm, local (ours only)")
    parser.add_argument("--recalls", type=int, default=200, help="timed recalls per size")
    parser.add_argument("--store-probes", type=int, default=100, help="timed sequential stores per size")
    parser.add_argument("--concurrency", type=int, default=8, help="store requests in flight while filling")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)
    if args.store_probes < 1 or args.recalls < 1 or args.store_probes >= args.sizes[0]:
        parser.error("--store-probes and --recalls must be >= 1, and --store-probes below the smallest size")
    return args


if __name__ == "__main__":
    asyncio.run(main_async(parse_args()))
