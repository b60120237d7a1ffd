"""Checking an embedding backend's answer before any of it is used (spec EMB-1..3).

The backend sits outside this process's trust boundary, so its body goes
through a fixed sequence, each step making the next one safe to attempt:
size (enforced while reading, in client.py) → JSON object → list shape →
at most 512 vectors → one vector per text → per vector: non-empty, at most
16,384 wide, numbers only (JSON booleans are not numbers), finite,
representable in float32 → one width for the whole response and for the
process. The first failed step raises ``EmbeddingResponseError`` naming it.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from cpersona.embedding.vectors import FLOAT32, l2_normalised

if TYPE_CHECKING:
    import numpy as np  # imported where vectors are read (see cpersona.embedding.vectors)

MAX_RESPONSE_BYTES = 64 * 1024 * 1024
MAX_VECTORS = 512
MAX_DIMENSION = 16_384


class EmbeddingResponseError(Exception):
    """A 2xx answer that does not satisfy the embedding contract."""


def describe(value: Any) -> str:
    """A short type name for error messages (never the value: it may be huge)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def parse_json_object(body: bytes) -> dict[str, Any]:
    try:
        payload = json.loads(body)
    except (ValueError, RecursionError) as exc:
        # ValueError covers bad JSON, bad UTF-8 and over-long integer literals.
        raise EmbeddingResponseError(f"response is not valid JSON ({type(exc).__name__})") from None
    if not isinstance(payload, dict):
        raise EmbeddingResponseError(f"response is {describe(payload)}, expected a JSON object")
    return payload


def _check_list(value: Any, field: str, expected_count: int) -> list[Any]:
    if not isinstance(value, list):
        raise EmbeddingResponseError(f"'{field}' is {describe(value)}, expected a list")
    if len(value) > MAX_VECTORS:
        raise EmbeddingResponseError(f"'{field}' holds {len(value)} entries, more than {MAX_VECTORS}")
    if len(value) != expected_count:
        raise EmbeddingResponseError(f"'{field}' holds {len(value)} entries for {expected_count} text(s)")
    return value


def check_vector(raw: Any, position: int) -> np.ndarray:
    """One vector as float64, after the per-vector steps of EMB-3."""
    if not isinstance(raw, list):
        raise EmbeddingResponseError(f"vector {position} is {describe(raw)}, expected a list")
    if not raw:
        raise EmbeddingResponseError(f"vector {position} is empty")
    if len(raw) > MAX_DIMENSION:
        raise EmbeddingResponseError(f"vector {position} is {len(raw)} wide, more than {MAX_DIMENSION}")
    for value in raw:
        # Exact type test: bool is a subclass of int, and JSON true is not a number.
        kind = type(value)
        if kind is not float and kind is not int:
            raise EmbeddingResponseError(f"vector {position} holds {describe(value)}, expected numbers only")
    import numpy as np

    try:
        vector = np.array(raw, dtype=np.float64)
    except OverflowError:
        raise EmbeddingResponseError(f"vector {position} holds an integer too large to represent") from None
    if not np.isfinite(vector).all():
        raise EmbeddingResponseError(f"vector {position} holds a value that is not finite")
    with np.errstate(over="ignore"):
        fits = np.isfinite(vector.astype(FLOAT32)).all()
    if not fits:
        raise EmbeddingResponseError(f"vector {position} holds a value outside the float32 range")
    return vector


def check_width(vectors: list[np.ndarray], process_dimension: int | None) -> int:
    """The response's single width; it must equal the process's once one is fixed."""
    width = len(vectors[0])
    for position, vector in enumerate(vectors):
        if len(vector) != width:
            raise EmbeddingResponseError(f"vector {position} is {len(vector)} wide, vector 0 is {width} wide")
    if process_dimension is not None and width != process_dimension:
        raise EmbeddingResponseError(f"vectors are {width} wide, this process accepted {process_dimension} before")
    return width


def vectors_from_http(payload: dict[str, Any], expected_count: int) -> list[np.ndarray]:
    """``{"embeddings": [[...], ...]}`` in input order, stored as given (EMB-1)."""
    raw = _check_list(payload.get("embeddings"), "embeddings", expected_count)
    return [check_vector(vector, position) for position, vector in enumerate(raw)]


def vectors_from_api(payload: dict[str, Any], expected_count: int) -> list[np.ndarray]:
    """OpenAI-style ``{"data": [{"index", "embedding"}, ...]}``, placed by index (EMB-2).

    The indices must be exactly 0..n-1, in any order; each vector is then
    L2-normalised unless its norm is at most 1e-9.
    """
    items = _check_list(payload.get("data"), "data", expected_count)
    placed: dict[int, Any] = {}
    for position, item in enumerate(items):
        if not isinstance(item, dict):
            raise EmbeddingResponseError(f"data[{position}] is {describe(item)}, expected an object")
        index = item.get("index")
        if type(index) is not int:
            raise EmbeddingResponseError(f"data[{position}].index is {describe(index)}, expected an integer")
        if index < 0 or index >= expected_count or index in placed:
            raise EmbeddingResponseError(
                f"data indices must be exactly 0..{expected_count - 1}; got {index} at data[{position}]"
            )
        placed[index] = item.get("embedding")
    vectors = [check_vector(placed[index], index) for index in range(expected_count)]
    return [l2_normalised(vector) for vector in vectors]
