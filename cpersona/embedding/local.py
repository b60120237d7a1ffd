"""``CPERSONA_EMBEDDING_MODE=local``: the embedding model in this process (ONNX Runtime, no torch).

``LocalEmbedder`` is the embedding client with the HTTP request replaced by a
forward pass, so caching, health counters, outcomes and the never-raise rule
are the client's own. What differs:

- **Lazy**: nothing is read at start-up. The first text to embed loads the
  model folder (``CPERSONA_EMBEDDING_MODEL_PATH``, else the profile's folder in
  the cache). When the cache has no folder yet, a background thread fetches it
  once while calls answer "no vector" with the fetch's progress as the reason;
  rows stored meanwhile get their vectors from the backfill when the model is
  ready. Offline with nothing cached, every call reports one error naming both
  ways out (``cpersona fetch-model`` elsewhere and copy the folder, or a model
  path).
- **Identity**: the label stored beside vectors is the model's fingerprint
  (``local:<name>:<width>:<hash of model, tokenizer and config>``), the same one
  ``cpersona embed-server`` reports on ``/capabilities`` — so switching between
  the in-process model and the shared server of the same model changes nothing.
- **Queries and passages**: ``embed_query`` (recall) adds the profile's query
  prefix, ``embed``/``embed_many`` (stores, backfill, repairs) the passage prefix.
- **Tokens**: the tokenizer answers the token report record nodes need (OV-1).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from cpersona.embedding.client import Embedder, NotReady, _NotIssued
from cpersona.embedding.fetch import FetchError, cache_folder, fetch_model, is_complete
from cpersona.embedding.local_model import LocalModel, folder_fingerprint
from cpersona.embedding.profiles import ModelConfig, ModelFolderError, Profile, profile
from cpersona.embedding.tokens import MAX_TEXTS, TokenInfo

log = logging.getLogger(__name__)

FETCH_RETRY_SECS = 600.0  # an offline machine is not asked to fetch more often than this
DEFAULT_THREADS = 2


class ModelUnavailable(_NotIssued):
    """No model can be loaded as configured (a configuration fault: nothing was attempted)."""


class ModelProvider:
    """The model folder's one lazy load, and the one background fetch when the cache is empty."""

    def __init__(
        self,
        *,
        profile: Profile,
        model_path: Path | None,
        cache_dir: Path,
        source: str | None,
        threads: int,
        fetch: bool = True,
    ) -> None:
        self.profile = profile
        self.model_path = Path(model_path).expanduser() if model_path else None
        self.cache_dir = Path(cache_dir).expanduser()
        self.source = source
        self.threads = threads
        self._fetch_allowed = fetch
        self._lock = threading.Lock()
        self._model: LocalModel | None = None
        self._error: str | None = None  # a load failure: permanent for this process
        self._fetch_thread: threading.Thread | None = None
        self._fetch_failed_at: float | None = None
        self._fetch_error: str | None = None
        self._progress = ""
        self._identity: tuple[str, int | None] | None = None

    @property
    def folder(self) -> Path:
        return self.model_path or cache_folder(self.cache_dir, self.profile)

    @property
    def loaded(self) -> LocalModel | None:
        return self._model

    def get(self) -> LocalModel:
        """The loaded model; raises ``ModelUnavailable`` or ``NotReady`` saying why there is none."""
        model = self._model
        if model is not None:
            return model
        with self._lock:
            if self._model is not None:
                return self._model
            if self._error is not None:
                raise ModelUnavailable(self._error)
            if self.model_path is None and not is_complete(self.folder, self.profile):
                self._need_fetch()  # raises
            started = time.monotonic()
            try:
                self._model = LocalModel(self.folder, threads=self.threads)
            except ModelFolderError as exc:
                self._error = self._where(str(exc))
                log.error("local embedding model unusable: %s", self._error)
                raise ModelUnavailable(self._error) from None
            log.info(
                "local embedding model %s loaded from %s in %.1f s (%d-wide vectors, %d thread(s))",
                self._model.name,
                self.folder,
                time.monotonic() - started,
                self._model.dimension,
                self.threads,
            )
            return self._model

    def identity(self) -> tuple[str, int | None] | None:
        """(fingerprint, width) of the model this provider loads, without loading it; None while absent."""
        model = self._model
        if model is not None:
            return model.fingerprint, model.dimension
        if self._identity is None:
            try:
                config = ModelConfig.read(self.folder)
                self._identity = folder_fingerprint(self.folder, config), config.dimension
            except (ModelFolderError, OSError):
                return None
        return self._identity

    def load_now(self, progress: Any = None) -> LocalModel:
        """Fetch in the foreground if needed (with progress lines), then load: for the commands.

        Raises ``ModelUnavailable`` with the same one-line messages ``get`` gives.
        """
        if self.model_path is None and not is_complete(self.folder, self.profile):
            try:
                fetch_model(
                    self.profile, self.cache_dir, source=self.source, **({"progress": progress} if progress else {})
                )
            except FetchError as exc:
                raise ModelUnavailable(self.offline_message(str(exc))) from None
        return self.get()

    def _where(self, problem: str) -> str:
        if self.model_path is not None:
            return f"CPERSONA_EMBEDDING_MODEL_PATH: {problem}"
        return f"{problem}; delete the folder and run `cpersona fetch-model {self.profile.name}` again"

    def _need_fetch(self) -> None:
        """Start (or report on) the background fetch; always raises: there is no model yet."""
        if self._fetch_thread is not None and self._fetch_thread.is_alive():
            raise NotReady(f"the model {self.profile.name} is being fetched into {self.folder}: {self._progress}")
        now = time.monotonic()
        recently_failed = self._fetch_failed_at is not None and now - self._fetch_failed_at < FETCH_RETRY_SECS
        if not self._fetch_allowed or recently_failed:
            raise ModelUnavailable(self.offline_message(self._fetch_error))
        self._progress = "starting"
        self._fetch_thread = threading.Thread(target=self._fetch, name="cpersona-model-fetch", daemon=True)
        self._fetch_thread.start()
        raise NotReady(f"the model {self.profile.name} is being fetched into {self.folder} (first use)")

    def _fetch(self) -> None:
        def progress(line: str) -> None:
            self._progress = line
            log.info("%s", line)

        try:
            fetch_model(self.profile, self.cache_dir, source=self.source, progress=progress)
            self._fetch_error = None
            self._fetch_failed_at = None
        except Exception as exc:  # noqa: BLE001 - recorded and reported by every later call
            self._fetch_error = str(exc) if isinstance(exc, FetchError) else f"{type(exc).__name__}: {exc}"
            self._fetch_failed_at = time.monotonic()
            log.error("%s", self.offline_message(self._fetch_error))

    def offline_message(self, why: str | None) -> str:
        return (
            f"no local embedding model: {self.folder} holds no copy of {self.profile.name}"
            f"{f' and fetching it failed ({why})' if why else ''}. Either run "
            f"`cpersona fetch-model {self.profile.name}` (on a machine with network access, then copy "
            f"the folder to {self.folder}), or set CPERSONA_EMBEDDING_MODEL_PATH to a model folder"
        )

    def wait_for_fetch(self, timeout: float | None = None) -> bool:
        thread = self._fetch_thread
        if thread is not None:
            thread.join(timeout)
        return thread is None or not thread.is_alive()


class LocalEmbedder(Embedder):
    """The embedding client backed by an in-process ONNX model (mode ``local``)."""

    SERVED_MODES = ("local",)
    USES_HTTP = False

    def __init__(
        self, provider: ModelProvider, *, cache_size: int = 256, cache_ttl: float = 300.0, timeout_secs: float = 30.0
    ) -> None:
        super().__init__(
            mode="local",
            url="",
            model=provider.profile.name,
            model_configured=True,
            timeout_secs=timeout_secs,
            cache_size=cache_size,
            cache_ttl=cache_ttl,
        )
        self._config_problem = None  # there is no URL to check
        self.provider = provider

    # --- what the client reports about itself

    @property
    def endpoint(self) -> str:
        return f"local model {self.provider.folder}"

    @property
    def model(self) -> str:  # type: ignore[override] - the name of the model actually loaded, once it is
        loaded = self.provider.loaded
        return loaded.name if loaded is not None else self.provider.profile.name

    @model.setter
    def model(self, value: str) -> None:
        pass  # the base class assigns the configured name; the loaded model's name wins

    @property
    def model_label(self) -> str:
        return self.refresh_identity() or ""

    @property
    def backend_model(self) -> str | None:
        return self.model

    def refresh_identity(self, timeout_secs: float = 0.0, *, force: bool = False) -> str | None:
        """The model's fingerprint, read from its folder; never loads the model (start-up stays cheap)."""
        found = self.provider.identity()
        return found[0] if found is not None else None

    def identity(self) -> tuple[str, int | None] | None:
        """(fingerprint, width) for the database's embedding identity; None while no model is available."""
        return self.provider.identity()

    # --- embedding

    def embed(self, text: str) -> bytes | None:
        """A stored passage's vector (passage prefix, not cached: it is embedded once)."""
        return self.embed_many([text])[0]

    def _vectors(self, texts: list[str], timeout: float, query: bool) -> list[np.ndarray]:
        matrix = self.provider.get().embed(texts, query=query)
        return list(matrix)

    def _evidence(self, method: str, url: str, exc: BaseException) -> str:
        detail = str(exc) if isinstance(exc, (_NotIssued, NotReady)) else f"{type(exc).__name__}: {exc}"
        return f"mode=local / {self.provider.folder} failed: {detail}"

    # --- token report (OV-1)

    def token_reporter(self) -> LocalTokenReporter:
        return LocalTokenReporter(self.provider)


class LocalTokenReporter:
    """The tokenizer's answer to "how much of this text does the model read" (same shape as the http report)."""

    def __init__(self, provider: ModelProvider) -> None:
        self._provider = provider

    def report(self, texts: Sequence[str]) -> list[TokenInfo] | None:
        if not texts or len(texts) > MAX_TEXTS:
            return None
        try:
            return self._provider.get().token_info(texts)
        except Exception as exc:  # noqa: BLE001 - unknown, whatever went wrong
            log.info("token report from the local model unavailable: %s", exc)
            return None

    def measure(self, text: str) -> TokenInfo | None:
        found = self.report([text])
        return None if found is None else found[0]

    def close(self) -> None:
        pass


def _setting(settings: Any, name: str, default: Any) -> Any:
    value = getattr(settings, name, default)
    return default if value is None else value


def build_provider(settings: Any, *, name: str | None = None) -> ModelProvider:
    """The model the settings name; ``ValueError`` for an unknown profile or a missing extra."""
    from cpersona.embedding.local_model import extra_problem

    problem = extra_problem()
    if problem:
        raise ValueError(problem)
    try:
        chosen = profile(name or str(_setting(settings, "embedding_local_model", "")))
    except KeyError as exc:
        raise ValueError(f"CPERSONA_EMBEDDING_LOCAL_MODEL: {exc.args[0]}") from None
    return ModelProvider(
        profile=chosen,
        model_path=_setting(settings, "embedding_model_path", None),
        cache_dir=Path(_setting(settings, "embedding_cache_dir", None) or default_cache_dir()),
        source=_setting(settings, "embedding_model_source", None),
        threads=int(_setting(settings, "embedding_threads", DEFAULT_THREADS)),
    )


def build_local_embedder(settings: Any) -> LocalEmbedder:
    return LocalEmbedder(
        build_provider(settings),
        cache_size=int(_setting(settings, "embedding_cache_size", 256)),
        cache_ttl=float(_setting(settings, "embedding_cache_ttl", 300)),
        timeout_secs=float(_setting(settings, "embedding_timeout_secs", 30)),
    )


def default_cache_dir() -> Path:
    """Where fetched models live unless CPERSONA_EMBEDDING_CACHE_DIR says otherwise."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "cpersona" / "models"
