#!/usr/bin/env bash
# Latency benchmark, both servers, embeddings off and the stub embedder.
# Extra arguments go to latency.py (e.g. --sizes 1000,10000 for a quick run).
set -euo pipefail
BENCH_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
[ -x "$BENCH_DIR/../.venv/bin/python" ] && [ -x "$BENCH_DIR/.venvs/ref/bin/python" ] || SKIP_EMBED=1 bash "$BENCH_DIR/setup.sh"
exec "$BENCH_DIR/../.venv/bin/python" "$BENCH_DIR/latency.py" --sizes 1000,10000,100000 --servers ours,ref --modes none,stub "$@"
