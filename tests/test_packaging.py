"""The distribution this project installs as, and that nothing offers to install another program instead.

`cpersona` on PyPI is CPersona 2.6, a different program (README "Install"); ours is
``cpersona.DISTRIBUTION``. The import package and the ``cpersona`` command keep their names.
"""

from __future__ import annotations

import importlib.metadata
import re
import tomllib
from pathlib import Path

import cpersona
from cpersona import DISTRIBUTION, __version__

ROOT = Path(__file__).resolve().parents[1]
# An install of the distribution `cpersona` (tests/test_update_check.py uses the same shape).
FOREIGN_INSTALL = re.compile(r"(?:pip install(?: --upgrade| -q)?|uvx(?: --from)?) ['\"]?cpersona(?![\w-])")
# Lines that name the other program on purpose: the reference benchmarks and the README's warning.
ON_PURPOSE = ("CPersona 2.6", "reference")


def test_the_distribution_is_ours_and_its_version_is_the_codes():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert project["project"]["name"] == DISTRIBUTION != "cpersona"
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "cpersona.__version__"}
    assert project["project"]["scripts"] == {"cpersona": "cpersona.cli:main"}
    # The installed record is this checkout's (a stale install under another name would not be).
    assert importlib.metadata.version(DISTRIBUTION) == __version__
    scripts = importlib.metadata.distribution(DISTRIBUTION).entry_points.select(group="console_scripts")
    assert [(e.name, e.value) for e in scripts] == [("cpersona", "cpersona.cli:main")]
    assert cpersona.__file__ and Path(cpersona.__file__).resolve().is_relative_to(ROOT)


def _texts() -> list[Path]:
    paths = [ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *(ROOT / "cpersona").rglob("*.py")]
    return paths


def test_no_doc_or_message_offers_to_install_the_other_program():
    found = []
    for path in _texts():
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if FOREIGN_INSTALL.search(line) and not any(mark in line for mark in ON_PURPOSE):
                found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not found, "\n".join(found)
