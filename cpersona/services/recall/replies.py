"""Replies beside the questions they answer, in the keyword memories list (issue 14).

A memory that asks something ("How often do you all work out together?")
shares the query's words; the memory stored right after it in the same
conversation ("Three times a week") holds the answer and often none of
them. So for each row of the keyword list that holds a question mark, the
memory stored next in scope and source (the next id, at
most :data:`REACH` ids on) is placed in the list just **ahead** of it, as
long as the two were stamped within :data:`WITHIN` of each other (a reply
follows its question in the same exchange; two unrelated notes stored days
apart are not question and answer). The list keeps its depth: each reply
takes a seat and the last row gives its up.

Only the keyword memories list is touched, after the word merge, so fusion
still sees one lexical list per table and the vector channel is unchanged.
A reply's raw score is its question's, so raw scores stay in list order for
rsf. One statement per recall, and only when the list holds a question row.

Leave-one-conversation-out on the LoCoMo dev conversations chose, in every
fold, every row of the list (over its first 1, 2, 3 or 5) and the reply ahead
of its question (over behind it) (docs/benchmarks.md, "Issue 14, fifth pass");
a question mark anywhere (URLs included) gave the same LoCoMo answers as the
sentence rule of :func:`asks`, and put the next paragraph first on three JSQuAD
questions (R@1 0.924 -> 0.922; the sentence rule gives 0.924 again).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import timedelta

from cpersona.services.timestamps import instant_seconds
from cpersona.storage.scope import Scope
from cpersona.storage.search import Hit, Record, SearchBackend

REACH = 64  # ids looked past a question for the next memory in scope
WITHIN = timedelta(hours=1)  # a reply is stamped this close to its question
AHEAD = True  # the reply takes its question's seat and the question follows it (False: behind it)
# A sentence that ends in a question mark (ASCII or full-width), closing quotes or
# brackets allowed after it: the mark then meets a space or the end of the text.
# A mark inside a URL (``?hl=ja``) or a quoted question the sentence goes on past
# (「…だろう？」とアルマに尋ねる) asks the reader nothing.
_ASKS = re.compile("[?\uff1f][\"'\u201d\u2019\u300d\u300f)\\]\uff09]*(?:\\s|$)")


def asks(text: str) -> bool:
    """Whether a memory's text holds a sentence that asks something."""
    return _ASKS.search(text) is not None


def _stamp(record: Record) -> float | None:
    return instant_seconds(record.timestamp or record.created_at)


def answers(question: Record, reply: Record) -> bool:
    """Whether ``reply`` was stamped within :data:`WITHIN` of ``question`` (either way);
    two unreadable stamps count only when they are the same text."""
    if (question.timestamp or question.created_at) == (reply.timestamp or reply.created_at):
        return True  # the same stamp (a session's turns often share one): nothing to parse
    a, b = _stamp(question), _stamp(reply)
    return a is not None and b is not None and abs(b - a) <= WITHIN.total_seconds()


def with_replies(
    backend: SearchBackend, scope: Scope, hits: Sequence[Hit], depth: int, *, source_id: str = ""
) -> list[Hit]:
    """``hits`` (a memories list, best first) with each question row's reply placed beside it."""
    asking = [hit.record.id for hit in hits if hit.record.kind == "mem" and asks(hit.record.text)]
    if not asking:
        return list(hits)
    following = backend.next_memories(scope, asking, source_id=source_id, reach=REACH)
    if not following:
        return list(hits)
    out: list[Hit] = []
    placed: set[int] = set()
    for hit in hits:
        reply = following.get(hit.record.id)
        pair = [hit]
        if reply is not None and reply.id not in placed and answers(hit.record, reply):
            pair = [Hit(reply, hit.raw), hit] if AHEAD else [hit, Hit(reply, hit.raw)]
        for item in pair:
            if item.record.id not in placed:
                placed.add(item.record.id)
                out.append(item)
    return out[:depth]
