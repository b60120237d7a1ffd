"""Stage 1a: cue terms — declared names the query mentions widen the lexical search (RX-7, RX-8).

A query naming a declared entity also searches for that entity's other
names, so "Mina" finds rows that only say "M. Tanaka". The extra terms go to
the lexical arms only; they add a vote and never admit a row past the gate.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sqlalchemy.orm import Session

from cpersona.services.graph.associations import entity_rows, normalize
from cpersona.storage.repositories.associations import AssociationRepository
from cpersona.storage.scope import Scope

MAX_MATCHES = 64
MAX_TERMS = 32


@dataclass(slots=True)
class Cues:
    entities: list[str] = field(default_factory=list)  # declared names of the matched entities
    terms: list[str] = field(default_factory=list)  # extra lexical terms, as written
    terms_omitted: int = 0

    def trace(self) -> dict[str, object] | None:
        if not self.entities:
            return None
        out: dict[str, object] = {"entities": list(self.entities)}
        if self.terms:
            out["terms"] = list(self.terms)
        if self.terms_omitted:
            out["terms_omitted"] = self.terms_omitted
        return out


def _overlaps(span: tuple[int, int], claimed: list[tuple[int, int]]) -> bool:
    return any(span[0] < end and start < span[1] for start, end in claimed)


def _occurrences(text: str, term: str) -> list[tuple[int, int]]:
    spans, at = [], text.find(term)
    while at >= 0:
        spans.append((at, at + len(term)))
        at = text.find(term, at + 1)
    return spans


def cue_terms(session: Session, scope: Scope, query: str) -> Cues:
    """RX-7: readable entities whose name or alias occurs in the query, and their other names."""
    folded = normalize(query)
    cues = Cues()
    if not folded:
        return cues
    matches = AssociationRepository(session, scope).names_in(folded, MAX_MATCHES)
    counted_terms: set[str] = set()
    claimed: list[tuple[int, int]] = []
    matched: list[int] = []
    for term, entity_id in matches:
        counts = term in counted_terms
        if not counts:
            for span in _occurrences(folded, term):
                if not _overlaps(span, claimed):
                    claimed.append(span)  # a shorter name inside a longer one names nothing ("eye" in "mizeye")
                    counts = True
                    break
        if counts:
            counted_terms.add(term)
            if entity_id not in matched:
                matched.append(entity_id)
    if not matched:
        return cues
    details = entity_rows(session, matched)
    seen: set[str] = set()
    for entity_id in matched:
        name, aliases = details[entity_id]
        cues.entities.append(name)
        for written in [name, *aliases]:
            key = normalize(written)
            if not key or key in folded or key in seen:
                continue
            seen.add(key)
            if len(cues.terms) < MAX_TERMS:
                cues.terms.append(written)
            else:
                cues.terms_omitted += 1
    return cues
