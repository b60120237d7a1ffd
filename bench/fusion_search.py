"""Replay recall's whole fusion from each retriever's own list, with its parameters varied.

Input: a dump of ``bench/fusion_lists.py --raw-depth N`` (the trigram and word
lists of each table and the vector near list, unmerged, N deep). A candidate
is a set of parameters of the fusion below; each is replayed exactly as
recall fuses (``words.with_words`` merge, ``fusion.on_one_scale``,
``fusion.vector_votes``, ``fusion.rrf`` at K = 60), the gate and the episode
penalty aside, and cut to 10. For a family of candidates one is chosen on four
LoCoMo conversations (R@10 + NDCG@10) and scored on the fifth; every fold is
printed beside keyword-only with the same lexical parameters. The defaults
are what recall ships; each family pins the other parameters as they were
before its own question was asked.

    python bench/fusion_lists.py --embedding local --raw-depth 30 --out raw.json
    python bench/fusion_lists.py --embedding local --raw-depth 30 --out raw.json
    python bench/fusion_search.py --lists raw.json [--family NAME ...]
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from collections import defaultdict
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from harness_python import ensure_harness_python

ensure_harness_python()

from metrics import average, score_question  # noqa: E402
from mcp_driver import REPO_DIR  # noqa: E402

sys.path.insert(0, str(REPO_DIR))

from cpersona.services.recall import fusion  # noqa: E402
from cpersona.services.recall.fusion import Ranked, RankedList, rrf  # noqa: E402

LIMIT = 10
RRF_K = 60


@dataclass(frozen=True)
class Params:
    word_weight: float = 2.0  # CPERSONA_RECALL_WORD_WEIGHT
    merge_k: float = 2.0  # words.MERGE_K
    lex_in: int = 10  # rows of each trigram / word list that enter the merge
    lex_depth: int = 10  # rows of the merged lexical list that enter fusion (2 x lex_in: every row of either)
    vec_depth: int = 10  # rows of the vector list that enter fusion
    vec_weight: float = 1.0
    votes: str = "shipped"  # shipped | always
    vec_k_extra: float = 0.0  # extra rank offset for vector votes (K + extra)
    vec_gap: float = 1.0  # vector rows whose cosine is more than this below the list's first are left out
    vec_floor: float = 0.0  # vector rows below this cosine are left out
    agree_within: int = 0  # agreement for vector_votes judged on this many vector rows (0: every row)
    # Issue 14, fifth pass (what recall ships): the near list read to 1.5 x depth (memory rows
    # only past depth) and each merged lexical list kept whole, a row past the cut counting only
    # where the other channel ranks it (fusion.confirmed); the memories' clear first place takes
    # the near list's first-place vote (fusion.defer_to_clear_first). on_one_scale is recall's own.
    past_cut: bool = True
    defer: bool = True

    def label(self) -> str:
        default = Params()
        return ",".join(f"{k}={v}" for k, v in self.__dict__.items() if getattr(default, k) != v) or "shipped"


def key_of(text: str) -> tuple[str, int]:
    kind, number = text.split(":")
    return kind, int(number)


def merged(trigram: list, words: list, p: Params) -> list[tuple[tuple[str, int], float]]:
    """words.with_words on the first ``lex_in`` rows of each, cut to ``lex_depth``."""
    trigram, words = trigram[: p.lex_in], words[: p.lex_in]
    if p.word_weight <= 0 or not words:
        return [(key_of(r[0]), r[2]) for r in trigram[: p.lex_depth]]
    score: dict[tuple[str, int], float] = {}
    for share, listed in ((1.0, trigram), (p.word_weight, words)):
        for rank, row in enumerate(listed):
            key = key_of(row[0])
            score[key] = score.get(key, 0.0) + share / (p.merge_k + rank + 1)
    order = sorted(score, key=lambda key: -score[key])
    return [(key, score[key]) for key in order[: p.lex_depth]]


def answer(q: dict[str, Any], p: Params, vector: bool) -> list[str]:
    raw = q["raw"]
    label = {key_of(r[0]): r[1] for rows in raw.values() for r in rows}
    lists = []
    embedded = vector and bool(raw.get("vector"))
    past = p.past_cut and embedded
    if embedded:
        rows = raw["vector"][: fusion.past_the_cut(p.vec_depth) if past else p.vec_depth]
        rows = [r for r in rows if r[2] >= max(p.vec_floor, rows[0][2] - p.vec_gap)]
        # recall keeps episode rows past the cut out of the near list (retrievers.vector_lists)
        rows = [(i, r) for i, r in enumerate(rows) if i < p.vec_depth or r[0].startswith("mem")]
        entries = tuple(Ranked(key_of(r[0]), i + p.vec_k_extra, r[2]) for i, r in rows)
        lists.append(RankedList("vector", entries, p.vec_weight))
    lex = replace(p, lex_depth=2 * p.lex_in) if past else p
    for channel, prefix in (("episodes", "ep"), ("memories", "mem")):
        hits = merged(raw[f"{prefix}_trigram"], raw[f"{prefix}_word"], lex)
        lists.append(RankedList.of(channel, hits))
    if past:
        lists = list(fusion.confirmed(lists, p.vec_depth))
    counts = q.get("counts") or []
    if vector and p.votes == "shipped":
        # recall's rule, its agreement judged on the first ``agree_within`` vector rows when set
        judged = [
            replace(lst, entries=lst.entries[: p.agree_within]) if p.agree_within and lst.channel == "vector" else lst
            for lst in lists
        ]
        depth = p.vec_depth if past else None
        silenced = any(lst.weight == 0 for lst in fusion.vector_votes(judged, depth) if lst.channel == "vector")
        lists = [replace(lst, weight=0.0) if silenced and lst.channel == "vector" else lst for lst in lists]
    if len(counts) == 2:
        lists = list(fusion.on_one_scale(lists, *counts))
    if p.defer and embedded:
        lists = list(fusion.defer_to_clear_first(lists))
    return [label[row.key] for row in rrf(lists, RRF_K)][:LIMIT]


def per_conversation(questions: list[dict[str, Any]], p: Params, vector: bool) -> dict[str, list[dict[str, float]]]:
    out: dict[str, list[dict[str, float]]] = defaultdict(list)
    for q in questions:
        out[q["conversation"]].append(score_question(answer(q, p, vector), q["evidence"]))
    return out


def objective(rows: list[dict[str, float]]) -> float:
    figures = average(rows)
    return figures["recall@10"] + figures["ndcg@10"]


def cell(rows: list[dict[str, float]]) -> str:
    figures = average(rows)
    return f"{figures['recall@10']:.3f}/{figures['ndcg@10']:.3f}"


def grid(**axes: list[Any]) -> list[Params]:
    names = list(axes)
    return [replace(Params(), **dict(zip(names, values))) for values in itertools.product(*axes.values())]


# What recall ships (the defaults above), pinned for families that vary other parameters.
SHIPPED: dict[str, list[Any]] = {"lex_depth": [10], "vec_depth": [10], "agree_within": [0]}

FAMILIES = {
    "lexical": lambda: grid(**SHIPPED, word_weight=[1.0, 1.5, 2.0, 3.0], merge_k=[0.0, 1.0, 2.0, 5.0], lex_in=[10, 20]),
    "lexdepth": lambda: grid(**{**SHIPPED, "lex_in": [10, 15, 20, 30], "lex_depth": [10, 15, 20]}),
    "vector": lambda: grid(
        **{**SHIPPED, "vec_depth": [3, 5, 7, 10]}, vec_weight=[0.9, 0.95, 1.0], votes=["shipped", "always"]
    ),
    "vecgap": lambda: grid(**SHIPPED, vec_gap=[0.05, 0.1, 0.15, 0.2, 0.3, 1.0]),
    "vecfloor": lambda: grid(**SHIPPED, vec_floor=[0.0, 0.3, 0.35, 0.4, 0.45, 0.5]),
    "veck": lambda: grid(**{**SHIPPED, "vec_depth": [5, 10]}, vec_k_extra=[0.0, 1.0, 2.0, 3.0, 5.0]),
    "depth": lambda: grid(**{**SHIPPED, "lex_depth": [10, 20], "vec_depth": [10, 12, 15, 20]}),
    "depthagree": lambda: grid(lex_depth=[10, 20], vec_depth=[10, 12, 15, 20], agree_within=[0, 10]),
    # issue 14, fifth pass: each of its two rules on and off (the vector scale is recall's own)
    "fifth": lambda: grid(**SHIPPED, past_cut=[False, True], defer=[False, True]),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lists", type=Path, required=True)
    parser.add_argument("--family", action="append", choices=sorted(FAMILIES))
    parser.add_argument("--keyword", action="store_true", help="replay without the vector list (keyword-only)")
    parser.add_argument("--check", action="store_true", help="compare the shipped replay with recall's answers")
    args = parser.parse_args()
    questions = json.loads(args.lists.read_text())["questions"]
    vector = not args.keyword and any(q["raw"].get("vector") for q in questions)
    if args.check:
        same = sum(answer(q, Params(), vector) == q["answer"][:LIMIT] for q in questions)
        print(f"replay of today's parameters equals the dumped answer on {same} of {len(questions)} questions")
    conversations = sorted({q["conversation"] for q in questions})
    for family in args.family or sorted(FAMILIES):
        members = FAMILIES[family]()
        runs = {p: per_conversation(questions, p, vector) for p in members}
        print(f"\nfamily {family}: R@10/NDCG@10 per conversation " + " ".join(conversations))
        for p, grouped in runs.items():
            pooled = [s for c in conversations for s in grouped[c]]
            print(f"  {p.label():<48} " + " ".join(cell(grouped[c]) for c in conversations) + f"  all {cell(pooled)}")
        pooled, pooled_kw = [], []
        for held in conversations:
            chosen = max(members, key=lambda p: objective([s for c in conversations if c != held for s in runs[p][c]]))  # noqa: B023
            rows, kw = runs[chosen][held], per_conversation(questions, chosen, False)[held]
            pooled += rows
            pooled_kw += kw
            margin = average(rows)["recall@10"] - average(kw)["recall@10"]
            print(
                f"  held {held}: chose {chosen.label():<40} {cell(rows)}  keyword-only {cell(kw)}  R@10 +{margin:.3f}"
            )
        print(f"  pooled held-out {cell(pooled)}  keyword-only {cell(pooled_kw)}")


if __name__ == "__main__":
    main()
