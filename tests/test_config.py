"""Settings: defaults, aliases, parsing, clamps and start-up errors (spec transport-and-config §7, §8)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cpersona.config import LEFT_OUT, ConfigError, Settings, env_name, load_settings


def bad(environ: dict[str, str]) -> str:
    with pytest.raises(ConfigError) as caught:
        load_settings(environ)
    message = str(caught.value)
    assert "\n" not in message  # one line, fit for stderr
    return message


# --- defaults ---------------------------------------------------------------


def test_defaults_match_the_spec_tables() -> None:
    s = load_settings({})
    assert s.db_path == Path("data/cpersona.db")  # §8.1
    assert s.database_url is None
    assert s.max_content_length == 16000
    assert s.max_profile_length == 2000
    assert s.max_metadata_length == 8000
    assert s.embedding_mode == "none"  # §8.2
    assert s.embedding_url is None
    assert s.embedding_api_url == "https://api.openai.com/v1/embeddings"
    assert s.embedding_model == "text-embedding-3-small"
    assert s.embedding_api_key is None
    assert s.max_memories == 10000
    assert s.vector_min_similarity == 0.3
    assert s.recall_mode == "rrf"  # §8.3
    assert s.rrf_k == 60
    assert s.recall_preview_chars == 500
    assert s.recall_excerpt_chars == 800
    assert s.autocut_min_results == 3
    assert s.confidence_enabled is False
    assert s.confidence_ordering == "fusion"  # spec README decision 2
    assert s.recall_precision == "balanced"
    assert s.calibrate_method == "separation"  # §8.5
    assert s.calibrate_max_sample == 5000
    assert s.transport == "stdio"  # §8.7, T-1
    assert s.http_host == "127.0.0.1"  # T-3
    assert s.http_port == 8402
    assert s.auth_token is None
    assert s.allow_unauthenticated_http is False
    assert s.http_max_body_bytes == 4194304  # BB-1
    assert s.http_body_limit_mode == "warn"  # BB-2
    assert s.proxy_max_inflight == 8
    assert s.update_check is True  # §8.8
    assert s.update_check_interval_seconds == 86400


def test_episode_penalty_defaults_to_true() -> None:
    # spec README decision 1: the configuration document wins over the reference's false.
    assert load_settings({}).episode_penalty_enabled is True


def test_derived_defaults() -> None:
    s = load_settings({})
    assert s.reconstruct_default_count == 10  # min(10, max)
    assert s.reconstruct_tail_quote_chars == 400  # min(400, quote chars)
    assert s.reconstruct_max_budget == 20000  # max(20000, preview)
    assert s.reconstruct_default_budget == 4000
    assert s.block_retrieval_enabled is True  # follows the build switch
    assert s.gate_beta == 1.0  # balanced


def test_derived_defaults_follow_their_inputs() -> None:
    s = load_settings(
        {
            "CPERSONA_RECONSTRUCT_MAX_COUNT": "4",
            "CPERSONA_RECONSTRUCT_QUOTE_CHARS": "300",
            "CPERSONA_RECALL_PREVIEW_CHARS": "25000",
            "CPERSONA_BLOCK_BUILD_ENABLED": "false",
            "CPERSONA_RECALL_PRECISION": "strict",
        }
    )
    assert s.reconstruct_default_count == 4
    assert s.reconstruct_tail_quote_chars == 300
    assert s.reconstruct_max_budget == 25000
    assert s.reconstruct_default_budget == 25000
    assert s.block_retrieval_enabled is False
    assert s.gate_beta == 2.0
    assert load_settings({"CPERSONA_FUSED_GATE_BETA": "0.7"}).gate_beta == 0.7


def test_given_mapping_replaces_the_process_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CPERSONA_RRF_K", "7")
    monkeypatch.setenv("EMBEDDING_MODE", "http")
    s = load_settings({})
    assert s.rrf_k == 60
    assert s.embedding_mode == "none"
    # ...and without a mapping the process environment is read.
    assert load_settings().rrf_k == 7
    assert Settings().embedding_mode == "http"


def test_dotenv_files_are_not_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / ".env").write_text("CPERSONA_RRF_K=9\n")
    monkeypatch.chdir(tmp_path)
    assert load_settings({}).rrf_k == 60


def test_variable_names_are_exact() -> None:
    # The reference reads os.environ by exact name; a lower-case name is another variable.
    assert load_settings({"cpersona_rrf_k": "7"}).rrf_k == 60


def test_unknown_variables_are_ignored() -> None:
    assert load_settings({"CPERSONA_NOT_A_SETTING": "x", "CPERSONA_DECLARED_FOLDERS": "true"}).rrf_k == 60
    assert "CPERSONA_DECLARED_FOLDERS" in LEFT_OUT


def test_every_field_has_a_description() -> None:
    for name, info in Settings.model_fields.items():
        assert info.description and len(info.description) > 10, name


# --- aliases (spec CFG-5) ---------------------------------------------------

ALIASES = [
    ("embedding_mode", "CPERSONA_EMBEDDING_MODE", "EMBEDDING_MODE", "http", "api"),
    ("embedding_url", "CPERSONA_EMBEDDING_URL", "EMBEDDING_HTTP_URL", "http://a/embed", "http://b/embed"),
    ("embedding_model", "CPERSONA_EMBEDDING_MODEL", "EMBEDDING_MODEL", "m-prefixed", "m-alias"),
    ("embedding_api_url", "CPERSONA_EMBEDDING_API_URL", "EMBEDDING_API_URL", "https://a/v1", "https://b/v1"),
    ("embedding_api_key", "CPERSONA_EMBEDDING_API_KEY", "EMBEDDING_API_KEY", "key-prefixed", "key-alias"),
]


def _value(s: Settings, field: str) -> object:
    value = getattr(s, field)
    return value.get_secret_value() if hasattr(value, "get_secret_value") else value


@pytest.mark.parametrize(("field", "prefixed", "alias", "one", "other"), ALIASES)
def test_alias_alone_is_used(field: str, prefixed: str, alias: str, one: str, other: str) -> None:
    assert _value(load_settings({alias: other}), field) == other


@pytest.mark.parametrize(("field", "prefixed", "alias", "one", "other"), ALIASES)
def test_prefixed_name_wins_over_alias(field: str, prefixed: str, alias: str, one: str, other: str) -> None:
    assert _value(load_settings({prefixed: one, alias: other}), field) == one


@pytest.mark.parametrize(("field", "prefixed", "alias", "one", "other"), ALIASES)
def test_empty_prefixed_value_falls_through_to_alias(
    field: str, prefixed: str, alias: str, one: str, other: str
) -> None:
    assert _value(load_settings({prefixed: "", alias: other}), field) == other
    assert _value(load_settings({prefixed: "  ", alias: other}), field) == other


def test_empty_alias_and_prefixed_give_the_default() -> None:
    s = load_settings({"CPERSONA_EMBEDDING_MODE": "", "EMBEDDING_MODE": ""})
    assert s.embedding_mode == "none"


def test_bad_alias_value_is_reported_under_the_alias() -> None:
    message = bad({"EMBEDDING_MODE": "gpu"})
    assert message.startswith("EMBEDDING_MODE='gpu' is not valid")
    assert "none, http, api" in message


def test_embedding_model_configured_tracks_whether_it_was_given() -> None:
    assert load_settings({}).embedding_model_configured is False
    assert load_settings({"EMBEDDING_MODEL": "bge-m3"}).embedding_model_configured is True


def test_secrets_do_not_leak_into_repr() -> None:
    s = load_settings({"CPERSONA_AUTH_TOKEN": "hunter2", "EMBEDDING_API_KEY": "sk-123"})
    assert "hunter2" not in repr(s) and "sk-123" not in repr(s)
    assert s.auth_token is not None and s.auth_token.get_secret_value() == "hunter2"


# --- booleans (spec CFG-3) --------------------------------------------------

BOOLS = [
    ("true", True),
    ("TRUE", True),
    (" True ", True),
    ("1", True),
    ("yes", True),
    ("YES", True),
    ("on", True),
    ("On", True),
    ("false", False),
    ("False", False),
    ("0", False),
    ("no", False),
    ("NO", False),
    ("off", False),
    (" off\n", False),
]


@pytest.mark.parametrize(("raw", "expected"), BOOLS)
def test_boolean_spellings(raw: str, expected: bool) -> None:
    # Both fields default the other way round, so a parser that ignores the value fails one of them.
    assert load_settings({"CPERSONA_FTS_ENABLED": raw}).fts_enabled is expected
    assert load_settings({"CPERSONA_AUTO_CALIBRATE": raw}).auto_calibrate is expected


@pytest.mark.parametrize("raw", ["", "   "])
def test_empty_boolean_means_default(raw: str) -> None:
    assert load_settings({"CPERSONA_FTS_ENABLED": raw}).fts_enabled is True
    assert load_settings({"CPERSONA_AUTO_CALIBRATE": raw}).auto_calibrate is False


@pytest.mark.parametrize("raw", ["maybe", "t", "y", "2", "enabled", "truee"])
def test_unreadable_boolean_stops_startup(raw: str) -> None:
    message = bad({"CPERSONA_FTS_ENABLED": raw})
    assert message.startswith(f"CPERSONA_FTS_ENABLED={raw!r} is not valid")
    assert "true, false, 1, 0, yes, no, on, off" in message


def test_update_check_unreadable_value_stops_startup() -> None:
    # CFG-3 makes an unreadable value mean false; a stopped start-up queries nothing either.
    assert "CPERSONA_UPDATE_CHECK=" in bad({"CPERSONA_UPDATE_CHECK": "sometimes"})
    assert load_settings({"CPERSONA_UPDATE_CHECK": "off"}).update_check is False


@pytest.mark.parametrize(("raw", "expected"), [("true", True), ("TRUE", True), ("false", False), ("", False)])
def test_allow_unauthenticated_http_accepts_only_the_word_true(raw: str, expected: bool) -> None:
    # spec CFG-3 exception and T-8: only `true` opts in.
    env = {"CPERSONA_ALLOW_UNAUTHENTICATED_HTTP": raw}
    assert load_settings(env).allow_unauthenticated_http is expected


@pytest.mark.parametrize("raw", ["1", "yes", "on"])
def test_allow_unauthenticated_http_other_true_spellings_are_refused(raw: str) -> None:
    message = bad({"CPERSONA_ALLOW_UNAUTHENTICATED_HTTP": raw})
    assert "CPERSONA_ALLOW_UNAUTHENTICATED_HTTP" in message and "only the word 'true'" in message


# --- enumerations (spec CFG-4) and the transport (T-1) ----------------------


def test_enums_are_trimmed_and_lower_cased() -> None:
    s = load_settings(
        {
            "CPERSONA_RECALL_MODE": " RSF ",
            "CPERSONA_TRANSPORT": "Streamable-HTTP",
            "CPERSONA_HTTP_BODY_LIMIT_MODE": "Reject",
        }
    )
    assert (s.recall_mode, s.transport, s.http_body_limit_mode) == ("rsf", "streamable-http", "reject")


@pytest.mark.parametrize(
    ("var", "raw", "allowed"),
    [
        ("CPERSONA_RECALL_MODE", "fast", "rrf, rsf, cascade"),
        ("CPERSONA_EMBEDDING_MODE", "onnx", "none, http, api, local"),
        ("CPERSONA_TRANSPORT", "http", "stdio, streamable-http"),
        ("CPERSONA_HTTP_BODY_LIMIT_MODE", "block", "warn, reject, off"),
        ("CPERSONA_CONFIDENCE_ORDERING", "score", "fusion, legacy"),
        ("CPERSONA_RECALL_PRECISION", "high", "strict, balanced, lenient"),
        ("CPERSONA_VECTOR_SEARCH_MODE", "cloud", "local, remote"),
    ],
)
def test_unknown_enum_value_names_variable_and_choices(var: str, raw: str, allowed: str) -> None:
    assert bad({var: raw}) == f"{var}={raw!r} is not valid: expected one of {allowed}"


def test_empty_enum_means_default() -> None:
    assert load_settings({"CPERSONA_RECALL_MODE": ""}).recall_mode == "rrf"


@pytest.mark.parametrize("raw", ["", "  "])
def test_set_but_empty_transport_stops_startup(raw: str) -> None:
    # spec T-1: unlike other variables, an empty transport is an error.
    message = bad({"CPERSONA_TRANSPORT": raw})
    assert "CPERSONA_TRANSPORT" in message and "empty" in message and "stdio, streamable-http" in message


# --- numbers (spec CFG-2) ---------------------------------------------------


def test_numbers_are_parsed() -> None:
    s = load_settings(
        {
            "CPERSONA_RRF_K": " 42 ",
            "CPERSONA_VECTOR_MIN_SIMILARITY": "0.45",
            "CPERSONA_HTTP_PORT": "9000",
            "CPERSONA_DECAY_RATE": "1e-3",
        }
    )
    assert (s.rrf_k, s.vector_min_similarity, s.http_port, s.decay_rate) == (42, 0.45, 9000, 0.001)


@pytest.mark.parametrize("raw", ["abc", "80.5", "8o", "0x50", "65536", "0", "-1"])
def test_bad_port_stops_startup(raw: str) -> None:
    assert bad({"CPERSONA_HTTP_PORT": raw}) == f"CPERSONA_HTTP_PORT={raw!r} is not valid: expected an integer 1..65535"


@pytest.mark.parametrize("raw", ["sixty", "6.5", "1,000"])
def test_unparseable_integer_stops_startup(raw: str) -> None:
    assert bad({"CPERSONA_RRF_K": raw}) == f"CPERSONA_RRF_K={raw!r} is not valid: expected an integer"


@pytest.mark.parametrize("raw", ["high", "nan", "inf", "0.3.1"])
def test_unparseable_float_stops_startup(raw: str) -> None:
    message = bad({"CPERSONA_VECTOR_MIN_SIMILARITY": raw})
    assert message.startswith(f"CPERSONA_VECTOR_MIN_SIMILARITY={raw!r} is not valid: expected a number")


def test_empty_number_means_default() -> None:
    assert load_settings({"CPERSONA_RRF_K": "", "CPERSONA_HTTP_PORT": " "}).rrf_k == 60


# --- clamps and range errors (spec §8 tables) -------------------------------


@pytest.mark.parametrize(
    ("var", "raw", "field", "expected"),
    [
        ("CPERSONA_MAX_MEMORIES", "0", "max_memories", 10000),  # < 1 → default, not 1
        ("CPERSONA_MAX_MEMORIES", "-5", "max_memories", 10000),
        ("CPERSONA_MAX_MEMORIES", "1", "max_memories", 1),
        ("CPERSONA_RRF_K", "0", "rrf_k", 1),  # ≥ 1
        ("CPERSONA_RRF_K", "-20", "rrf_k", 1),
        ("CPERSONA_AUTOCUT_MIN_RESULTS", "1", "autocut_min_results", 2),  # min 2
        ("CPERSONA_AUTOCUT_MIN_RESULTS", "2", "autocut_min_results", 2),
        ("CPERSONA_AUTOCUT_MIN_RESULTS", "7", "autocut_min_results", 7),
        ("CPERSONA_PROXY_MAX_INFLIGHT", "0", "proxy_max_inflight", 1),  # < 1 → 1
        ("CPERSONA_EMBEDDING_CACHE_SIZE", "-1", "embedding_cache_size", 0),
        ("CPERSONA_NEAR_DUPLICATE_ROW_CAP", "1", "near_duplicate_row_cap", 2),
        ("CPERSONA_CALIBRATE_MAX_SAMPLE", "0", "calibrate_max_sample", 1),
        ("CPERSONA_VECTOR_REACH", "-3", "vector_reach", 0),
        ("CPERSONA_PRIOR_FAR_WEIGHT", "1.5", "prior_far_weight", 1.0),  # [0, 1]
        ("CPERSONA_PRIOR_FAR_WEIGHT", "-0.2", "prior_far_weight", 0.0),
        ("CPERSONA_PRIOR_AGE_FLOOR", "0.4", "prior_age_floor", 0.4),
        ("CPERSONA_RECONSTRUCT_MAX_COUNT", "0", "reconstruct_max_count", 1),
    ],
)
def test_clamps(var: str, raw: str, field: str, expected: float) -> None:
    assert getattr(load_settings({var: raw}), field) == expected


@pytest.mark.parametrize(
    ("var", "raw", "expected"),
    [
        ("CPERSONA_MAX_CONTENT_LENGTH", "0", "an integer >= 1"),  # §8.1: no "unlimited"
        ("CPERSONA_MAX_CONTENT_LENGTH", "-1", "an integer >= 1"),
        ("CPERSONA_MAX_PROFILE_LENGTH", "0", "an integer >= 1"),
        ("CPERSONA_HTTP_MAX_BODY_BYTES", "0", "an integer >= 1"),
    ],
)
def test_startup_errors_for_values_below_their_minimum(var: str, raw: str, expected: str) -> None:
    assert bad({var: raw}) == f"{var}={raw!r} is not valid: expected {expected}"


def test_content_length_of_one_is_allowed() -> None:
    assert load_settings({"CPERSONA_MAX_CONTENT_LENGTH": "1"}).max_content_length == 1


def test_keyword_arguments_get_the_same_clamps() -> None:
    assert Settings(rrf_k=0, max_memories=0).rrf_k == 1
    assert Settings(max_memories=0).max_memories == 10000
    with pytest.raises(ConfigError, match="CPERSONA_MAX_CONTENT_LENGTH"):
        Settings(max_content_length=0)


@pytest.mark.parametrize(("raw", "expected"), [("0.9", 0.9), ("1", 1.0), ("95", 0.95), ("100", 1.0)])
def test_calibrate_percentile_accepts_fraction_or_percent(raw: str, expected: float) -> None:
    assert load_settings({"CPERSONA_CALIBRATE_PERCENTILE": raw}).calibrate_percentile == pytest.approx(expected)


@pytest.mark.parametrize("raw", ["0", "-0.5", "150"])
def test_calibrate_percentile_out_of_range_stops_startup(raw: str) -> None:
    assert "CPERSONA_CALIBRATE_PERCENTILE" in bad({"CPERSONA_CALIBRATE_PERCENTILE": raw})


# --- combinations that are start-up errors (spec §8.3, §8.4, T-7 step 1) ----


@pytest.mark.parametrize(
    ("env", "var"),
    [
        ({"CPERSONA_RECONSTRUCT_DEFAULT_COUNT": "11"}, "CPERSONA_RECONSTRUCT_DEFAULT_COUNT"),
        (
            {"CPERSONA_RECONSTRUCT_MAX_COUNT": "3", "CPERSONA_RECONSTRUCT_FORCED_COUNT": "4"},
            "CPERSONA_RECONSTRUCT_FORCED_COUNT",
        ),
        ({"CPERSONA_RECONSTRUCT_TAIL_QUOTE_CHARS": "0"}, "CPERSONA_RECONSTRUCT_TAIL_QUOTE_CHARS"),
        ({"CPERSONA_RECONSTRUCT_TAIL_QUOTE_CHARS": "801"}, "CPERSONA_RECONSTRUCT_TAIL_QUOTE_CHARS"),
        ({"CPERSONA_RECONSTRUCT_MAX_BUDGET": "499"}, "CPERSONA_RECONSTRUCT_MAX_BUDGET"),
        ({"CPERSONA_RECONSTRUCT_DEFAULT_BUDGET": "20001"}, "CPERSONA_RECONSTRUCT_DEFAULT_BUDGET"),
        ({"CPERSONA_RECONSTRUCT_DEFAULT_BUDGET": "499"}, "CPERSONA_RECONSTRUCT_DEFAULT_BUDGET"),
        ({"CPERSONA_RECONSTRUCT_FORCED_BUDGET": "100"}, "CPERSONA_RECONSTRUCT_FORCED_BUDGET"),
        (
            {"CPERSONA_BLOCK_BUILD_ENABLED": "false", "CPERSONA_BLOCK_RETRIEVAL_ENABLED": "true"},
            "CPERSONA_BLOCK_RETRIEVAL_ENABLED",
        ),
    ],
)
def test_invalid_combinations_stop_startup(env: dict[str, str], var: str) -> None:
    assert bad(env).startswith(f"{var}=")


def test_valid_reconstruct_overrides_are_kept() -> None:
    s = load_settings(
        {
            "CPERSONA_RECONSTRUCT_FORCED_COUNT": "10",
            "CPERSONA_RECONSTRUCT_FORCED_BUDGET": "900",
            "CPERSONA_RECONSTRUCT_QUOTE_CHARS": "0",
            "CPERSONA_RECONSTRUCT_TAIL_QUOTE_CHARS": "0",
        }
    )
    assert (s.reconstruct_forced_count, s.reconstruct_forced_budget) == (10, 900)
    assert s.reconstruct_tail_quote_chars == 0  # quotes off: the tail size no longer matters
    # With previews off the budget floor is 1, so a tiny forced budget is allowed.
    off = load_settings({"CPERSONA_RECALL_PREVIEW_CHARS": "0", "CPERSONA_RECONSTRUCT_FORCED_BUDGET": "1"})
    assert off.reconstruct_forced_budget == 1


# --- OAuth lists (spec OA-1, OA-2) ------------------------------------------


def test_oauth_lists_split_on_spaces_and_commas() -> None:
    s = load_settings(
        {
            "CPERSONA_OAUTH_RESOURCE": " https://memory.example.com/mcp ",
            "CPERSONA_OAUTH_AUTHORIZATION_SERVERS": "https://auth.example.com, https://login.example.org\n",
            "CPERSONA_OAUTH_SCOPES": "memory.read,memory.write",
        }
    )
    assert s.oauth_resource == "https://memory.example.com/mcp"
    assert s.oauth_authorization_servers == ("https://auth.example.com", "https://login.example.org")
    assert s.oauth_scopes == ("memory.read", "memory.write")
    assert s.oauth_enabled is True


def test_oauth_needs_resource_and_server() -> None:
    assert load_settings({"CPERSONA_OAUTH_RESOURCE": "https://m.example/mcp"}).oauth_enabled is False
    assert load_settings({"CPERSONA_OAUTH_AUTHORIZATION_SERVERS": "https://a.example"}).oauth_enabled is False


@pytest.mark.parametrize(
    ("var", "raw"),
    [
        ("CPERSONA_OAUTH_RESOURCE", "memory.example.com/mcp"),
        ("CPERSONA_OAUTH_AUTHORIZATION_SERVERS", "https://ok.example ftp://bad.example"),
        ("CPERSONA_OAUTH_SCOPES", 'read "write"'),
        ("CPERSONA_OAUTH_SCOPES", "read wr\\ite"),
    ],
)
def test_bad_oauth_values_stop_startup(var: str, raw: str) -> None:
    assert var in bad({var: raw})


# --- paths --------------------------------------------------------------------


def test_relative_db_path_resolves_against_working_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    s = load_settings({"CPERSONA_DB_PATH": "sub/mem.db"})
    assert s.db_file == tmp_path / "sub" / "mem.db"
    assert s.db_file.is_absolute()
    assert s.calibration_sidecar == tmp_path / "sub" / "mem.db.calibration.json"
    assert s.update_check_cache == tmp_path / "sub" / "update-check.json"  # spec FS-3
    assert s.alias_ledger_path == tmp_path / "sub" / "alias_ledger.json"
    assert load_settings({}).db_file == tmp_path / "data" / "cpersona.db"


def test_absolute_db_path_is_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "abs" / "x.db"
    monkeypatch.chdir(os.path.dirname(tmp_path))
    s = load_settings({"CPERSONA_DB_PATH": str(target)})
    assert s.db_file == target
    assert str(s.calibration_sidecar) == f"{target}.calibration.json"


def test_empty_db_path_means_default() -> None:
    assert load_settings({"CPERSONA_DB_PATH": ""}).db_path == Path("data/cpersona.db")


def test_alias_ledger_file_overrides_location(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.json"
    assert load_settings({"CPERSONA_ALIAS_LEDGER_FILE": str(ledger)}).alias_ledger_path == ledger


def test_operating_context_path_expands_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    assert load_settings({}).operating_context_path == tmp_path / ".cpersona" / "operating-context.toml"
    s = load_settings({"CPERSONA_OPERATING_CONTEXT_PATH": "~/oc.toml"})
    assert s.operating_context_path == tmp_path / "oc.toml"


@pytest.mark.parametrize(
    ("raw", "enabled"), [(None, True), ("off", False), ("OFF", False), ("on", True), ("false", True)]
)
def test_operating_context_kill_switch_is_only_off(raw: str | None, enabled: bool) -> None:
    # spec §8.8 / open point 2: only `off` disables; other words leave it on.
    env = {} if raw is None else {"CPERSONA_OPERATING_CONTEXT": raw}
    assert load_settings(env).operating_context_enabled is enabled


def test_env_name() -> None:
    assert env_name("http_port") == "CPERSONA_HTTP_PORT"
