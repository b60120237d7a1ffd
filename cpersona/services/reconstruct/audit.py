"""The parts of ``trace`` that explain quotes and coverage (spec RX-43).

``coverage`` splits the query into parts and says which cited records hold
each one, so a reader can see at a glance which words of the question nothing
it was given speaks to. ``node_order`` names, per record quoted from its
nodes, the best-ranked node indices (the first is the one quoted).

Parts, on the query folded with NFKC and lower-casing (spans index that
folded text): ASCII identifiers — letters and digits, with inner ``.``, ``-``
or ``_`` kept (``cve-2024-3094``, ``e.g``, ``banana_bread``) — and runs of
kanji or of katakana; anything shorter than 2 characters is not a part
(neither are hiragana or other scripts' runs, mostly particles). A record
holds a part when its folded stored text contains it. These rules reproduce
the reference's trace on the inputs measured.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Any

NORMALIZATION = "nfkc-lower"
NODE_ORDER_DEPTH = 3
_PARTS = re.compile(
    r"(?P<identifier>[a-z0-9]+(?:[._\-][a-z0-9]+)*)"
    r"|(?P<kanji>[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]+)"
    r"|(?P<katakana>[\u30a0-\u30ff\u31f0-\u31ff\uff66-\uff9f]+)"
)


def fold(text: str) -> str:
    return unicodedata.normalize("NFKC", text).lower()


def query_parts(query: str) -> tuple[str, list[dict[str, Any]]]:
    folded = fold(query)
    parts = [
        {"span": [m.start(), m.end()], "kind": m.lastgroup} for m in _PARTS.finditer(folded) if m.end() - m.start() >= 2
    ]
    return folded, parts


def coverage(query: str, records: list[tuple[str, str]]) -> dict[str, Any]:
    """``records``: (ref, stored text) of every cited record, in citation order, each once."""
    folded, parts = query_parts(query)
    texts = [(ref, fold(text)) for ref, text in records]
    covered_by = [[ref for ref, text in texts if folded[p["span"][0] : p["span"][1]] in text] for p in parts]
    return {
        "normalization": NORMALIZATION,
        "parts": parts,
        "covered_by": covered_by,
        "uncovered": [i for i, refs in enumerate(covered_by) if not refs],
        "records": len(texts),
    }
