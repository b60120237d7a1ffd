"""Why the lexical channels miss LoCoMo evidence, and lexical candidates replayed through recall's rrf chain.

Input: a dump of ``bench/fusion_lists.py --embedding local --raw-depth N``
(each retriever's own list N deep beside the fused lists and recall's answer).

``--misses`` classifies every evidence turn that recall's answer (with the
vector channel) misses, per conversation, by where the lexical channels had it:

- ``displaced``: keyword-only's ten (the keyword lists alone, cut at 10) held it;
- ``lexical deep``: a trigram or word list had it past 10 (``word only``: the
  word index alone, a stem the trigram substrings cannot see);
- ``vector only``: the near list had it within N, no lexical list did;
- ``on no list``: neither; split by the question's content words it shares
  (porter stems, the word channel's terms): none, only common ones (each in
  more than a tenth of the conversation's turns: speaker names), a rarer one;
- beside that, how many sit within two turns (same session) of an answer row.

``--family NAME`` replays recall's chain (``fusion.vector_votes`` at depth 10,
``on_one_scale``, ``defer_to_clear_first``, ``seat_vector_only`` 2, rrf K 60,
cut to 10; the gate aside) with one more lexical list of weight ``w`` fed in
when the near list votes, each member of the family one set of its values,
and keyword-only beside it (the keyword lists cut at 10, fused alone; the
``date`` family feeds keyword-only too). Families (issue 14, lexical side):

- ``neighbours``: the turns within ``span`` of a keyword top-10 row (same
  session) that the near list ranks within ``V``, at their anchor's rank;
- ``rare``: the rows holding the query's rarest content word (df at most
  ``maxdf`` rows of the scope), ``n`` deep, optionally only those the near
  list holds;
- ``uncommon``: the bm25 ranking of the query's words without the common ones
  (df above a share of the scope: speaker names), ``n`` deep;
- ``replies``: the next turn after each question row of the near list
  (``replies.asks``) within its first ``V`` rows, as a lexical row at its
  question's rank, or in the near list ahead of its question / on its rank;
- ``common_rows``: the memories list's rows that hold none of the query's
  words but common ones (in more than ``share`` of the scope's turns: speaker
  names) out of it, from rank ``start`` on (their replies with them);
- ``weak_score``: the same for rows scoring below ``share`` of the first row
  in both indexes (raw bm25), dropped or kept past the cut where the near list
  ranks them within 10;
- ``date``: a question naming a calendar day: the lexical rows (``n`` deep)
  stamped within ``days`` of it, in both modes.

Each family is chosen leave one conversation out (R@10 + NDCG@10 on the other
four), beside today (no extra list) as a member.

    python bench/fusion_lists.py --embedding local --raw-depth 50 --out raw.json
    python bench/lexical_replay.py --lists raw.json --misses
    python bench/lexical_replay.py --lists raw.json --family rare
"""

from __future__ import annotations

import argparse
import itertools
import json
import re
import sqlite3
import sys
from collections import Counter, defaultdict
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import Any

from harness_python import ensure_harness_python

ensure_harness_python()

from locomo_data import DEFAULT_DATA_DIR, load_conversations  # noqa: E402
from metrics import average, score_question  # noqa: E402
from mcp_driver import REPO_DIR  # noqa: E402
from pair_replay import lists_of  # noqa: E402

sys.path.insert(0, str(REPO_DIR))

from cpersona.services.recall import fusion  # noqa: E402
from cpersona.services.recall.fusion import VECTOR_CHANNELS, Ranked, RankedList, rrf  # noqa: E402
from cpersona.services.recall.replies import asks  # noqa: E402
from cpersona.storage.search_words import word_terms  # noqa: E402

LIMIT = 10
RRF_K = 60
SEATS = 2  # fusion.vector_only_seats(10)
COMMON_SHARE = 0.1  # --misses: a word in more than this share of the conversation's turns is common
_MONTHS = "January|February|March|April|May|June|July|August|September|October|November|December"
_DAY = re.compile(rf"\b(\d{{1,2}}) ({_MONTHS}),? (\d{{4}})")


class Corpus:
    """The dev conversations' turns: text, stamp, order, and a porter index per conversation (the scope)."""

    def __init__(self, questions: list[dict[str, Any]], data: Path) -> None:
        self.conversations = {c.name: c for c in load_conversations(data)}
        self.text = {(c.name, t.dia_id): t.content for c in self.conversations.values() for t in c.turns}
        self.stamp = {
            (c.name, t.dia_id): datetime.fromisoformat(t.timestamp).replace(tzinfo=None)
            for c in self.conversations.values()
            for t in c.turns
        }
        self.order = {c.name: [t.dia_id for t in c.turns] for c in self.conversations.values()}
        # fusion_lists.py stores every turn in order, so a memory id is its turn's place plus an offset
        self.offset: dict[str, int] = {}
        for q in questions:
            for rows in q["raw"].values():
                for key, dia, _ in rows:
                    if key.startswith("mem:") and q["conversation"] not in self.offset:
                        place = self.order[q["conversation"]].index(dia)
                        self.offset[q["conversation"]] = int(key[4:]) - place
        self.db = sqlite3.connect(":memory:")
        self.db.execute(
            "CREATE VIRTUAL TABLE t USING fts5(conv UNINDEXED, dia UNINDEXED, body, tokenize='porter unicode61')"
        )
        self.db.executemany("INSERT INTO t VALUES (?, ?, ?)", [(c, d, body) for (c, d), body in self.text.items()])

    def dia(self, conv: str, memory_id: int) -> str | None:
        place = memory_id - self.offset[conv]
        return self.order[conv][place] if 0 <= place < len(self.order[conv]) else None

    def df(self, conv: str, word: str) -> int:
        sql = "SELECT count(*) FROM t WHERE t MATCH ? AND conv = ?"
        return self.db.execute(sql, (f'body:"{word}"', conv)).fetchone()[0]

    def ranked(self, conv: str, words: list[str], n: int) -> list[str]:
        match = " OR ".join(f'body:"{w}"' for w in words)
        sql = "SELECT dia FROM t WHERE t MATCH ? AND conv = ? ORDER BY bm25(t) LIMIT ?"
        return [r[0] for r in self.db.execute(sql, (match, conv, n))]

    def shares(self, conv: str, question: str, dia: str) -> set[str]:
        """The question's content words the turn holds (porter stems, as the word index matches)."""
        sql = "SELECT count(*) FROM t WHERE t MATCH ? AND conv = ? AND dia = ?"
        return {w for w in word_terms(question) if self.db.execute(sql, (f'body:"{w}"', conv, dia)).fetchone()[0]}


def session(dia: str) -> str:
    return dia.split(":")[0]


def key_of(text: str) -> tuple[str, int]:
    kind, number = text.split(":")
    return kind, int(number)


# -- the chain ---------------------------------------------------------------------------


def chain(q: dict[str, Any], extra: Any, corpus: Corpus, *, keyword: bool) -> list[str]:
    """Recall's rrf chain on the dumped lists, ``extra(q, lists, label, corpus, keyword)`` adding lists first."""
    lists, label = lists_of(q)
    if keyword:
        lists = [lst for lst in fusion.within_cut(lists, LIMIT) if lst.channel not in VECTOR_CHANNELS]
    else:
        lists = list(fusion.vector_votes(lists, LIMIT))
    if extra is not None:
        lists = extra(q, lists, label, corpus, keyword)
    counts = q.get("counts") or []
    if len(counts) == 2:
        lists = list(fusion.on_one_scale(lists, *counts))
    if not keyword:
        lists = list(fusion.defer_to_clear_first(lists))
        lists = list(fusion.seat_vector_only(lists, SEATS, RRF_K))
    return [label[row.key] for row in rrf(lists, RRF_K)][:LIMIT]


def voting_near(lists: list[RankedList]) -> RankedList | None:
    return next((lst for lst in lists if lst.channel == "vector" and lst.weight > 0), None)


def neighbours(span: int, within: int, weight: float):
    def extra(q, lists, label, corpus, keyword):
        near, memories = voting_near(lists), next((lst for lst in lists if lst.channel == "memories"), None)
        if keyword or near is None or memories is None:
            return lists
        conv, vector_rank = q["conversation"], {e.key: e.rank for e in near.entries}
        held = {e.key for lst in lists if lst.channel not in VECTOR_CHANNELS for e in lst.entries if e.rank < LIMIT}
        entries, seen = [], set()
        for e in memories.entries:
            if e.rank >= LIMIT or e.key[0] != "mem" or e.key not in label:
                continue
            for step in (s for d in range(1, span + 1) for s in (d, -d)):
                key = ("mem", e.key[1] + step)
                dia = corpus.dia(conv, key[1])
                if dia is None or session(dia) != session(label[e.key]) or key in held or key in seen:
                    continue
                if vector_rank.get(key, within) < within:
                    seen.add(key)
                    label[key] = dia
                    entries.append(Ranked(key, e.rank))
        return [*lists, RankedList("memories", tuple(entries), weight)] if entries else lists

    return extra


def rarest(maxdf: int, n: int, weight: float, on_near: bool):
    def extra(q, lists, label, corpus, keyword):
        near = voting_near(lists)
        if keyword or near is None:
            return lists
        conv = q["conversation"]
        found = sorted((corpus.df(conv, w), w) for w in word_terms(q["question"]))
        found = [(df, w) for df, w in found if df > 0]
        if len(found) < 2 or found[0][0] > maxdf:
            return lists
        return _as_list(
            q, lists, label, corpus, corpus.ranked(conv, [found[0][1]], n), weight, near if on_near else None
        )

    return extra


def uncommon(share: float, n: int, weight: float, on_near: bool):
    def extra(q, lists, label, corpus, keyword):
        near = voting_near(lists)
        if keyword or near is None:
            return lists
        conv = q["conversation"]
        words = [w for w in word_terms(q["question"]) if corpus.df(conv, w) > 0]
        kept = [w for w in words if corpus.df(conv, w) <= share * len(corpus.order[conv])]
        if not kept or len(kept) == len(words):
            return lists
        return _as_list(q, lists, label, corpus, corpus.ranked(conv, kept, n), weight, near if on_near else None)

    return extra


def _as_list(q, lists, label, corpus, dias, weight, near):
    conv = q["conversation"]
    first = corpus.offset[conv]
    ids = {corpus.dia(conv, mid): mid for mid in range(first, first + len(corpus.order[conv]))}
    on_near = None if near is None else {e.key for e in near.entries}
    entries = []
    for dia in dias:
        key = ("mem", ids[dia])
        if on_near is not None and key not in on_near:
            continue
        label[key] = dia
        entries.append(Ranked(key, len(entries)))
    return [*lists, RankedList("memories", tuple(entries), weight)] if entries else lists


def near_replies(within: int, how: str):
    def extra(q, lists, label, corpus, keyword):
        near = voting_near(lists)
        if keyword or near is None:
            return lists
        conv = q["conversation"]
        lexical, order, placed = [], [], set()
        for e in near.entries:
            reply = None
            if e.key[0] == "mem" and e.rank < within and asks(corpus.text[(conv, label[e.key])]):
                dia = corpus.dia(conv, e.key[1] + 1)
                if dia is not None and session(dia) == session(label[e.key]):
                    reply = ("mem", e.key[1] + 1)
                    label[reply] = dia
            if reply is not None and reply not in placed:
                placed.add(reply)
                lexical.append(Ranked(reply, e.rank))
                order.append(Ranked(reply, len(order) if how == "ahead" else e.rank))
            if e.key not in placed:
                placed.add(e.key)
                order.append(replace(e, rank=len(order)) if how == "ahead" else e)
        if how == "lexical":
            return [*lists, RankedList("memories", tuple(lexical), 0.5)] if lexical else lists
        entries = tuple(order[: len(near.entries)] if how == "ahead" else order)
        return [replace(lst, entries=entries) if lst is near else lst for lst in lists]

    return extra


def dated(days: int, n: int, weight: float):
    def extra(q, lists, label, corpus, keyword):
        match = _DAY.search(q["question"])
        if match is None:
            return lists
        day = datetime.strptime(" ".join(match.groups()), "%d %B %Y")
        conv, entries, seen = q["conversation"], [], set()
        for name in ("mem_trigram", "mem_word"):
            for key_text, dia, _ in q["raw"][name][:n]:
                key = key_of(key_text)
                if key not in seen and abs((corpus.stamp[(conv, dia)] - day).days) <= days:
                    seen.add(key)
                    label[key] = dia
                    entries.append(Ranked(key, len(entries)))
        return [*lists, RankedList("memories", tuple(entries), weight)] if entries else lists

    return extra


def _replies_of(entries) -> dict:
    """reply key -> its question's key: a reply sits just ahead of its question, on its score (replies.py)."""
    out = {}
    for e, nxt in zip(entries, entries[1:]):
        if nxt.raw == e.raw and e.key[0] == nxt.key[0] == "mem" and nxt.key[1] + 1 == e.key[1]:
            out[e.key] = nxt.key
    return out


def _without(lists, weak_of, past_cut: bool):
    """The memories list with the rows ``weak_of(list)`` names out of it (their replies too), the others re-ranked;
    ``past_cut``: those the near list ranks within 10 follow at ranks 10, 11, ... (they vote as rows past the cut)."""
    near = [lst for lst in lists if lst.channel == "vector"]
    if not near:
        return lists  # no query vector: nothing to give the seats to
    confirmed = {e.key for lst in near for e in lst.entries if e.rank < LIMIT and lst.weight > 0}
    out = []
    for lst in lists:
        if lst.channel == "memories" and lst.entries:
            replies = _replies_of(lst.entries)
            weak = weak_of(lst, replies)
            weak |= {reply for reply, question in replies.items() if question in weak}
            if weak and len(weak) < len(lst.entries):
                kept = [Ranked(e.key, i, e.raw) for i, e in enumerate(x for x in lst.entries if x.key not in weak)]
                if past_cut:
                    late = (e for e in lst.entries if e.key in weak and e.key in confirmed)
                    kept += [Ranked(e.key, LIMIT + i, e.raw) for i, e in enumerate(late)]
                lst = replace(lst, entries=tuple(kept))
        out.append(lst)
    return out


def common_rows(share: float, start: int):
    """Rows of the memories list holding none of the query's words but common ones (df above ``share`` of the
    scope: speaker names), from rank ``start`` on, out of the list when the near list votes."""

    def extra(q, lists, label, corpus, keyword):
        if keyword:
            return lists
        conv = q["conversation"]
        rare = {w for w in word_terms(q["question"]) if 0 < corpus.df(conv, w) <= share * len(corpus.order[conv])}

        def weak_of(lst, replies):
            return {
                e.key for e in lst.entries
                if e.rank >= start and e.key not in replies and not corpus.shares(conv, q["question"], label[e.key]) & rare
            }  # fmt: skip

        return _without(lists, weak_of, past_cut=False)

    return extra


def weak_score(share: float, how: str, start: int):
    """Rows of the memories list scoring below ``share`` of the first row in both indexes (raw bm25), from rank
    ``start`` on, out of the list when the near list votes (``how`` past_cut: kept where the near list confirms)."""

    def extra(q, lists, label, corpus, keyword):
        if keyword:
            return lists
        strength: dict[str, float] = {}
        for name in ("mem_trigram", "mem_word"):
            rows = q["raw"][name]
            if rows and rows[0][2] and rows[0][2] > 0:
                for _, dia, raw in rows:
                    strength[dia] = max(strength.get(dia, float("-inf")), (raw or 0.0) / rows[0][2])

        def weak_of(lst, replies):
            return {
                e.key for e in lst.entries
                if e.rank >= start and e.key not in replies and strength.get(label[e.key], 0.0) < share
            }  # fmt: skip

        return _without(lists, weak_of, past_cut=how == "past_cut")

    return extra


FAMILIES = {
    "neighbours": lambda: {m: neighbours(*m) for m in itertools.product([1, 2], [3, 5, 10, 15], [0.5, 1.0])},
    "rare": lambda: {m: rarest(*m) for m in itertools.product([3, 5, 10, 20], [3, 5, 10], [0.5, 1.0], [False, True])},
    "uncommon": lambda: {
        m: uncommon(*m) for m in itertools.product([0.05, 0.1, 0.2, 0.3], [5, 10, 20], [0.5, 1.0], [False, True])
    },
    "replies": lambda: {m: near_replies(*m) for m in itertools.product([3, 5, 10, 15], ["lexical", "ahead", "same"])},
    "common_rows": lambda: {m: common_rows(*m) for m in itertools.product([0.03, 0.05, 0.1, 0.2], [0, 3, 5])},
    "weak_score": lambda: {
        m: weak_score(*m) for m in itertools.product([0.2, 0.3, 0.4, 0.5], ["drop", "past_cut"], [0, 3])
    },
    "date": lambda: {m: dated(*m) for m in itertools.product([0, 1, 3, 7], [20, 50], [0.5, 1.0])},
}


def cell(rows: list[dict[str, float]]) -> str:
    f = average(rows)
    return f"{f['recall@10']:.3f}/{f['ndcg@10']:.3f}"


def objective(rows: list[dict[str, float]]) -> float:
    f = average(rows)
    return f["recall@10"] + f["ndcg@10"]


def replay(questions: list[dict[str, Any]], corpus: Corpus, family: str) -> None:
    members = {"today": None, **FAMILIES[family]()}
    conversations = sorted({q["conversation"] for q in questions})
    runs: dict[Any, tuple[dict, dict]] = {}
    for name, extra in members.items():
        runs[name] = tuple(defaultdict(list) for _ in range(2))
        for q in questions:
            for mode, keyword in enumerate((True, False)):
                runs[name][mode][q["conversation"]].append(
                    score_question(chain(q, extra, corpus, keyword=keyword), q["evidence"])
                )
    print(
        f"family {family}: R@10/NDCG@10 with MiniLM per conversation {' '.join(conversations)}, all | margin over keyword-only R@10"
    )
    for name, (kw, hy) in runs.items():
        pooled = [s for c in conversations for s in hy[c]]
        margins = " ".join(f"{average(hy[c])['recall@10'] - average(kw[c])['recall@10']:+.3f}" for c in conversations)
        print(
            f"  {str(name):<30} " + " ".join(cell(hy[c]) for c in conversations) + f"  all {cell(pooled)} | {margins}"
        )
    kw_today = runs["today"][0]
    print(f"  {'keyword-only (today)':<30} " + " ".join(cell(kw_today[c]) for c in conversations))
    pooled = []
    for held in conversations:
        chosen = max(members, key=lambda m: objective([s for c in conversations if c != held for s in runs[m][1][c]]))  # noqa: B023
        kw, hy = runs[chosen][0][held], runs[chosen][1][held]
        pooled += hy
        margin = average(hy)["recall@10"] - average(kw)["recall@10"]
        print(f"  held {held}: chose {chosen!s:<28} MiniLM {cell(hy)}  keyword-only {cell(kw)}  margin {margin:+.3f}")
    print(f"  pooled held-out MiniLM {cell(pooled)}")


def misses(questions: list[dict[str, Any]], corpus: Corpus) -> None:
    table: dict[str, Counter] = defaultdict(Counter)
    for q in questions:
        conv, evidence = q["conversation"], set(q["evidence"])
        answer, keyword = q["answer"][:LIMIT], set(chain(q, None, corpus, keyword=True))
        raw = q["raw"]
        tri, word = ({r[1] for r in raw[name]} for name in ("mem_trigram", "mem_word"))
        near = {r[1] for r in raw.get("vector", [])}
        turns = len(corpus.order[conv])
        for dia in evidence:
            row = table[conv]
            row["evidence"] += 1
            if dia in answer:
                continue
            row["missed"] += 1
            if dia in keyword:
                row["displaced"] += 1
            elif dia in tri or dia in word:
                row["lexical deep"] += 1
                row["  word only"] += dia not in tri
                row["  also near"] += dia in near
            elif dia in near:
                row["vector only"] += 1
            else:
                row["on no list"] += 1
                shared = corpus.shares(conv, q["question"], dia)
                rare = {w for w in shared if corpus.df(conv, w) <= COMMON_SHARE * turns}
                row["  shares no word" if not shared else "  only common words" if not rare else "  a rarer word"] += 1
            place = corpus.order[conv].index(dia)
            close = [a for a in answer if a in corpus.order[conv] and session(a) == session(dia)]
            row["within 2 turns of an answer row"] += any(abs(corpus.order[conv].index(a) - place) <= 2 for a in close)
    names = sorted(table)
    labels = [
        "evidence",
        "missed",
        "displaced",
        "lexical deep",
        "  word only",
        "  also near",
        "vector only",
        "on no list",
        "  shares no word",
        "  only common words",
        "  a rarer word",
        "within 2 turns of an answer row",
    ]
    print("missed evidence turns (answer with MiniLM), per conversation: " + " ".join(names) + " all")
    for label in labels:
        print(
            f"  {label:<34} "
            + " ".join(f"{table[c][label]:>5}" for c in names)
            + f" {sum(table[c][label] for c in names):>5}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lists", type=Path, required=True)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA_DIR)
    parser.add_argument("--misses", action="store_true")
    parser.add_argument(
        "--check", action="store_true", help="count the questions where the replay equals recall's answer"
    )
    parser.add_argument("--family", choices=sorted(FAMILIES), action="append", default=[])
    args = parser.parse_args()
    questions = json.loads(args.lists.read_text())["questions"]
    if not all("raw" in q for q in questions):
        parser.error("the dump needs each retriever's own list: fusion_lists.py --raw-depth N")
    corpus = Corpus(questions, args.data)
    if args.check:
        same = sum(chain(q, None, corpus, keyword=False) == q["answer"][:LIMIT] for q in questions)
        print(f"the replay with no extra list equals the dumped answer on {same} of {len(questions)} questions")
    if args.misses:
        misses(questions, corpus)
    for family in args.family:
        replay(questions, corpus, family)


if __name__ == "__main__":
    main()
