"""Plain Okapi BM25 over the same formatted turns: the floor recall must never fall below.

No stemming, no fields: lower-cased word tokens, k1=1.2, b=0.75, and the
non-negative idf log(1 + (N - n + 0.5) / (n + 0.5)). By default English
function words are dropped from documents and queries (the benchmark's
floor); `stop_words=frozenset()` gives BM25 with every token, which scores
lower on LoCoMo because "what", "did", "the" match nearly every turn.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from typing import Callable, Sequence

_TOKEN = re.compile(r"\w+", re.UNICODE)

ENGLISH_STOP_WORDS = frozenset(
    """a an the and or but if of at by for with about against between into through during
    before after above below to from up down in out on off over under again further then once
    here there when where why how all any both each few more most other some such no nor not
    only own same so than too very s t can will just don should now i me my myself we our ours
    ourselves you your yours yourself yourselves he him his himself she her hers herself it its
    itself they them their theirs themselves what which who whom this that these those am is
    are was were be been being have has had having do does did doing would could""".split()
)


def tokenize(text: str, stop_words: frozenset[str] = frozenset()) -> list[str]:
    return [token for token in _TOKEN.findall(text.lower()) if token not in stop_words]


class BM25Index:
    def __init__(
        self,
        doc_ids: Sequence[str],
        texts: Sequence[str],
        k1: float = 1.2,
        b: float = 0.75,
        stop_words: frozenset[str] = ENGLISH_STOP_WORDS,
        tokenizer: Callable[[str], list[str]] | None = None,
    ) -> None:
        """``tokenizer`` replaces the word tokens (and ``stop_words``) when given, e.g. character bigrams."""
        if len(doc_ids) != len(texts):
            raise ValueError("doc_ids and texts differ in length")
        self.doc_ids = list(doc_ids)
        self.k1, self.b = k1, b
        self.tokens = tokenizer or (lambda text: tokenize(text, stop_words))
        self.term_counts = [Counter(self.tokens(text)) for text in texts]
        self.lengths = [sum(counts.values()) for counts in self.term_counts]
        self.average_length = (sum(self.lengths) / len(self.lengths)) if self.lengths else 0.0
        document_frequency: Counter[str] = Counter()
        for counts in self.term_counts:
            document_frequency.update(counts.keys())
        total = len(self.doc_ids)
        self.idf = {
            term: math.log(1.0 + (total - frequency + 0.5) / (frequency + 0.5))
            for term, frequency in document_frequency.items()
        }

    def score(self, query: str) -> list[float]:
        terms = [term for term in set(self.tokens(query)) if term in self.idf]
        scores = []
        for counts, length in zip(self.term_counts, self.lengths):
            norm = self.k1 * (1.0 - self.b + self.b * length / self.average_length)
            total = 0.0
            for term in terms:
                frequency = counts.get(term, 0)
                if frequency:
                    total += self.idf[term] * frequency * (self.k1 + 1.0) / (frequency + norm)
            scores.append(total)
        return scores

    def search(self, query: str, limit: int) -> list[str]:
        """Best-first ids of the documents matching at least one query term (ties: earlier document first)."""
        scores = self.score(query)
        order = sorted((i for i, s in enumerate(scores) if s > 0.0), key=lambda i: (-scores[i], i))
        return [self.doc_ids[i] for i in order[:limit]]
