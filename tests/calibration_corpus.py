"""Corpora for the calibration tests: real rows with real vectors in a real SQLite file.

Vectors come from the test embedding server's deterministic embedder
(``embed_text``), so rows inserted directly carry exactly the vector the
server would have returned for them over HTTP.
"""

from __future__ import annotations

import random
from datetime import datetime, timedelta, timezone

from cpersona.embedding.vectors import to_blob
from cpersona.storage.engine import Database
from cpersona.storage.models import Memory
from embed_server import embed_text

TOPICS = [
    "cooking pasta tomato sauce basil", "python asyncio event loop tasks", "hiking mountain trail boots",
    "guitar chords practice strumming", "tax return deadline receipts", "garden roses pruning spring",
    "kubernetes pods deployment yaml", "marathon training long run pace", "coffee espresso grinder beans",
    "astronomy telescope saturn rings", "knitting wool scarf pattern", "bicycle chain repair gears",
    "french verbs conjugation lesson", "chess opening sicilian defence", "photography aperture lens light",
    "sourdough starter flour hydration",
]  # fmt: skip
BASE = datetime(2026, 1, 1, 9, 0, tzinfo=timezone.utc)


def sessions(groups: int, per_group: int, gap_minutes: int = 5, seed: int = 7) -> list[tuple[str, str]]:
    """(content, timestamp) rows: ``groups`` sessions a day apart, ``per_group`` notes minutes apart.

    Notes of one session share a topic, so they are related both in time and
    in wording. This is the corpus the reference was run on for the figures
    the tests compare against (same seed, same text, same stamps).
    """
    rng = random.Random(seed)
    rows = []
    for g in range(groups):
        words = TOPICS[g % len(TOPICS)].split()
        for i in range(per_group):
            stamp = BASE + timedelta(days=g, minutes=i * gap_minutes)
            content = (
                f"note {g}-{i}: "
                + " ".join(rng.sample(words, 3))
                + f" {rng.choice(['today', 'again', 'later', 'maybe'])}"
            )
            rows.append((content, stamp.isoformat().replace("+00:00", "Z")))
    return rows


def insert(
    db: Database, agent_id: str, rows: list[tuple[str, str]], *, dimension: int = 64, blob: bytes | None = None
) -> list[int]:
    """Insert memories with their vectors (or the given ``blob``); returns their ids."""
    with db.write() as session:
        made = [
            Memory(
                agent_id=agent_id,
                content=content,
                timestamp=stamp,
                embedding=blob if blob is not None else to_blob(embed_text(content, dimension)),
            )
            for content, stamp in rows
        ]
        session.add_all(made)
        session.flush()
        return [m.id for m in made]
