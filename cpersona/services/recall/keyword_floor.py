"""What keeps an answer from losing the memories that match (issue 14).

Two rules: embeddings never cost answers (the gate's keyword-only floor), and
episodes never take a whole answer when memories matched (:func:`keep_a_memory`);
and when the gate does empty an answer, the answer says so (:func:`gate_notice`).

Embeddings never cost answers.

With an embedder on, the gate judges fused scores that the vector channel
helped make. A weak or out-of-domain embedder then did harm in two ways: its
votes (weighted ``CPERSONA_RECALL_VECTOR_WEIGHT``) lowered the fused score of
rows only the lexical lists found below the fused bar, and its rows took the
places of lexical ones. On small pools the first emptied answers that
keyword-only recall filled (a row on one list at rank 0 scores 1/(K+1), below
the fused bar there).

So every candidate of an embedded query carries two more scores:

- ``lexical``: its fused score over the lexical lists alone, exactly what
  keyword-only recall would have judged; the gate admits a row that passes
  keyword-only's bar on it (``gate.apply_gate``), whatever the fused bar or a
  calibrated gate say;
- ``judged_rrf``: under rrf, its score with the near vector list at full
  weight, so a down-weighted vector channel orders rows but does not move
  the heuristic bar (the bar was derived on unit votes, spec GATE-2).

Both are read off the retrievers' own ranks, so they are also set when the
lexical lists were put on one scale (``fusion.on_one_scale``) for a query
without a vector: the stretched episode ranks order rows, they don't gate them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from cpersona.services.recall.fusion import VECTOR_CHANNELS, RankedList, rrf, rsf
from cpersona.services.recall.gate import Candidate


def annotate(lists: Sequence[RankedList], rows: Sequence[Candidate], mode: str, rrf_k: int) -> None:
    """Set ``lexical`` (and under rrf ``judged_rrf``) on the fused rows of an embedded query."""
    lexical = [lst for lst in lists if lst.channel not in VECTOR_CHANNELS]
    fuse = (lambda chosen: rrf(chosen, rrf_k)) if mode == "rrf" else rsf
    by_key = {row.key: row.score for row in fuse(lexical)}
    judged: dict = {}
    if mode == "rrf":
        unit = [replace(lst, weight=1.0) if lst.channel == "vector" else lst for lst in lists]
        judged = {row.key: row.score for row in rrf(unit, rrf_k)}
    for row in rows:
        row.lexical = None if row.key not in by_key else (mode, by_key[row.key])
        row.judged_rrf = judged.get(row.key)


def keep_a_memory(rows: Sequence[Candidate], limit: int) -> list[Candidate]:
    """The first ``limit`` rows, except that a full answer of episodes only keeps a seat for a memory.

    Episodes summarise many turns, so they match many questions; when every
    seat went to one, the best memory that passed the gate takes the last
    episode's seat (its rank, the lowest place). An answer with room to spare
    already holds every memory that passed.
    """
    ranked = list(rows[:limit])
    shown = [row for row in ranked if not row.is_profile]
    if limit < 2 or len(ranked) < limit or not shown or any(row.record.kind == "mem" for row in shown):
        return ranked
    memory = next((row for row in rows[limit:] if row.record is not None and row.record.kind == "mem"), None)
    if memory is None:
        return ranked
    ranked[ranked.index(shown[-1])] = memory
    return ranked


def gate_notice(candidates: Sequence[Candidate], admitted: Sequence[Candidate]) -> dict[str, Any] | None:
    """What the answer says when the quality gate turned every candidate away, else None.

    An empty answer used to look the same whether nothing matched or the gate
    judged every match too weak; only the second can be changed by the caller
    (``deep``).
    """
    scored = [row for row in candidates if not row.is_profile]
    if not scored or any(not row.is_profile for row in admitted):
        return None
    return {
        "candidates": len(scored),
        "message": f"{len(scored)} candidate row(s) were found but none cleared the quality gate; "
        "deep=true halves its bar",
    }
