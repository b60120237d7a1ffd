"""Settings a user trips over at start-up (issue 13 item 8): `~` in paths, misspelt
variable names, an embedding mode without the value it needs.

Behaviour seen by a user is checked on the real `python -m cpersona` process.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from cpersona.config import (
    EMBEDDING_MODE_NEEDS,
    LEFT_OUT,
    READ_ELSEWHERE,
    ConfigError,
    Settings,
    check_startup,
    env_name,
    field_kind,
    field_rule,
    load_settings,
    unknown_variables,
)
from cpersona.mcp.acl import parse_acl

REPO = Path(__file__).resolve().parents[1]
PATH_FIELDS = [name for name, info in Settings.model_fields.items() if field_kind(info)[0] == "path"]


def _serve(
    tmp_path: Path, env: dict[str, str], *args: str, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """The real server (or a subcommand) with only ``env`` as its CPERSONA_* environment; stdin closed."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("CPERSONA_", "EMBEDDING_"))}
    base.update({"CPERSONA_DB_PATH": str(tmp_path / "serve.db"), "CPERSONA_UPDATE_CHECK": "false", **env})
    return subprocess.run(
        [sys.executable, "-m", "cpersona", *args],
        env=base,
        cwd=cwd or tmp_path,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
    )


# --- `~` in every path setting ------------------------------------------------------------------------


def test_the_model_has_the_path_settings_this_table_walks() -> None:
    # guards the walk below against an empty table (a renamed kind would test nothing)
    assert {"db_path", "export_dir", "acl_file", "alias_ledger_file", "operating_context_path"} <= set(PATH_FIELDS)


@pytest.mark.parametrize("name", PATH_FIELDS)
def test_every_path_setting_expands_home(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    from_env = load_settings({env_name(name): f"~/sub/{name}"})
    assert getattr(from_env, name) == tmp_path / "sub" / name
    # keyword arguments (the library's way in) get the same treatment
    assert getattr(Settings(**{name: f"~/kw/{name}"}), name) == tmp_path / "kw" / name
    # only a leading `~` is special: a `~` inside a name is kept
    assert getattr(load_settings({env_name(name): f"/srv/a~b/{name}"}), name) == Path(f"/srv/a~b/{name}")


def test_files_beside_the_database_follow_the_expanded_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    s = load_settings({"CPERSONA_DB_PATH": "~/mem/c.db"})
    assert s.db_file == tmp_path / "mem" / "c.db"
    assert s.calibration_sidecar == tmp_path / "mem" / "c.db.calibration.json"
    assert s.alias_ledger_path == tmp_path / "mem" / "alias_ledger.json"
    assert s.update_check_cache == tmp_path / "mem" / "update-check.json"


def test_server_with_a_tilde_db_path_writes_under_home_not_a_tilde_folder(tmp_path: Path) -> None:
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    run = _serve(tmp_path, {"HOME": str(home), "CPERSONA_DB_PATH": "~/mem/c.db"}, cwd=work)
    assert run.returncode == 0, run.stderr
    assert (home / "mem" / "c.db").is_file()
    assert list(work.iterdir()) == []  # no ./~/ folder (nor anything else) in the working directory


# --- unknown CPERSONA_* variables ----------------------------------------------------------------------

MISSPELT = [
    ("CPERSONA_EMBEDING_MODE", "CPERSONA_EMBEDDING_MODE"),
    ("CPERSONA_DBPATH", "CPERSONA_DB_PATH"),
    ("CPERSONA_HTTP_PROT", "CPERSONA_HTTP_PORT"),
    ("CPERSONA_AUTH_TOKNE", "CPERSONA_AUTH_TOKEN"),
    ("CPERSONA_EMBEDDING_APIKEY", "CPERSONA_EMBEDDING_API_KEY"),
]


@pytest.mark.parametrize("wrong,meant", MISSPELT)
def test_a_misspelt_variable_names_the_closest_setting(wrong: str, meant: str) -> None:
    [line] = unknown_variables({wrong: "x"})
    assert line.startswith(f"{wrong} is not a cpersona setting") and line.endswith(f"did you mean {meant}?")


def test_a_variable_near_nothing_points_at_the_documentation() -> None:
    [line] = unknown_variables({"CPERSONA_ZZZZ_QQQQ": "1"})
    assert "did you mean" not in line and "docs/configuration.md" in line


def test_no_known_name_ever_warns() -> None:
    # every setting, every alias, the reference's left-out names, the names read outside the model
    known = {env_name(n): "x" for n in Settings.model_fields}
    known.update({r.alias: "x" for r in map(field_rule, Settings.model_fields.values()) if r.alias})
    known.update({v: "x" for v in (*LEFT_OUT, *READ_ELSEWHERE)})
    known.update(
        {"CPERSONA_BENCH_OURS_PYTHON": "x", "CPERSONA_BENCH_REF_PYTHON": "x", "PATH": "x", "cpersona_db_pth": "x"}
    )
    assert unknown_variables(known) == []


def _tracked_files() -> list[Path]:
    # Only what the repository holds: bench/.venvs carries the reference's own
    # package, whose variables are not ours to know.
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=False)
    if listed.returncode == 0 and listed.stdout:
        return [REPO / name for name in listed.stdout.decode().split("\0") if name]
    return [
        p
        for top in ("cpersona", "tests", "bench", ".ci", "docs")
        for p in (REPO / top).rglob("*")
        if p.is_file() and ".venv" not in p.parts
    ] + [REPO / "README.md"]


def _names_in_repository() -> set[str]:
    names: set[str] = set()
    for path in _tracked_files():
        if (
            not path.is_file()
            or path.suffix not in {".py", ".sh", ".md", ".toml", ""}
            or path.name == Path(__file__).name
        ):
            continue
        try:
            names.update(re.findall(r"\bCPERSONA_[A-Z0-9_]*[A-Z0-9]\b", path.read_text(encoding="utf-8")))
        except UnicodeDecodeError:
            continue
    return names


def test_every_cpersona_variable_the_repository_mentions_is_known() -> None:
    # A variable read with os.environ somewhere (tests, bench, CI) must be listed in
    # READ_ELSEWHERE, or users setting it would be told it is not a setting.
    # tests/test_config.py's stand-in for a foreign name; the docs' example of a misspelling
    # (the contracts' example ACL file, whose ${CPERSONA_TOKEN_WRITER} is known through its env_refs; the
    # bench docs' placeholder CPERSONA_X)
    deliberate = {"CPERSONA_NOT_A_SETTING", "CPERSONA_EMBEDING_MODE", "CPERSONA_TOKEN_WRITER", "CPERSONA_X"}
    names = _names_in_repository() - deliberate
    assert "CPERSONA_TEST_PG_URL" in names and "CPERSONA_DB_PATH" in names  # the scan found the repository
    assert unknown_variables(dict.fromkeys(names, "x")) == []


def test_acl_token_references_are_known(tmp_path: Path) -> None:
    env = {"CPERSONA_ALICE_TOKEN": "s3cret-alice"}
    policy = parse_acl(
        {"clients": [{"client_id": "alice", "token": "${CPERSONA_ALICE_TOKEN}", "grants": {"alice": "read-write"}}]},
        env,
    )
    assert policy.env_refs == {"CPERSONA_ALICE_TOKEN"}
    assert unknown_variables(env) != [] and unknown_variables(env, policy.env_refs) == []


def test_server_warns_once_per_unknown_variable_and_still_starts(tmp_path: Path) -> None:
    acl = tmp_path / "acl.json"
    acl.write_text(
        json.dumps(
            {
                "clients": [
                    {"client_id": "local", "grants": {"*": "read-write"}},
                    {"client_id": "bob", "token": "${CPERSONA_BOB_TOKEN}", "grants": {"bob": "read"}},
                ]
            }
        )
    )
    os.chmod(acl, 0o600)
    run = _serve(
        tmp_path,
        {
            "CPERSONA_EMBEDING_MODE": "http",
            "CPERSONA_ACL_FILE": str(acl),
            "CPERSONA_BOB_TOKEN": "bob-token-1",
            "CPERSONA_TEST_PG_URL": "postgresql://x/y",
        },
    )
    assert run.returncode == 0, run.stderr
    warned = [line for line in run.stderr.splitlines() if "is not a cpersona setting" in line]
    assert len(warned) == 1, run.stderr
    assert "CPERSONA_EMBEDING_MODE" in warned[0] and "did you mean CPERSONA_EMBEDDING_MODE?" in warned[0]


def test_maintenance_commands_warn_too(tmp_path: Path) -> None:
    run = _serve(tmp_path, {"CPERSONA_EXPORTDIR": str(tmp_path)}, "stats")
    assert (
        "CPERSONA_EXPORTDIR is not a cpersona setting and is ignored; did you mean CPERSONA_EXPORT_DIR?" in run.stderr
    )


# --- an embedding mode without what it needs ---------------------------------------------------------

NEEDS = [(mode, name) for mode, rows in EMBEDDING_MODE_NEEDS.items() for name, _ in rows]
GIVEN = {"embedding_url": "http://127.0.0.1:9/embed", "embedding_api_key": "k-123"}


def test_every_mode_that_needs_something_is_in_the_table() -> None:
    assert {"http", "api"} <= set(EMBEDDING_MODE_NEEDS)
    assert all(name in GIVEN for _, name in NEEDS), "give this test a value for the new row"


@pytest.mark.parametrize("mode,missing", NEEDS)
def test_check_startup_names_the_variable_to_set(mode: str, missing: str) -> None:
    others = {env_name(n): GIVEN[n] for m, n in NEEDS if m == mode and n != missing}
    settings = load_settings({"CPERSONA_EMBEDDING_MODE": mode, **others})
    with pytest.raises(ConfigError) as caught:
        check_startup(settings)
    message = str(caught.value)
    assert env_name(missing) in message and f"CPERSONA_EMBEDDING_MODE={mode}" in message and "\n" not in message
    alias = field_rule(Settings.model_fields[missing]).alias
    assert alias is None or alias in message
    # blank counts as missing; a value (under either name) satisfies it
    with pytest.raises(ConfigError):
        check_startup(load_settings({"CPERSONA_EMBEDDING_MODE": mode, env_name(missing): "  ", **others}))
    check_startup(load_settings({"CPERSONA_EMBEDDING_MODE": mode, env_name(missing): GIVEN[missing], **others}))
    if alias:
        check_startup(load_settings({"CPERSONA_EMBEDDING_MODE": mode, alias: GIVEN[missing], **others}))


def test_mode_none_needs_nothing() -> None:
    check_startup(load_settings({}))


@pytest.mark.parametrize("mode,missing", NEEDS)
def test_server_refuses_to_start_without_it(mode: str, missing: str, tmp_path: Path) -> None:
    others = {env_name(n): GIVEN[n] for m, n in NEEDS if m == mode and n != missing}
    run = _serve(tmp_path, {"CPERSONA_EMBEDDING_MODE": mode, **others})
    assert run.returncode == 2
    [line] = run.stderr.strip().splitlines()
    assert line.startswith("cpersona: ") and env_name(missing) in line
    assert not (tmp_path / "serve.db").exists()  # refused before the database was touched
