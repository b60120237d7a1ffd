"""Stored vector format: raw little-endian float32, no header (spec VF-5, EMB-5).

A blob whose length is not a multiple of 4, or that holds NaN/Inf, is never
written; a reader handed one gets a clear ``VectorError`` instead of a silently
poisoned dot product.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

# A dtype spelling numpy takes wherever it takes a dtype. A string, so that importing
# this module (every start does) does not load numpy: a start without embeddings
# may never compare a vector, and numpy costs it ~0.1 s CPU and 12 MiB.
FLOAT32 = "<f4"

# Below this norm a vector has no direction worth keeping; scaling it up would
# only amplify noise (spec EMB-2).
MIN_NORM = 1e-9


class VectorError(ValueError):
    """A vector or blob that may not be stored or compared."""


def to_blob(vector: Sequence[float] | np.ndarray) -> bytes:
    """Encode a 1-d vector as little-endian float32 bytes.

    Values are rounded to float32 first; a value that is not finite there
    (NaN, Inf, or a finite float64 beyond the float32 range) is refused.
    """
    import numpy as np

    array = np.asarray(vector, dtype=np.float64)
    if array.ndim != 1 or array.size == 0:
        raise VectorError(f"a vector must be a non-empty 1-d sequence, got shape {array.shape}")
    with np.errstate(over="ignore", invalid="ignore"):
        as_f32 = array.astype(FLOAT32)
    if not np.isfinite(as_f32).all():
        raise VectorError("vector holds a value that is not finite in float32")
    return as_f32.tobytes()


def from_blob(blob: bytes | bytearray | memoryview) -> np.ndarray:
    """Decode a stored blob into a read-only float32 array (no copy).

    Refuses an empty blob, a length that is not a multiple of 4 and non-finite
    values, so a corrupt row can be reported instead of ranked.
    """
    import numpy as np

    raw = bytes(blob) if not isinstance(blob, bytes) else blob
    if len(raw) == 0 or len(raw) % 4:
        raise VectorError(f"a vector blob must be a non-zero multiple of 4 bytes, got {len(raw)}")
    vector = np.frombuffer(raw, dtype=FLOAT32)
    if not np.isfinite(vector).all():
        raise VectorError("vector blob holds NaN or Inf")
    return vector


def l2_normalised(vector: np.ndarray) -> np.ndarray:
    """The vector scaled to unit length, or unchanged when its norm is ≤ 1e-9."""
    import numpy as np

    as_f64 = np.asarray(vector, dtype=np.float64)
    norm = float(np.linalg.norm(as_f64))
    if norm <= MIN_NORM:
        return as_f64
    return as_f64 / norm
