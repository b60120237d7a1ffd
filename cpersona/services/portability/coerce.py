"""Turning the values of a JSONL record into column values, or refusing them.

The tolerances are those a reader of the export format must keep (spec JL-5,
JL-6, JL-8, IM-5): ``null`` in a text field reads as empty, flags are read by
truthiness, counters accept integral numbers and numeric strings. Anything that
cannot be stored refuses its own line with a reason, never the whole file.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
import struct
from typing import Any

from cpersona.services.sanitize import has_lone_surrogate, nul_refusal, to_json
from cpersona.services.timestamps import parse_iso

INT64_MAX = 2**63 - 1
INT64_MIN = -(2**63)


class LineRefused(Exception):
    """This record cannot be stored; ``reason`` completes "Line N: <kind> …"."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class VectorRejected(Exception):
    """An ``embedding_b64`` that is not a storable vector (the row is kept without it)."""


def _storable(value: str, field: str) -> str:
    # json.loads turns "\ud800" into a lone surrogate, which no database
    # encoding can hold: refuse it here rather than fail at the INSERT.
    if has_lone_surrogate(value):
        raise LineRefused(f"{field} holds an unpaired surrogate")
    return value


def text(record: dict[str, Any], field: str, default: str = "") -> str:
    """A text field; absent or null → ``default``; any other non-string refuses the line."""
    value = record.get(field)
    if value is None:
        return default
    if not isinstance(value, str):
        raise LineRefused(f"{field} is not a string")
    return _storable(value, field)


def optional_text(record: dict[str, Any], field: str) -> str | None:
    """A nullable text column (``last_recalled_at``, ``start_time``…): absent or null stays None."""
    return None if record.get(field) is None else text(record, field)


def flag(record: dict[str, Any], field: str) -> int:
    """``locked`` / ``resolved``: truthiness, stored as 0/1 (JL-8)."""
    return 1 if record.get(field) else 0


_NUMERIC = re.compile(r"[+-]?\d+")


def count(record: dict[str, Any], field: str) -> int:
    """``recall_count``: integers, integral floats and numeric strings (JL-8)."""
    value = record.get(field)
    if value is None:
        return 0
    if isinstance(value, bool):
        raise LineRefused(f"{field} is not a number")
    if isinstance(value, float):
        if not (math.isfinite(value) and value.is_integer()):
            raise LineRefused(f"{field} is not a whole number")
        value = int(value)
    elif isinstance(value, str):
        if not _NUMERIC.fullmatch(value.strip()):
            raise LineRefused(f"{field} is not a number")
        value = int(value.strip())
    elif not isinstance(value, int):
        raise LineRefused(f"{field} is not a number")
    if not INT64_MIN <= value <= INT64_MAX:
        raise LineRefused(f"{field} is out of range")
    return value


def keywords(record: dict[str, Any]) -> str:
    """Episode keywords: a string, or a list of strings joined by single spaces."""
    value = record.get("keywords")
    if isinstance(value, list):
        if not all(isinstance(item, str) for item in value):
            raise LineRefused("keywords holds a non-string item")
        value = " ".join(value)
        record = {"keywords": value}
    return text(record, "keywords")


def json_column(record: dict[str, Any], field: str) -> str:
    """``source`` / ``metadata`` as stored text.

    ``<field>_text`` (JL-5) carries the verbatim text of a column that was not
    valid JSON, and wins. Otherwise the parsed value is serialised the way the
    store writes it (:func:`cpersona.services.sanitize.to_json`); absent or
    null means the empty object, as on ``store``.
    """
    verbatim = record.get(f"{field}_text")
    if isinstance(verbatim, str):
        return _storable(verbatim, f"{field}_text")
    value = record.get(field)
    if value is None:
        return "{}"
    try:
        return to_json(value)  # non-finite numbers become null (IM-6.5)
    except ValueError:
        raise LineRefused(f"{field} cannot be serialised as JSON") from None


def _reject_constant(name: str) -> Any:
    raise ValueError(f"non-standard JSON constant {name}")


def parse_json_column(stored: str) -> tuple[Any, str | None]:
    """Export side of JL-5: (value, None) for valid JSON, else ({}, verbatim text).

    NaN and Infinity count as invalid: Python would parse them, but writing them
    back would make the export line unreadable to every strict JSON reader.
    """
    try:
        return json.loads(stored, parse_constant=_reject_constant), None
    except (ValueError, TypeError, RecursionError):
        return {}, stored


def decode_vector(value: Any) -> bytes:
    """The blob behind ``embedding_b64`` (JL-6, VF-5), or VectorRejected with why."""
    if not isinstance(value, str):
        raise VectorRejected("embedding_b64 is not a string")
    try:
        blob = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise VectorRejected("embedding_b64 is not valid base64") from None
    if not blob or len(blob) % 4:
        raise VectorRejected("embedding_b64 is not a whole number of float32 values")
    if not vector_is_finite(blob):
        raise VectorRejected("embedding_b64 holds non-finite values")
    return blob


def vector_is_finite(blob: bytes) -> bool:
    return all(math.isfinite(x) for (x,) in struct.iter_unpack("<f", blob))


def encode_vector(blob: bytes) -> str:
    return base64.b64encode(blob).decode("ascii")


def key(record: dict[str, Any], field: str) -> str:
    """An identity field (msg_id, project_id, channel, user_id): text without NUL.

    A NUL would make two keys compare equal in some SQL functions and cannot be
    stored by PostgreSQL; the store refuses it in keys too.
    """
    value = text(record, field)
    if problem := nul_refusal(**{field: value}):
        raise LineRefused(problem)
    return value


def is_newer(left: str | None, right: str | None) -> bool:
    """Whether stamp ``left`` is later than ``right`` (text order if either is unreadable)."""
    a, b = parse_iso(left or ""), parse_iso(right or "")
    if a is not None and b is not None:
        return a > b
    return (left or "") > (right or "")
