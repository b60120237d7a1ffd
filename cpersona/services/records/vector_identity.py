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

from cpersona.services.app import App
from cpersona.storage.repositories.embedding_identity import EmbeddingIdentityRepository

log = logging.getLogger(__name__)


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
        return EmbeddingIdentityRepository(session).recorded()


def reconcile(app: App) -> Reconciled:
    """Compare the live identity with the recorded one; clear the vectors of another model."""
    live = live_identity(app.embedder)
    if live is None:
        return Reconciled("unknown")
    label, dimension = live
    now = datetime.now(timezone.utc).isoformat()
    with app.db.write() as session:
        identity = EmbeddingIdentityRepository(session)
        recorded = identity.recorded()
        if recorded is None:
            identity.record(label, dimension, now)
            return Reconciled("recorded", label)
        previous, recorded_dimension = recorded
        if previous == label:
            if dimension is not None and recorded_dimension != dimension:
                identity.set_dimension(dimension)
            return Reconciled("unchanged", label)
        cleared = identity.clear_vectors()
        identity.replace(label, dimension, now)
    log.warning(
        "the embedding model changed from %s to %s: %d stored vector(s) cleared; the backfill "
        "re-embeds those rows with the new model (keyword search finds them meanwhile)",
        previous,
        label,
        cleared,
    )
    return Reconciled("cleared", label, previous, cleared)
