"""Runtime configuration: every ``CPERSONA_*`` environment variable in one place.

Settings are read once, from the process environment (or from a mapping handed
to :func:`load_settings`), never from a ``.env`` file: the MCP client that
spawns the server owns the environment, and a stray dotfile in its working
directory must not change behaviour.

A value that cannot be read stops start-up with a one-line :class:`ConfigError`
naming the variable and what it accepts. That deliberately departs from the
reference's warn-and-use-default (spec CFG-2..CFG-4): a mistyped setting that
silently falls back is a misconfiguration nobody notices.

Left out (they serve only features out of scope, spec README decision 6):
CPERSONA_DECLARED_FOLDERS, CPERSONA_FOLDER_MAX_DEPTH (folders),
CPERSONA_BLOCK_INDEX (block index file), CPERSONA_CUE_COARSE_ENABLED (coarse
index), CPERSONA_FAR_SEATS_ENABLED (far seats). No tantivy variable exists.
"""

from __future__ import annotations

import logging
import os
import re
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import SecretStr, ValidationError, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from cpersona import DISTRIBUTION
from cpersona.config_env import ENV_PREFIX, ENVIRON, ConfigError, EnvironmentSource, Rule, bad_value, env_name
from cpersona.config_env import expectation, field_kind, field_rule
from cpersona.config_env import rule_field as _f

__all__ = ["ConfigError", "EMBEDDING_MODE_NEEDS", "LEFT_OUT", "Rule", "Settings", "SECTIONS", "check_startup",
           "env_name", "field_kind", "field_rule", "load_settings", "unknown_variables",
           "warn_unknown_variables"]

log = logging.getLogger(__name__)

# Section keys → headings, in the order of spec transport-and-config §8.1–§8.8.
SECTIONS: dict[str, str] = {
    "core": "Core and storage",
    "embedding": "Embeddings and vector search",
    "recall": "Recall, fusion and scoring",
    "reconstruct": "Reconstruct",
    "calibration": "Calibration",
    "caps": "Corpus-scale caps (health and maintenance)",
    "transport": "Transport and security",
    "operator": "Operator files and update check",
}

GATE_BETA = {"strict": 2.0, "balanced": 1.0, "lenient": 0.5}

# Variables of the reference that this server does not read (see module docstring).
LEFT_OUT = ("CPERSONA_DECLARED_FOLDERS", "CPERSONA_FOLDER_MAX_DEPTH", "CPERSONA_BLOCK_INDEX",
            "CPERSONA_CUE_COARSE_ENABLED", "CPERSONA_FAR_SEATS_ENABLED")


# CPERSONA_* variables read outside the Settings model (the test suite, the
# benchmarks, CI): they are ours, so they never draw the unknown-variable warning.
READ_ELSEWHERE = ("CPERSONA_TEST_PG_URL", "CPERSONA_TEST_REFERENCE_BIN", "CPERSONA_PG_BINDIR", "CPERSONA_CI_NO_PG",
                  "CPERSONA_TEST_PG_REQUIRE_PGVECTOR", "CPERSONA_BENCH_PG_URL", "CPERSONA_TEST_MODULES_FILE",
                  "CPERSONA_TEST_DOCKER_BASE", "CPERSONA_TEST_ARTIFACTS")
READ_ELSEWHERE_PREFIXES = ("CPERSONA_BENCH_",)  # CPERSONA_BENCH_<SERVER>_PYTHON (bench/mcp_driver.py)

# What each embedding mode cannot start without: the field to set and what it
# holds. A mode without a row needs nothing (none).
EMBEDDING_MODE_NEEDS: dict[str, tuple[tuple[str, str], ...]] = {
    "http": (("embedding_url", "the embedding server's endpoint, e.g. http://127.0.0.1:8401/embed"),),
    "api": (("embedding_api_key", "the service's API key (any value for a server that takes none)"),),
}


# Section shorthands keep the field table readable.
CORE, EMB, REC, RX, CAL, CAPS, NET, OPS = SECTIONS

OAUTH_SCOPE_CHARS = re.compile(r"[!#-\[\]-~]+")  # printable ASCII without " and \


class Settings(BaseSettings):
    """Every setting of the server, typed and validated. Build with load_settings()."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore", env_file=None)

    # --- §8.1 core and storage ---
    db_path: Path = _f(Path("data/cpersona.db"), CORE, "SQLite database file. A relative path is taken from the server's working directory; give an absolute path so every session finds the same memories. Calibration sidecar, update-check cache and alias ledger sit beside it.")
    database_url: str | None = _f(None, CORE, "SQLAlchemy URL of a PostgreSQL database to use instead of the SQLite file (unset: SQLite at CPERSONA_DB_PATH).")
    write_lock_wait_seconds: float = _f(30.0, CORE, "How long a write waits while another writer holds the write lock (another process, or one batch of an import or merge) before it answers \"the database is busy\" and writes nothing.", lo=1, hi=3600, out_of_range="error")
    max_content_length: int = _f(16000, CORE, "Longest memory or episode summary kept, in characters; longer text is cut. A health fix also cuts stored rows to this length.", lo=1, out_of_range="error")
    max_profile_length: int = _f(2000, CORE, "Longest profile row kept, in characters (profiles are never shortened for previews).", lo=1, out_of_range="error")
    max_metadata_length: int = _f(8000, CORE, "Longest serialized `source` or `metadata` a write may carry; a longer one refuses the write.", lo=1, out_of_range="error")
    fts_enabled: bool = _f(True, CORE, "Keep and search the full-text (FTS5 trigram) indexes.")
    task_queue_enabled: bool = _f(True, CORE, "Run the database-backed background task queue (survives restarts).")
    task_max_retries: int = _f(3, CORE, "Attempts a failing queued task gets before it is dropped.", lo=1)
    task_retry_delay: int = _f(30, CORE, "Seconds to wait before a failed task is tried again.", lo=0, out_of_range="error")
    export_dir: Path | None = _f(None, CORE, "Directory that export and import paths must stay inside. Unset: over stdio any path without `..` segments; over streamable HTTP `<database directory>/exports/`. Either way the server's own files, non-regular files, symlinks and files that are not exports are never written over.")
    max_import_bytes: int = _f(104857600, CORE, "Largest file an import will read, in bytes.", lo=1, out_of_range="error")
    future_timestamp_skew_seconds: int = _f(300, CORE, "How far past the server clock a caller-supplied timestamp may point before it counts as wrong.", lo=0, out_of_range="error")
    future_timestamp_mode: Literal["warn", "reject", "off"] = _f("warn", CORE, "Timestamps beyond that allowance: `warn` stores and reports them, `reject` refuses the write, `off` stores silently. Imports always store.")
    external_context_mode: Literal["warn", "reject", "off"] = _f("warn", CORE, "`recall_with_context` entries with a non-string declared field: `warn` ignores the field and reports it, `reject` refuses the call, `off` ignores it without a report.")
    logical_directory: bool = _f(False, CORE, "Offer the read-only directory-style view (`path`) on `list_memories`.")
    scope_stats_cache: bool = _f(True, CORE, "Cache per-scope statistics that recall scoring reads.")
    scope_stats_ttl_seconds: float = _f(60.0, CORE, "Seconds a cached scope statistic may be reused while other processes write (0: never reused).", lo=0, out_of_range="error")

    # --- §8.2 embeddings and vector search ---
    embedding_mode: Literal["none", "http", "api", "local"] = _f("none", EMB, f"Where vectors come from: `none` (keyword search only), `http` (an embedding server such as `cpersona embed-server`), `api` (an OpenAI-compatible service; billed per request at the default URL), `local` (the model runs inside this process; needs `pip install '{DISTRIBUTION}[local]'`).", alias="EMBEDDING_MODE")
    embedding_url: str | None = _f(None, EMB, "Embedding server endpoint for `http` mode, e.g. `http://127.0.0.1:8401/embed`.", alias="EMBEDDING_HTTP_URL")
    embedding_api_url: str = _f("https://api.openai.com/v1/embeddings", EMB, "Endpoint for `api` mode.", alias="EMBEDDING_API_URL")
    embedding_api_key: SecretStr | None = _f(None, EMB, "Bearer key sent in `api` mode.", alias="EMBEDDING_API_KEY")
    embedding_model: str = _f("text-embedding-3-small", EMB, "Model name requested in `api` mode; reported by health and calibration only when set or in `api` mode.", alias="EMBEDDING_MODEL")
    embedding_model_mode: Literal["warn", "reject", "off"] = _f("warn", EMB, "Rows whose vector came from another model: `warn` reports them in health, `reject` treats them as unembedded, `off` ignores the label.")
    embedding_timeout_secs: int = _f(30, EMB, "Timeout of one embedding request, in seconds.", lo=1, out_of_range="error")
    embedding_cache_size: int = _f(256, EMB, "Entries in the in-memory embedding cache (0 turns it off).", lo=0)
    embedding_cache_ttl: int = _f(300, EMB, "Seconds an embedding stays in that cache.", lo=0, out_of_range="error")
    # `local` mode (and `cpersona embed-server`, `cpersona fetch-model`): the in-process model.
    embedding_local_model: str = _f("all-MiniLM-L6-v2", EMB, "Model profile of `local` mode: `all-MiniLM-L6-v2` (English), `bge-small-en-v1.5` (English) or `multilingual-e5-small` (Japanese and other languages). Ignored when CPERSONA_EMBEDDING_MODEL_PATH is set.")
    embedding_model_path: Path | None = _f(None, EMB, "Model folder for `local` mode (the ONNX file, `tokenizer.json` and `cpersona-model.json`); unset: the profile's folder in the cache, fetched on first use.")
    embedding_cache_dir: Path | None = _f(None, EMB, "Folder that holds fetched models, one subfolder per profile.", shown="$XDG_CACHE_HOME/cpersona/models (~/.cache/cpersona/models)")
    embedding_model_source: str | None = _f(None, EMB, "URL of a folder laid out like a cached model folder (e.g. another machine's cache served on your network) to fetch models from instead of the Hugging Face hub.")
    embedding_threads: int = _f(2, EMB, "CPU threads one forward pass of the local model may use.", lo=1, hi=64)
    vector_search_mode: Literal["local", "remote"] = _f("local", EMB, "Run vector search in-process (`local`) or hand it to the embedding service's index (`remote`).")
    store_blob: bool = _f(True, EMB, "Keep a local copy of each vector in `remote` mode, so search still works when the remote index is down.")
    remote_search_timeout_secs: float = _f(5.0, EMB, "Timeout of a remote search call, in seconds.", lo=0, out_of_range="error")
    remote_index_timeout_secs: float = _f(10.0, EMB, "Timeout of remote index, remove and purge calls, in seconds.", lo=0, out_of_range="error")
    vector_min_similarity: float = _f(0.3, EMB, "Cosine similarity a vector match needs until calibration sets a threshold.")
    degraded_advisory: bool = _f(True, EMB, "Add an `advisory` to recall answers while embeddings are unavailable.")
    max_memories: int = _f(10000, EMB, "How many of the newest rows in scope the vector search ranks per recall (a search window, not a storage limit).", lo=1, out_of_range="default")
    vector_reach: int = _f(0, EMB, "Total rows vector search may consider. Only a value above CPERSONA_MAX_MEMORIES has an effect: the rows in between form a second ranked list fused beside the first (local search, rrf/rsf). On SQLite that list is read through the coarse index (one sign bit per dimension, best candidates re-ranked by exact cosine), and each server process scans its own in-memory copy of that index (sign bits and scope codes, ~105 bytes a row: ~11 MB at 100k rows, ~104 MB at 1M), so a reach of the whole corpus (e.g. 1000000000) cost ~4 ms of CPU a recall at 100k rows and ~37 ms at 1M (its candidate proposal alone 14 ms since the fourth round) on the 2-core benchmark machine. With that copy loaded the exact window (CPERSONA_MAX_MEMORIES) is also scored on float vectors the process holds for it (~1.5 KB a row of the window: ~15 MB for 10,000 rows at 384-d), with the same answer as the SQL scan, so at 100k rows a whole-corpus reach costs less recall CPU than 0 (docs/benchmarks.md, Scale, fourth round). Stays 0 by default: on PostgreSQL the same value builds HNSW indexes that slow every vector write.", lo=0)
    vector_far_limit: int = _f(0, EMB, "Rows of that second list passed to fusion: 0 means the response limit, N means at most min(limit, N).", lo=0)
    vector_scan_chunk_rows: int = _f(512, EMB, "Rows per block in the fallback vector scan; bounds memory use, not speed.", lo=1)
    vector_index_max_excluded_ids: int = _f(10000, EMB, "How many rows the contiguous vector index may list as holes; with more, the index is not built and recall scans the table.", lo=0, also=("caps",))

    # --- §8.3 recall, fusion and scoring ---
    recall_mode: Literal["rrf", "rsf", "cascade"] = _f("rrf", REC, "How keyword and vector results are merged: `rrf` by rank, `rsf` by per-query normalised score (better for text without spaces, such as Japanese), `cascade` the older fill-in-turn method.")
    rrf_k: int = _f(60, REC, "Smoothing constant of rank fusion.", lo=1)
    rrf_threshold_factor: float = _f(0.5, REC, "Multiplier on the vector threshold when a fusion mode admits candidates.")
    recall_preview_chars: int = _f(500, REC, "Characters of each recalled row shown in the preview tier. Full-content answers are capped at 200,000 characters and `get_contents` at 40,000; 0 turns off the preview tier and both caps.", lo=0, out_of_range="error")
    recall_excerpt_chars: int = _f(800, REC, "Length of the query-matching excerpt attached to a row cut by the preview (0: no excerpt).", lo=0, out_of_range="error")
    recall_library_max_limit: int = _f(10000, REC, "Upper bound on a caller's `limit` inside the library (the tool schemas stop at 100).", lo=1)
    recall_depth_floor: int = _f(0, REC, "Minimum depth of each fused list: depth is max(limit, this).", lo=0)
    recall_propagation_seat: bool = _f(False, REC, "Reserve one extra place for a row held further down a deeper ranking.")
    recall_cue_time_limit_ms: int = _f(1000, REC, "Milliseconds after which the time-cue widening step is skipped.", lo=0)
    confidence_enabled: bool = _f(False, REC, "Compute a confidence score for every returned row.")
    confidence_ordering: Literal["fusion", "legacy"] = _f("fusion", REC, "`fusion`: confidence is reported beside rows and neither orders nor filters them; `legacy`: it re-sorts and gates them as in 2.5.")
    cosine_floor: float = _f(0.20, REC, "Cosine similarity that maps to the bottom of the confidence scale.")
    cosine_ceil: float = _f(0.75, REC, "Cosine similarity that maps to the top of the confidence scale.")
    decay_rate: float = _f(0.005, REC, "Hourly time decay inside confidence.")
    decay_floor: float = _f(0.3, REC, "Lowest value time decay can reach.")
    decay_ceil: float = _f(0.5, REC, "Highest value the recall boost may lift that floor to.")
    recall_boost: float = _f(0.02, REC, "Confidence boost per log(1 + times recalled).")
    boost_decay_rate: float = _f(0.002, REC, "Hourly fade of the recall boost.")
    min_time_range_hours: float = _f(24.0, REC, "Shortest corpus time span used when scaling decay, in hours.")
    reference_hours: float = _f(168.0, REC, "Time span, in hours, at which decay runs at its nominal rate.")
    resolved_decay_factor: float = _f(0.3, REC, "Multiplier applied to memories of resolved episodes.")
    recent_recall_penalty: float = _f(0.7, REC, "Multiplier for memories that were recalled a moment ago.")
    recent_recall_window_min: float = _f(5.0, REC, "Minutes during which that penalty applies.")
    autocut_enabled: bool = _f(True, REC, "Cut results at a large score gap (acts on similarity-scale scores only, so not under rrf/rsf).")
    autocut_min_gap_ratio: float = _f(0.15, REC, "Relative gap that triggers the cut.")
    autocut_min_results: int = _f(3, REC, "Result sets shorter than this are never cut.", lo=2)
    episode_penalty_enabled: bool = _f(True, REC, "Lower memories older than the latest archived episode.")
    episode_decay_rate: float = _f(0.01, REC, "Hourly growth of that penalty before the boundary.")
    episode_decay_floor: float = _f(0.5, REC, "Lowest multiplier the episode penalty reaches.")
    recall_vector_weight: float = _f(1.0, REC, "Weight of a vote from the vector near list in fusion, beside the lexical lists' 1. The gate judges vector rows by their rank whatever this weight.", lo=0, hi=1)
    recall_word_weight: float = _f(2.0, REC, "Weight of the word channel (whole words, stemmed, Latin script) where it joins the trigram ranking of each keyword list; 0 leaves the channel out.", lo=0, hi=4)
    prior_far_weight: float = _f(1.0, REC, "Weight of a vote from the second (far) vector list in fusion.", lo=0, hi=1)
    prior_age_rate: float = _f(0.0, REC, "Rate of the age prior (0 leaves scores unchanged).", lo=0)
    prior_age_floor: float = _f(0.3, REC, "Lowest multiplier the age prior reaches.", lo=0, hi=1)
    prior_age_anchor: Literal["newest", "now"] = _f("newest", REC, "Measure age from the newest row in scope (`newest`) or from the current time (`now`).")
    fused_gate_enabled: bool = _f(True, REC, "Filter fused results with the calibrated quality gate; off falls back to a cruder pool-size rule.")
    fused_gate_sample_queries: int = _f(40, REC, "Sample queries per gate calibration draw.", lo=1)
    fused_gate_calibration_draws: int = _f(5, REC, "Gate calibration draws; their median is used.", lo=1)
    recall_precision: Literal["strict", "balanced", "lenient"] = _f("balanced", REC, "How picky the gate is by default: `strict` (β 2.0), `balanced` (β 1.0), `lenient` (β 0.5).")
    fused_gate_beta: float | None = _f(None, REC, "Explicit gate β; overrides CPERSONA_RECALL_PRECISION.", lo=0, out_of_range="error", shown="from precision")
    block_build_enabled: bool = _f(True, REC, "Split stored records into clause-sized blocks in the background (needs the task queue and an embedding client).")
    block_retrieval_enabled: bool | None = _f(None, REC, "Use those blocks when quoting; cannot be on while building is off.", shown="= build setting")

    # --- §8.4 reconstruct ---
    reconstruct_max_count: int = _f(10, RX, "Most items one reconstruct may return.", lo=1)
    reconstruct_default_count: int | None = _f(None, RX, "Items returned when the caller gives no count; may not exceed the maximum.", lo=1, shown="min(10, max count)")
    reconstruct_forced_count: int | None = _f(None, RX, "Item count imposed on every call; may not exceed the maximum.", lo=1)
    reconstruct_top_k: int = _f(20, RX, "Candidates drawn from recall.", lo=1)
    reconstruct_max_hops: int = _f(2, RX, "Depth of the walk over declared relations.", lo=0)
    reconstruct_max_evidence: int = _f(40, RX, "Rows kept per item.", lo=1)
    reconstruct_adjacency_seconds: int = _f(60, RX, "Rows from one source this close in time form one item (0: never).", lo=0)
    reconstruct_quote_chars: int = _f(800, RX, "Size of the head quote of the first items (0: one governing passage instead).", lo=0)
    reconstruct_full_quotes: int = _f(5, RX, "How many items get a full-size quote.", lo=0)
    reconstruct_tail_quote_chars: int | None = _f(None, RX, "Quote size of the remaining items; must be above 0 and at most the head size when quotes are on.", lo=0, shown="min(400, quote chars)")
    reconstruct_sequence: Literal["items", "evidence", "whole"] = _f("items", RX, "What the budget admits, in order: `items` every head quote, then excerpts; `evidence` the passages of every head record, ranked by item and passage position, then excerpts; `whole` the same with records that fit shown whole first. The modes always use `whole`.")
    reconstruct_max_budget: int | None = _f(None, RX, "Largest quoted-character budget; may not be below the preview size (1 when previews are off).", shown="max(20000, preview chars)")
    reconstruct_default_budget: int | None = _f(None, RX, "Budget when the caller gives none; between the preview size and the maximum.", shown="min(max(4000, preview chars), max budget)")
    reconstruct_forced_budget: int | None = _f(None, RX, "Budget imposed on every call; same bounds as the default.")

    # --- §8.5 calibration ---
    auto_calibrate: bool = _f(False, CAL, "Calibrate the vector threshold at start-up.")
    calibrate_on_model_change: bool = _f(True, CAL, "Recalibrate at start-up when the embedding width or scoring fingerprint changed.")
    calibrate_method: Literal["separation", "percentile", "zscore"] = _f("separation", CAL, "Calibration method.")
    calibrate_sample_size: int = _f(200, CAL, "Rows sampled when the caller does not say.", lo=1)
    calibrate_max_sample: int = _f(5000, CAL, "Ceiling on any calibration sample (memory grows with its square).", lo=1, also=("caps",))
    calibrate_z_factor: float = _f(1.0, CAL, "z multiplier of the `zscore` method.")
    calibrate_floor: float = _f(0.05, CAL, "Lowest threshold calibration may set.")
    calibrate_percentile: float = _f(0.95, CAL, "Quantile used by `percentile`: a fraction in (0, 1] or a percent up to 100 (95 reads as 0.95).")
    calibrate_temporal_window_min: float = _f(30.0, CAL, "Rows stored within this many minutes of each other count as related for `separation`.")

    # --- §8.6 corpus-scale caps ---
    reembed_row_cap: int = _f(5000, CAPS, "Unembedded rows one health fix re-embeds per table; also caps the reported `repairable`.", lo=1)
    near_duplicate_row_cap: int = _f(5000, CAPS, "Embedded rows the near-duplicate deep check compares (memory grows with the square).", lo=2)
    invalid_source_classify_cap: int = _f(10000, CAPS, "Bad-source rows one check classifies and repairs; beyond it `repairable` is null.", lo=1)
    normalization_scan_cap: int = _f(10000, CAPS, "Rows per table the Unicode-normalisation deep check reads; beyond it the answer says `complete: false`.", lo=1)

    # --- §8.7 transport and security ---
    transport: Literal["stdio", "streamable-http"] = _f("stdio", NET, "`stdio` (one client owns the process) or `streamable-http` (one shared server). Set but empty also stops start-up.", empty_is_error=True)
    http_host: str = _f("127.0.0.1", NET, "Address the HTTP server binds to. Loopback is not a security boundary: tunnels and proxies reach it.")
    http_port: int = _f(8402, NET, "Port the HTTP server binds to.", lo=1, hi=65535, out_of_range="error")
    auth_token: SecretStr | None = _f(None, NET, "Bearer token every HTTP request must carry (ignored when an ACL file is set); the stdio proxy sends it too.")
    allow_unauthenticated_http: bool = _f(False, NET, "Let the HTTP transport run with no credentials at all; meant for local development only.", only_true_word=True)
    acl_file: Path | None = _f(None, NET, "Per-client permission file; anything it does not grant is denied.")
    alias_ledger_file: Path | None = _f(None, NET, "Where the server keeps its per-subject alias ledger.", shown="alias_ledger.json beside the database")
    oauth_resource: str | None = _f(None, NET, "Resource identifier published in OAuth protected-resource metadata and required as token audience; discovery stays off while unset.")
    oauth_authorization_servers: tuple[str, ...] = _f((), NET, "Issuer URLs clients should authenticate with, separated by spaces or commas; discovery stays off while none are given.")
    oauth_scopes: tuple[str, ...] = _f((), NET, "Scopes advertised in 401 challenges and metadata; list only scopes your issuer defines.")
    oauth_jwks_uri: str | None = _f(None, NET, "Signing-key URL for an issuer whose metadata cannot be read; honoured only with exactly one authorization server.")
    http_max_body_bytes: int = _f(4194304, NET, "Per-request body budget in bytes, counted as the body arrives.", lo=1, out_of_range="error")
    http_body_limit_mode: Literal["warn", "reject", "off"] = _f("warn", NET, "Over-budget bodies: `warn` serves and logs, `reject` answers 413, `off` does not count. In every mode a body larger than the largest request any tool can accept (about 51 MiB) is answered 413 without being read in full.")
    # How long and how many HTTP connections may stay open (cpersona/mcp/http_guard.py).
    http_header_timeout_secs: float = _f(10.0, NET, "Seconds a connection has to send a complete request head, counted from when it opened or its previous response ended; slow bytes do not extend it.", lo=0.1, out_of_range="error")
    http_keep_alive_timeout_secs: float = _f(5.0, NET, "Seconds an idle keep-alive connection stays open after a response.", lo=0.1, out_of_range="error")
    http_body_timeout_secs: float = _f(30.0, NET, "Longest silence, in seconds, while a request body is arriving; then the connection is closed.", lo=0.1, out_of_range="error")
    http_stream_max_secs: float = _f(300.0, NET, "Seconds after which a GET event stream is ended (the stateless server never sends on one; clients reconnect).", lo=0.1, out_of_range="error")
    http_max_connections: int = _f(0, NET, "Most HTTP connections open at once; 0 derives it from the file limit (RLIMIT_NOFILE: three quarters of what is left after 128 descriptors of reserve, at most 4096). A larger value is lowered to that bound.", lo=0, out_of_range="error", shown="from the file limit")
    remote_url: str = _f("http://localhost:8402/mcp", NET, "Server the stdio proxy forwards to.")
    proxy_max_inflight: int = _f(8, NET, "Unanswered messages the stdio proxy keeps in flight.", lo=1)
    proxy_spawn: bool = _f(False, NET, "`cpersona proxy` starts the shared HTTP server itself when nothing answers (as `--spawn`): on 127.0.0.1, a free port, a random token in a 0600 file beside the database; under `CPERSONA_ACL_FILE` it enforces that file, and each proxy presents its own `CPERSONA_AUTH_TOKEN`.")
    proxy_server_idle_seconds: float = _f(600.0, NET, "How long a server started by `cpersona proxy --spawn` keeps running with no proxy connected, in seconds (0: until stopped).", lo=0, out_of_range="error")
    http_idle_exit_seconds: float = _f(0.0, NET, "The HTTP server stops by itself after this many seconds without a request (0: never); `cpersona proxy --spawn` sets it for the server it starts.", lo=0, out_of_range="error")

    # --- §8.8 operator files and update check ---
    operating_context: str | None = _f(None, OPS, "`off` (any case) disables the operating context; any other value leaves it on.")
    operating_context_path: Path = _f(Path("~/.cpersona/operating-context.toml"), OPS, "Operating-context file; `~` is expanded.")
    update_check: bool = _f(True, OPS, "Ask the package index once per start whether a newer or withdrawn release exists (cached); false turns off the request, the cache and the notices.")
    update_check_interval_seconds: int = _f(86400, OPS, "How long a cached update verdict stays fresh, in seconds.", lo=0, out_of_range="error")
    update_check_url: str = _f(f"https://pypi.org/simple/{DISTRIBUTION}/", OPS, f"PEP 691 JSON index page the update check reads (the project page of the `{DISTRIBUTION}` distribution on PyPI by default; `cpersona` there is CPersona 2.6, another program); point it at a mirror or a private index. Only a page naming `{DISTRIBUTION}` counts.")

    def __init__(self, **values: Any) -> None:
        try:
            super().__init__(**values)
        except ValidationError as exc:
            raise ConfigError(_one_line(exc)) from None

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Keyword arguments win over the environment; no dotenv, no secrets dir.
        return init_settings, EnvironmentSource(settings_cls)

    @model_validator(mode="after")
    def _check(self) -> Settings:
        for name, info in type(self).model_fields.items():
            path = getattr(self, name)
            if field_kind(info)[0] == "path" and path is not None and path != path.expanduser():
                # MCP clients pass the environment as written, unexpanded: a
                # `~/...` from a client config must not become a `./~/` folder.
                # (Only a changed value is set: setting marks the field as given.)
                setattr(self, name, path.expanduser())
            rule = field_rule(info)
            if rule.lo is not None or rule.hi is not None:
                self._bound(name, info, rule)
        self._derive()
        return self

    def _bound(self, name: str, info: FieldInfo, rule: Rule) -> None:
        value = getattr(self, name)
        if value is None:
            return
        low = rule.lo is not None and value < rule.lo
        high = rule.hi is not None and value > rule.hi
        if not (low or high):
            return
        var = env_name(name)
        if rule.out_of_range == "error":
            raise bad_value(var, value, expectation(field_kind(info)[0], rule))
        new = info.default if rule.out_of_range == "default" else (rule.lo if low else rule.hi)
        new = type(value)(new)
        log.warning("%s=%s is out of range; using %s", var, value, new)
        setattr(self, name, new)

    def _derive(self) -> None:
        """Defaults that depend on other settings, and combinations that cannot work."""
        if self.block_retrieval_enabled is None:
            self.block_retrieval_enabled = self.block_build_enabled
        elif self.block_retrieval_enabled and not self.block_build_enabled:
            raise ConfigError("CPERSONA_BLOCK_RETRIEVAL_ENABLED='true' is not valid: "
                              "expected false while CPERSONA_BLOCK_BUILD_ENABLED is false")
        pct = self.calibrate_percentile
        if 1 < pct <= 100:
            self.calibrate_percentile = pct / 100
        elif not 0 < pct <= 1:
            raise bad_value("CPERSONA_CALIBRATE_PERCENTILE", pct, "a fraction in (0, 1] or a percent up to 100")
        self._derive_reconstruct()
        self._check_oauth()

    def _derive_reconstruct(self) -> None:
        # Spec §8.4 / T-7 step 1: these combinations are start-up errors.
        top = self.reconstruct_max_count
        if self.reconstruct_default_count is None:
            self.reconstruct_default_count = min(10, top)
        for name in ("reconstruct_default_count", "reconstruct_forced_count"):
            value = getattr(self, name)
            if value is not None and value > top:
                raise bad_value(env_name(name), value, f"an integer <= CPERSONA_RECONSTRUCT_MAX_COUNT ({top})")
        quote = self.reconstruct_quote_chars
        if self.reconstruct_tail_quote_chars is None:
            self.reconstruct_tail_quote_chars = min(400, quote)
        tail = self.reconstruct_tail_quote_chars
        if quote > 0 and not 0 < tail <= quote:
            raise bad_value("CPERSONA_RECONSTRUCT_TAIL_QUOTE_CHARS", tail,
                       f"an integer 1..{quote} (CPERSONA_RECONSTRUCT_QUOTE_CHARS)")
        floor = self.recall_preview_chars or 1
        if self.reconstruct_max_budget is None:
            self.reconstruct_max_budget = max(20000, floor)
        ceiling = self.reconstruct_max_budget
        if ceiling < floor:
            raise bad_value("CPERSONA_RECONSTRUCT_MAX_BUDGET", ceiling,
                       f"an integer >= {floor} (the preview size, CPERSONA_RECALL_PREVIEW_CHARS)")
        if self.reconstruct_default_budget is None:
            self.reconstruct_default_budget = min(max(4000, floor), ceiling)
        for name in ("reconstruct_default_budget", "reconstruct_forced_budget"):
            value = getattr(self, name)
            if value is not None and not floor <= value <= ceiling:
                raise bad_value(env_name(name), value, f"an integer {floor}..{ceiling} "
                           "(preview size .. CPERSONA_RECONSTRUCT_MAX_BUDGET)")

    def _check_oauth(self) -> None:
        # Spec OA-1/OA-2 would warn and switch discovery off; a half-working
        # OAuth setup is exactly what should not start unnoticed.
        urls = [("CPERSONA_OAUTH_RESOURCE", self.oauth_resource), ("CPERSONA_OAUTH_JWKS_URI", self.oauth_jwks_uri)]
        urls += [("CPERSONA_OAUTH_AUTHORIZATION_SERVERS", s) for s in self.oauth_authorization_servers]
        for var, url in urls:
            if url is not None and not re.fullmatch(r"https?://[^/\s?#]+(?:[/?#]\S*)?", url, re.IGNORECASE):
                raise bad_value(var, url, "an http(s) URL")
        for scope in self.oauth_scopes:
            if not OAUTH_SCOPE_CHARS.fullmatch(scope):
                raise bad_value("CPERSONA_OAUTH_SCOPES", scope, 'scope names of printable ASCII without " or \\')

    # --- derived values other modules use ---

    @property
    def db_file(self) -> Path:
        """The database file; a relative CPERSONA_DB_PATH is read from the working directory."""
        path = Path(self.db_path)
        return path if path.is_absolute() else Path(os.path.abspath(path))

    @property
    def calibration_sidecar(self) -> Path:
        return Path(f"{self.db_file}.calibration.json")

    @property
    def update_check_cache(self) -> Path:
        return self.db_file.parent / "update-check.json"

    @property
    def alias_ledger_path(self) -> Path:
        return self.alias_ledger_file or self.db_file.parent / "alias_ledger.json"

    @property
    def gate_beta(self) -> float:
        """Global gate β: the explicit value, else the named precision level's."""
        return self.fused_gate_beta if self.fused_gate_beta is not None else GATE_BETA[self.recall_precision]

    @property
    def embedding_model_configured(self) -> bool:
        """Whether CPERSONA_EMBEDDING_MODEL (or its alias) was given rather than defaulted."""
        return "embedding_model" in self.model_fields_set

    @property
    def oauth_enabled(self) -> bool:
        """Discovery (and, in ACL mode, verification) needs a resource and an issuer (spec OA-1)."""
        return bool(self.oauth_resource) and bool(self.oauth_authorization_servers)

    @property
    def operating_context_enabled(self) -> bool:
        return (self.operating_context or "").lower() != "off"


def _one_line(exc: ValidationError) -> str:
    """One stderr line out of pydantic's report: the first problem is enough to act on."""
    err = exc.errors()[0]
    cause = (err.get("ctx") or {}).get("error")
    if isinstance(cause, ConfigError):
        return str(cause)
    where = ".".join(str(p) for p in err["loc"]) or "settings"
    var = env_name(where) if where in Settings.model_fields else where
    return f"{var}={str(err.get('input'))!r} is not valid: {err['msg']}".replace("\n", " ")


def load_settings(environ: Mapping[str, str] | None = None) -> Settings:
    """Read and validate every setting; ``environ`` replaces os.environ when given.

    Raises ConfigError (one line naming the variable) for any unusable value.
    """
    token = ENVIRON.set(environ)
    try:
        return Settings()
    finally:
        ENVIRON.reset(token)


def check_startup(settings: Settings) -> None:
    """Refuse to serve a combination that cannot work, naming the variable to set.

    Kept out of load_settings(): the library and the maintenance commands build
    settings without an embedding client, so only serving needs these.
    """
    for name, what in EMBEDDING_MODE_NEEDS.get(settings.embedding_mode, ()):
        value = getattr(settings, name)
        if isinstance(value, SecretStr):
            value = value.get_secret_value()
        if not value:
            alias = field_rule(Settings.model_fields[name]).alias
            spelled = env_name(name) + (f" (or {alias})" if alias else "")
            raise ConfigError(f"CPERSONA_EMBEDDING_MODE={settings.embedding_mode} needs {spelled}: "
                              f"set it to {what}")
    # `local` also needs an installed extra and a known profile: the embedding
    # package checks those (cpersona.embedding.local_model.local_mode_problem).


def _known_variables() -> set[str]:
    known = {env_name(name) for name in Settings.model_fields}
    known.update(rule.alias for rule in map(field_rule, Settings.model_fields.values()) if rule.alias)
    return known | set(LEFT_OUT) | set(READ_ELSEWHERE)


def unknown_variables(environ: Mapping[str, str] | None = None, also_known: Iterable[str] = ()) -> list[str]:
    """One warning per CPERSONA_* variable nothing reads, with the nearest known name.

    A misspelt name is otherwise silently ignored and its default applies.
    ``also_known``: names read elsewhere at run time (an ACL file's ``${NAME}`` tokens).
    """
    environ = os.environ if environ is None else environ
    known = _known_variables() | set(also_known)
    suffixes = {var[len(ENV_PREFIX):]: var for var in known if var.startswith(ENV_PREFIX)}
    out = []
    for var in sorted(environ):
        if not var.startswith(ENV_PREFIX) or var in known or var.startswith(READ_ELSEWHERE_PREFIXES):
            continue
        import difflib  # only once a variable is unknown: a start with none never loads it

        # Matched on the part after the prefix, which every candidate shares.
        near = difflib.get_close_matches(var[len(ENV_PREFIX):], suffixes, n=1, cutoff=0.75)
        hint = f"did you mean {suffixes[near[0]]}?" if near else "see docs/configuration.md for the settings"
        out.append(f"{var} is not a cpersona setting and is ignored; {hint}")
    return out


def warn_unknown_variables(also_known: Iterable[str] = ()) -> None:
    """Log unknown_variables() of the process environment, once per start."""
    for line in unknown_variables(also_known=also_known):
        log.warning("%s", line)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args != ["--markdown"]:
        print("usage: python -m cpersona.config --markdown", file=sys.stderr)
        return 2
    from cpersona.config_docs import settings_markdown

    sys.stdout.write(settings_markdown())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
