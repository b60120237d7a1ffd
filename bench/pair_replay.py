"""Replay recall's rrf fusion from dumped retriever lists with the shared first place on or off.

Input: a dump of ``bench/fusion_lists.py`` (the retrievers' lists as recall's
fusion sees them: keyword lists after the replies rule, rows past the cut
confirmed). Each candidate runs recall's own chain (``fusion.vector_votes``
at depth 10, ``fusion.on_one_scale``, ``fusion.defer_to_clear_first``,
``fusion.rrf`` at K = 60), the gate aside, cut to 10, with
``fusion.SHARED`` (rows that may hold one clear first place on one score)
set separately for the vector-votes test and for the deferred first place.
One candidate is chosen on four LoCoMo conversations (R@10 + NDCG@10) and
scored on the fifth, beside keyword-only (the keyword lists cut at 10 and
fused alone, as recall without an embedder fuses them).

    python bench/fusion_lists.py --embedding local --out lists.json
    python bench/pair_replay.py --lists lists.json [--check]
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

sys.path.insert(0, str(REPO_DIR))

from cpersona.services.recall import fusion  # noqa: E402
from cpersona.services.recall.fusion import VECTOR_CHANNELS, Ranked, RankedList, rrf  # noqa: E402

LIMIT = 10
RRF_K = 60
# (SHARED in vector_votes, SHARED in defer_to_clear_first): (1, 1) is the rule before this pass
# defer 3: SHARED 2 with the near list's other rows moved down past the pair (shifted)
CANDIDATES = [(1, 1), (2, 1), (1, 2), (2, 2), (2, 3)]


def shifted(lists: list[RankedList]) -> list[RankedList]:
    memories = next((lst for lst in lists if lst.channel == "memories" and lst.entries), None)
    held = 0 if memories is None else fusion.first_place(memories)
    if not held:
        return lists
    firsts = [e.key for e in memories.entries[:held]]
    out = []
    for lst in lists:
        if lst.channel == "vector" and lst.weight > 0:
            cosine = {e.key: e.raw for e in lst.entries}
            rest = tuple(Ranked(e.key, e.rank + held - 1, e.raw) for e in lst.entries if e.key not in firsts)
            lst = RankedList(
                lst.channel,
                (*(Ranked(k, i, cosine.get(k)) for i, k in enumerate(firsts)), *rest),
                lst.weight,
                lst.scale,
            )
        out.append(lst)
    return out


def lists_of(q: dict[str, Any]) -> tuple[list[RankedList], dict[tuple[str, int], str]]:
    lists, label = [], {}
    for lst in q["lists"]:
        entries = []
        for key, name, rank, raw in lst["rows"]:
            kind, number = key.split(":")
            label[(kind, int(number))] = name
            entries.append(Ranked((kind, int(number)), rank, raw))
        lists.append(RankedList(lst["channel"], tuple(entries), lst["weight"]))
    return lists, label


def answer(q: dict[str, Any], votes: int, defer: int | None) -> list[str]:
    """``defer`` None: keyword-only (no vector list, keyword lists cut at the depth)."""
    lists, label = lists_of(q)
    counts = q.get("counts") or []
    if defer is None:
        lists = [lst for lst in fusion.within_cut(lists, LIMIT) if lst.channel not in VECTOR_CHANNELS]
    else:
        fusion.SHARED = votes
        lists = list(fusion.vector_votes(lists, LIMIT))
    if len(counts) == 2:
        lists = list(fusion.on_one_scale(lists, *counts))
    if defer is not None:
        fusion.SHARED = min(defer, 2)
        lists = shifted(lists) if defer == 3 else list(fusion.defer_to_clear_first(lists))
    return [label[row.key] for row in rrf(lists, RRF_K)][:LIMIT]


def cell(rows: list[dict[str, float]]) -> str:
    f = average(rows)
    return f"{f['recall@10']:.3f}/{f['ndcg@10']:.3f}"


def objective(rows: list[dict[str, float]]) -> float:
    f = average(rows)
    return f["recall@10"] + f["ndcg@10"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lists", type=Path, required=True)
    parser.add_argument("--check", action="store_true", help="compare the (1, 1) replay with recall's dumped answers")
    args = parser.parse_args()
    questions = json.loads(args.lists.read_text())["questions"]
    if args.check:
        same = sum(answer(q, 1, 1) == q["answer"][:LIMIT] for q in questions)
        print(f"replay of (1, 1) equals the dumped answer on {same} of {len(questions)} questions")
    conversations = sorted({q["conversation"] for q in questions})
    runs: dict[Any, dict[str, list]] = {}
    for cand in [*CANDIDATES, "keyword"]:
        grouped = defaultdict(list)
        for q in questions:
            ranked = answer(q, 0, None) if cand == "keyword" else answer(q, *cand)
            grouped[q["conversation"]].append(score_question(ranked, q["evidence"]))
        runs[cand] = grouped
    print("R@10/NDCG@10 per conversation " + " ".join(conversations))
    for cand, grouped in runs.items():
        pooled = [s for c in conversations for s in grouped[c]]
        name = "keyword-only" if cand == "keyword" else f"votes={cand[0]},defer={cand[1]}"
        print(f"  {name:<20} " + " ".join(cell(grouped[c]) for c in conversations) + f"  all {cell(pooled)}")
    pooled, pooled_kw = [], []
    for held in conversations:
        chosen = max(CANDIDATES, key=lambda p: objective([s for c in conversations if c != held for s in runs[p][c]]))  # noqa: B023
        rows, kw = runs[chosen][held], runs["keyword"][held]
        pooled += rows
        pooled_kw += kw
        print(f"  held {held}: chose votes={chosen[0]},defer={chosen[1]}  {cell(rows)}  keyword-only {cell(kw)}")
    print(f"  pooled held-out {cell(pooled)}  keyword-only {cell(pooled_kw)}")


if __name__ == "__main__":
    main()
