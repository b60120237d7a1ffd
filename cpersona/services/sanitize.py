"""What a write does to caller text before it is stored (spec §5.2).

Three jobs, each a pure function with no database access:

* :func:`sanitize` — the content sanitizer shared by every write path (memory
  content, episode summary and keywords, profiles): annotation removal, trim,
  length cap (§5.2.1).
* :func:`check_key_field` / :func:`check_timestamp_field` / :func:`check_json_size`
  — the write bounds that refuse rather than cut (§5.2.2), and
  :func:`nul_refusal`, the refusal of NUL in any text (decision 11).
* :func:`normalize_source` and :func:`to_json` — how ``source`` and ``metadata``
  become the JSON text stored in their columns (§5.2.3, storage VF-4).

A check returns the refusal message (or None when the value passes) so every
write path can put it under its own failure key (``reason`` or ``error``).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

KEY_FIELD_MAX = 256  # msg_id, channel, project_id, session_key (spec §5.2.2)
TIMESTAMP_MAX = 64

# "[Memory from <anything but ]>]" plus the whitespace after it. The name must be
# non-empty and the match is case-sensitive: "[memory from a]" and
# "[Memory from ]" are ordinary text to the reference, and so they are here.
_ANNOTATION = re.compile(r"\[Memory from [^\]]+\]\s*")

# NUL is refused, never stored and never silently removed (spec README decision
# 11). SQLite keeps it in a bound TEXT value, but its string functions stop at
# it: length() under-counts, and LIKE (the lexical fallback for 1-2 character
# queries) never sees the text after it, so part of a memory would become
# unsearchable; PostgreSQL refuses NUL in TEXT outright. Removing it instead
# would store something other than what the caller sent. The reference keeps NUL.
_NUL = "\x00"


@dataclass(frozen=True, slots=True)
class Sanitized:
    text: str
    truncated: bool

    @property
    def empty(self) -> bool:
        return not self.text


def strip_annotations(text: str) -> str:
    """Remove every annotation, repeating until none is left (spec §5.2.1 step 1).

    Repetition matters: ``[Memory fr[Memory from a] om b] x`` forms a new
    annotation once the inner one is gone, and must end up as ``x``.
    """
    while True:
        cleaned = _ANNOTATION.sub("", text)
        if cleaned == text:
            return cleaned
        text = cleaned


def sanitize(text: str, cap: int) -> Sanitized:
    """Clean ``text`` for storage and cut it to ``cap`` code points (spec §5.2.1).

    ``truncated`` is true exactly when the cap removed characters (ST-3, PF-1).
    The result is a fixed point: sanitizing it again changes nothing (SAN-2).
    """
    if cap < 1:
        # Settings refuse such a cap at startup (SAN-4); a library caller gets
        # the same rule instead of an empty store.
        raise ValueError(f"content cap must be at least 1, got {cap}")
    if (position := text.find(_NUL)) >= 0:
        # Every caller checks first and refuses in its own shape; reaching here
        # with a NUL is a caller that forgot, and must not store altered text.
        raise ValueError(nul_message("text", position))
    cleaned = strip_annotations(text).strip()
    if len(cleaned) <= cap:
        return Sanitized(cleaned, truncated=False)
    return Sanitized(cleaned[:cap].rstrip(), truncated=True)


# -- bounds that refuse (spec §5.2.2) -------------------------------------------------


def has_nul(value: str) -> bool:
    return _NUL in value


def nul_message(where: str, position: int) -> str:
    """The one wording of the NUL refusal (decision 11): which field, which character, where."""
    return f"{where} contains the NUL character (U+0000) at position {position}"


def nul_refusal(**named: Any) -> str | None:
    """The refusal for the first NUL in any of the named values, or None.

    Strings are searched at any depth, in dict keys as in values, so a NUL deep
    in ``metadata`` is named by its path (``metadata.k``, ``source[0]``).
    """
    stack: list[tuple[Any, str]] = [(value, name) for name, value in reversed(named.items())]
    while stack:
        value, path = stack.pop()
        if isinstance(value, str):
            if (position := value.find(_NUL)) >= 0:
                return nul_message(path, position)
        elif isinstance(value, dict):
            children = []
            for key, child in value.items():
                if isinstance(key, str) and (position := key.find(_NUL)) >= 0:
                    return nul_message(f"{path} key {key!r}", position)
                children.append((child, f"{path}.{key}"))
            stack.extend(reversed(children))
        elif isinstance(value, (list, tuple)):
            stack.extend(reversed([(child, f"{path}[{i}]") for i, child in enumerate(value)]))
    return None


def bucket_field(value: Any) -> str:
    """A library caller's project or channel: missing or not a string is the global bucket '' (ISO-1)."""
    return value if isinstance(value, str) else ""


def check_key_field(name: str, value: str) -> str | None:
    """A key field (msg_id, channel, project_id) is refused, never cut, past 256."""
    if len(value) > KEY_FIELD_MAX:
        return f"{name} too long ({len(value)} chars, max {KEY_FIELD_MAX})"
    return nul_refusal(**{name: value})


def check_timestamp_field(value: str) -> str | None:
    if len(value) > TIMESTAMP_MAX:
        return f"timestamp too long ({len(value)} chars, max {TIMESTAMP_MAX})"
    return nul_refusal(timestamp=value)


def check_json_size(name: str, serialized: str, cap: int) -> str | None:
    """Serialized ``source`` / ``metadata`` past the cap is refused, never cut."""
    if len(serialized) > cap:
        return f"{name} too large ({len(serialized)} chars, max {cap})"
    return None


def has_lone_surrogate(text: str) -> bool:
    """True if ``text`` holds a lone UTF-16 surrogate.

    It is the one thing a Python str can hold that UTF-8 cannot encode, and
    encoding is a C loop, so this stays cheap on a multi-megabyte string.
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def find_lone_surrogate(*values: Any) -> bool:
    """True if any string in ``values`` (nested in dicts/lists too) holds a lone surrogate.

    The MCP facade refuses these before a service runs (spec G-6); services
    check again because a library caller can hand them in directly, and such a
    string cannot be encoded into the database.
    """
    stack = list(values)
    while stack:
        value = stack.pop()
        if isinstance(value, str):
            if has_lone_surrogate(value):
                return True
        elif isinstance(value, dict):
            stack.extend(value.keys())
            stack.extend(value.values())
        elif isinstance(value, (list, tuple)):
            stack.extend(value)
    return False


# -- JSON columns (spec §5.2.2, storage VF-4) ------------------------------------------


def _finite(value: Any) -> Any:
    """The value with NaN and ±Infinity replaced by None, at any depth."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(item) for item in value]
    return value


def to_json(value: Any) -> str:
    """The JSON text stored in ``source`` / ``metadata``.

    Python's default separators with non-ASCII escaped, as every CPersona
    database holds them (VF-4); non-finite numbers become ``null`` because
    strict JSON readers (SQLite's json functions among them) reject them.
    Raises ``ValueError`` for a value JSON cannot represent.
    """
    try:
        return json.dumps(_finite(value), ensure_ascii=True, allow_nan=False)
    except (TypeError, ValueError, RecursionError) as exc:
        raise ValueError(f"not representable as JSON: {exc}") from None


# -- source normalisation (spec §5.2.3) ------------------------------------------------

CANONICAL_TYPES = ("User", "Agent", "System")
_TYPE_WORDS = {
    "user": "User",
    "agent": "Agent",
    "system": "System",
    "assistant": "Agent",
    "ai": "Agent",
    "session": "System",
}
_BARE_WORDS = {"user": "User", "assistant": "Agent", "ai": "Agent"}


def normalize_source(source: Any) -> Any:
    """Fold the legacy spellings of ``source`` into the canonical ``{type, id, name}``.

    Shapes the rules do not name are returned unchanged: the column keeps what
    the caller meant rather than guessing.
    """
    if source is None:
        return {}
    if isinstance(source, str):
        kind = _BARE_WORDS.get(source.strip().lower())
        return {"type": kind, "id": "", "name": ""} if kind else source
    if not isinstance(source, dict):
        return source

    declared = source.get("type")
    if declared is not None:
        if declared in CANONICAL_TYPES:
            return source
        if isinstance(declared, str) and (kind := _TYPE_WORDS.get(declared.strip().lower())):
            return {**source, "type": kind}
        return source

    present = [key for key in CANONICAL_TYPES if key in source]
    if len(present) != 1:
        return source
    kind = present[0]
    value = source[kind]
    if isinstance(value, dict):
        shaped = {**value, "type": kind}
        shaped.setdefault("id", "")
        shaped.setdefault("name", "")
        return shaped
    if isinstance(value, str):
        # A system source names a process, not a person: its name stays empty.
        return {"type": kind, "id": value, "name": "" if kind == "System" else value}
    return source


def source_id_text(source: Any) -> str | None:
    """``source.$.id`` compared as text, the key of content dedup (spec DD-2).

    None means "no id" (not an object, no ``id`` key, or JSON null), and only
    equals another "no id"; an empty string is an id like any other.
    """
    if not isinstance(source, dict) or source.get("id") is None:
        return None
    value = source["id"]
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "1" if value else "0"  # how SQLite's json_extract renders true/false
    return json.dumps(value, ensure_ascii=True)


def parse_stored_json(text: str | None) -> Any:
    """A stored JSON column (``source``, ``metadata``) as a value; ``{}`` when empty or unreadable.

    The one reader of those columns for answers: a legacy row's broken JSON
    must not fail the read that shows it.
    """
    if not text:
        return {}
    try:
        return json.loads(text)
    except (TypeError, ValueError, RecursionError):
        return {}
