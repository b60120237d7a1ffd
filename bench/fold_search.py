"""Leave-one-conversation-out over recall's rrf constants on an exact dump (issue 14, ninth pass).

Input: a ``bench/fusion_lists.py`` dump made on the tree under test (its lists are what
recall fused, so the replay of today's constants equals recall's answer). Keyword-only is
read from a separate dump made with ``--embedding none`` (the real keyword-only answer:
a hybrid dump's lexical lists were shaped by the query vector, common_words and the
confirmation of rows past the cut, so a keyword-only replay of them is not keyword-only).

    python bench/fusion_lists.py --embedding local --raw-depth 30 --out lists.json
    python bench/fusion_lists.py --embedding none --out kw.json
    python bench/fold_search.py --lists lists.json --keyword kw.json
"""

from __future__ import annotations

import argparse
import itertools
import json
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

from harness_python import ensure_harness_python

ensure_harness_python()

from metrics import average, score_question  # noqa: E402
from pair_replay import lists_of  # noqa: E402

from cpersona.services.recall import fusion  # noqa: E402
from cpersona.services.recall.fusion import VECTOR_CHANNELS, rrf  # noqa: E402

LIMIT = 10


def chain(q, *, k=60, seats=2, dominant=0.9, agree=2, vweight=1.0) -> list[str]:
    """Recall's rrf chain on the dumped lists with its constants replaced (gate aside)."""
    lists, label = lists_of(q)
    lists = [replace(lst, weight=lst.weight * vweight) if lst.channel in VECTOR_CHANNELS else lst for lst in lists]
    fusion.DOMINANT, fusion.AGREE_ROWS = dominant, agree
    try:
        lists = list(fusion.vector_votes(lists, LIMIT))
        counts = q.get("counts") or []
        if len(counts) == 2:
            lists = list(fusion.on_one_scale(lists, *counts))
        lists = list(fusion.defer_to_clear_first(lists))
        if seats:
            lists = list(fusion.seat_vector_only(lists, seats, k))
    finally:
        fusion.DOMINANT, fusion.AGREE_ROWS = 0.9, 2
    return [label[row.key] for row in rrf(lists, k)][:LIMIT]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lists", type=Path, required=True)
    parser.add_argument("--keyword", type=Path, required=True, help="a --embedding none dump: the real keyword-only")
    args = parser.parse_args()
    questions = json.loads(args.lists.read_text())["questions"]
    keyword = json.loads(args.keyword.read_text())["questions"]
    convs = sorted({q["conversation"] for q in questions})
    kw = defaultdict(list)
    for q, k in zip(questions, keyword, strict=True):
        assert q["question"] == k["question"]
        kw[q["conversation"]].append(score_question(k["answer"][:LIMIT], k["evidence"]))
    same = sum(chain(q) == q["answer"][:LIMIT] for q in questions)
    print(f"replay of today's constants equals the dumped answer on {same} of {len(questions)}")
    grid = {
        "k": (30, 45, 60, 90),
        "seats": (1, 2, 3, 0),
        "dominant": (0.85, 0.9, 0.95),
        "agree": (1, 2, 3),
        "vweight": (0.8, 1.0, 1.25),
    }
    runs = {}
    for values in itertools.product(*grid.values()):
        member = dict(zip(grid, values))
        fused = defaultdict(list)
        for q in questions:
            fused[q["conversation"]].append(score_question(chain(q, **member), q["evidence"]))
        runs[values] = {c: average(rows) for c, rows in fused.items()} | {"_rows": fused}
    today = (60, 2, 0.9, 2, 1.0)

    def show(values) -> str:
        r = runs[values]
        return " ".join(f"{r[c]['recall@10']:.3f}/{r[c]['ndcg@10']:.3f}" for c in convs)

    print(
        "keyword-only  ", " ".join(f"{average(kw[c])['recall@10']:.3f}/{average(kw[c])['ndcg@10']:.3f}" for c in convs)
    )
    print("today         ", show(today))
    need = {c: average(kw[c])["recall@10"] + 0.04 for c in convs}
    passing = [v for v in runs if all(runs[v][c]["recall@10"] >= need[c] - 1e-9 for c in convs)]
    print(f"members meeting +0.04 on all five (in-sample): {len(passing)}")
    for v in passing[:20]:
        print("  ", dict(zip(grid, v)), show(v))

    def objective(values, held) -> float:
        rows = [s for c in convs if c != held for s in runs[values]["_rows"][c]]
        f = average(rows)
        return f["recall@10"] + f["ndcg@10"]

    for family, members in {
        "every member": list(runs),
        "seats x K": [v for v in runs if v[2:] == today[2:]],
        "vector weight x seats": [v for v in runs if v[0] == 60 and v[2:4] == today[2:4]],
        "dominant x agree": [v for v in runs if v[:2] == today[:2] and v[4] == 1.0],
    }.items():
        print(f"leave one conversation out, {family} ({len(members)} members):")
        for held in convs:
            chosen = max(members, key=lambda v: objective(v, held))  # noqa: B023
            r, k = runs[chosen][held], average(kw[held])
            print(
                f"  held {held}: chose {dict(zip(grid, chosen))} {r['recall@10']:.3f}/{r['ndcg@10']:.3f}"
                f" margin {r['recall@10'] - k['recall@10']:+.3f}/{r['ndcg@10'] - k['ndcg@10']:+.3f}"
            )


if __name__ == "__main__":
    main()
