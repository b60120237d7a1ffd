#!/usr/bin/env bash
# LoCoMo retrieval benchmark, both servers and both embedding modes in one run.
# Extra arguments go to locomo.py (e.g. --servers ref --modes none).
set -euo pipefail
BENCH_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
[ -x "$BENCH_DIR/../.venv/bin/python" ] && [ -x "$BENCH_DIR/.venvs/ref/bin/python" ] || bash "$BENCH_DIR/setup.sh"
exec "$BENCH_DIR/../.venv/bin/python" "$BENCH_DIR/locomo.py" --servers ours,ref --modes none,minilm "$@"
