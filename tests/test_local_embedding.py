"""CPERSONA_EMBEDDING_MODE=local: a real ONNX Runtime session on a model folder the test builds.

The model (tests/local_model_support.py) is tiny but real: an ONNX graph made
with the onnx helper API and a tokenizers WordLevel tokenizer, loaded through
the same code the server uses (settings → build_embedder → LocalEmbedder →
LocalModel). Nothing is downloaded.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import db_settings_env
from cpersona.config import ConfigError, check_startup, load_settings
from cpersona.embedding.client import build_embedder
from cpersona.embedding.local import LocalEmbedder
from cpersona.embedding.tokens import build_token_reporter, parse_entry
from cpersona.embedding.vectors import FLOAT32
from cpersona.services.app import App
from cpersona.services.records.backfill import start_backfill, stop_backfill
from cpersona.services.records.memories import store
from cpersona.services.records.vector_identity import recorded_identity
from local_model_support import build_model_folder

TEXTS = [
    "The automobile needs new tyres",
    "car wants fresh tires",
    "cat",
    "the weather is sunny today",
    "music piano guitar lesson book library reading garden tomato coffee tea morning evening",
]


def local_embedder(folder: Path, **env: str) -> LocalEmbedder:
    settings = load_settings(
        {
            "CPERSONA_EMBEDDING_MODE": "local",
            "CPERSONA_EMBEDDING_MODEL_PATH": str(folder),
            **{f"CPERSONA_{k}": v for k, v in env.items()},
        }
    )
    embedder = build_embedder(settings)
    assert isinstance(embedder, LocalEmbedder)
    return embedder


@pytest.fixture
def model_folder(tmp_path: Path) -> Path:
    return build_model_folder(tmp_path / "tiny", dimension=16)


@pytest.fixture
def embedder(model_folder: Path):
    found = local_embedder(model_folder, EMBEDDING_THREADS="1")
    yield found
    found.close()


def vector(blob: bytes | None) -> np.ndarray:
    assert blob is not None
    return np.frombuffer(blob, dtype=FLOAT32)


# -- vectors -------------------------------------------------------------------------------


def test_vectors_have_the_configured_width_and_unit_length(embedder):
    blobs = embedder.embed_many(TEXTS)
    assert [len(b) for b in blobs] == [16 * 4] * len(TEXTS)
    norms = [float(np.linalg.norm(vector(b))) for b in blobs]
    assert norms == pytest.approx([1.0] * len(TEXTS), abs=1e-5)
    assert embedder.dimension == 16


def test_equal_texts_give_equal_vectors_and_different_texts_do_not(embedder):
    first, again, other = embedder.embed_many([TEXTS[0], TEXTS[0], TEXTS[1]])
    assert first == again
    assert first != other
    # The query path (recall) and the passage path agree when the profile has no prefixes.
    assert embedder.embed_query(TEXTS[0]).blob == first


def test_a_batch_equals_single_calls(embedder):
    # Batches are sorted by length and padded: padding must not change any vector.
    batch = embedder.embed_many(TEXTS * 10)
    singles = [embedder.embed(text) for text in TEXTS]
    for position, blob in enumerate(batch):
        np.testing.assert_allclose(vector(blob), vector(singles[position % len(TEXTS)]), atol=1e-6)


def test_query_and_passage_prefixes_go_where_the_config_says(tmp_path):
    folder = build_model_folder(tmp_path / "prefixed", query_prefix="car ", passage_prefix="cat ")
    embedder = local_embedder(folder)
    plain = local_embedder(build_model_folder(tmp_path / "plain"))
    try:
        np.testing.assert_allclose(embedder.embed_query("tea").vector, vector(plain.embed("car tea")), atol=1e-6)
        np.testing.assert_allclose(vector(embedder.embed("tea")), vector(plain.embed("cat tea")), atol=1e-6)
    finally:
        embedder.close()
        plain.close()


def test_nothing_is_loaded_until_a_text_needs_the_model(embedder, model_folder):
    # Building the client (server start-up) and naming the model read files only.
    assert embedder.provider.loaded is None
    assert embedder.refresh_identity(force=True).startswith("local:tiny-test:")
    assert embedder.provider.loaded is None
    embedder.embed("cat")
    assert embedder.provider.loaded is not None
    assert embedder.model_label == embedder.provider.loaded.fingerprint


def test_the_token_report_follows_the_tokenizer_and_the_contract(embedder):
    reporter = build_token_reporter(embedder)
    texts = ["cat", TEXTS[4], TEXTS[4] + " " + TEXTS[4]]
    found = reporter.report(texts)
    assert [(i.count, i.window, i.truncated) for i in found] == [(1, 10, False), (13, 10, True), (26, 10, True)]
    # Each entry passes the checks the http report must pass (spec OV-1) ...
    for info, text in zip(found, texts):
        entry = {
            "count": info.count,
            "window": info.window,
            "truncated": info.truncated,
            "window_end_char": info.window_end_char,
        }
        assert parse_entry(entry, text) == info
    # ... and the window closes after the tenth word.
    assert TEXTS[4][: found[1].window_end_char] == " ".join(TEXTS[4].split()[:10])


# -- one clear error ------------------------------------------------------------------------


def broken(folder: Path, how: str) -> Path:
    if how == "no folder":
        return folder / "nowhere"
    if how == "no tokenizer":
        (folder / "tokenizer.json").unlink()
    elif how == "no config":
        (folder / "cpersona-model.json").unlink()
    elif how == "no model":
        (folder / "model.onnx").unlink()
    elif how == "corrupt model":
        (folder / "model.onnx").write_bytes(b"\x08\x07not a protobuf at all" * 50)
    elif how == "corrupt tokenizer":
        (folder / "tokenizer.json").write_text('{"model": "truncated', encoding="utf-8")
    elif how == "wrong width":
        config = json.loads((folder / "cpersona-model.json").read_text())
        (folder / "cpersona-model.json").write_text(json.dumps({**config, "dimension": 32}))
    elif how == "bad pooling":
        config = json.loads((folder / "cpersona-model.json").read_text())
        (folder / "cpersona-model.json").write_text(json.dumps({**config, "pooling": "max"}))
    return folder


EXPECTED = {
    "no folder": "does not exist",
    "no tokenizer": "has no tokenizer.json",
    "no config": "has no cpersona-model.json",
    "no model": "has no model.onnx",
    "corrupt model": "is not a loadable ONNX model",
    "corrupt tokenizer": "is not a readable tokenizer",
    "wrong width": "produces 16-wide vectors but cpersona-model.json says dimension 32",
    "bad pooling": "pooling must be one of mean, cls",
}


@pytest.mark.parametrize("how", sorted(EXPECTED))
def test_a_broken_model_folder_gives_one_clear_error_and_no_vector(model_folder, how):
    embedder = local_embedder(broken(model_folder, how))
    try:
        first = embedder.embed_query("cat")
        second = embedder.embed_many(["cat", "dog"])
        assert first.vector is None and second == [None, None]
        # A configuration fault (nothing attempted), named once, the same on every call.
        assert first.outcome.misconfigured
        assert first.outcome.error.count("CPERSONA_EMBEDDING_MODEL_PATH") == 1
        assert EXPECTED[how] in first.outcome.error
        assert embedder.health.last_error == embedder.embed_query("dog").outcome.error
    finally:
        embedder.close()


@pytest.mark.parametrize("command", ["serve", "embed-server"])
def test_without_the_extra_local_mode_and_embed_server_refuse_with_the_install_command(tmp_path, model_folder, command):
    # The package is hidden the standard way (None in sys.modules) in a real process.
    launch = (
        "import sys; sys.modules['onnxruntime'] = None; from cpersona.cli import main; "
        f"raise SystemExit(main([{command!r}]))"
    )
    env = {
        "PATH": "/usr/bin:/bin",
        "CPERSONA_DB_PATH": str(tmp_path / "x.db"),
        "CPERSONA_UPDATE_CHECK": "false",
        "CPERSONA_EMBEDDING_MODEL_PATH": str(model_folder),
        **({"CPERSONA_EMBEDDING_MODE": "local"} if command == "serve" else {}),
    }
    done = subprocess.run(
        [sys.executable, "-c", launch], env=env, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL
    )
    assert done.returncode == 2
    assert "onnxruntime" in done.stderr and "pip install 'cpersona-server[local]'" in done.stderr
    assert not (tmp_path / "x.db").exists()  # refused before the database was touched


def refuse_local(settings) -> None:
    """The start-up checks a serve runs for `local`: the settings' own, then the embedding package's."""
    from cpersona.embedding.local_model import local_mode_problem

    check_startup(settings)
    if (problem := local_mode_problem(settings)) is not None:
        raise ConfigError(problem)


def test_the_settings_refuse_local_mode_without_the_extra(monkeypatch, model_folder):
    monkeypatch.setitem(sys.modules, "tokenizers", None)
    with pytest.raises(
        ConfigError, match=r"needs tokenizers, which are not installed: run pip install 'cpersona-server\[local\]'"
    ):
        refuse_local(
            load_settings({"CPERSONA_EMBEDDING_MODE": "local", "CPERSONA_EMBEDDING_MODEL_PATH": str(model_folder)})
        )
    # Every other mode does not care.
    for mode, needs in (
        ("none", {}),
        ("http", {"CPERSONA_EMBEDDING_URL": "http://127.0.0.1:1/embed"}),
        ("api", {"CPERSONA_EMBEDDING_API_KEY": "k"}),
    ):
        check_startup(load_settings({"CPERSONA_EMBEDDING_MODE": mode, **needs}))


def test_an_unknown_profile_name_stops_start_up():
    with pytest.raises(ConfigError, match="CPERSONA_EMBEDDING_LOCAL_MODEL='nope' .*known: all-MiniLM-L6-v2"):
        refuse_local(load_settings({"CPERSONA_EMBEDDING_MODE": "local", "CPERSONA_EMBEDDING_LOCAL_MODEL": "nope"}))


# -- a model change is seen: rows of the other model are re-embedded -----------------------------


def local_app(db, folder: Path) -> App:
    settings = load_settings(
        {**db_settings_env(db), "CPERSONA_EMBEDDING_MODE": "local", "CPERSONA_EMBEDDING_MODEL_PATH": str(folder)}
    )
    return App(db=db, settings=settings, embedder=build_embedder(settings))


def run_backfill(app: App) -> None:
    """What one `cpersona serve` start does in the background, to its end."""
    assert start_backfill(app)
    assert app.backfill.wait(60)
    stop_backfill(app)
    app._built.pop("backfill")  # the next call is the next start: a new worker


def stored_vectors(app: App) -> dict[int, bytes | None]:
    from sqlalchemy import text

    with app.db.read() as session:
        return dict(session.execute(text("SELECT id, embedding FROM memories ORDER BY id")).all())


@pytest.mark.both_backends
def test_a_model_change_re_embeds_every_row_with_the_new_model(db, tmp_path):
    first = local_app(db, build_model_folder(tmp_path / "a", seed=1))
    second = local_app(db, build_model_folder(tmp_path / "b", seed=2))  # same width, other weights
    try:
        for text in TEXTS:
            assert store(first, agent_id="a", content=text)["embedded"] is True
        run_backfill(first)  # what `cpersona serve` starts with: the identity is recorded
        old = stored_vectors(first)
        assert recorded_identity(first) == (first.embedder.model_label, 16)

        # The same model again: nothing is cleared or re-embedded.
        run_backfill(first)
        assert stored_vectors(first) == old

        # Another model: its vectors replace the old ones, row by row, via the backfill.
        run_backfill(second)
        new = stored_vectors(second)
        assert new.keys() == old.keys()
        for row_id, text in zip(sorted(new), TEXTS):
            assert new[row_id] == second.embedder.embed(text) != old[row_id]
        assert recorded_identity(second) == (second.embedder.model_label, 16)
    finally:
        first.embedder.close()
        second.embedder.close()


@pytest.mark.both_backends
def test_a_backend_that_cannot_name_itself_changes_nothing(db, tmp_path, embed_server):
    first = local_app(db, build_model_folder(tmp_path / "a", seed=1))
    for text in TEXTS[:2]:
        store(first, agent_id="a", content=text)
    run_backfill(first)
    kept = stored_vectors(first)
    settings = load_settings(
        {**db_settings_env(db), "CPERSONA_EMBEDDING_MODE": "http", "CPERSONA_EMBEDDING_URL": embed_server.url}
    )
    unnamed = App(db=db, settings=settings, embedder=build_embedder(settings))  # no /capabilities report
    try:
        run_backfill(unnamed)
        assert stored_vectors(unnamed) == kept  # unknown is never "changed"
        assert recorded_identity(unnamed) == (first.embedder.model_label, 16)
    finally:
        unnamed.embedder.close()
        first.embedder.close()
