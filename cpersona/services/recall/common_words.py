"""With a query vector, keyword rows that share only the scope's common words with the query leave the list (issue 14).

A question names its subject ("What did Nate think of the coconut milk ice
cream he made?") with words of two kinds: words most memories in the scope
hold (a speaker's or the user's own name, in half a conversation's turns) and
the words that say what it is about. The keyword lists rank every row holding
either; a row holding only the common ones (or none of the content words at
all: a trigram substring, the function-word tier) fills a seat of the answer
almost never usefully: on LoCoMo dev such rows in the keyword memories list's
first ten were evidence 2 times in 617 (0.3%), against 3.3% for the vector
channel's first row no keyword list holds and 4% for keyword rows ranked past
the tenth (``bench/lexical_replay.py``, docs/benchmarks.md "Issue 14, seventh
pass"). With a query vector under rrf the vector channel has rows to seat,
so the memories list drops them before fusion. Keyword-only recall keeps
them: the rule was chosen for the hybrid (issue 14's margin of MiniLM over
keyword-only); what it would do to keyword-only's answers was not measured.

A word is common when more than :data:`SHARE` of the memories in scope and
source hold it (the word index's match, so "plays" and "played" are one
word); the rows a query's uncommon word is in are kept, and so is every reply
the list then seats beside a kept question (``replies.with_replies`` runs after
this). Nothing changes when no content word of the query is uncommon (every
row would go), when every row of the list would go, or when the scope holds
:data:`SCOPE_CAP` memories or more (counting stops there, so the share cannot
be read; the rule is then off, at the cost of one capped count: its counts
took 2.4-3.1 ms CPU per recall in an 11k-row scope, 1.4 ms at 4,900 rows).

Leave-one-conversation-out on the LoCoMo dev conversations, over 0.03, 0.05,
0.1, 0.2 and leaving the rows in: on the replay 0.05 in every fold, on the
real recall 0.05 in two folds and 0.03 in three; every share from 0.03 to 0.2
is above leaving the rows in, pooled, in both R@10 and NDCG@10.
"""

from __future__ import annotations

from collections.abc import Sequence

from cpersona.storage.scope import Scope
from cpersona.storage.search import Hit, SearchBackend

SHARE = 0.05  # a word held by more than this share of the scope's memories is common
SCOPE_CAP = 5_000  # memories counted in scope at most; a scope this large keeps every row (the counts cost)


def without_common_only(
    backend: SearchBackend, scope: Scope, query: str, hits: Sequence[Hit], *, source_id: str = ""
) -> list[Hit]:
    """``hits`` (a keyword memories list, best first) without the rows holding none of the query's uncommon words."""
    ids = [hit.record.id for hit in hits if hit.record.kind == "mem"]
    if len(ids) < 2:
        return list(hits)
    spread = backend.word_spread(scope, query, ids, source_id=source_id, cap=SCOPE_CAP, share=SHARE)
    if spread is None or not 0 < spread.rows < SCOPE_CAP:
        return list(hits)
    bar = SHARE * spread.rows
    uncommon = {word for word, count in spread.counts.items() if 0 < count <= bar}
    if not uncommon:
        return list(hits)  # every content word the scope holds is common: nothing tells the rows apart
    kept = [hit for hit in hits if hit.record.kind != "mem" or spread.held.get(hit.record.id, frozenset()) & uncommon]
    return kept if kept else list(hits)
