"""Hand-written SQL statements, each built once per distinct text.

The search backends assemble their SQL from a few fixed shapes (the scope's
fragment, the columns, the FTS table), so the same strings come back on every
recall. Building a ``TextClause`` parses the string for bind parameters each
time, and at a dozen statements a recall that cost about as much as a tenth
of the recall's whole CPU at 10k rows; the parameters' values are never part
of the text, so the statements can be shared. A ``TextClause`` is not changed
by executing it, and ``.bindparams()`` returns a copy, so sharing is safe
across threads.
"""

from __future__ import annotations

from functools import lru_cache

from sqlalchemy import TextClause
from sqlalchemy import text as _build


@lru_cache(maxsize=1024)
def text(sql: str) -> TextClause:
    """``sqlalchemy.text(sql)``, built on the first call and shared afterwards."""
    return _build(sql)
