"""One model folder loaded into ONNX Runtime and a Hugging Face tokenizer: texts in, unit vectors out.

No torch: the tokenizer is the Rust ``tokenizers`` library and the network runs
in an ``onnxruntime`` CPU session with a bounded thread count. Both packages are
the optional ``local`` extra; without them nothing here can load, and
``missing_packages`` names what to install.

Everything is synchronous and meant for worker threads. One forward pass runs
at a time (a lock): on a machine with a couple of cores, concurrent passes only
thrash. A batch is sorted by length and cut into groups of ``GROUP`` texts, so
one long text does not make a whole batch pay for its padding.
"""

from __future__ import annotations

import hashlib
import importlib.util
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from cpersona import DISTRIBUTION
from cpersona.embedding.profiles import TOKENIZER_FILE, ModelConfig, ModelFolderError, read_sums
from cpersona.embedding.tokens import TokenInfo
from cpersona.embedding.vectors import FLOAT32, MIN_NORM

EXTRA_PACKAGES = ("onnxruntime", "tokenizers")
INSTALL_HINT = f"pip install '{DISTRIBUTION}[local]'"
GROUP = 4  # at most this many texts per forward pass ...
PASS_TOKENS = 256  # ... and at most this many padded tokens
HASH_CHUNK = 1 << 20


def missing_packages() -> list[str]:
    """The packages of the ``local`` extra that are not installed (checked without importing them)."""
    return [name for name in EXTRA_PACKAGES if importlib.util.find_spec(name) is None]


def extra_problem() -> str | None:
    missing = missing_packages()
    if not missing:
        return None
    return f"CPERSONA_EMBEDDING_MODE=local needs {' and '.join(missing)}, which are not installed: run {INSTALL_HINT}"


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def folder_fingerprint(folder: Path, config: ModelConfig) -> str:
    """Names what produces a folder's vectors: model bytes, tokenizer bytes and the pooling config.

    The sums a fetch recorded in ``SHA256SUMS`` stand for the files, so naming a
    fetched model does not read hundreds of megabytes; any other folder is hashed.
    """
    sums = read_sums(folder)
    digest = hashlib.sha256()
    for name in (config.model_file, TOKENIZER_FILE):
        digest.update((sums.get(name) or file_sha256(folder / name)).encode("ascii"))
    digest.update(config.to_json().encode("utf-8"))
    return f"local:{config.name}:{digest.hexdigest()[:16]}"


class LocalModel:
    """A loaded model folder. Construction raises ``ModelFolderError`` with one line saying what is wrong."""

    def __init__(self, folder: Path, *, threads: int = 2) -> None:
        folder = Path(folder)
        if not folder.is_dir():
            raise ModelFolderError(f"model folder {folder} does not exist")
        self.folder = folder
        self.config = ModelConfig.read(folder)
        model_path = folder / self.config.model_file
        tokenizer_path = folder / TOKENIZER_FILE
        for path in (model_path, tokenizer_path):
            if not path.is_file():
                raise ModelFolderError(
                    f"model folder {folder} has no {path.name} "
                    f"(a model folder holds cpersona-model.json, {TOKENIZER_FILE} "
                    f"and the ONNX file the config names)"
                )
        self._windowed, self._counting = self._tokenizers(tokenizer_path)
        self._session = self._open_session(model_path, threads)
        self._input_names = {i.name for i in self._session.get_inputs()}
        if "input_ids" not in self._input_names:
            raise ModelFolderError(
                f"{model_path} takes no input_ids input (inputs: {sorted(self._input_names)}); "
                "it is not a text-embedding model"
            )
        self._lock = threading.Lock()
        probe = self._forward(self._windowed.encode_batch(["probe"]))
        self.dimension = int(probe.shape[1])
        if self.config.dimension is not None and self.config.dimension != self.dimension:
            raise ModelFolderError(
                f"{model_path} produces {self.dimension}-wide vectors but "
                f"cpersona-model.json says dimension {self.config.dimension}"
            )
        self.fingerprint = folder_fingerprint(folder, self.config)
        self._prefix_tokens = {
            prefix: len(self._counting.encode(prefix, add_special_tokens=False).ids)
            for prefix in {self.config.query_prefix, self.config.passage_prefix}
        }
        self._specials = self._counting.num_special_tokens_to_add(False)

    @property
    def name(self) -> str:
        return self.config.name

    # ------------------------------------------------------------------ loading

    def _tokenizers(self, path: Path) -> tuple[Any, Any]:
        from tokenizers import Tokenizer

        try:
            windowed = Tokenizer.from_file(str(path))
            counting = Tokenizer.from_file(str(path))
        except Exception as exc:  # noqa: BLE001 - the Rust library raises its own Exception type
            raise ModelFolderError(f"{path} is not a readable tokenizer ({_first_line(exc)})") from None
        # Two instances because truncation is a setting of the tokenizer, not of a call:
        # one cuts at the model's window, the other counts a text's full length.
        windowed.enable_truncation(self.config.max_tokens)
        counting.no_truncation()
        counting.no_padding()
        windowed.no_padding()  # each pass pads its own group (see _groups)
        pad_id = windowed.token_to_id("[PAD]")
        if pad_id is None:
            pad_id = windowed.token_to_id("<pad>")
        self._pad_id = pad_id if pad_id is not None else 0  # masked out, so any id works
        return windowed, counting

    def _open_session(self, path: Path, threads: int) -> Any:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = max(1, int(threads))
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.log_severity_level = 3  # warnings about unused initializers are noise here
        # Idle worker threads would otherwise spin for work: on a busy machine with
        # a couple of cores (measured under load 8-11) that makes a 2-thread pass
        # 2-3x slower than a 1-thread one instead of faster.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        options.add_session_config_entry("session.inter_op.allow_spinning", "0")
        try:
            return ort.InferenceSession(str(path), sess_options=options, providers=["CPUExecutionProvider"])
        except Exception as exc:  # noqa: BLE001 - onnxruntime raises several unrelated types for a bad file
            raise ModelFolderError(f"{path} is not a loadable ONNX model ({_first_line(exc)})") from None

    # ---------------------------------------------------------------- embedding

    def embed(self, texts: Sequence[str], *, query: bool = False) -> np.ndarray:
        """A float32 matrix, one row per text, in input order (unit rows when the config says normalize)."""
        prefix = self.config.query_prefix if query else self.config.passage_prefix
        out = np.empty((len(texts), self.dimension), dtype=FLOAT32)
        encodings = self._windowed.encode_batch([prefix + text for text in texts])
        for group in _groups([len(e.ids) for e in encodings]):
            out[group] = self._forward([encodings[i] for i in group])
        return out

    def _forward(self, encodings: list[Any]) -> np.ndarray:
        width = max(len(e.ids) for e in encodings)
        ids = np.full((len(encodings), width), self._pad_id, dtype=np.int64)
        mask = np.zeros((len(encodings), width), dtype=np.int64)
        types = np.zeros((len(encodings), width), dtype=np.int64)
        for row, encoding in enumerate(encodings):
            n = len(encoding.ids)
            ids[row, :n], mask[row, :n], types[row, :n] = encoding.ids, 1, encoding.type_ids
        feeds = {"input_ids": ids}
        if "attention_mask" in self._input_names:
            feeds["attention_mask"] = mask
        if "token_type_ids" in self._input_names:
            feeds["token_type_ids"] = types
        with self._lock:
            output = self._session.run(None, feeds)[0]
        output = np.asarray(output, dtype=np.float32)
        if output.ndim == 3:  # token vectors: pool them
            if self.config.pooling == "cls":
                pooled = output[:, 0, :]
            else:
                weights = mask[:, :, None].astype(np.float32)
                pooled = (output * weights).sum(axis=1) / np.maximum(weights.sum(axis=1), 1.0)
        elif output.ndim == 2:  # the export already pooled
            pooled = output
        else:
            raise ModelFolderError(
                f"the model's first output has shape {output.shape}; expected (batch, tokens, width) or (batch, width)"
            )
        if not np.isfinite(pooled).all():
            raise ValueError("the model produced a vector that is not finite")
        if self.config.normalize:
            norms = np.linalg.norm(pooled, axis=1, keepdims=True)
            pooled = np.where(norms > MIN_NORM, pooled / np.maximum(norms, MIN_NORM), pooled)
        return pooled.astype(FLOAT32)

    # ------------------------------------------------------------------ tokens

    def token_info(self, texts: Sequence[str]) -> list[TokenInfo]:
        """What the model reads of each stored text (spec OV-1): ``text[:window_end_char]``."""
        window = max(1, self.config.max_tokens - self._specials - self._prefix_tokens[self.config.passage_prefix])
        found = []
        for text, encoding in zip(texts, self._counting.encode_batch(list(texts), add_special_tokens=False)):
            count = len(encoding.ids)
            truncated = count > window
            end = encoding.offsets[window - 1][1] if truncated else len(text)
            found.append(TokenInfo(count, window, truncated, min(max(end, 0), len(text))))
        return found


def _groups(lengths: list[int]) -> list[list[int]]:
    """Positions cut into forward passes of texts of similar length.

    Padding costs compute, and so does a wide pass: a pass of 32 LoCoMo turns
    padded to the longest took 2-3x the time of the same turns one at a time on
    the 2-core benchmark machine. Passes of 1 to 8 similar-length texts could
    not be told apart there (load 8-13); 4 keeps the per-call overhead low
    without wide passes.
    A pass holds at most ``GROUP`` texts and ``PASS_TOKENS`` padded tokens.
    """
    groups: list[list[int]] = []
    current: list[int] = []
    for position in sorted(range(len(lengths)), key=lengths.__getitem__):
        if current and (len(current) >= GROUP or (len(current) + 1) * lengths[position] > PASS_TOKENS):
            groups.append(current)
            current = []
        current.append(position)
    if current:
        groups.append(current)
    return groups


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:300]}" if text else type(exc).__name__


def local_mode_problem(settings: Any) -> str | None:
    """What keeps `CPERSONA_EMBEDDING_MODE=local` from serving (the extra, the profile), or None.

    Checked at start-up without importing the extra itself.
    """
    from cpersona.embedding.profiles import profile

    if settings.embedding_model_path is None:
        try:
            profile(settings.embedding_local_model)
        except KeyError as exc:
            return f"CPERSONA_EMBEDDING_LOCAL_MODEL={settings.embedding_local_model!r} is not valid: {exc.args[0]}"
    return extra_problem()
