"""The word channel's retriever: stemmed whole words beside the trigram index (issue 14).

The word lists (:mod:`cpersona.storage.search_words`) are not fusion lists of
their own: each is merged into the trigram list of the same table, and the
merged list takes the trigram list's place ("episodes", "memories"). So fusion
still sees one lexical list per table, the scale every fused score and gate
bar is defined on (three first places at most) is unchanged, and a row both
indexes rank high rises within its list rather than collecting an extra vote
against the vector channel.

The merge is a reciprocal-rank sum with a small constant: ``1/(K+r+1)`` from
the trigram rank ``r`` plus ``w/(K+s+1)`` from the word rank ``s``, with
``w = CPERSONA_RECALL_WORD_WEIGHT`` (0 leaves the word channel out). On a tie
the row the trigram list ranked first wins, so the outcome depends only on
the inputs (RC-11). A row's raw score is its merged score (higher is better),
which is what rsf normalises.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from cpersona.storage.search import Hit, RowKey, SearchBackend
from cpersona.services.recall import cjk_query
from cpersona.services.recall.common_words import without_common_only
from cpersona.services.recall.replies import with_replies

if TYPE_CHECKING:
    from cpersona.services.recall.retrievers import Query, Retrieval

# Chosen with the weight (2) by leave-one-conversation-out on the LoCoMo dev
# conversations, in every fold (docs/benchmarks.md): the word ranking leads,
# trigram confirms and breaks ties.
MERGE_K = 2


def with_words(trigram: Sequence[Hit], words: Sequence[Hit], depth: int, *, weight: float) -> list[Hit]:
    """``trigram`` and ``words`` as one ranked list of at most ``depth`` hits."""
    if weight <= 0 or not words:
        return list(trigram)
    score: dict[RowKey, float] = {}
    hits: dict[RowKey, Hit] = {}
    for share, listed in ((1.0, trigram), (weight, words)):
        for rank, hit in enumerate(listed):
            key = hit.record.key
            hits.setdefault(key, hit)
            score[key] = score.get(key, 0.0) + share / (MERGE_K + rank + 1)
    order = sorted(score, key=lambda key: -score[key])  # stable: trigram order first on a tie
    return [Hit(hits[key].record, score[key]) for key in order[:depth]]


def add_lexical_lists(
    backend: SearchBackend,
    query: Query,
    depth: int,
    excluded: Callable[[str], bool],
    found: Retrieval,
    *,
    weight: float,
    phrases: Sequence[str] = (),
    cjk: bool = False,
    whole: bool = False,
) -> None:
    """The two lexical lists, in fusion order: episodes (when they apply), then memories.

    ``phrases`` (reconstruct's declared names, RX-8) go to the trigram arms
    only: a name is searched as written, spaces included. ``cjk`` (recall of a
    kana/kanji query) reads the memories' trigram side as content runs and
    bigrams instead (cjk_query), with no word list merged into it. The memories
    list then takes the replies of its question rows (:mod:`~cpersona.services.recall.replies`).
    ``whole`` keeps each merged list whole (up to both indexes' ``depth`` rows)
    instead of cutting it at ``depth``: the rows past the cut vote only where
    the vector channel ranks them within ``depth`` (``fusion.confirmed``).
    ``whole`` is the query-vector case, and then the memories list also loses
    its rows holding only the scope's common words (:mod:`~cpersona.services.recall.common_words`).
    """
    keep = 2 * depth if whole else depth
    if query.episodes_apply:
        episodes = backend.keyword_episodes(query.scope, query.text, depth, phrases=phrases)
        words = backend.word_episodes(query.scope, query.text, depth) if weight > 0 else []
        found.add("episodes", with_words(episodes, words, keep, weight=weight), excluded)
    if cjk:
        hits = cjk_query.keyword_memories(backend, query.scope, query.text, depth, source_id=query.source_id)
    else:
        hits = backend.keyword_memories(query.scope, query.text, depth, source_id=query.source_id, phrases=phrases).hits
    # A kana/kanji query's reading scores its Latin words itself, beside its runs and
    # bigrams; led by the word ranking it lost the row sharing the rarer Japanese runs.
    words_apply = weight > 0 and not cjk
    words = backend.word_memories(query.scope, query.text, depth, source_id=query.source_id) if words_apply else []
    merged = with_words(hits, words, keep, weight=weight)
    if whole and words_apply and not query.pseudo:
        # A query vector under rrf (``whole``): rows sharing only the scope's common words with the
        # query give their seats to the vector channel's rows (common_words, issue 14).
        merged = without_common_only(backend, query.scope, query.text, merged, source_id=query.source_id)
    found.add("memories", with_replies(backend, query.scope, merged, keep, source_id=query.source_id), excluded)
