"""The query without the scope's speaker names: a recall's second query text (issue 14).

A chat turn is stored as ``"<speaker>: <text>"`` (bench/locomo.py, and any
importer of chat logs). A question names the speaker ("What did Caroline
research?"), and every turn of that speaker carries the name, so the name pulls
the query vector towards all of them alike. The vector channel embeds the query
as asked and with the names removed, and searches with the unit vector of the
query plus ``WEIGHT`` times that of the query without the names, scaled to unit
length (Session 9 and the ninth pass of issue 14, docs/benchmarks.md: the sum, then
its weight, each chosen in every leave-one-conversation-out fold of LoCoMo dev).

The names are the speaker labels of the scope's newest memories: a bounded read
(``NAME_SCAN`` rows, at most ``MAX_NAMES`` names), the same for every recall of
the same stored rows, so the result is deterministic. When no name occurs in the
query there is no second text and the recall is as before.
"""

from __future__ import annotations

import re

# How many of the newest memories are read for speaker labels: a chat's speakers
# recur on every few turns, so a couple of hundred rows see them all.
NAME_SCAN = 200
# At most this many names: a scope of many speakers is not a two-party chat.
MAX_NAMES = 16
# The nameless text's unit vector counts this many times the query's in the sum
# (docs/benchmarks.md, "Issue 14, ninth pass": chosen in every leave-one-conversation-out
# fold of LoCoMo dev among 0-3; the name pulls the query towards every turn of that
# speaker, so the query without it is the better guide to which of them answers).
WEIGHT = 2.0
# A label is a line's head before ": ": 1-3 capitalised words (a name, not a sentence).
_LABEL = re.compile(r"^([A-Z][\w'.-]{0,29}(?: [A-Z][\w'.-]{0,29}){0,2}): ", re.MULTILINE)
_WORD = re.compile(r"\w+(?:'\w+)?")
_POSSESSIVE = re.compile(r"'s$", re.IGNORECASE)


def speaker_names(texts: list[str]) -> frozenset[str]:
    """The lowercased words of the speaker labels in ``texts`` (first seen first, ≤ MAX_NAMES labels)."""
    labels: dict[str, None] = {}  # insertion-ordered: the first MAX_NAMES labels seen
    for text in texts:
        for match in _LABEL.finditer(text):
            labels.setdefault(match.group(1))
            if len(labels) >= MAX_NAMES:
                break
        if len(labels) >= MAX_NAMES:
            break
    return frozenset(word.lower() for label in labels for word in label.split())


def nameless(query: str, names: frozenset[str]) -> str | None:
    """The query's words without the names (and their possessive 's), or None when
    no name occurs in it or nothing else is left."""
    if not names:
        return None
    words = _WORD.findall(query)
    kept = [w for w in words if _POSSESSIVE.sub("", w).lower() not in names]
    if len(kept) == len(words) or not kept:
        return None
    return " ".join(kept)
