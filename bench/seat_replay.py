"""Replay recall's rrf fusion with the seats of vector-only rows varied, and measure the vector channel's headroom.

Input: a dump of ``bench/fusion_lists.py`` (``--raw-depth`` adds each
retriever's own list, which the headroom table reads for the near list past
the depth recall reads). Each candidate runs recall's own chain
(``fusion.vector_votes`` at depth 10, ``fusion.on_one_scale``,
``fusion.defer_to_clear_first``, ``fusion.seat_vector_only`` with the given
seats, ``fusion.rrf`` at K = 60), the gate aside, cut to 10; "off" lets every
vector-only row vote (the rule before issue 14's sixth pass). One candidate is
chosen on four LoCoMo conversations (R@10 + NDCG@10) and scored on the fifth,
beside keyword-only (the keyword lists cut at 10 and fused alone).

``--headroom`` prints, per conversation, the R@10 of keyword-only, of the
replayed answer, and of the union of keyword-only's ten with the near list's
first k rows (an answer of 10 + k seats that loses nothing: no fusion of these
lists into ten seats can do better), and the precision of vector-only rows by
their place among the vector-only rows of the near list.

    python bench/fusion_lists.py --embedding local --raw-depth 30 --out lists.json
    python bench/seat_replay.py --lists lists.json [--check] [--headroom]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

from harness_python import ensure_harness_python

ensure_harness_python()

from metrics import average, score_question  # noqa: E402
from mcp_driver import REPO_DIR  # noqa: E402
from pair_replay import lists_of  # noqa: E402

sys.path.insert(0, str(REPO_DIR))

from cpersona.services.recall import fusion  # noqa: E402
from cpersona.services.recall.fusion import VECTOR_CHANNELS, rrf  # noqa: E402

LIMIT = 10
RRF_K = 60
OFF = 0  # every vector-only row votes
CANDIDATES = [OFF, 1, 2, 3, 4]


def answer(q: dict[str, Any], seats: int | None) -> list[str]:
    """``seats`` None: keyword-only (no vector list, keyword lists cut at the depth)."""
    lists, label = lists_of(q)
    counts = q.get("counts") or []
    if seats is None:
        lists = [lst for lst in fusion.within_cut(lists, LIMIT) if lst.channel not in VECTOR_CHANNELS]
    else:
        lists = list(fusion.vector_votes(lists, LIMIT))
    if len(counts) == 2:
        lists = list(fusion.on_one_scale(lists, *counts))
    if seats is not None:
        lists = list(fusion.defer_to_clear_first(lists))
        if seats != OFF:
            lists = list(fusion.seat_vector_only(lists, seats, RRF_K))
    return [label[row.key] for row in rrf(lists, RRF_K)][:LIMIT]


def name(seats: int | None) -> str:
    return "keyword-only" if seats is None else "off" if seats == OFF else f"seats={seats}"


def cell(rows: list[dict[str, float]]) -> str:
    f = average(rows)
    return f"{f['recall@10']:.3f}/{f['ndcg@10']:.3f}"


def objective(rows: list[dict[str, float]]) -> float:
    f = average(rows)
    return f["recall@10"] + f["ndcg@10"]


def headroom(questions: list[dict[str, Any]], conversations: list[str]) -> None:
    union = defaultdict(lambda: defaultdict(list))
    precision = defaultdict(lambda: [0, 0])
    for q in questions:
        c, evidence = q["conversation"], set(q["evidence"])
        keyword = answer(q, None)
        shipped = answer(q, fusion.vector_only_seats(LIMIT))
        near = [row[1] for row in q["raw"]["vector"]] if "raw" in q else []
        union[c]["keyword"].append(len(evidence & set(keyword)) / len(evidence))
        union[c]["recall"].append(len(evidence & set(shipped)) / len(evidence))
        for k in (1, 2, 5, 10, 15, 20, 30):
            union[c][f"kw10+near{k}"].append(len(evidence & (set(keyword) | set(near[:k]))) / len(evidence))
        # precision where recall's vector lists vote (not set aside by fusion.vector_votes), in its fused lists
        lists, label = lists_of(q)
        lists = list(fusion.vector_votes(lists, LIMIT))
        near_list = next((lst for lst in lists if lst.channel == "vector" and lst.weight > 0), None)
        if near_list is None:
            continue
        lexical = {e.key for lst in lists if lst.channel not in VECTOR_CHANNELS for e in lst.entries}
        place = 0
        for entry in near_list.entries:
            if entry.key in lexical:
                continue
            place += 1
            for group in (c, "all"):
                precision[(group, place)][0] += label[entry.key] in evidence
                precision[(group, place)][1] += 1
    columns = list(next(iter(union.values())))
    print("R@10 per conversation: keyword-only, recall's replay, keyword-only's ten + the near list's first k rows")
    print("  conv " + " ".join(f"{col:>13}" for col in columns))
    for c in conversations:
        print(f"  {c:>4} " + " ".join(f"{sum(v) / len(v):>13.3f}" for v in union[c].values()))
    print("evidence / rows, vector-only rows (on no keyword list) by their place among them in a voting near list")
    for c in [*conversations, "all"]:
        print(f"  {c:>4} " + " ".join(f"{precision[(c, p)][0]}/{precision[(c, p)][1]}" for p in range(1, 6)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lists", type=Path, required=True)
    parser.add_argument("--check", action="store_true", help="compare the replays with the dumped answers")
    parser.add_argument("--headroom", action="store_true")
    args = parser.parse_args()
    questions = json.loads(args.lists.read_text())["questions"]
    conversations = sorted({q["conversation"] for q in questions})
    if args.check:
        # a dump made before the rule equals "off"; one made with it equals recall's seats
        for seats in (OFF, fusion.vector_only_seats(LIMIT)):
            same = sum(answer(q, seats) == q["answer"][:LIMIT] for q in questions)
            print(f"replay with {name(seats)} equals the dumped answer on {same} of {len(questions)} questions")
    if args.headroom:
        headroom(questions, conversations)
    runs: dict[Any, dict[str, list]] = {}
    for cand in [*CANDIDATES, None]:
        grouped = defaultdict(list)
        for q in questions:
            grouped[q["conversation"]].append(score_question(answer(q, cand), q["evidence"]))
        runs[cand] = grouped
    print("R@10/NDCG@10 per conversation " + " ".join(conversations) + "   (R@10 minus keyword-only)")
    for cand, grouped in runs.items():
        pooled = [s for c in conversations for s in grouped[c]]
        margins = " ".join(
            f"{average(grouped[c])['recall@10'] - average(runs[None][c])['recall@10']:+.3f}" for c in conversations
        )
        print(
            f"  {name(cand):<13} "
            + " ".join(cell(grouped[c]) for c in conversations)
            + f"  all {cell(pooled)}  {margins}"
        )
    pooled, pooled_kw = [], []
    for held in conversations:
        chosen = max(CANDIDATES, key=lambda p: objective([s for c in conversations if c != held for s in runs[p][c]]))  # noqa: B023
        rows, kw = runs[chosen][held], runs[None][held]
        pooled += rows
        pooled_kw += kw
        print(f"  held {held}: chose {name(chosen):<8} {cell(rows)}  keyword-only {cell(kw)}")
    print(f"  pooled held-out {cell(pooled)}  keyword-only {cell(pooled_kw)}")


if __name__ == "__main__":
    main()
