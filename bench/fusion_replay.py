"""Replay dumped ranked lists through rrf with a per-query weight on the vector channel.

Inputs are dumps of bench/fusion_lists.py (LoCoMo) and bench/jsquad_lists.py
(JSQuAD). Each candidate gives the vector lists of one query a weight from 0
to 1 (multiplied into their votes) and the lists are fused with recall's own
``rrf`` (K = 60, the tie rule) and cut to 10; the gate is not re-run. Families:

- ``peak/c``: the near list's first cosine minus the mean of its first 10,
  divided by c, capped at 1 (how peaked the list is for this query);
- ``agree/n``: 1 when the vector list holds one of the keyword lists' first n
  rows, else 0 (the channels agree at the keyword top); 1 when no keyword row;
- ``both/n``: 1 when the keyword lists' first n and the vector list's first n
  share a row, else 0;
- ``clear/n,t``: 0 when a keyword list's second row scores below t times its
  first (a clear first place) and the vector list holds none of the keyword
  lists' first n rows, else 1 — the rule recall ships with n = 2, t = 0.9
  (``fusion.vector_votes``, replayed as ``shipped`` through that function).

For each family, the member is chosen on four LoCoMo conversations (R@10 +
NDCG@10) and scored on the fifth, beside today's rrf (weight 1) and
keyword-only (weight 0); every member's JSQuAD R@1 / MRR@10 is printed.

    python bench/fusion_replay.py --locomo lists.json --jsquad jsquad-lists.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness_python import ensure_harness_python

ensure_harness_python()

from metrics import average, score_question  # noqa: E402
from mcp_driver import REPO_DIR  # noqa: E402

sys.path.insert(0, str(REPO_DIR))

from cpersona.services.recall.fusion import VECTOR_CHANNELS, Ranked, RankedList, rrf, vector_votes  # noqa: E402

LIMIT = 10
RRF_K = 60  # CPERSONA_RRF_K's default
Weight = Callable[[dict[str, Any]], float]


def keys(question: dict[str, Any], vector: bool, depth: int = LIMIT) -> list[str]:
    return [
        row[0]
        for lst in question["lists"]
        if (lst["channel"] in VECTOR_CHANNELS) == vector
        for row in lst["rows"][:depth]
    ]


def peak(question: dict[str, Any]) -> float:
    cosines = [row[3] for lst in question["lists"] if lst["channel"] == "vector" for row in lst["rows"][:LIMIT]]
    return cosines[0] - statistics.mean(cosines) if len(cosines) > 1 else 0.0


def families() -> dict[str, dict[str, Weight]]:
    def peaked(c: float) -> Weight:
        return lambda q: min(1.0, peak(q) / c)

    def agree(n: int) -> Weight:
        return lambda q: 1.0 if not keys(q, False) or set(keys(q, False, n)) & set(keys(q, True)) else 0.0

    def both(n: int) -> Weight:
        return lambda q: 1.0 if not keys(q, False) or set(keys(q, False, n)) & set(keys(q, True, n)) else 0.0

    def clear(n: int, t: float) -> Weight:
        def weight(q: dict[str, Any]) -> float:
            lexical = [lst["rows"] for lst in q["lists"] if lst["channel"] not in VECTOR_CHANNELS and lst["rows"]]
            sure = any(len(rows) > 1 and rows[0][3] > 0 and rows[1][3] < t * rows[0][3] for rows in lexical)
            agree = set(keys(q, False, n)) & set(keys(q, True))
            return 0.0 if lexical and keys(q, True) and sure and not agree else 1.0

        return weight

    return {
        "clear": {f"clear/{n},{t}": clear(n, t) for n in (1, 2, 3, 5, 10) for t in (0.5, 0.7, 0.8, 0.85, 0.9, 0.95)},
        "peak": {f"peak/{c}": peaked(c) for c in (0.02, 0.03, 0.04, 0.05, 0.06, 0.07, 0.1, 0.15, 0.2)},
        "agree": {f"agree/{n}": agree(n) for n in (1, 2, 3, 4, 5, 6, 8, 10)},
        "both": {f"both/{n}": both(n) for n in (1, 2, 3, 4, 5, 6, 8, 10)},
    }


def ranked(question: dict[str, Any], weight: float | None) -> list[str]:
    """Best-first labels; ``weight`` None = the lists through recall's own ``vector_votes``."""
    lists, label = [], {}
    for lst in question["lists"]:
        scaled = lst["weight"] * (weight if weight is not None and lst["channel"] in VECTOR_CHANNELS else 1.0)
        entries = []
        for key, name, rank, raw in lst["rows"]:
            kind, number = key.split(":")
            label[(kind, int(number))] = name
            entries.append(Ranked((kind, int(number)), rank, raw))
        lists.append(RankedList(lst["channel"], tuple(entries), scaled))
    if weight is None:
        lists = list(vector_votes(lists))
    return [label[row.key] for row in rrf(lists, RRF_K)][:LIMIT]


def per_conversation(questions: list[dict[str, Any]], weight: Weight) -> dict[str, list[dict[str, float]]]:
    out: dict[str, list[dict[str, float]]] = defaultdict(list)
    for q in questions:
        out[q["conversation"]].append(score_question(ranked(q, weight(q)), q["evidence"]))
    return out


def objective(rows: list[dict[str, float]]) -> float:
    figures = average(rows)
    return figures["recall@10"] + figures["ndcg@10"]


def cell(rows: list[dict[str, float]]) -> str:
    figures = average(rows)
    return f"{figures['recall@10']:.3f} / {figures['ndcg@10']:.3f}"


def jsquad(questions: list[dict[str, Any]], weight: Weight) -> str:
    found = [ranked(q, weight(q)) for q in questions]
    ranks = [r.index(q["evidence"][0]) + 1 if q["evidence"][0] in r else 0 for q, r in zip(questions, found)]
    r1 = sum(rank == 1 for rank in ranks) / len(ranks)
    mrr = sum(1 / rank for rank in ranks if rank) / len(ranks)
    return f"{r1:.3f} / {mrr:.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--locomo", type=Path, required=True)
    parser.add_argument("--jsquad", type=Path)
    args = parser.parse_args()
    locomo = json.loads(args.locomo.read_text())["questions"]
    japanese = json.loads(args.jsquad.read_text())["questions"] if args.jsquad else []
    today = per_conversation(locomo, lambda q: 1.0)
    keyword = per_conversation(locomo, lambda q: 0.0)
    conversations = sorted(today)
    print("R@10 / NDCG@10 per conversation; JSQuAD R@1 / MRR@10")
    print(f"{'candidate':<12} " + " ".join(f"{c:>15}" for c in conversations) + f" {'JSQuAD':>15}")
    shipped = per_conversation(locomo, lambda q: None)
    for name, weight, grouped in (
        ("rrf before", lambda q: 1.0, today),
        ("keyword-only", lambda q: 0.0, keyword),
        ("shipped", lambda q: None, shipped),
    ):
        print(
            f"{name:<12} "
            + " ".join(f"{cell(grouped[c]):>15}" for c in conversations)
            + (f" {jsquad(japanese, weight):>15}" if japanese else "")
        )
    for family, members in families().items():
        runs = {name: per_conversation(locomo, weight) for name, weight in members.items()}
        print()
        for name, grouped in runs.items():
            print(
                f"{name:<12} "
                + " ".join(f"{cell(grouped[c]):>15}" for c in conversations)
                + (f" {jsquad(japanese, members[name]):>15}" if japanese else "")
            )
        print(f"leave one conversation out, family {family}:")
        pooled = []
        for held in conversations:
            chosen = max(runs, key=lambda n: objective([s for c, rows in runs[n].items() if c != held for s in rows]))  # noqa: B023
            rows = runs[chosen][held]
            pooled += rows
            verdict = "better" if objective(rows) > objective(today[held]) else "NOT better"
            print(
                f"  held {held}: chose {chosen:<10} {cell(rows)}  rrf before {cell(today[held])}  "
                f"keyword-only {cell(keyword[held])}  {verdict} than today"
            )
        print(f"  pooled held-out {cell(pooled)}  (rrf before {cell([s for c in conversations for s in today[c]])})")


if __name__ == "__main__":
    main()
