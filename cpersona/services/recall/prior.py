"""The age prior: an optional lean toward newer rows among fused results (spec §5.9.6).

``p = max(CPERSONA_PRIOR_AGE_FLOOR, 1 / (1 + age_h × CPERSONA_PRIOR_AGE_RATE))``,
age measured from the scope's newest memory timestamp (anchor ``newest``) or
from now (``now``); an undated row sits at the middle of the scope's span.
Rows are re-sorted by fused score × p. It runs after the gate and autocut, so
it reorders what was admitted and never admits or removes a row. At the
default rate 0 it does nothing.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from cpersona.services.recall.confidence import HOUR, TimeSpan
from cpersona.services.recall.gate import Candidate
from cpersona.services.timestamps import parse_iso


def prior_applies(settings: Any, rows: list[Candidate], *, legacy: bool) -> str | None:
    """The fused score the prior multiplies ("rrf" or "rsf"), or None when it does not run."""
    if settings.prior_age_rate <= 0 or legacy:
        return None
    scored = [row for row in rows if not row.is_profile]
    if not scored:
        return None
    for name in ("rrf", "rsf"):
        if all(getattr(row, name) is not None for row in scored):
            return name
    return None


def apply_prior(settings: Any, rows: list[Candidate], name: str, *, span: TimeSpan, now: datetime) -> list[Candidate]:
    """Each non-profile row's ``prior``, and the rows re-sorted by ``name`` × prior (stable, profile last)."""
    anchor = now if settings.prior_age_anchor == "now" else span.newest
    scored = [row for row in rows if not row.is_profile]
    for row in scored:
        stamp = parse_iso(row.record.timestamp) if row.record is not None and row.record.timestamp else None
        if stamp is not None and anchor is not None:
            age_h = max(0.0, (anchor - stamp).total_seconds() / HOUR)
        else:  # undated: the middle of the span, as seen from the anchor
            age_h = span.range_hours / 2 + (span.newest_age_hours(now) if settings.prior_age_anchor == "now" else 0.0)
        row.prior = max(settings.prior_age_floor, 1 / (1 + age_h * settings.prior_age_rate))
    scored.sort(key=lambda row: -(getattr(row, name) * row.prior))  # type: ignore[operator]
    return scored + [row for row in rows if row.is_profile]
