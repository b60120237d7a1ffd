"""Re-run a benchmark script under the project's venv when started with another Python.

The harness needs the MCP SDK client (mcp 2.x), which lives in <repo>/.venv;
`python bench/locomo.py` from a bare interpreter would otherwise fail on import.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

HARNESS_PYTHON = Path(__file__).resolve().parent.parent / ".venv" / "bin" / "python"


def ensure_harness_python() -> None:
    try:
        import mcp  # noqa: F401

        return
    except ImportError:
        pass
    if not HARNESS_PYTHON.exists():
        raise SystemExit(f"the MCP SDK is not importable here and {HARNESS_PYTHON} does not exist; run bench/setup.sh")
    # Compare prefixes, not executables: a venv's python is a symlink to the base one.
    if Path(sys.prefix).resolve() == HARNESS_PYTHON.parent.parent.resolve():
        raise SystemExit(f"{HARNESS_PYTHON} has no MCP SDK; run bench/setup.sh")
    os.execv(str(HARNESS_PYTHON), [str(HARNESS_PYTHON), *sys.argv])
