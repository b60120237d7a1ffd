"""The local embedding model alone: cold start, memory, per-text latency (single and batch of 32).

    python bench/local_embed.py [--model-path DIR] [--threads 2] [--texts 256]

Each figure comes from a fresh child process so nothing is warm: the child
imports cpersona's local embedder, loads the model folder, embeds one text
(cold first-embed, wall clock from before the import), then embeds LoCoMo
turns one at a time and in batches of 32. Memory is the child's resident set
(VmRSS, /proc) before the model is loaded and after the timed work, and its
peak (VmHWM). ``--server`` also times the same texts through
``cpersona embed-server`` over HTTP on 127.0.0.1 (one text per request, as a
stdio server in ``http`` mode sends them), reads that server's resident set,
and that of a stdio server (`python -m cpersona`) after one store and one
recall in ``none`` and in ``local`` mode.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from harness_python import ensure_harness_python

ensure_harness_python()

from locomo_data import DEFAULT_DATA_DIR, load_conversations  # noqa: E402
from mcp_driver import LOCAL_MODEL, write_results  # noqa: E402
from metrics import percentile  # noqa: E402

CHILD = r"""
import json, sys, time
started = time.perf_counter()
from pathlib import Path

def status(key):
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024  # MiB
    return None

from cpersona.embedding.local import LocalEmbedder, ModelProvider
from cpersona.embedding.profiles import profile
args = json.loads(sys.argv[1])
texts = args["texts"]
provider = ModelProvider(profile=profile("all-MiniLM-L6-v2"), model_path=Path(args["model"]),
                         cache_dir=Path("/nonexistent"), source=None, threads=args["threads"], fetch=False)
embedder = LocalEmbedder(provider, cache_size=0)
imported = time.perf_counter()
rss_before = status("VmRSS")
assert embedder.embed(texts[0]) is not None
first = time.perf_counter()
single = []
for text in texts:
    t = time.perf_counter(); embedder.embed(text); single.append((time.perf_counter() - t) * 1000)
batch = []
for start in range(0, len(texts) - 31, 32):
    t = time.perf_counter(); embedder.embed_many(texts[start:start + 32]); batch.append((time.perf_counter() - t) * 1000)
print(json.dumps({"import_s": imported - started, "first_embed_s": first - started, "load_and_first_s": first - imported,
                  "rss_before_mib": rss_before, "rss_after_mib": status("VmRSS"), "rss_peak_mib": status("VmHWM"),
                  "single_ms": single, "batch32_ms": batch}))
"""


def server_latency(model: Path, threads: int, texts: list[str]) -> dict[str, float]:
    import httpx

    env = {
        **os.environ,
        "CPERSONA_EMBEDDING_MODEL_PATH": str(model),
        "CPERSONA_EMBEDDING_THREADS": str(threads),
        "CPERSONA_UPDATE_CHECK": "false",
    }
    started = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "cpersona", "embed-server", "--port", "0"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        url = proc.stdout.readline().strip().removeprefix("listening on ")
        ready = time.perf_counter() - started
        timings = []
        with httpx.Client(timeout=60) as http:
            http.post(url, json={"texts": ["warm"]})
            for text in texts:
                t = time.perf_counter()
                http.post(url, json={"texts": [text]}).raise_for_status()
                timings.append((time.perf_counter() - t) * 1000)
        rss = None
        for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) / 1024
        client = stdio_server_rss({"CPERSONA_EMBEDDING_MODE": "http", "CPERSONA_EMBEDDING_URL": url})
        return {
            "ready_s": ready,
            "single_p50_ms": percentile(timings, 0.5),
            "single_p95_ms": percentile(timings, 0.95),
            "rss_mib": rss,
            "stdio_server_in_http_mode_rss_mib": client,
        }
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def stdio_server_rss(env_extra: dict[str, str]) -> float:
    """Resident MiB of `python -m cpersona` (stdio) after initialize and one store in the given mode."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="cpersona-rss-") as workdir:
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("CPERSONA_")},
            "CPERSONA_DB_PATH": f"{workdir}/memory.db",
            "CPERSONA_UPDATE_CHECK": "false",
            **env_extra,
        }
        proc = subprocess.Popen(
            [sys.executable, "-m", "cpersona"],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        try:

            def ask(message_id: int, method: str, params: dict) -> dict:
                proc.stdin.write(
                    json.dumps({"jsonrpc": "2.0", "id": message_id, "method": method, "params": params}) + "\n"
                )
                proc.stdin.flush()
                while True:
                    answer = json.loads(proc.stdout.readline())
                    if answer.get("id") == message_id:
                        return answer

            ask(
                1,
                "initialize",
                {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "rss", "version": "0"}},
            )
            proc.stdin.write('{"jsonrpc":"2.0","method":"notifications/initialized"}\n')
            proc.stdin.flush()
            ask(2, "tools/call", {"name": "store", "arguments": {"agent_id": "a", "content": "a first memory"}})
            ask(3, "tools/call", {"name": "recall", "arguments": {"agent_id": "a", "query": "memory"}})
            for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
            return float("nan")
        finally:
            proc.stdin.close()
            proc.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-path", type=Path, default=LOCAL_MODEL)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--texts", type=int, default=256)
    parser.add_argument("--server", action="store_true", help="also time cpersona embed-server over HTTP")
    args = parser.parse_args()
    turns = [t.content for c in load_conversations(DEFAULT_DATA_DIR) for t in c.turns][: args.texts]
    payload = json.dumps({"model": str(args.model_path), "threads": args.threads, "texts": turns})
    load = os.getloadavg()
    done = subprocess.run([sys.executable, "-c", CHILD, payload], capture_output=True, text=True, check=True)
    child = json.loads(done.stdout)
    batch_per_text = [ms / 32 for ms in child["batch32_ms"]]
    figures = {
        "model": str(args.model_path),
        "threads": args.threads,
        "texts": len(turns),
        "mean_chars": sum(map(len, turns)) / len(turns),
        "load_average": load,
        "cold_first_embed_s": child["first_embed_s"],
        "import_s": child["import_s"],
        "load_and_first_embed_s": child["load_and_first_s"],
        "rss_before_load_mib": child["rss_before_mib"],
        "rss_loaded_mib": child["rss_after_mib"],
        "rss_peak_mib": child["rss_peak_mib"],
        "single_p50_ms": percentile(child["single_ms"], 0.5),
        "single_p95_ms": percentile(child["single_ms"], 0.95),
        "batch32_p50_ms": percentile(child["batch32_ms"], 0.5),
        "batch32_p95_ms": percentile(child["batch32_ms"], 0.95),
        "batch32_per_text_p50_ms": percentile(batch_per_text, 0.5),
        "batch32_per_text_p95_ms": percentile(batch_per_text, 0.95),
        "single_total_s": sum(child["single_ms"]) / 1000,
        "batch32_total_s": sum(child["batch32_ms"]) / 1000,
        "model_files_mb": sum(p.stat().st_size for p in args.model_path.iterdir() if p.is_file()) / 1e6,
    }
    if args.server:
        figures["embed_server"] = server_latency(args.model_path, args.threads, turns)
        figures["stdio_rss_mib"] = {
            "none": stdio_server_rss({"CPERSONA_EMBEDDING_MODE": "none"}),
            "local": stdio_server_rss(
                {"CPERSONA_EMBEDDING_MODE": "local", "CPERSONA_EMBEDDING_MODEL_PATH": str(args.model_path)}
            ),
        }
    for key, value in figures.items():
        print(f"{key:28} {value:.2f}" if isinstance(value, float) else f"{key:28} {value}")
    print(f"results written to {write_results('local-embed', figures)}")


if __name__ == "__main__":
    main()
