"""Which model made the stored vectors, and what happens when that changes.

The database records one embedding identity (table ``embedding_identity``):
the label of the model in force — a local model's or ``/capabilities``'
fingerprint, the configured model name in ``api`` mode — and its width. The
backfill worker reconciles it before each run:

- no identity known for the live backend (an ``http`` backend that does not
  name itself): nothing is recorded or changed — unknown is never "changed";
- nothing recorded yet: the live identity is recorded and the vectors are
  kept (a database from before this record, or a new one);
- the same label: nothing to do;
- another label: every stored memory and episode vector is cleared in one
  short transaction and the new identity recorded, so the backfill that runs
  next re-embeds the rows with the live model. Vectors of two models are never
  ranked against each other; until a row is re-embedded, keyword search finds it.

Record nodes carry their own model key and are rebuilt by their own rule (OV-2).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import text

from cpersona.services.app import App

log = logging.getLogger(__name__)

_TABLES = ("memories", "episodes")


@dataclass(frozen=True)
class Reconciled:
    action: str  # "unknown", "recorded", "unchanged", "cleared"
    label: str = ""
    previous: str = ""
    cleared: int = 0


def live_identity(embedder: Any) -> tuple[str, int | None] | None:
    """(label, width or None) of the live backend, or None when it cannot be named.

    Never sends an embedding request: a local model names itself from its files,
    an http backend from its capability report (asked when due), api mode from
    the configured model.
    """
    own = getattr(embedder, "identity", None)
    if callable(own):
        return own()
    ask = getattr(embedder, "label_for_write", None)
    label = ask() if callable(ask) else ""
    return (label, getattr(embedder, "dimension", None)) if label else None


def recorded_identity(app: App) -> tuple[str, int | None] | None:
    with app.db.read() as session:
        row = session.execute(text("SELECT label, dimension FROM embedding_identity WHERE id = 1")).first()
    return None if row is None else (row.label, row.dimension)


def reconcile(app: App) -> Reconciled:
    """Compare the live identity with the recorded one; clear the vectors of another model."""
    live = live_identity(app.embedder)
    if live is None:
        return Reconciled("unknown")
    label, dimension = live
    now = datetime.now(timezone.utc).isoformat()
    params = {"label": label, "dimension": dimension, "at": now}
    with app.db.write() as session:
        row = session.execute(text("SELECT label, dimension FROM embedding_identity WHERE id = 1")).first()
        if row is None:
            session.execute(text("INSERT INTO embedding_identity (id, label, dimension, recorded_at) "
                                 "VALUES (1, :label, :dimension, :at)"), params)
            return Reconciled("recorded", label)
        if row.label == label:
            if dimension is not None and row.dimension != dimension:
                session.execute(text("UPDATE embedding_identity SET dimension = :dimension WHERE id = 1"), params)
            return Reconciled("unchanged", label)
        cleared = sum(session.execute(text(f"UPDATE {table} SET embedding = NULL WHERE embedding IS NOT NULL"))
                      .rowcount or 0 for table in _TABLES)
        session.execute(text("UPDATE embedding_identity SET label = :label, dimension = :dimension, "
                             "recorded_at = :at WHERE id = 1"), params)
    log.warning("the embedding model changed from %s to %s: %d stored vector(s) cleared; the backfill "
                "re-embeds those rows with the new model (keyword search finds them meanwhile)",
                row.label, label, cleared)
    return Reconciled("cleared", label, row.label, cleared)
