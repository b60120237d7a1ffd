"""Fixtures for the end-to-end tests (helpers live in stdio_harness.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from mcp import StdioServerParameters
from stdio_harness import RawSession, server_env


@pytest.fixture
def e2e_db_path(tmp_path: Path) -> Path:
    return tmp_path / "data" / "memory.db"


@pytest.fixture
def stdio_params(e2e_db_path: Path) -> StdioServerParameters:
    return StdioServerParameters(command=sys.executable, args=["-m", "cpersona"], env=server_env(e2e_db_path))


@pytest.fixture
def raw_session(e2e_db_path: Path):
    session = RawSession(server_env(e2e_db_path))
    session.initialize()
    yield session
    if session.proc.poll() is None:
        session.close()
