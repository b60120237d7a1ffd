"""Leave-one-conversation-out over LoCoMo runs: choose a fusion on four conversations, score it on the fifth.

Each input is a ``bench/results/locomo-*.json`` written with per-question
rankings (the default). Every (file, mode, server) run is one candidate
configuration. For each conversation held out, the candidate with the best
recall@10 + NDCG@10 on the other conversations' questions is chosen and its
figures on the held-out conversation are printed beside the plain BM25 floor
on that conversation, so a choice that only fits the average shows.

    python bench/locomo_folds.py bench/results/locomo-A.json bench/results/locomo-B.json
    python bench/locomo_folds.py --table bench/results/*.json     # every candidate per conversation
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

from harness_python import ensure_harness_python

ensure_harness_python()

from bm25 import BM25Index  # noqa: E402
from locomo_data import DEFAULT_DATA_DIR, load_conversations  # noqa: E402
from metrics import average, score_question  # noqa: E402

RECALL_LIMIT = 10


def candidates(paths: list[Path]) -> dict[str, list[dict[str, Any]]]:
    """{label: per-question rows} for every run of every file."""
    found: dict[str, list[dict[str, Any]]] = {}
    for path in paths:
        payload = json.loads(path.read_text())
        settings = payload.get("settings_ours") or {}
        tag = ",".join(f"{k.removeprefix('CPERSONA_')}={v}" for k, v in sorted(settings.items())) or "defaults"
        for run_label, questions in (payload.get("per_question") or {}).items():
            found[f"{path.stem} {run_label} [{tag}]"] = questions
    return found


def by_conversation(questions: list[dict[str, Any]]) -> dict[str, list[dict[str, float]]]:
    grouped: dict[str, list[dict[str, float]]] = defaultdict(list)
    for question in questions:
        grouped[question["conversation"]].append(question["scores"])
    return grouped


def bm25_by_conversation(data: Path) -> dict[str, dict[str, float]]:
    out = {}
    for conversation in load_conversations(data):
        index = BM25Index([t.dia_id for t in conversation.turns], [t.content for t in conversation.turns])
        scores = [score_question(index.search(q.question, RECALL_LIMIT), q.evidence) for q in conversation.questions]
        out[conversation.name] = average(scores)
    return out


def objective(scores: list[dict[str, float]]) -> float:
    figures = average(scores)
    return figures["recall@10"] + figures["ndcg@10"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", nargs="+", type=Path)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA_DIR)
    parser.add_argument("--table", action="store_true", help="also print every candidate on every conversation")
    parser.add_argument("--only", default="", help="keep candidates whose label contains this (e.g. minilm/)")
    args = parser.parse_args()

    runs = {label: by_conversation(q) for label, q in candidates(args.results).items() if args.only in label}
    if not runs:
        raise SystemExit("no per-question results in those files")
    conversations = sorted({c for grouped in runs.values() for c in grouped})
    floor = bm25_by_conversation(args.data)

    if args.table:
        print(f"{'candidate':<70} " + " ".join(f"{c:>13}" for c in conversations) + "   (R@10/NDCG@10)")
        for label, grouped in runs.items():
            cells = []
            for c in conversations:
                figures = average(grouped.get(c, []))
                cells.append(f"{figures['recall@10']:.3f}/{figures['ndcg@10']:.3f}")
            print(f"{label[:70]:<70} " + " ".join(f"{cell:>13}" for cell in cells))
        cells = [f"{floor[c]['recall@10']:.3f}/{floor[c]['ndcg@10']:.3f}" for c in conversations]
        print(f"{'plain BM25':<70} " + " ".join(f"{cell:>13}" for cell in cells))
        print()

    print(
        f"{'held out':>8}  {'chosen on the other four':<70} {'R@10':>6} {'NDCG':>6} {'BM25 R@10':>9} {'BM25 NDCG':>9}"
    )
    held_scores: list[dict[str, float]] = []
    for held in conversations:

        def train_score(label: str) -> float:
            return objective([s for c, rows in runs[label].items() if c != held for s in rows])  # noqa: B023 - called in this iteration only

        chosen = max(runs, key=train_score)
        rows = runs[chosen].get(held, [])
        held_scores.extend(rows)
        figures = average(rows)
        print(
            f"{held:>8}  {chosen[:70]:<70} {figures['recall@10']:>6.3f} {figures['ndcg@10']:>6.3f} "
            f"{floor[held]['recall@10']:>9.3f} {floor[held]['ndcg@10']:>9.3f}"
        )
    total = average(held_scores)
    print(f"{'all':>8}  {'(held-out answers pooled)':<70} {total['recall@10']:>6.3f} {total['ndcg@10']:>6.3f}")


if __name__ == "__main__":
    main()
