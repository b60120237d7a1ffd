"""Token counting for the modes' caps (RX-44): ``cl100k_base`` over the JSON text as sent.

The exact vocabulary comes with ``tiktoken`` when it is installed and its
data can be loaded; otherwise a conservative estimate (one token per 3 UTF-8
bytes) keeps the cap a cap — answers are then shorter than the reference's,
never longer.
"""

from __future__ import annotations

import json
import math
from functools import lru_cache
from typing import Any, Callable


@lru_cache(maxsize=1)
def _encoder() -> Callable[[str], int] | None:
    try:
        import tiktoken

        encoding = tiktoken.get_encoding("cl100k_base")
    except Exception:  # noqa: BLE001 - no package or no vocabulary offline: estimate instead
        return None
    return lambda text: len(encoding.encode(text, disallowed_special=()))


def dumps(payload: Any) -> str:
    return json.dumps(payload, ensure_ascii=False, separators=(", ", ": "))


def count_tokens(payload: Any) -> int:
    text = dumps(payload)
    exact = _encoder()
    if exact is not None:
        return exact(text)
    return math.ceil(len(text.encode("utf-8")) / 3)
