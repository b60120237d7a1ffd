"""The embedding client against a real local HTTP server (tests/embed_server.py).

No HTTP mocks: every test sends real requests over 127.0.0.1 and the server
counts what it received.
"""

from __future__ import annotations

import json
import math
import socket
import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest
from embed_server import EmbedServer, embed_server, embed_text  # noqa: F401 - fixture

from cpersona.config import load_settings
from cpersona.embedding.client import Embedder, build_embedder
from cpersona.embedding.validate import MAX_RESPONSE_BYTES
from cpersona.embedding.vectors import VectorError, from_blob, to_blob

# --------------------------------------------------------------------- helpers


def http_embedder(server: EmbedServer, **env: str) -> Embedder:
    environ = {"CPERSONA_EMBEDDING_MODE": "http", "CPERSONA_EMBEDDING_URL": server.url}
    environ.update(env)
    embedder = build_embedder(load_settings(environ))
    assert embedder is not None
    return embedder


def api_embedder(server: EmbedServer, **env: str) -> Embedder:
    environ = {"CPERSONA_EMBEDDING_MODE": "api", "CPERSONA_EMBEDDING_API_URL": server.api_url}
    environ.update(env)
    embedder = build_embedder(load_settings(environ))
    assert embedder is not None
    return embedder


def expected_blob(text: str, dimension: int = 64) -> bytes:
    return np.asarray(embed_text(text, dimension), dtype="<f4").tobytes()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def client(embed_server: EmbedServer):  # noqa: F811 - pytest fixture injection
    embedder = http_embedder(embed_server)
    yield embedder
    embedder.close()


# ------------------------------------------------------------------ mode none


def test_mode_none_builds_no_client():
    # spec EMB-7: mode none never contacts anything — there is no client at all.
    assert build_embedder(load_settings({})) is None
    assert build_embedder(load_settings({"CPERSONA_EMBEDDING_MODE": "none"})) is None


def test_unsupported_mode_is_refused():
    # spec EMB-7: an unsupported mode stops the server at startup.
    with pytest.raises(ValueError, match="CPERSONA_EMBEDDING_MODE=gpu is not supported"):
        build_embedder(SimpleNamespace(embedding_mode="gpu"))


# ------------------------------------------------------------------ http mode


def test_http_embed_returns_float32_blob_of_the_backend_vector(client, embed_server):
    # spec EMB-1, EMB-5: POST {"texts": [...]}, vector stored as given, little-endian float32.
    blob = client.embed("the cat sat on the mat")
    assert blob == expected_blob("the cat sat on the mat")
    assert len(blob) == 64 * 4
    assert client.dimension == 64
    [request] = embed_server.embed_requests()
    assert request.path == "/embed"
    assert request.body == {"texts": ["the cat sat on the mat"]}
    assert request.headers["content-type"] == "application/json"


def test_similar_texts_get_similar_vectors(client):
    cat = client.embed_vector("the cat sat on the mat")
    cats = client.embed_vector("a cat sat on a mat")
    tax = client.embed_vector("quarterly tax filing deadline")
    assert float(cat @ cats) > 0.4
    assert float(cat @ tax) < float(cat @ cats) - 0.3


def test_embed_many_keeps_input_order_in_one_request(client, embed_server):
    # spec EMB-1: one vector per text, in input order.
    texts = ["alpha", "bravo charlie", "delta", "echo foxtrot golf", "alpha"]
    blobs = client.embed_many(texts)
    assert blobs == [expected_blob(t) for t in texts]
    assert len(embed_server.embed_requests()) == 1


def test_embed_many_sends_at_most_512_texts_per_request(client, embed_server):
    # spec EMB-3: a response holds at most 512 vectors, so requests are split.
    texts = [f"text number {i}" for i in range(1100)]
    blobs = client.embed_many(texts)
    sizes = [len(r.body["texts"]) for r in embed_server.embed_requests()]
    assert sizes == [512, 512, 76]
    assert blobs[0] == expected_blob("text number 0")
    assert blobs[1099] == expected_blob("text number 1099")


def test_embed_many_stops_after_a_failed_batch(client, embed_server):
    embed_server.status = 500
    blobs = client.embed_many([f"t{i}" for i in range(1100)])
    assert blobs == [None] * 1100
    assert len(embed_server.embed_requests()) == 1


def test_embed_many_of_nothing_sends_nothing(client, embed_server):
    assert client.embed_many([]) == []
    assert embed_server.embed_requests() == []


def test_a_lone_surrogate_is_sent_escaped_not_crashed(client, embed_server):
    text = "broken \ud800 text"
    assert client.embed(text) == expected_blob(text)


def test_a_non_string_gives_no_vector_and_no_request(client, embed_server):
    assert client.embed(42) is None  # type: ignore[arg-type]
    assert embed_server.embed_requests() == []


def test_concurrent_calls_share_one_client(client, embed_server):
    texts = [f"thread text {i}" for i in range(16)]
    results: dict[str, bytes | None] = {}

    def work(text: str) -> None:
        results[text] = client.embed(text)

    threads = [threading.Thread(target=work, args=(t,)) for t in texts]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == {t: expected_blob(t) for t in texts}


# ---------------------------------------------------------------------- cache


def test_cache_hit_makes_no_request(client, embed_server):
    # spec EMB-4: single-text calls are cached; a hit makes no request.
    first = client.embed_query("what did we decide about the launch")
    second = client.embed_query("what did we decide about the launch")
    assert second.blob == first.blob is not None
    assert len(embed_server.embed_requests()) == 1
    assert first.outcome.attempted and not first.outcome.from_cache
    # spec ADV-2: a cache hit is no observation of the backend.
    assert second.outcome.from_cache and not second.outcome.attempted and second.outcome.ok


def test_cache_size_zero_turns_caching_off(embed_server):
    embedder = http_embedder(embed_server, CPERSONA_EMBEDDING_CACHE_SIZE="0")
    embedder.embed("same text")
    embedder.embed("same text")
    assert len(embed_server.embed_requests()) == 2


def test_cache_entries_expire_after_the_ttl(embed_server):
    # spec EMB-4: TTL 300 s by default; a fake clock moves time.
    now = [1000.0]
    embedder = Embedder(mode="http", url=embed_server.url, cache_size=256, cache_ttl=300, clock=lambda: now[0])
    embedder.embed("query")
    now[0] += 299
    embedder.embed("query")
    assert len(embed_server.embed_requests()) == 1
    now[0] += 2
    embedder.embed("query")
    assert len(embed_server.embed_requests()) == 2


def test_cache_evicts_the_least_recently_used_entry(embed_server):
    embedder = Embedder(mode="http", url=embed_server.url, cache_size=2)
    embedder.embed("a")
    embedder.embed("b")
    embedder.embed("a")  # hit: "b" is now the least recently used
    embedder.embed("c")  # evicts "b"
    embedder.embed("a")  # still cached
    assert [r.body["texts"] for r in embed_server.embed_requests()] == [["a"], ["b"], ["c"]]
    embedder.embed("b")
    assert len(embed_server.embed_requests()) == 4


def test_embed_many_does_not_read_the_cache(client, embed_server):
    client.embed("cached")
    client.embed_many(["cached"])
    assert len(embed_server.embed_requests()) == 2


# -------------------------------------------------------- response validation


def _vectors(payload):
    return payload["embeddings"]


VIOLATIONS = {
    "not an object": lambda p: _vectors(p),
    "no embeddings key": lambda p: {"vectors": _vectors(p)},
    "embeddings not a list": lambda p: {"embeddings": {"0": _vectors(p)[0]}},
    "fewer vectors than texts": lambda p: {"embeddings": _vectors(p)[:-1]},
    "more vectors than texts": lambda p: {"embeddings": _vectors(p) + _vectors(p)[:1]},
    "more than 512 vectors": lambda p: {"embeddings": [_vectors(p)[0]] * 513},
    "empty vector": lambda p: {"embeddings": [[]] + _vectors(p)[1:]},
    "vector not a list": lambda p: {"embeddings": ["0.1"] + _vectors(p)[1:]},
    "wider than 16384": lambda p: {"embeddings": [[0.001] * 16385] * len(_vectors(p))},
    "boolean element": lambda p: {"embeddings": [[True] + v[1:] for v in _vectors(p)]},
    "string element": lambda p: {"embeddings": [["0.5"] + v[1:] for v in _vectors(p)]},
    "null element": lambda p: {"embeddings": [[None] + v[1:] for v in _vectors(p)]},
    "NaN": lambda p: {"embeddings": [[math.nan] + v[1:] for v in _vectors(p)]},
    "Infinity": lambda p: {"embeddings": [[math.inf] + v[1:] for v in _vectors(p)]},
    "beyond float32": lambda p: {"embeddings": [[1e39] + v[1:] for v in _vectors(p)]},
    "integer beyond float": lambda p: {"embeddings": [[10**400] + v[1:] for v in _vectors(p)]},
    "ragged widths": lambda p: {"embeddings": [_vectors(p)[0], _vectors(p)[1][:-1]]},
}


@pytest.mark.parametrize("violation", sorted(VIOLATIONS))
def test_every_contract_violation_gives_no_vector(violation, client, embed_server):
    # spec EMB-3: any violation makes the call produce nothing.
    embed_server.mutate = VIOLATIONS[violation]
    assert client.embed_many(["first text", "second text"]) == [None, None]
    assert client.embed("first text") is None
    health = client.health
    assert health.consecutive_failures == 2
    assert health.last_error.startswith(f"mode=http / POST {embed_server.url} failed: ")
    # Nothing accepted, so no width was fixed either.
    assert client.dimension is None


def test_a_violation_is_named_in_the_evidence(client, embed_server):
    embed_server.mutate = VIOLATIONS["boolean element"]
    client.embed("x")
    assert "EmbeddingResponseError: vector 0 holds a boolean" in client.health.last_error


def test_widest_allowed_vector_is_accepted(client, embed_server):
    # spec EMB-3: ≤ 16,384 wide is fine.
    embed_server.mutate = lambda p: {"embeddings": [[0.001] * 16384]}
    blob = client.embed("wide")
    assert blob is not None and len(blob) == 16384 * 4


def test_invalid_json_gives_no_vector(client, embed_server):
    embed_server.raw_body = b'{"embeddings": [[0.1, 0.2]'
    assert client.embed("x") is None
    assert "not valid JSON" in client.health.last_error


@pytest.mark.parametrize("status", [404, 500, 503])
def test_non_2xx_gives_no_vector(status, client, embed_server):
    embed_server.status = status
    assert client.embed("x") is None
    assert f"HTTPStatusError: {status}" in client.health.last_error


def test_later_response_of_another_width_is_rejected(client, embed_server):
    # spec EMB-3: every vector of one process shares the first accepted width.
    assert client.embed("first") is not None
    embed_server.dimension = 32
    assert client.embed("second") is None
    assert client.embed_many(["third", "fourth"]) == [None, None]
    assert client.dimension == 64
    assert "this process accepted 64" in client.health.last_error
    embed_server.dimension = 64
    assert client.embed("fifth") == expected_blob("fifth")


def test_first_width_is_whatever_the_backend_sends(embed_server):
    embed_server.dimension = 384
    embedder = http_embedder(embed_server)
    assert len(embedder.embed("x")) == 384 * 4
    assert embedder.dimension == 384


# ---------------------------------------------------------------- body budget


def _padded_body(total: int) -> bytes:
    head = json.dumps({"embeddings": [embed_text("x")]}).encode()
    return head + b" " * (total - len(head))


def test_declared_body_over_64_mib_is_refused_before_reading(client, embed_server):
    # spec EMB-3: body size ≤ 64 MiB, declared ...
    embed_server.declared_length = MAX_RESPONSE_BYTES + 1
    started = time.monotonic()
    assert client.embed("x") is None
    assert time.monotonic() - started < 2
    assert "declares" in client.health.last_error


def test_received_body_over_64_mib_is_refused(client, embed_server):
    # spec EMB-3: ... and received (no Content-Length: counted while streaming).
    embed_server.omit_length = True
    embed_server.raw_body = _padded_body(MAX_RESPONSE_BYTES + 1)
    assert client.embed("x") is None
    assert "runs past" in client.health.last_error


def test_body_of_exactly_64_mib_is_accepted(client, embed_server):
    embed_server.omit_length = True
    embed_server.raw_body = _padded_body(MAX_RESPONSE_BYTES)
    assert client.embed("x") == expected_blob("x")


def test_smaller_cap_applies_to_streamed_bodies(embed_server):
    embedder = Embedder(mode="http", url=embed_server.url, max_response_bytes=4096)
    embed_server.omit_length = True
    embed_server.raw_body = _padded_body(4097)
    assert embedder.embed("x") is None
    embed_server.raw_body = _padded_body(4096)
    assert embedder.embed("x") == expected_blob("x")


# ------------------------------------------------------------ timeouts, down


def test_slow_backend_times_out_within_the_timeout(embed_server):
    # spec EMB-3: a timeout produces nothing; CPERSONA_EMBEDDING_TIMEOUT_SECS bounds it.
    embedder = http_embedder(embed_server, CPERSONA_EMBEDDING_TIMEOUT_SECS="1")
    embed_server.delay = 4
    started = time.monotonic()
    result = embedder.embed_query("slow")
    elapsed = time.monotonic() - started
    assert result.blob is None
    assert 0.9 <= elapsed < 2.0
    assert result.outcome.attempted and "ReadTimeout" in result.outcome.error
    assert len(embed_server.embed_requests()) == 1  # no retry


def test_dripping_body_is_cut_near_the_timeout(embed_server):
    embedder = http_embedder(embed_server, CPERSONA_EMBEDDING_TIMEOUT_SECS="1")
    embed_server.drip = (16, 0.25)  # a ~1.4 kB body would take ~20 s
    started = time.monotonic()
    assert embedder.embed("drip") is None
    assert time.monotonic() - started < 2.5


def test_server_down_gives_no_vector_and_health_records_it():
    # spec EMB-3 (transport error → nothing), ADV-4 (evidence format).
    url = f"http://127.0.0.1:{free_port()}/embed"
    embedder = build_embedder(load_settings({"CPERSONA_EMBEDDING_MODE": "http", "CPERSONA_EMBEDDING_URL": url}))
    result = embedder.embed_query("anyone there")
    assert result.blob is None and result.vector is None
    assert result.outcome.attempted and not result.outcome.misconfigured
    assert result.outcome.error.startswith(f"mode=http / POST {url} failed: ConnectError: ")
    assert embedder.embed("again") is None
    health = embedder.health
    assert health.consecutive_failures == 2
    assert health.last_error.startswith(f"mode=http / POST {url} failed: ConnectError")
    assert health.last_failure_at is not None and health.last_success_at is None
    assert health.last_failure_attempted is True
    assert embedder.probe() is False


def test_recovery_resets_the_failure_count(embed_server):
    embedder = http_embedder(embed_server)
    embed_server.status = 500
    embedder.embed("a")
    embedder.embed("b")
    assert embedder.health.consecutive_failures == 2
    embed_server.status = 200
    assert embedder.embed("c") is not None
    health = embedder.health
    assert health.consecutive_failures == 0
    assert health.last_success_at is not None and health.requests == 3


def test_credentials_in_the_url_never_reach_the_evidence():
    # spec ADV-4: the endpoint is reported without userinfo or query.
    url = f"http://user:hunter2@127.0.0.1:{free_port()}/embed?token=s3cret"
    embedder = Embedder(mode="http", url=url)
    error = embedder.embed_query("x").outcome.error
    assert "hunter2" not in error and "s3cret" not in error
    assert embedder.endpoint in error and embedder.endpoint.endswith("/embed")


def test_no_url_is_a_configuration_fault_without_any_request():
    # spec ADV-2: a call that could not be issued is "misconfigured", not "unreachable".
    embedder = build_embedder(load_settings({"CPERSONA_EMBEDDING_MODE": "http"}))
    outcome = embedder.embed_query("x").outcome
    assert not outcome.ok and not outcome.attempted and outcome.misconfigured
    assert "CPERSONA_EMBEDDING_URL is not set" in outcome.error
    assert embedder.health.requests == 0 and embedder.health.last_failure_attempted is False


def test_url_without_http_scheme_is_a_configuration_fault():
    embedder = Embedder(mode="http", url="ftp://127.0.0.1/embed")
    assert embedder.embed_query("x").outcome.misconfigured


# ---------------------------------------------------------------------- probe


def test_probe_bypasses_the_cache(client, embed_server):
    assert client.probe() is True
    assert client.probe() is True
    assert [r.body["texts"] for r in embed_server.embed_requests()] == [["test"], ["test"]]


def test_probe_uses_a_short_timeout(client, embed_server):
    embed_server.delay = 3
    started = time.monotonic()
    assert client.probe(timeout_secs=0.5) is False
    assert time.monotonic() - started < 1.5


# ------------------------------------------------------------------- api mode


def test_api_mode_sends_model_input_and_bearer_key(embed_server):
    # spec EMB-2: Bearer key, {"model", "input"}.
    embed_server.api_key = "sk-test-123"
    embedder = api_embedder(embed_server, CPERSONA_EMBEDDING_API_KEY="sk-test-123", CPERSONA_EMBEDDING_MODEL="my-model")
    assert embedder.embed("hello") == expected_blob("hello")
    [request] = embed_server.embed_requests()
    assert request.path == "/v1/embeddings"
    assert request.body == {"model": "my-model", "input": ["hello"]}
    assert request.headers["authorization"] == "Bearer sk-test-123"
    assert embedder.model_label == "my-model"


def test_api_mode_wrong_key_gives_no_vector(embed_server):
    embed_server.api_key = "sk-right"
    embedder = api_embedder(embed_server, CPERSONA_EMBEDDING_API_KEY="sk-wrong")
    assert embedder.embed("hello") is None
    assert "HTTPStatusError: 401" in embedder.health.last_error
    assert "sk-wrong" not in embedder.health.last_error


def test_api_mode_places_vectors_by_index(embed_server):
    # spec EMB-2: vectors are placed by index, not by list position.
    embed_server.api_order = "reverse"
    embedder = api_embedder(embed_server)
    texts = ["one", "two two", "three three three"]
    assert embedder.embed_many(texts) == [expected_blob(t) for t in texts]


def test_api_mode_normalises_vectors(embed_server):
    # spec EMB-2: each vector is L2-normalised before use.
    embed_server.api_scale = 7.5
    embedder = api_embedder(embed_server)
    vector = embedder.embed_vector("scaled")
    assert float(np.linalg.norm(vector)) == pytest.approx(1.0, abs=1e-6)
    assert np.allclose(vector, embed_text("scaled"), atol=1e-6)


def test_api_mode_keeps_a_near_zero_vector_as_is(embed_server):
    # spec EMB-2: ... unless its norm is ≤ 1e-9.
    embed_server.mutate = lambda p: {"data": [{"index": 0, "embedding": [0.0] * 8}]}
    embedder = api_embedder(embed_server)
    assert embedder.embed_vector("zero").tolist() == [0.0] * 8


def test_http_mode_does_not_normalise(embed_server):
    # spec EMB-1: vectors are stored as given.
    embed_server.mutate = lambda p: {"embeddings": [[3.0, 4.0]]}
    embedder = http_embedder(embed_server)
    assert embedder.embed_vector("x").tolist() == [3.0, 4.0]


def _items(payload):
    return payload["data"]


BAD_INDEX_SETS = {
    "duplicate index": lambda p: {"data": [dict(i, index=0) for i in _items(p)]},
    "indices start at 1": lambda p: {"data": [dict(i, index=i["index"] + 1) for i in _items(p)]},
    "negative index": lambda p: {"data": [dict(i, index=i["index"] - 1) for i in _items(p)]},
    "missing index": lambda p: {"data": [{"embedding": i["embedding"]} for i in _items(p)]},
    "boolean index": lambda p: {"data": [dict(i, index=bool(i["index"])) for i in _items(p)]},
    "string index": lambda p: {"data": [dict(i, index=str(i["index"])) for i in _items(p)]},
    "item not an object": lambda p: {"data": [i["embedding"] for i in _items(p)]},
    "data missing": lambda p: {"embeddings": [i["embedding"] for i in _items(p)]},
    "one item short": lambda p: {"data": _items(p)[:-1]},
}


@pytest.mark.parametrize("defect", sorted(BAD_INDEX_SETS))
def test_api_mode_bad_index_set_gives_no_vector(defect, embed_server):
    # spec EMB-2: indices must be exactly 0..n-1, otherwise the call fails.
    embed_server.mutate = BAD_INDEX_SETS[defect]
    embedder = api_embedder(embed_server)
    assert embedder.embed_many(["a", "b"]) == [None, None]


def test_api_mode_default_url_and_model():
    embedder = build_embedder(load_settings({"CPERSONA_EMBEDDING_MODE": "api"}))
    assert embedder.url == "https://api.openai.com/v1/embeddings"
    assert embedder.model_label == "text-embedding-3-small"
    embedder.close()


# ----------------------------------------------------- identity (capabilities)

GOOD_REPORT = {"identity": {"model": "hash-64", "dimensions": 64}, "incomplete": [], "fingerprint": "fp-hash-64"}


def test_http_label_is_empty_without_a_backend_identity(client, embed_server):
    # storage §6.4: '' = unknown; the default model name is never sent in http mode.
    assert client.refresh_identity(force=True) is None  # the server answers 404
    assert client.model_label == ""
    assert [r.path for r in embed_server.requests] == ["/capabilities"]


def test_http_label_is_the_backend_fingerprint(client, embed_server):
    # spec EMB-6: GET …/capabilities names the backend.
    embed_server.capabilities = GOOD_REPORT
    assert client.refresh_identity(force=True) == "fp-hash-64"
    assert client.model_label == "fp-hash-64"
    assert client.backend_model == "hash-64"


def test_http_label_falls_back_to_an_explicitly_configured_model(embed_server):
    embedder = http_embedder(embed_server, CPERSONA_EMBEDDING_MODEL="bge-m3")
    assert embedder.model_label == "bge-m3"


def test_a_learned_fingerprint_survives_a_failed_ask(client, embed_server):
    embed_server.capabilities = GOOD_REPORT
    client.refresh_identity(force=True)
    embed_server.status = 500
    assert client.refresh_identity(force=True) == "fp-hash-64"
    assert client.model_label == "fp-hash-64"


@pytest.mark.parametrize(
    "report",
    [
        {"identity": {"model": "m"}, "incomplete": ["weights"], "fingerprint": "fp"},
        {"identity": {"model": "m"}, "incomplete": [], "fingerprint": None},
        {"identity": "m", "fingerprint": "fp"},
        {"identity": {}, "fingerprint": ""},
        ["not", "an", "object"],
    ],
    ids=["fingerprint-but-incomplete", "neither", "identity-not-object", "empty-fingerprint", "list"],
)
def test_a_self_contradicting_report_is_refused(report, client, embed_server):
    embed_server.capabilities = report
    assert client.refresh_identity(force=True) is None
    assert client.model_label == ""


def test_identity_is_asked_at_most_once_per_interval(client, embed_server):
    embed_server.capabilities = GOOD_REPORT
    client.label_for_write()
    client.label_for_write()
    assert [r.path for r in embed_server.requests] == ["/capabilities"]


def test_no_capability_route_without_an_embed_url(embed_server):
    # spec EMB-6: siblings are derived only when the URL ends in /embed.
    embedder = Embedder(mode="http", url=f"{embed_server.base_url}/vectors")
    assert embedder.refresh_identity(force=True) is None
    assert embed_server.requests == []


def test_api_mode_asks_nothing_about_identity(embed_server):
    embedder = api_embedder(embed_server)
    assert embedder.refresh_identity(force=True) is None
    assert embed_server.requests == []


# --------------------------------------------------------------- blob helpers


def test_blob_roundtrip_is_little_endian_float32():
    # spec VF-5: raw little-endian IEEE-754 float32, no header.
    blob = to_blob([1.0, -2.5, 0.125])
    assert blob == b"\x00\x00\x80\x3f" + b"\x00\x00\x20\xc0" + b"\x00\x00\x00\x3e"
    assert from_blob(blob).tolist() == [1.0, -2.5, 0.125]
    assert from_blob(blob).dtype == np.dtype("<f4")


@pytest.mark.parametrize("values", [[math.nan], [1.0, math.inf], [-math.inf], [1e39], []])
def test_to_blob_refuses_what_may_not_be_stored(values):
    # spec VF-5 / EMB-5: a vector not finite in float32 is never written.
    with pytest.raises(VectorError):
        to_blob(values)


@pytest.mark.parametrize(
    "blob",
    [b"", b"\x00\x00\x80", np.array([1.0, np.nan], dtype="<f4").tobytes(), np.array([np.inf], dtype="<f4").tobytes()],
    ids=["empty", "not-multiple-of-4", "nan", "inf"],
)
def test_from_blob_refuses_corrupt_blobs(blob):
    with pytest.raises(VectorError):
        from_blob(blob)
