"""Preview tier, excerpts and response budgets for rows that carry a ``ref``.

By default a recalled row shows only its first N characters
(``CPERSONA_RECALL_PREVIEW_CHARS``); the caller expands it with ``get_contents``.
A row cut that way also gets an ``excerpt``: verbatim passages of the stored
text that best match the query, so the part that made the row relevant is
visible even when it lies past the preview (spec §5.15, §5.16).

These helpers work on response messages (plain dicts) and are shared by
``recall``, ``recall_with_context`` and ``get_contents``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from cpersona.storage.search import clean_query

FULL_CONTENT_BUDGET = 200_000  # characters per full_content response (spec §5.15.2)
SEPARATOR = " … "  # between excerpt passages that are not adjacent in the text
EPISODE_LABEL = "[Episode] "

# Where a read-time block may end: after sentence punctuation followed by
# space, or at a line break. Blocks longer than MAX_BLOCK_CHARS are split
# further so a text without punctuation still yields passages to choose from.
_BLOCK_END = re.compile(r"(?<=[.!?。！？])\s+|(?<=[。！？])|\n+")
MAX_BLOCK_CHARS = 240

Message = dict[str, Any]


def stored_text(message: Message) -> str:
    """The stored text behind a message: episodes lose their display label."""
    content = message["content"]
    if str(message.get("ref", "")).startswith("ep:") and content.startswith(EPISODE_LABEL):
        return content[len(EPISODE_LABEL) :]
    return content


# -- excerpts --------------------------------------------------------------------


def _blocks(text: str) -> list[tuple[int, int]]:
    """Contiguous spans covering ``text``: sentences, lines, or fixed-size pieces."""
    spans: list[tuple[int, int]] = []
    start = 0
    ends = [m.end() for m in _BLOCK_END.finditer(text) if 0 < m.end() < len(text)]
    for end in [*ends, len(text)]:
        while end - start > MAX_BLOCK_CHARS:
            cut = text.rfind(" ", start + MAX_BLOCK_CHARS // 2, start + MAX_BLOCK_CHARS)
            cut = cut + 1 if cut > start else start + MAX_BLOCK_CHARS
            spans.append((start, cut))
            start = cut
        if end > start:
            spans.append((start, end))
            start = end
    return spans


def _trigrams(text: str) -> set[str]:
    """The query's 3-character windows, word by word (its short words if it has none)."""
    words = text.lower().split()
    grams = {word[i : i + 3] for word in words for i in range(len(word) - 2)}
    return grams or set(words)


def _render(text: str, chosen: Sequence[tuple[int, int]]) -> str:
    """Chosen spans in text order; touching spans merge, gaps become a separator."""
    passages: list[list[int]] = []
    for start, end in sorted(chosen):
        if passages and passages[-1][1] == start:
            passages[-1][1] = end
        else:
            passages.append([start, end])
    return SEPARATOR.join(text[s:e].strip() for s, e in passages)


def _window_around(text: str, span: tuple[int, int], grams: set[str], limit: int) -> str:
    """At most ``limit`` characters of one long passage, centred on its first match."""
    start, end = span
    lowered = text[start:end].lower()
    hits = [pos for gram in grams if (pos := lowered.find(gram)) >= 0]
    centre = start + (min(hits) if hits else 0)
    begin = max(start, min(centre - limit // 4, end - limit))
    return text[begin : begin + limit].strip() or text[begin : begin + limit]


def make_excerpt(text: str, query: str, limit: int) -> tuple[str, str] | None:
    """``(excerpt, basis)`` for ``text`` and ``query``, at most ``limit`` characters.

    Basis ``start``: the text is a single block and the excerpt is its start.
    Basis ``lexical``: blocks cut at read time, ranked by how many of the
    query's trigrams they contain, then by closeness to the best block, and
    taken in that order while they fit.
    """
    if limit <= 0 or not text or not clean_query(query):
        return None
    spans = _blocks(text)
    if len(spans) <= 1:
        return text[:limit], "start"
    grams = _trigrams(clean_query(query))
    overlap = [sum(1 for g in grams if g in text[s:e].lower()) for s, e in spans]
    best = max(range(len(spans)), key=lambda i: (overlap[i], -i))
    order = sorted(range(len(spans)), key=lambda i: (-overlap[i], abs(i - best), i))
    if len(_render(text, [spans[best]])) > limit:
        return _window_around(text, spans[best], grams, limit), "lexical"
    chosen: list[tuple[int, int]] = []
    for i in order:
        trial = [*chosen, spans[i]]
        if len(_render(text, trial)) > limit:
            break
        chosen = trial
    return _render(text, chosen), "lexical"


# -- preview tier and budgets ----------------------------------------------------


def to_preview(message: Message, *, preview_chars: int, excerpt_chars: int, query: str) -> None:
    """Cut one message to its preview form in place (no-op when short or ref-less)."""
    content = message.get("content", "")
    if "ref" not in message or preview_chars <= 0 or len(content) <= preview_chars:
        return
    excerpt = make_excerpt(stored_text(message), query, excerpt_chars)
    message["content"] = content[:preview_chars]
    if excerpt is not None:
        message["excerpt"], message["excerpt_basis"] = excerpt
    message["content_len"] = len(content)
    message["content_truncated"] = True


def apply_preview_tier(messages: Sequence[Message], *, preview_chars: int, excerpt_chars: int, query: str) -> None:
    """Cut every ref-carrying message longer than ``preview_chars`` (spec RC-6)."""
    for message in messages:
        to_preview(message, preview_chars=preview_chars, excerpt_chars=excerpt_chars, query=query)


def apply_full_content_budget(
    messages: Sequence[Message],
    *,
    preview_chars: int,
    excerpt_chars: int,
    query: str,
    budget: int = FULL_CONTENT_BUDGET,
) -> bool:
    """Whole rows from the end of the list while ``budget`` lasts (spec §5.15.2).

    The last (best) message is always whole. From the first message that would
    overrun the budget, it and every earlier ref-carrying message fall back to
    the preview form. Returns whether the budget was overrun. A preview of 0
    turns the budget off.
    """
    if preview_chars <= 0:
        return False
    used = 0
    for position in range(len(messages) - 1, -1, -1):
        used += len(messages[position].get("content", ""))
        if used > budget and position < len(messages) - 1:
            for message in messages[: position + 1]:
                to_preview(message, preview_chars=preview_chars, excerpt_chars=excerpt_chars, query=query)
            return True
    return False
