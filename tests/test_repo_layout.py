"""The repository promises a new user two commands; CI must run the same test command."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    return re.findall(r"```bash\n(.+?)\n```", text, flags=re.S)


def test_readme_has_server_and_test_commands():
    commands = _readme_commands()
    assert any(c.rstrip().endswith("cpersona") for c in commands), commands
    assert any("pytest" in c for c in commands), commands


def test_ci_runs_the_readme_test_command():
    test_command = next(c for c in _readme_commands() if "pytest" in c)
    ci_lines = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert test_command.strip() in [line.strip() for line in ci_lines]


def test_top_level_layout():
    for name in ("pyproject.toml", "cpersona", "migrations", "tests", "docs", "alembic.ini"):
        assert (ROOT / name).exists(), name


def test_every_package_folder_ships():
    import tomllib

    declared = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(init.parent.relative_to(ROOT).parts) for init in (ROOT / "cpersona").rglob("__init__.py")}
    found |= {
        "cpersona." + ".".join(init.parent.relative_to(ROOT).parts)
        for init in (ROOT / "migrations").rglob("__init__.py")
    }
    assert found <= declared, sorted(found - declared)


def test_every_declared_package_data_file_exists():
    """A pattern in [tool.setuptools.package-data] that matches nothing ships nothing, silently
    (py.typed was declared for a long time before it existed)."""
    import tomllib

    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    folders = setuptools.get("package-dir", {})
    for package, patterns in setuptools["package-data"].items():
        folder = ROOT / folders.get(package, package.replace(".", "/"))
        for pattern in patterns:
            assert list(folder.glob(pattern)), f"{package}: {pattern} matches no file in {folder}"
