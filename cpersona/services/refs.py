"""Record refs: ``mem:<id>`` names a row of ``memories``, ``ep:<id>`` one of ``episodes``.

The one reader of a ref string (spec associations-and-reconstruct §0.3). The
spec lets its readers differ in three ways, each a named option here so a
caller states which reading it needs:

- ``trim``: surrounding white space is ignored. Declared text is trimmed
  before it is read (A-3), so ``" mem:3 "`` is a ref in declare_associations;
  get_contents reads the string exactly as sent (GC-3).
- ``leading_zeros``: ``mem:007`` is read as ``mem:7`` (§0.3: accepted wherever
  a ref is read). Refs *stored* in a column or written to an export file are
  canonical (storage VF-7), so the graph records of a file are read with
  ``leading_zeros=False``: a non-canonical spelling there is malformed.
- ``max_chars``: a string longer than this is not scanned at all (a cost
  guard; None: no guard).

The id is never range-checked here: :attr:`Ref.in_range` says whether it fits
a signed 64-bit row id, and the caller decides what an out-of-range id means
(get_contents: malformed; declare_associations: a ref that names nothing;
an import file: the file's own record id, compared with the file's ids).

Everywhere: the kind is lower case, the id is ASCII decimal digits only.
Signs, inner spaces, underscores and non-ASCII digits — which ``int()`` would
quietly accept — make the string no ref.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

RECORD_KINDS = ("mem", "ep")
MAX_ID = 2**63 - 1  # a ref whose id does not fit a signed 64-bit integer names no row
MAX_REF_CHARS = 64  # the default guard: a canonical ref is at most 23 characters

# Python converts at most this many digits to an int (sys.int_info); a longer
# id cannot be a JSON number of an import file either, so it names nothing.
_MAX_DIGITS = 4300
_REF = re.compile(r"(mem|ep):([0-9]+)")


@dataclass(frozen=True, slots=True)
class Ref:
    """A ref-shaped string read: ``kind`` and ``id`` (the id may be 0 or overflow)."""

    kind: str
    id: int

    @property
    def canonical(self) -> str:
        return canonical_ref(self.kind, self.id)

    @property
    def in_range(self) -> bool:
        """The id can be a row id: 1 … 2**63 - 1."""
        return 1 <= self.id <= MAX_ID

    @property
    def key(self) -> tuple[str, int]:
        return (self.kind, self.id)


def canonical_ref(kind: str, record_id: int) -> str:
    """The stored spelling of a ref (VF-7): no leading zeros."""
    return f"{kind}:{record_id}"


def parse_ref(
    value: Any,
    *,
    trim: bool = False,
    leading_zeros: bool = True,
    max_chars: int | None = MAX_REF_CHARS,
) -> Ref | None:
    """The ref ``value`` spells under the given reading, else None (not a string, not ref-shaped)."""
    if not isinstance(value, str) or (max_chars is not None and len(value) > max_chars):
        return None
    match = _REF.fullmatch(value.strip() if trim else value)
    if match is None:
        return None
    kind, digits = match.groups()
    significant = digits.lstrip("0") or "0"
    if len(significant) != len(digits) and not leading_zeros:
        return None
    if len(significant) > _MAX_DIGITS:
        return None
    return Ref(kind, int(significant))


def ref_key(ref: str) -> tuple[str, int]:
    """``(kind, id)`` of a ref the server itself wrote (a stored or canonical one).

    ValueError when ``ref`` is not one: such a string reaching this point is a
    bug upstream, not caller input.
    """
    found = parse_ref(ref, leading_zeros=False, max_chars=None)
    if found is None:
        raise ValueError(f"not a canonical record ref: {ref!r}")
    return found.key


__all__ = ["MAX_ID", "MAX_REF_CHARS", "RECORD_KINDS", "Ref", "canonical_ref", "parse_ref", "ref_key"]
