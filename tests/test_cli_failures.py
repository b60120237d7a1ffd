"""Every subcommand against every kind of bad target: one line, no traceback, a documented exit status.

Table-driven over (subcommand × role × target), each run as the real
``python -m cpersona`` process. Targets are a directory, a text file, a missing
file and a read-only location; the role is the database (CPERSONA_DB_PATH or
``--db``) or the command's own file argument. A read-only location is refused
only where the command would write there; reading from one works. Runs go
through :func:`as_other_user` so file modes apply even when tests run as root
(issue 13 item 7; exit codes in docs/operations.md).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import make_app
from cpersona.services.portability import export_memories
from cpersona.services.records.memories import store
from cpersona.storage.migrate import open_and_upgrade
from test_storage_failures import NOBODY, as_other_user

OK, FAILED, USAGE = 0, 1, 2
CHECKUP_FAILED = 2  # checkup's own table (spec CLI-6): 2 for a failure as for a critical finding


@dataclass
class World:
    base: Path
    good_db: Path
    folder: Path
    text_file: Path
    ro_db: Path
    ro_dir: Path
    export: Path
    ro_export: Path
    source_26: Path
    ro_source_26: Path

    def missing(self, name: str) -> Path:
        return self.base / "missing" / name

    def target(self, kind: str, name: str) -> Path:
        return {
            "directory": self.folder,
            "text file": self.text_file,
            "missing file": self.missing(name),
            "read-only location": self.ro_dir / name,
        }[kind]


def _chown(path: Path) -> None:
    if os.geteuid() == 0:
        os.chown(path, NOBODY, NOBODY)


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Iterator[World]:
    from test_import_db import make_26_database

    base = Path(tempfile.mkdtemp(prefix="cpersona-cli-", dir="/tmp"))
    base.chmod(0o755)
    _chown(base)
    good = base / "good.db"
    db = open_and_upgrade(good)
    app = make_app(db)
    store(app, agent_id="a", content="a remembered fact")
    export = base / "good.jsonl"
    assert export_memories(app, agent_id="", output_path=str(export))["ok"]
    db.close()
    folder = base / "a folder"
    folder.mkdir()
    text_file = base / "notes.txt"
    text_file.write_text("these are notes,\nnot a database and not an export\n" * 20)
    source_26 = make_26_database(tmp_path_factory.mktemp("src"))
    moved_26 = base / "source-26.db"
    shutil.copy(source_26, moved_26)
    ro_dir = base / "read-only"
    ro_dir.mkdir()
    ro_db = ro_dir / "memory.db"
    shutil.copy(good, ro_db)
    ro_export = ro_dir / "export.jsonl"
    shutil.copy(export, ro_export)
    ro_source_26 = ro_dir / "source-26.db"
    shutil.copy(source_26, ro_source_26)
    (base / "missing").mkdir()
    for path in (good, moved_26, export, text_file, folder, base / "missing"):
        _chown(path)
    for path in (good, moved_26, export, text_file):
        path.chmod(0o600)  # the other user's own files (a group-readable database draws a warning)
    for path in (ro_db, ro_export, ro_source_26):
        path.chmod(0o444)
    ro_dir.chmod(0o555)
    yield World(base, good, folder, text_file, ro_db, ro_dir, export, ro_export, moved_26, ro_source_26)
    ro_dir.chmod(0o755)
    shutil.rmtree(base)


def run(world: World, db: Path, *args: str, stdout=subprocess.PIPE) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CPERSONA_", "EMBEDDING_"))}
    env.update({"CPERSONA_DB_PATH": str(db), "CPERSONA_UPDATE_CHECK": "false", "HOME": str(world.base)})
    return subprocess.run(
        as_other_user([sys.executable, "-m", "cpersona", *args]),
        env=env,
        stdout=stdout,
        stderr=subprocess.PIPE,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
        cwd=world.base,
    )


BAD = ("directory", "text file", "missing file", "read-only location")


@dataclass(frozen=True)
class Case:
    command: str
    role: str  # "db" or "file"
    target: str
    expect: int
    build: Callable[[World, Path], tuple[Path, list[str]]]  # (database, argv) for a target path

    @property
    def id(self) -> str:
        return f"{self.command}:{self.role}={self.target}"


def _db_cases(command: str, argv: Callable[[World, str], list[str]], outcome: dict[str, int]) -> list[Case]:
    return [Case(command, "db", kind, outcome[kind], lambda w, p, kind=kind: (p, argv(w, kind))) for kind in BAD]


def _file_cases(command: str, outcome: dict[str, int], kinds=BAD) -> list[Case]:
    return [Case(command, "file", kind, outcome[kind], lambda w, p: (w.good_db, [command, str(p)])) for kind in kinds]


def _fail_but(**ok: int) -> dict[str, int]:
    return {
        "directory": FAILED,
        "text file": FAILED,
        "missing file": FAILED,
        "read-only location": FAILED,
        **{k.replace("_", " ").replace("read only", "read-only"): v for k, v in ok.items()},
    }


def _new(name: str) -> Callable[[World, str], str]:
    return lambda w, kind: str(w.missing(f"{name}-{kind.replace(' ', '-')}"))


CASES: list[Case] = [
    # reading commands: a read-only database is served, not refused
    *_db_cases("stats", lambda w, k: ["stats"], _fail_but(read_only_location=OK)),
    *[
        Case("checkup", "db", kind, expect, lambda w, p: (w.good_db, ["checkup", "--db", str(p)]))
        for kind, expect in {
            "directory": CHECKUP_FAILED,
            "text file": CHECKUP_FAILED,
            "missing file": CHECKUP_FAILED,
            "read-only location": OK,
        }.items()
    ],
    *_db_cases("backup", lambda w, k: ["backup", _new("backup")(w, k)], _fail_but(read_only_location=OK)),
    *_db_cases("export", lambda w, k: ["export", _new("export")(w, k)], _fail_but(read_only_location=OK)),
    # writing commands: a missing database is created, a read-only one refused
    *_db_cases("import", lambda w, k: ["import", str(w.export)], _fail_but(missing_file=OK)),
    *_db_cases("import-db", lambda w, k: ["import-db", str(w.source_26)], _fail_but(missing_file=OK)),
    # the people commands read through the tools: a read-only database is read; delete there is refused
    *_db_cases("search", lambda w, k: ["search", "fact", "--agent", "a"], _fail_but(read_only_location=OK)),
    *_db_cases("list", lambda w, k: ["list"], _fail_but(read_only_location=OK)),
    *_db_cases("show", lambda w, k: ["show", "mem:1", "--agent", "a"], _fail_but(read_only_location=OK)),
    *_db_cases("delete", lambda w, k: ["delete", "mem:1", "--agent", "a", "--yes"], _fail_but()),
    # the page never creates a database; a read-only one it would serve (not run here: it serves until stopped)
    *[
        case
        for case in _db_cases("ui", lambda w, k: ["ui", "--port", "0"], _fail_but())
        if case.target != "read-only location"
    ],
    # the command's own file
    *_file_cases("backup", _fail_but(missing_file=OK)),  # a new file is what backup writes
    # export onto an existing non-export file: the export-path work of issue 13 item 1 owns that refusal
    *_file_cases("export", _fail_but(missing_file=OK), kinds=("directory", "missing file", "read-only location")),
    *_file_cases("import", _fail_but(read_only_location=OK)),  # reading an export from a read-only place
    *_file_cases("import-db", _fail_but(read_only_location=OK)),
]


def _resolve(case: Case, world: World) -> tuple[Path, list[str]]:
    name = f"{case.command}-{case.role}-{case.target.replace(' ', '-')}"
    if case.target == "read-only location":
        path = {
            ("db", "stats"): world.ro_db,
            ("db", "checkup"): world.ro_db,
            ("db", "backup"): world.ro_db,
            ("db", "export"): world.ro_db,
            ("db", "import"): world.ro_db,
            ("db", "import-db"): world.ro_db,
            ("db", "search"): world.ro_db,
            ("db", "list"): world.ro_db,
            ("db", "show"): world.ro_db,
            ("db", "delete"): world.ro_db,
            ("file", "import"): world.ro_export,
            ("file", "import-db"): world.ro_source_26,
        }.get((case.role, case.command), world.ro_dir / name)
    else:
        path = world.target(case.target, name)
    return case.build(world, path)


def test_the_table_covers_every_subcommand_and_every_bad_target():
    from cpersona.admin_cli import COMMANDS

    assert {c.command for c in CASES} == set(COMMANDS) | {"checkup", "search", "list", "show", "delete", "ui"}
    for command in {c.command for c in CASES}:
        served = {"read-only location"} if command == "ui" else set()  # a readable database is served
        assert {c.target for c in CASES if c.command == command and c.role == "db"} | served == set(BAD)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_every_subcommand_answers_a_bad_target_in_one_line(world, case):
    db, argv = _resolve(case, world)
    done = run(world, db, *argv)
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == case.expect, (done.returncode, done.stdout, done.stderr)
    if case.expect != OK:
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        assert len(lines) == 1, done.stderr
        for leak in ("[SQL", "[parameters", "sqlalche.me", "check crashed", "check_crashed"):
            assert leak not in done.stderr + done.stdout


def test_import_of_a_garbage_file_fails_and_says_nothing_was_imported(world):
    done = run(world, world.good_db, "import", str(world.text_file))
    assert done.returncode == FAILED
    assert done.stderr.startswith(f"cpersona: nothing was imported: {world.text_file} holds no cpersona record")
    assert "imported 0" not in done.stdout


def test_checkup_on_a_text_file_is_one_line_not_a_crash_per_check(world):
    done = run(world, world.good_db, "checkup", "--db", str(world.text_file))
    assert done.returncode == CHECKUP_FAILED
    assert done.stderr == f"error: checkup failed: {world.text_file} is not a SQLite database\n"
    assert done.stdout == ""


@pytest.mark.parametrize(
    "argv",
    [["stats"], ["stats", "--json"], ["checkup", "--json"], ["export", "-", "--json"]],
    ids=lambda a: " ".join(a),
)
def test_a_closed_output_pipe_ends_quietly(world, argv):
    # What `cpersona stats | head -1` does: the reader goes away before the writer is done.
    argv = [a if a != "-" else str(world.missing("piped.jsonl")) for a in argv]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CPERSONA_", "EMBEDDING_"))}
    env.update({"CPERSONA_DB_PATH": str(world.good_db), "CPERSONA_UPDATE_CHECK": "false"})
    read, write = os.pipe()
    os.close(read)  # closed before the first byte is written
    try:
        done = subprocess.run(
            as_other_user([sys.executable, "-m", "cpersona", *argv]),
            env=env,
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
            stdin=subprocess.DEVNULL,
        )
    finally:
        os.close(write)
    assert "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr, done.stderr
    assert done.stderr == ""
    assert done.returncode == 141  # as a program killed by SIGPIPE, which shells treat as a closed reader


# The hooks run under Claude Code, which shows stderr and goes on whatever the status: a database
# that cannot be opened or written is one line and 1 (the failure policy in cpersona/hooks.py).
# Every event over every bad target.
_HOOK_INPUT = {"session-start": "SessionStart", "session-end": "SessionEnd"}
_HOOK_OUTCOME = {
    "session-start": _fail_but(missing_file=OK, read_only_location=OK),  # a read-only store is read
    "session-end": _fail_but(missing_file=OK),  # recording the boundary is a write
}


@pytest.mark.parametrize("event", sorted(_HOOK_INPUT))
@pytest.mark.parametrize("kind", BAD)
def test_every_hook_answers_a_bad_database_in_one_line(world, event, kind):
    name = f"hook-{event}-{kind.replace(' ', '-')}"
    db = world.ro_db if kind == "read-only location" else world.target(kind, name)
    hook_input = json.dumps({"session_id": "s1", "cwd": str(world.base), "hook_event_name": _HOOK_INPUT[event]})
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CPERSONA_", "EMBEDDING_"))}
    env.update({"CPERSONA_UPDATE_CHECK": "false", "HOME": str(world.base)})
    done = subprocess.run(
        as_other_user([sys.executable, "-m", "cpersona", "hook", event, "--agent", "a", "--db", str(db)]),
        env=env,
        input=hook_input,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=world.base,
    )
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == _HOOK_OUTCOME[event][kind], (done.returncode, done.stdout, done.stderr)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    if done.returncode != OK or (kind, event) == ("missing file", "session-start"):
        assert len(lines) == 1 and lines[0].startswith("cpersona hook: "), done.stderr
    if kind == "missing file":
        # session-start only reads, so it leaves no file behind; session-end records the first
        # session's boundary, which creates the store as any first write does
        assert db.exists() == (event == "session-end")
    if done.returncode != OK:
        assert done.stdout == ""  # stdout carries the hook's JSON and nothing else
