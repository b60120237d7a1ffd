"""A stored text's vector: a chat turn is embedded whole and sentence by sentence (issue 14, seventh pass).

A sentence-embedding model mean-pools its tokens, so a turn of several
sentences ("Jon: Hey Gina! Good to see you too. Lost my job as a banker
yesterday, so I'm gonna take a shot at starting my own business.") gets one
vector in which the sentence that matters is diluted by the greeting. A text
that starts with a speaker label (``"<name>: "``, the way a conversation turn
is stored) and holds two or more sentences is therefore embedded as itself
**and** as each of its sentences under the same label, and its stored vector
is the normalised sum of its own vector and the normalised sum of its
sentences' vectors. Every other text keeps its own vector: the label is what
carried the gain (each sentence embedded bare, without the speaker the
questions name, was no better than the whole turn; docs/benchmarks.md,
"Issue 14, seventh pass").

Only stored rows (memories and episodes, on store, update and every backfill)
get this; a query is embedded as it is. One request per text as before, with
the sentences in it; at most :data:`MAX_PIECES` sentences are embedded (a cost
bound for long texts, not a tuned value).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

from cpersona.embedding.vectors import FLOAT32

if TYPE_CHECKING:
    import numpy as np

    from cpersona.embedding.client import Embedder

# A speaker label: up to 40 characters without a colon or line break, then ": " and text.
LABEL = re.compile(r"[^:\n]{1,40}: (?=\S)")
# The sentence end of record nodes (OV-9): a full-width mark, or a half-width one before whitespace or the end.
SENTENCE_END = re.compile(r"[。．！？]|[.!?](?=\s|\Z)")
MAX_PIECES = 16  # sentences embedded per text at most
_WORD = re.compile(r"\w")


def pieces(text: str) -> list[str]:
    """The sentences of a labelled turn, each under its label; [] when ``text`` keeps its own vector only."""
    label = LABEL.match(text) if isinstance(text, str) else None
    if label is None:
        return []
    body = text[label.end() :]
    parts, start = [], 0
    for end in SENTENCE_END.finditer(body):
        parts.append(body[start : end.end()])
        start = end.end()
    parts.append(body[start:])
    sentences = [part.strip() for part in parts if _WORD.search(part)]
    if len(sentences) < 2:
        return []
    return [label.group(0) + sentence for sentence in sentences[:MAX_PIECES]]


def combine(whole: np.ndarray, parts: Sequence[np.ndarray]) -> np.ndarray:
    """``whole`` plus the unit-length sum of ``parts``, scaled to unit length (``whole`` alone without parts)."""
    import numpy as np  # here: a start without embeddings never loads numpy (vectors.FLOAT32)

    if not parts:
        return whole
    total = np.sum(np.stack(parts).astype(np.float64), axis=0)
    norm = float(np.linalg.norm(total))
    if norm == 0.0:
        return whole
    both = whole.astype(np.float64) / max(float(np.linalg.norm(whole)), 1e-12) + total / norm
    size = float(np.linalg.norm(both))
    if size == 0.0:
        return whole
    return (both / size).astype(FLOAT32)


def _joined(blobs: Sequence[bytes | None]) -> bytes | None:
    """One text's blob from its own (first) and its sentences' blobs; None without its own."""
    if not blobs or blobs[0] is None:
        return None
    import numpy as np

    parts = [np.frombuffer(b, dtype=FLOAT32) for b in blobs[1:] if b is not None]
    if not parts:
        return blobs[0]
    return combine(np.frombuffer(blobs[0], dtype=FLOAT32), parts).tobytes()


def embed_passage(embedder: Embedder, text: str) -> bytes | None:
    """A stored text's vector blob, or None (see the module docstring)."""
    parts = pieces(text)
    if not parts:
        return embedder.embed(text)
    return _joined(embedder.embed_many([text, *parts]))


def embed_passages(embedder: Embedder, texts: Sequence[str], **options: int) -> list[bytes | None]:
    """:func:`embed_passage` for many texts in ``embed_many``'s requests; blobs aligned with ``texts``."""
    flat: list[str] = []
    spans: list[tuple[int, int]] = []
    for text in texts:
        start = len(flat)
        flat.append(text)
        flat.extend(pieces(text))
        spans.append((start, len(flat)))
    if len(flat) == len(texts):
        return embedder.embed_many(flat, **options)
    blobs = embedder.embed_many(flat, **options)
    return [_joined(blobs[a:b]) for a, b in spans]
